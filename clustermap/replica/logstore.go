// The Raft log and stable store in a Pebble database of their own.

package replica

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/hashicorp/raft"

	"github.com/rkv-io/rkv/internal/pebblelog"
)

// logStore is raft.LogStore and raft.StableStore over one Pebble database.
// Every write is synced before it returns: Raft counts a stored entry as
// durable. Keys: 'l' + big-endian index -> entry; 's' + key -> value.
//
// It is a few dozen lines over the storage engine the store already uses,
// rather than a second embedded database (raft-boltdb) for a log that
// holds a handful of entries a day.
type logStore struct {
	db     *pebble.DB
	logger pebblelog.Logger      // Pebble's
	failed atomic.Pointer[error] // set once Pebble reported a fatal error
}

// openLogStore opens the log in dir, Pebble logging to log. After a fatal
// error from Pebble (which may carry on as if a failed write had
// succeeded) every write fails: Raft stops counting on this log, and a
// restart recovers from what is durable.
func openLogStore(dir string, log *slog.Logger) (*logStore, error) {
	s := &logStore{}
	s.logger = pebblelog.Logger{Log: log, OnFatal: func(msg string) {
		err := fmt.Errorf("clustermap: the Raft log's Pebble failed (%s): it takes no more writes; restart the server", msg)
		s.failed.CompareAndSwap(nil, &err)
	}}
	var err error
	s.db, err = pebble.Open(dir, &pebble.Options{Logger: s.logger})
	if err != nil {
		return nil, fmt.Errorf("clustermap: opening the Raft log in %s: %w", dir, err)
	}
	return s, nil
}

// writable is nil unless Pebble reported a fatal error.
func (s *logStore) writable() error {
	if p := s.failed.Load(); p != nil {
		return *p
	}
	return nil
}

func (s *logStore) Close() error { return s.db.Close() }

func logKey(index uint64) []byte { return binary.BigEndian.AppendUint64([]byte{'l'}, index) }

var (
	logLower = []byte{'l'}
	logUpper = []byte{'l' + 1}
)

// An entry: term, type, appended-at (Unix nanoseconds), then the lengths
// and bytes of Data and Extensions.
const logEntryFormat = 1

func encodeLog(l *raft.Log) []byte {
	b := make([]byte, 0, 1+8+1+8+8+len(l.Data)+len(l.Extensions))
	b = append(b, logEntryFormat)
	b = binary.BigEndian.AppendUint64(b, l.Term)
	b = append(b, byte(l.Type))
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	b = binary.BigEndian.AppendUint64(b, uint64(at))
	b = binary.BigEndian.AppendUint32(b, uint32(len(l.Data)))
	b = append(b, l.Data...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(l.Extensions)))
	return append(b, l.Extensions...)
}

func decodeLog(index uint64, b []byte, l *raft.Log) error {
	bad := func(what string) error {
		return fmt.Errorf("clustermap: Raft log entry %d (%d bytes): %s: corrupt or from a newer version", index, len(b), what)
	}
	if len(b) < 1+8+1+8+4 || b[0] != logEntryFormat {
		return bad("header")
	}
	l.Index = index
	l.Term = binary.BigEndian.Uint64(b[1:])
	l.Type = raft.LogType(b[9])
	l.AppendedAt = time.Time{}
	if at := int64(binary.BigEndian.Uint64(b[10:])); at != 0 {
		l.AppendedAt = time.Unix(0, at)
	}
	rest := b[18:]
	var err error
	if l.Data, rest, err = lengthPrefixed(rest); err != nil {
		return bad("data")
	}
	if l.Extensions, rest, err = lengthPrefixed(rest); err != nil || len(rest) != 0 {
		return bad("extensions")
	}
	return nil
}

func lengthPrefixed(b []byte) (field, rest []byte, err error) {
	if len(b) < 4 {
		return nil, nil, errors.New("short")
	}
	n := binary.BigEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4) {
		return nil, nil, errors.New("overrun")
	}
	if n == 0 {
		return nil, b[4:], nil
	}
	return append([]byte(nil), b[4:4+n]...), b[4+n:], nil
}

func (s *logStore) edge(first bool) (uint64, error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: logLower, UpperBound: logUpper})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	ok := it.Last()
	if first {
		ok = it.First()
	}
	if !ok {
		return 0, it.Error()
	}
	return binary.BigEndian.Uint64(it.Key()[1:]), nil
}

// FirstIndex returns the first index written, 0 for none.
func (s *logStore) FirstIndex() (uint64, error) { return s.edge(true) }

// LastIndex returns the last index written, 0 for none.
func (s *logStore) LastIndex() (uint64, error) { return s.edge(false) }

// GetLog reads the entry at index into l; raft.ErrLogNotFound if none.
func (s *logStore) GetLog(index uint64, l *raft.Log) error {
	v, closer, err := s.db.Get(logKey(index))
	if errors.Is(err, pebble.ErrNotFound) {
		return raft.ErrLogNotFound
	}
	if err != nil {
		return err
	}
	defer closer.Close()
	return decodeLog(index, v, l)
}

// StoreLog stores one entry, synced.
func (s *logStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs stores entries in one synced batch.
func (s *logStore) StoreLogs(logs []*raft.Log) error {
	if err := s.writable(); err != nil {
		return err
	}
	b := s.db.NewBatch()
	defer b.Close()
	for _, l := range logs {
		if err := b.Set(logKey(l.Index), encodeLog(l), nil); err != nil {
			return err
		}
	}
	return b.Commit(pebble.Sync)
}

// DeleteRange deletes the entries from min to max inclusive, synced.
func (s *logStore) DeleteRange(min, max uint64) error {
	if err := s.writable(); err != nil {
		return err
	}
	if max < min {
		return nil
	}
	end := logUpper
	if max < 1<<64-1 {
		end = logKey(max + 1)
	}
	return s.db.DeleteRange(logKey(min), end, pebble.Sync)
}

func stableKey(k []byte) []byte { return append([]byte{'s'}, k...) }

// errKeyNotFound is what raft expects of a StableStore for a key never set:
// it compares the error's text with "not found".
var errKeyNotFound = errors.New("not found")

// Set stores a value, synced.
func (s *logStore) Set(k, v []byte) error {
	if err := s.writable(); err != nil {
		return err
	}
	return s.db.Set(stableKey(k), v, pebble.Sync)
}

// Get returns a key's value, or an error saying "not found".
func (s *logStore) Get(k []byte) ([]byte, error) {
	v, closer, err := s.db.Get(stableKey(k))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, errKeyNotFound
	}
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	return append([]byte(nil), v...), nil
}

// SetUint64 stores an integer value, synced.
func (s *logStore) SetUint64(k []byte, v uint64) error {
	return s.Set(k, binary.BigEndian.AppendUint64(nil, v))
}

// GetUint64 returns an integer value, or an error saying "not found".
func (s *logStore) GetUint64(k []byte) (uint64, error) {
	v, err := s.Get(k)
	if err != nil {
		return 0, err
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("clustermap: Raft stable value %q of %d bytes, want 8: corrupt", k, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}
