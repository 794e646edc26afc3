package store

import (
	"encoding/binary"
	"log/slog"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// writePebble writes keys into a Pebble database at dir/index, as an older
// rkv (or a newer one) would have left it.
func writePebble(t *testing.T, dir string, kv map[string][]byte) {
	t.Helper()
	db, err := pebble.Open(filepath.Join(dir, "index"), &pebble.Options{Logger: (&Store{log: slog.New(slog.DiscardHandler)}).pebbleLogger()})
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range kv {
		if err := db.Set([]byte(k), v, pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestFormatMarker(t *testing.T) {
	opts := smallOptions()
	sv := newServer(t, opts)
	// A new store records its format.
	v, closer, err := sv.s.db.Get(metaFormatKey)
	if err != nil {
		t.Fatalf("no format marker in a new store: %v", err)
	}
	if f := binary.LittleEndian.Uint64(v); f != Format {
		t.Fatalf("format marker %d, want %d", f, Format)
	}
	closer.Close()
	// It opens again.
	sv.restart()

	// Data without a marker: format 1, made before shards.
	old := opts
	old.Dir = t.TempDir()
	writePebble(t, old.Dir, map[string][]byte{"m/generation": binary.LittleEndian.AppendUint64(nil, 3), "kkey-1": entry{version: 1}.encode()})
	wantErr(t, openErr(t, sv, old), ErrFormat, old.Dir, "format 1", "no format marker", "older rkv", "Move it away or delete it")

	// Another format, from a newer rkv.
	newer := opts
	newer.Dir = t.TempDir()
	writePebble(t, newer.Dir, map[string][]byte{"m/format": binary.LittleEndian.AppendUint64(nil, 3)})
	wantErr(t, openErr(t, sv, newer), ErrFormat, newer.Dir, "format 3", "newer rkv")

	// The refused directories were left alone, and released: they are
	// refused again the same way, not found locked.
	wantErr(t, openErr(t, sv, old), ErrFormat, "format 1")
}
