// Ordered scans of the durable index, for listing keys on the control path.

package store

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/rkv-io/rkv/proto"
)

// ScanEntry is one key of a scan and where its record lies.
type ScanEntry struct {
	Key      []byte
	Location proto.Location
	Version  uint64
}

// Scan returns up to limit keys in [start, end) in order (end nil: no upper
// bound; limit 0: no limit). Use PrefixEnd(prefix) as end for a prefix scan.
func (s *Store) Scan(start, end []byte, limit int) ([]ScanEntry, error) {
	upper := []byte{'k' + 1}
	if end != nil {
		upper = dataKey(end)
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: dataKey(start), UpperBound: upper})
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []ScanEntry
	for it.First(); it.Valid() && (limit == 0 || len(out) < limit); it.Next() {
		e, err := decodeEntry(it.Value())
		if err != nil {
			return out, fmt.Errorf("store: key %q: %w", it.Key()[1:], err)
		}
		out = append(out, ScanEntry{Key: append([]byte(nil), it.Key()[1:]...), Location: e.loc, Version: e.version})
	}
	return out, it.Error()
}

// PrefixEnd returns the smallest key greater than every key with prefix,
// or nil if there is none (the prefix is all 0xff).
func PrefixEnd(prefix []byte) []byte {
	end := append([]byte(nil), prefix...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i]++; end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}
