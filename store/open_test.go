package store

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/rkv-io/rkv/proto"
)

// openErr opens a store on sv's device with opts and expects it to fail.
func openErr(t *testing.T, sv *server, opts Options) error {
	t.Helper()
	s, err := Open(context.Background(), sv.pd, sv.reg, opts)
	if err == nil {
		s.Close()
		t.Fatalf("Open(%s) succeeded, want an error", opts.Dir)
	}
	return err
}

func wantErr(t *testing.T, err error, is error, says ...string) {
	t.Helper()
	t.Logf("the error says: %v", err)
	if is != nil && !errors.Is(err, is) {
		t.Fatalf("error %q does not wrap %q", err, is)
	}
	for _, s := range says {
		if !strings.Contains(err.Error(), s) {
			t.Fatalf("error %q does not say %q", err, s)
		}
	}
}

// Every way a start can fail returns the reason and the fix, never a
// panic, and releases what it took (the directory opens once the cause is
// gone; goleak checks goroutines at the end of the package).
func TestOpenFailuresSayWhatToDo(t *testing.T) {
	t.Run("directory in use", func(t *testing.T) {
		opts := smallOptions()
		sv := newServer(t, opts)
		wantErr(t, openErr(t, sv, sv.opts), nil, "in use by another store", "process "+strconv.Itoa(os.Getpid()), "--data-dir")
		sv.restart() // the failed Open took nothing from the first
	})
	t.Run("directory not writable", func(t *testing.T) {
		sv := newServer(t, smallOptions())
		opts := smallOptions()
		if os.Geteuid() == 0 {
			// root writes anywhere: a path under a regular file is
			// what root cannot create.
			file := filepath.Join(t.TempDir(), "file")
			if err := os.WriteFile(file, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			opts.Dir = filepath.Join(file, "data")
			wantErr(t, openErr(t, sv, opts), nil, "creating the data directory", "not a directory", "--data-dir")
			return
		}
		opts.Dir = t.TempDir()
		if err := os.Chmod(opts.Dir, 0o500); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Chmod(opts.Dir, 0o700) })
		wantErr(t, openErr(t, sv, opts), nil, "not usable", "permission denied", "writable", "--data-dir")
	})
	t.Run("another arena size", func(t *testing.T) {
		opts := smallOptions()
		sv := newServer(t, opts)
		if err := sv.s.Close(); err != nil {
			t.Fatal(err)
		}
		bigger := sv.opts
		bigger.ArenaSize *= 2
		wantErr(t, openErr(t, sv, bigger), nil, "ArenaSize is 8388608", "made with ArenaSize 4194304", "--arena-size 4194304")
		sv.open() // with the size it was made with
	})
	t.Run("no room for the arenas", func(t *testing.T) {
		sv := newServer(t, smallOptions())
		opts := smallOptions()
		opts.Dir = t.TempDir()
		var fs unix.Statfs_t
		if err := unix.Statfs(opts.Dir, &fs); err != nil {
			t.Fatal(err)
		}
		// Arenas of 512 GiB, one more than the disk has room for.
		opts.ArenaSize = 1 << 39
		opts.RegistrationUnit = opts.ArenaSize
		opts.ArenaCount = int(int64(fs.Bavail)*fs.Bsize/opts.ArenaSize) + 1
		wantErr(t, openErr(t, sv, opts), nil, "for its new arena files (1 of 549755813888 bytes)", "MiB free", "--arena-count", "--arena-size")
		if left, _ := filepath.Glob(filepath.Join(opts.Dir, "arena-*")); len(left) != 0 {
			t.Fatalf("a start refused for want of room left arena files: %v", left)
		}
		opts.ArenaSize, opts.RegistrationUnit, opts.ArenaCount = smallOptions().ArenaSize, 0, 1
		if err := sv.s.Close(); err != nil {
			t.Fatal(err)
		}
		sv.opts = opts
		sv.open() // the directory, refused, opens once the arenas fit
	})
	for _, crash := range []bool{false, true} {
		name := "fewer arenas than hold records"
		if crash {
			name += ", after a crash"
		}
		t.Run(name, func(t *testing.T) {
			opts := smallOptions()
			opts.ArenaSize, opts.LeaseSize, opts.ArenaCount = 256<<10, 256<<10, 2 // one lease per arena
			sv := newServer(t, opts)
			waitArenas(t, sv.s, 2)
			c := newClient(t, sv)
			var arenas []uint16
			for i := range 2 {
				w := c.newWriter()
				arenas = append(arenas, w.lease.Arena)
				if _, err := w.put(key(i), []byte("v")); err != nil {
					t.Fatal(err)
				}
			}
			if arenas[1] != 1 {
				t.Fatalf("leases in arenas %v, want the second in arena 1", arenas)
			}
			if err := sv.s.close(!crash); err != nil {
				t.Fatal(err)
			}
			sv.s = nil
			fewer := sv.opts
			fewer.ArenaCount = 1
			wantErr(t, openErr(t, sv, fewer), nil, "arena 1, but ArenaCount is 1", "ArenaCount 2 or more", "--arena-count")
			sv.open()
			for i := range 2 {
				if _, err := sv.s.Get(key(i)); err != nil {
					t.Fatalf("key %d after the refused start: %v", i, err)
				}
			}
		})
	}
}

// syncWriter is a buffer that a logger writes while the test reads it.
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (w *syncWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.Write(b)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.w.String()
}

// Pebble's logs go to the store's logger; its Fatalf does not exit: the
// store refuses writes from then on.
func TestPebbleLogsThroughTheStoreAndNeverExits(t *testing.T) {
	logs := &syncWriter{w: &bytes.Buffer{}}
	opts := smallOptions()
	opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
	sv := newServer(t, opts)
	waitArenas(t, sv.s, 2)
	c := newClient(t, sv)
	w := c.newWriter()
	if _, err := w.put([]byte("before"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	l := sv.s.pebbleLogger()
	l.Errorf("an error %d", 1)
	l.Fatalf("a fatal error %d", 2) // the default logger would os.Exit here
	if _, err := w.put([]byte("after"), []byte("v")); err == nil || !strings.Contains(err.Error(), "a fatal error 2") {
		t.Fatalf("commit after a Pebble fatal error: %v, want refused", err)
	}
	if err := sv.s.Delete(context.Background(), []byte("before"), proto.Write{}); err == nil {
		t.Fatal("delete after a Pebble fatal error was applied")
	}
	if v, err := sv.s.Get([]byte("before")); err != nil || string(v) != "v" {
		t.Fatalf("reads go on: %q, %v", v, err)
	}
	for _, want := range []string{"pebble: an error 1", "a fatal error 2", "refuses writes"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the store's log lacks %q:\n%s", want, logs.String())
		}
	}
}
