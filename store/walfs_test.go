package store

import (
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// syncCounter counts, by file name, the syncs that reach the files it
// creates.
type syncCounter struct {
	vfs.FS
	mu    sync.Mutex
	syncs map[string]int
}

func (c *syncCounter) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := c.FS.Create(name, category)
	if err != nil {
		return nil, err
	}
	return &countedFile{File: f, c: c, name: name}, nil
}

func (c *syncCounter) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := c.FS.ReuseForWrite(oldname, newname, category)
	if err != nil {
		return nil, err
	}
	return &countedFile{File: f, c: c, name: newname}, nil
}

func (c *syncCounter) count(name string) {
	c.mu.Lock()
	c.syncs[name]++
	c.mu.Unlock()
}

type countedFile struct {
	vfs.File
	c    *syncCounter
	name string
}

func (f *countedFile) Sync() error     { f.c.count(f.name); return f.File.Sync() }
func (f *countedFile) SyncData() error { f.c.count(f.name); return f.File.SyncData() }

// A Pebble on flushOnlyWAL writes a synced commit out to its WAL file
// without syncing that file, and syncs its other files as before: the
// file names it matches are the ones Pebble gives its WALs.
func TestFlushOnlyWALSkipsTheWALsSyncsOnly(t *testing.T) {
	under := &syncCounter{FS: vfs.NewMem(), syncs: map[string]int{}}
	quiet := (&Store{log: slog.New(slog.DiscardHandler)}).pebbleLogger()
	db, err := pebble.Open("index", &pebble.Options{FS: flushOnlyWAL{under}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := db.Set([]byte{byte(i)}, []byte("v"), pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	// The commits are in a WAL file, not only in Pebble's buffer.
	walBytes := int64(0)
	for _, n := range mustList(t, under, "index") {
		if isWAL(n) {
			fi, err := under.Stat("index/" + n)
			if err != nil {
				t.Fatal(err)
			}
			walBytes += fi.Size()
		}
	}
	if walBytes == 0 {
		t.Error("synced commits left nothing in a WAL file: they were not written out")
	}
	if err := db.Flush(); err != nil { // a table, and the MANIFEST's edit
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	names := mustList(t, under, "index")
	var wals, synced []string
	for _, n := range names {
		if isWAL(n) {
			wals = append(wals, n)
		}
	}
	for n, k := range under.syncs {
		if isWAL(n) {
			t.Errorf("WAL %s synced %d times", n, k)
		}
		synced = append(synced, n)
	}
	if len(wals) == 0 {
		t.Fatalf("no file Pebble made is a WAL by isWAL: %v", names)
	}
	manifest := slices.ContainsFunc(synced, func(n string) bool { return strings.HasPrefix(n, "index/MANIFEST-") })
	table := slices.ContainsFunc(synced, func(n string) bool { return strings.HasSuffix(n, ".sst") })
	if !manifest || !table {
		t.Errorf("synced %v: want the MANIFEST and the table synced as usual", synced)
	}

}

func mustList(t *testing.T, fs vfs.FS, dir string) []string {
	t.Helper()
	names, err := fs.List(dir)
	if err != nil {
		t.Fatal(err)
	}
	return names
}
