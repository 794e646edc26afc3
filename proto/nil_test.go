package proto

import (
	"bytes"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// integerPaths returns every position of an integer in a decoded msgpack
// value, as index paths.
func integerPaths(v any, path []int, out *[][]int) {
	switch x := v.(type) {
	case []any:
		for i, e := range x {
			integerPaths(e, append(path[:len(path):len(path)], i), out)
		}
	case int8, int16, int32, int64, uint8, uint16, uint32, uint64:
		*out = append(*out, append([]int(nil), path...))
	}
}

// withNil returns a deep copy of v with the element at path set to nil.
func withNil(v any, path []int) any {
	if len(path) == 0 {
		return nil
	}
	x := v.([]any)
	c := append([]any(nil), x...)
	c[path[0]] = withNil(x[path[0]], path[1:])
	return c
}

// forEachNilInteger re-encodes b, a msgpack array, once per integer it
// holds with that integer replaced by nil, and calls check with each.
func forEachNilInteger(t *testing.T, b []byte, check func(path []int, mutated []byte)) {
	t.Helper()
	var v any
	if err := msgpack.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	var paths [][]int
	integerPaths(v, nil, &paths)
	if len(paths) == 0 {
		t.Fatal("no integers")
	}
	for _, p := range paths {
		var buf bytes.Buffer
		if err := msgpack.NewEncoder(&buf).Encode(withNil(v, p)); err != nil {
			t.Fatal(err)
		}
		check(p, buf.Bytes())
	}
}

// TestNilIsNotAnInteger: nil in place of any integer field, in every
// format, fails to decode (one strict decoder for all: a nil generation
// once decoded as 0 in metadata while a nil in a Commit was refused).
func TestNilIsNotAnInteger(t *testing.T) {
	for _, m := range controlSamples() {
		b, err := AppendFrame(nil, 42, m)
		if err != nil {
			t.Fatal(err)
		}
		forEachNilInteger(t, b[4:], func(path []int, mb []byte) {
			if _, got, err := DecodeFrame(mb); err == nil {
				t.Errorf("%v with nil at %v decoded as %#v", m.Type(), path, got)
			}
		})
	}
	for _, m := range []NodeMeta{testServerMeta(3), testClientMeta()} {
		b, err := EncodeNodeMeta(m)
		if err != nil {
			t.Fatal(err)
		}
		forEachNilInteger(t, b, func(path []int, mb []byte) {
			if got, err := DecodeNodeMeta(mb); err == nil {
				t.Errorf("metadata with nil at %v decoded as %+v", path, got)
			}
		})
	}
	tables, _ := EncodeArenaTables([]ArenaTable{{Node: "n", Generation: 3, Arenas: testServerMeta(2).Arenas}})
	forEachNilInteger(t, tables, func(path []int, mb []byte) {
		if _, err := DecodeArenaTables(mb); err == nil {
			t.Errorf("arena tables with nil at %v decoded", path)
		}
	})
	small := testMap()
	small.Shards = nil // a map without shards: the 1024 shards would make 4k cases
	for _, m := range []*ClusterMap{small} {
		b, _ := EncodeClusterMap(m)
		forEachNilInteger(t, b, func(path []int, mb []byte) {
			if _, err := DecodeClusterMap(mb); err == nil {
				t.Errorf("map with nil at %v decoded", path)
			}
		})
	}
	for _, c := range testCommands() {
		b, _ := EncodeMapCommand(c)
		forEachNilInteger(t, b, func(path []int, mb []byte) {
			if _, err := DecodeMapCommand(mb); err == nil {
				t.Errorf("%v with nil at %v decoded", c.Op, path)
			}
		})
	}
}
