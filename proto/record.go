// The on-arena record: a fixed header, then key and value, verifiable by any reader.

package proto

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// Record layout in an arena (all integers little-endian, records 8-byte
// aligned):
//
//	off size field
//	  0    4 magic    RecordMagic
//	  4    4 state    RecordPending, RecordLive, RecordDead or RecordBackup; not covered by
//	                  the CRC: a writer writes it pending, the server flips
//	                  it live when the commit is durable and dead when a
//	                  newer version commits (or the record moves)
//	  8    8 version  the write's version, unique per server, also in the index
//	 16    2 keyLen
//	 18    2 flags    RecordTombstone
//	 20    4 valueLen
//	 24    4 crc      CRC-32C of bytes 0..32 (state and crc as zero), key, value
//	 28    4 reserved zero
//	 32      key, then value, then zero padding to a multiple of 8
//
// A reader that fetched a record one-sidedly calls VerifyRecord: a torn read
// (the record being written while it was read), a stale location (the space
// reused), a superseded version, or a record written and not (yet)
// committed all fail it, and the reader retries from the index instead of
// returning them. Arena space is reused (the cleaner frees segments), so a
// location a reader holds may come to hold any record later: only a live
// record of the reader's key, which the server made live itself once it
// was durable, is an answer.
const (
	RecordHeaderSize = 32
	RecordMagic      = 0x5256_4b52 // "RKVR" read as little-endian bytes
	RecordAlign      = 8
	MaxKeyLen        = 1<<16 - 1
)

// Record states.
const (
	RecordLive    uint32 = 1
	RecordDead    uint32 = 2 // superseded by a newer version, deleted, or moved
	RecordPending uint32 = 3 // written, not committed: no reader may return it
	// RecordBackup: a backup replica's copy of its key's current version,
	// kept for a failover; never an answer (reads go to the primary).
	RecordBackup uint32 = 4
)

// Record flags.
const (
	RecordTombstone uint16 = 1 << 0 // a delete: no value
)

// RecordStateOffset is where the state word lies within a record, for the
// server's in-place update.
const RecordStateOffset = 4

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// RecordHeader is a decoded record header.
type RecordHeader struct {
	State    uint32
	Version  uint64
	KeyLen   int
	Flags    uint16
	ValueLen int
	CRC      uint32
}

// RecordSize is the space a record with the given key and value lengths
// takes in an arena, padding included.
func RecordSize(keyLen, valueLen int) int {
	return (RecordHeaderSize + keyLen + valueLen + RecordAlign - 1) &^ (RecordAlign - 1)
}

// EncodeRecord writes a pending record into dst, which must hold
// RecordSize(len(key), len(value)) bytes, and returns that size. The
// server makes it live when it commits it.
func EncodeRecord(dst []byte, version uint64, flags uint16, key, value []byte) (int, error) {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return 0, fmt.Errorf("proto: key of %d bytes: must be 1 to %d", len(key), MaxKeyLen)
	}
	if uint64(len(value)) > 1<<32-1 {
		return 0, fmt.Errorf("proto: value of %d bytes is too large", len(value))
	}
	n := RecordSize(len(key), len(value))
	if len(dst) < n {
		return 0, fmt.Errorf("proto: record needs %d bytes, buffer has %d", n, len(dst))
	}
	h := dst[:RecordHeaderSize]
	binary.LittleEndian.PutUint32(h[0:], RecordMagic)
	binary.LittleEndian.PutUint32(h[4:], 0)
	binary.LittleEndian.PutUint64(h[8:], version)
	binary.LittleEndian.PutUint16(h[16:], uint16(len(key)))
	binary.LittleEndian.PutUint16(h[18:], flags)
	binary.LittleEndian.PutUint32(h[20:], uint32(len(value)))
	binary.LittleEndian.PutUint32(h[24:], 0)
	binary.LittleEndian.PutUint32(h[28:], 0)
	copy(dst[RecordHeaderSize:], key)
	copy(dst[RecordHeaderSize+len(key):], value)
	clear(dst[RecordHeaderSize+len(key)+len(value) : n])
	crc := recordCRC(h, dst[RecordHeaderSize:RecordHeaderSize+len(key)+len(value)])
	binary.LittleEndian.PutUint32(h[24:], crc)
	binary.LittleEndian.PutUint32(h[4:], RecordPending)
	return n, nil
}

// zeroWord stands for the state and CRC words in a record's CRC.
var zeroWord [4]byte

// recordCRC is the CRC of header h with its state and CRC words zero, then
// body: the key and the value, which follow the header. It reads h in
// place: a copy with the words cleared escapes to the heap (crc32.Update),
// an allocation per record verified.
func recordCRC(h, body []byte) uint32 {
	c := crc32.Update(0, castagnoli, h[:4])
	c = crc32.Update(c, castagnoli, zeroWord[:]) // state
	c = crc32.Update(c, castagnoli, h[8:24])
	c = crc32.Update(c, castagnoli, zeroWord[:]) // CRC
	c = crc32.Update(c, castagnoli, h[28:RecordHeaderSize])
	return crc32.Update(c, castagnoli, body)
}

// DecodeRecordHeader parses the header at the start of b without checking
// the CRC.
func DecodeRecordHeader(b []byte) (RecordHeader, error) {
	if len(b) < RecordHeaderSize {
		return RecordHeader{}, fmt.Errorf("%w: %d bytes, header needs %d", ErrBadRecord, len(b), RecordHeaderSize)
	}
	if m := binary.LittleEndian.Uint32(b); m != RecordMagic {
		return RecordHeader{}, fmt.Errorf("%w: magic %#x", ErrBadRecord, m)
	}
	if r := binary.LittleEndian.Uint32(b[28:]); r != 0 {
		return RecordHeader{}, fmt.Errorf("%w: reserved word %#x", ErrBadRecord, r)
	}
	return RecordHeader{
		State:    binary.LittleEndian.Uint32(b[4:]),
		Version:  binary.LittleEndian.Uint64(b[8:]),
		KeyLen:   int(binary.LittleEndian.Uint16(b[16:])),
		Flags:    binary.LittleEndian.Uint16(b[18:]),
		ValueLen: int(binary.LittleEndian.Uint32(b[20:])),
		CRC:      binary.LittleEndian.Uint32(b[24:]),
	}, nil
}

var (
	// ErrBadRecord means the bytes are not a whole, intact record: torn,
	// truncated, or not a record at all. A one-sided reader retries.
	ErrBadRecord = errors.New("proto: bad record")
	// ErrStaleRecord means an intact record that is not the one asked
	// for: another key, another version, or superseded. A one-sided
	// reader retries from the index.
	ErrStaleRecord = errors.New("proto: stale record")
	// ErrOtherKey (which is also an ErrStaleRecord) means an intact record
	// of another key: an index slot whose fingerprint collided, or space
	// reused since a location was cached. Unlike a superseded record of
	// the key itself, it says nothing about the key.
	ErrOtherKey = fmt.Errorf("%w: record of another key", ErrStaleRecord)
)

// Record is a verified record; Key and Value alias the buffer it was
// verified in.
type Record struct {
	RecordHeader
	Key, Value []byte
}

// Tombstone reports whether the record is a delete.
func (r *Record) Tombstone() bool { return r.Flags&RecordTombstone != 0 }

// VerifyRecord checks that b starts with an intact, live record for key
// (and, if version is not zero, of that version). Errors wrap ErrBadRecord
// or ErrStaleRecord; an intact record of another key is ErrOtherKey,
// whatever its state.
func VerifyRecord(b []byte, key []byte, version uint64) (Record, error) {
	r, err := ParseRecord(b)
	switch {
	case err != nil:
		return Record{}, err
	case key != nil && string(r.Key) != string(key):
		return Record{}, ErrOtherKey
	case r.State != RecordLive:
		return Record{}, fmt.Errorf("%w: state %d", ErrStaleRecord, r.State)
	case version != 0 && r.Version != version:
		return Record{}, fmt.Errorf("%w: version %d, want %d", ErrStaleRecord, r.Version, version)
	}
	return r, nil
}

// ParseRecord checks that b starts with an intact record, in any state
// (errors wrap ErrBadRecord): what the server checks of a record a writer
// committed, and what the cleaner looks for in a segment.
func ParseRecord(b []byte) (Record, error) {
	h, err := DecodeRecordHeader(b)
	if err != nil {
		return Record{}, err
	}
	end := RecordHeaderSize + h.KeyLen + h.ValueLen
	if h.KeyLen == 0 || end > len(b) {
		return Record{}, fmt.Errorf("%w: key %d and value %d bytes in a %d-byte read", ErrBadRecord, h.KeyLen, h.ValueLen, len(b))
	}
	rk, rv := b[RecordHeaderSize:RecordHeaderSize+h.KeyLen], b[RecordHeaderSize+h.KeyLen:end]
	if c := recordCRC(b, b[RecordHeaderSize:end]); c != h.CRC {
		return Record{}, fmt.Errorf("%w: CRC %#x, header says %#x", ErrBadRecord, c, h.CRC)
	}
	return Record{RecordHeader: h, Key: rk, Value: rv}, nil
}
