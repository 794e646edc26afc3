// Readiness: a start with no arena refused, a start with some served.

package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/testlog"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/store"
)

// logBuffer collects JSON log lines from any goroutine.
type logBuffer struct{ testlog.Buffer }

// records returns the logged records whose msg is msg.
func (l *logBuffer) records(t *testing.T, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if r["msg"] == msg {
			out = append(out, r)
		}
	}
	return out
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// failingDevice is a soft device whose PDs refuse to register buffers of
// size bytes (the arenas) once allow of them have registered, as a kernel
// refuses to pin more than RLIMIT_MEMLOCK: the index and the leases still
// register.
type failingDevice struct {
	rdma.Device
	size  int
	allow *atomic.Int64
	err   error
}

func (d failingDevice) AllocPD() (rdma.PD, error) {
	pd, err := d.Device.AllocPD()
	return failingPD{pd, d}, err
}

type failingPD struct {
	rdma.PD
	d failingDevice
}

func (p failingPD) Register(buf []byte, access rdma.Access) (rdma.MR, error) {
	if len(buf) == p.d.size && p.d.allow.Add(-1) < 0 {
		return nil, p.d.err
	}
	return p.PD.Register(buf, access)
}

func failArenas(dev rdma.Device, size, allow int, err error) failingDevice {
	d := failingDevice{Device: dev, size: size, allow: new(atomic.Int64), err: err}
	d.allow.Store(int64(allow))
	return d
}

// A server none of whose arenas registers fails to start, with the
// provider's reason (which says how to fix it), instead of starting, joining
// the cluster and leaving its clients to time out on lease requests.
func TestNoArenaFailsTheStart(t *testing.T) {
	pinErr := errors.New("rdma: cannot pin 4194304 bytes (mlock: cannot allocate memory): RLIMIT_MEMLOCK is 8192 KiB; raise it (ulimit -l unlimited)")
	var logs logBuffer
	dir := t.TempDir()
	_, err := New(context.Background(), Config{
		Name:       "s1",
		Device:     failArenas(testDevice(t), 4<<20, 0, pinErr),
		Store:      store.Options{Dir: dir, ArenaSize: 4 << 20, ArenaCount: 2, IndexSlots: 1 << 12, LeaseSize: 256 << 10},
		Membership: membership.Config{Tuning: fastGossip},
		Bootstrap:  true,
		Raft:       fastRaft,
		Logger:     logs.logger(),
	})
	if err == nil || !strings.Contains(err.Error(), "none of the 2 arenas of "+dir+" could be registered") ||
		!strings.Contains(err.Error(), "arena 0: ") || !strings.Contains(err.Error(), pinErr.Error()) {
		t.Fatalf("New with no registrable arena: %v; want the arenas and the provider's reason", err)
	}
	if n := len(logs.records(t, "arena registration failed")); n != 2 {
		t.Fatalf("%d \"arena registration failed\" lines, want one per arena", n)
	}
	if n := len(logs.records(t, "server started")); n != 0 {
		t.Fatal("a server with no arena said it started")
	}
	// It released what it took: a server starts on the same directory.
	s := newTestServer(t, func(c *Config) { c.Store.Dir = dir })
	defer s.Close()
	if err := s.Ready(); err != nil {
		t.Fatalf("a server on the same directory, arenas registered: not ready: %v", err)
	}
}

// A server that registers some of its arenas serves on them, and logs the
// others as errors.
func TestSomeArenasServe(t *testing.T) {
	var logs logBuffer
	s := newTestServer(t, func(c *Config) {
		c.Device = failArenas(c.Device, int(c.Store.ArenaSize), 1, errors.New("pin refused"))
		c.Logger = logs.logger()
	})
	defer s.Close()
	if err := s.Ready(); err != nil {
		t.Fatalf("one of two arenas registered: not ready: %v", err)
	}
	waitFor(t, 10*time.Second, "the second arena's failure logged", func() error {
		if r := logs.records(t, "arena registration failed"); len(r) != 1 || r[0]["arena"] != 1.0 || !strings.HasSuffix(fmt.Sprint(r[0]["err"]), "pin refused") {
			return fmt.Errorf("logged %v", r)
		}
		return nil
	})
	if n := len(s.Meta().Arenas); n != 1 {
		t.Fatalf("%d arenas advertised, want the one registered", n)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Ready(); err == nil || !strings.Contains(err.Error(), "closed") {
		t.Fatalf("Ready after Close: %v", err)
	}
}
