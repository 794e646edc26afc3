// On-disk format 2: Pebble keys by shard, the format marker, and the encodings of shard states and sessions.

package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/rkv-io/rkv/proto"
)

// Format is the on-disk format this store reads and writes. Format 1 (no
// marker) keyed Pebble entries by the user key alone; format 2 puts the
// key's shard first, so that a shard is one contiguous range of Pebble
// keys (copied, scanned and dropped as one).
const Format = 2

// ErrFormat is returned by Open for a data directory of another on-disk
// format.
var ErrFormat = errors.New("store: data directory of another format")

// Pebble keys:
//
//	'k' be16(shard) key        -> entry (a key's current record)
//	'j' be64(seq)              -> journal entry (journal.go)
//	'w' be16(shard) be64(sess) -> session entry (sessions.go)
//	"m/format"                 -> le64(Format)
//	"m/generation"             -> le64(generation)
//	"m/shard/" be16(shard)     -> shard record; absent for ShardNone
//	"m/index-log"              -> how far the index log is flushed (indexlog.go)
var (
	keyPrefix     = []byte{'k'}
	keyEnd        = []byte{'k' + 1}
	sessionPrefix = []byte{'w'}
	sessionEnd    = []byte{'w' + 1}
	metaFormatKey = []byte("m/format")
	metaGenKey    = []byte("m/generation")
	// metaIndexSlotsKey: the slots the index grew to, so that the next
	// start opens it that large (indexgrow.go).
	metaIndexSlotsKey = []byte("m/index-slots")
	metaShardsKey     = []byte("m/shard/")
	metaShardsEnd     = []byte("m/shard0") // '0' follows '/'
	dataKeyPrefixN    = 3                  // 'k' and the shard
)

// dataKey is the Pebble key of key's entry.
func dataKey(key []byte) []byte { return shardDataKey(proto.ShardOf(key), key) }

func shardDataKey(sh proto.Shard, key []byte) []byte {
	return appendDataKey(make([]byte, 0, dataKeyPrefixN+len(key)), sh, key)
}

func appendDataKey(b []byte, sh proto.Shard, key []byte) []byte {
	b = binary.BigEndian.AppendUint16(append(b, 'k'), uint16(sh))
	return append(b, key...)
}

// shardLower and shardUpper bound shard sh's entries: [lower, upper).
func shardLower(sh proto.Shard) []byte { return shardDataKey(sh, nil) }
func shardUpper(sh proto.Shard) []byte { return shardDataKey(sh+1, nil) } // sh+1 <= NumShards fits 16 bits

// splitDataKey decodes a Pebble data key into its shard and user key,
// which must be one of the shard's keys.
func splitDataKey(k []byte) (proto.Shard, []byte, error) {
	if len(k) <= dataKeyPrefixN || k[0] != 'k' {
		return 0, nil, fmt.Errorf("store: data key %x: too short or not a data key", k)
	}
	sh := proto.Shard(binary.BigEndian.Uint16(k[1:]))
	key := k[dataKeyPrefixN:]
	if sh >= proto.NumShards || proto.ShardOf(key) != sh {
		return 0, nil, fmt.Errorf("store: data key %x: filed under shard %d, the key's shard is %d: corrupt", k, sh, proto.ShardOf(key))
	}
	return sh, key, nil
}

// shardStateKey is the Pebble key of shard sh's persisted state.
func shardStateKey(sh proto.Shard) []byte {
	return binary.BigEndian.AppendUint16(append([]byte(nil), metaShardsKey...), uint16(sh))
}

const shardRecordSize = 1 + 1 + 8

// encodeShardRecord is a shard state's Pebble value: format, state, since.
func encodeShardRecord(st ShardState, since uint64) []byte {
	b := make([]byte, 0, shardRecordSize)
	b = append(b, 1, byte(st))
	return binary.LittleEndian.AppendUint64(b, since)
}

// decodeShardRecord decodes a persisted shard state and its epoch: Owned
// since an epoch > 0, Incoming for the move started at since, Released
// with the since it was owned from (None is never stored).
func decodeShardRecord(b []byte) (ShardState, uint64, error) {
	if len(b) != shardRecordSize || b[0] != 1 {
		return 0, 0, fmt.Errorf("store: shard record of %d bytes, format %v: corrupt or from a newer version", len(b), b[:min(1, len(b))])
	}
	st, since := ShardState(b[1]), binary.LittleEndian.Uint64(b[2:])
	switch {
	case st == ShardOwned && since == 0:
		return 0, 0, fmt.Errorf("store: shard record: owned since epoch 0: corrupt")
	case st == ShardOwned, st == ShardIncoming, st == ShardReleased, st == ShardBackup:
	default:
		return 0, 0, fmt.Errorf("store: shard record: state %d since %d: corrupt", b[1], since)
	}
	return st, since, nil
}

// sessionKey is the Pebble key of a session's entry in shard sh.
func sessionKey(sh proto.Shard, session uint64) []byte {
	return appendSessionKey(make([]byte, 0, sessionKeySize), sh, session)
}

func appendSessionKey(b []byte, sh proto.Shard, session uint64) []byte {
	b = binary.BigEndian.AppendUint16(append(b, 'w'), uint16(sh))
	return binary.BigEndian.AppendUint64(b, session)
}

func sessionShardLower(sh proto.Shard) []byte {
	return binary.BigEndian.AppendUint16([]byte{'w'}, uint16(sh))
}
func sessionShardUpper(sh proto.Shard) []byte {
	return binary.BigEndian.AppendUint16([]byte{'w'}, uint16(sh+1))
}

const sessionKeySize = 1 + 2 + 8

func decodeSessionKey(k []byte) (proto.Shard, uint64, error) {
	if len(k) != sessionKeySize || k[0] != 'w' {
		return 0, 0, fmt.Errorf("store: session key %x: corrupt", k)
	}
	sh, session := proto.Shard(binary.BigEndian.Uint16(k[1:])), binary.BigEndian.Uint64(k[3:])
	if sh >= proto.NumShards || session == 0 {
		return 0, 0, fmt.Errorf("store: session key %x: shard %d, session %d: corrupt", k, sh, session)
	}
	return sh, session, nil
}

// sessionRecord is what a session's Pebble value holds: its last applied
// write.
type sessionRecord struct {
	seq, version uint64
	loc          proto.Location // zero when unknown (a delete, or ingested)
	time         int64          // when it was applied, Unix nanoseconds
}

const sessionRecordSize = 1 + 8 + 8 + 2 + 8 + 4 + 8

func (r sessionRecord) encode() []byte { return r.append(make([]byte, 0, sessionRecordSize)) }

func (r sessionRecord) append(b []byte) []byte {
	b = append(b, 1)
	b = binary.LittleEndian.AppendUint64(b, r.seq)
	b = binary.LittleEndian.AppendUint64(b, r.version)
	b = binary.LittleEndian.AppendUint16(b, r.loc.Arena)
	b = binary.LittleEndian.AppendUint64(b, r.loc.Offset)
	b = binary.LittleEndian.AppendUint32(b, r.loc.Length)
	return binary.LittleEndian.AppendUint64(b, uint64(r.time))
}

func decodeSessionRecord(b []byte) (sessionRecord, error) {
	if len(b) != sessionRecordSize || b[0] != 1 {
		return sessionRecord{}, fmt.Errorf("store: session entry of %d bytes, format %v: corrupt or from a newer version", len(b), b[:min(1, len(b))])
	}
	r := sessionRecord{
		seq:     binary.LittleEndian.Uint64(b[1:]),
		version: binary.LittleEndian.Uint64(b[9:]),
		loc: proto.Location{Arena: binary.LittleEndian.Uint16(b[17:]), Offset: binary.LittleEndian.Uint64(b[19:]),
			Length: binary.LittleEndian.Uint32(b[27:])},
		time: int64(binary.LittleEndian.Uint64(b[31:])),
	}
	if r.time < 0 {
		return sessionRecord{}, fmt.Errorf("store: session entry applied at %d: corrupt", r.time)
	}
	return r, nil
}

// checkFormat reads the format marker. A store without one is either new
// (Pebble holds nothing: the marker is written) or of format 1, made by
// an rkv from before shards.
func (s *Store) checkFormat() error {
	v, closer, err := s.db.Get(metaFormatKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		empty, err := s.dbEmpty()
		if err != nil {
			return err
		}
		if !empty {
			return s.formatError(1, "it has data but no format marker")
		}
		if err := s.db.Set(metaFormatKey, binary.LittleEndian.AppendUint64(nil, Format), pebble.Sync); err != nil {
			return fmt.Errorf("store: recording the format in %s: %w", s.opts.Dir, err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("store: reading the format marker in %s: %w", s.opts.Dir, err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return fmt.Errorf("%w: %s: format marker of %d bytes: corrupt", ErrFormat, s.opts.Dir, len(v))
	}
	if f := binary.LittleEndian.Uint64(v); f != Format {
		return s.formatError(f, "")
	}
	return nil
}

func (s *Store) formatError(found uint64, why string) error {
	if why != "" {
		why = " (" + why + ")"
	}
	if found < Format {
		return fmt.Errorf("%w: %s holds format %d%s; this rkv reads format %d: it was made by an older rkv. "+
			"Move it away or delete it, and the store starts empty there", ErrFormat, s.opts.Dir, found, why, Format)
	}
	return fmt.Errorf("%w: %s holds format %d%s; this rkv reads format %d: it was made by a newer rkv. "+
		"Run that version, or move the directory away to start empty", ErrFormat, s.opts.Dir, found, why, Format)
}

func (s *Store) dbEmpty() (bool, error) {
	it, err := s.db.NewIter(nil)
	if err != nil {
		return false, err
	}
	empty := !it.First()
	return empty, errors.Join(it.Error(), it.Close())
}
