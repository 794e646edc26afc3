package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"
)

// encode returns a record as a commit leaves it: live.
func encode(t testing.TB, version uint64, flags uint16, key, value string) []byte {
	t.Helper()
	b := make([]byte, RecordSize(len(key), len(value)))
	n, err := EncodeRecord(b, version, flags, []byte(key), []byte(value))
	if err != nil || n != len(b) {
		t.Fatalf("EncodeRecord = %d, %v; want %d", n, err, len(b))
	}
	binary.LittleEndian.PutUint32(b[RecordStateOffset:], RecordLive)
	return b
}

// A record as written is pending: intact, and no answer for a reader
// until the server commits it.
func TestEncodedRecordIsPending(t *testing.T) {
	b := make([]byte, RecordSize(3, 5))
	if _, err := EncodeRecord(b, 1, 0, []byte("key"), []byte("value")); err != nil {
		t.Fatal(err)
	}
	if _, err := VerifyRecord(b, []byte("key"), 0); !errors.Is(err, ErrStaleRecord) || errors.Is(err, ErrOtherKey) {
		t.Errorf("VerifyRecord of a pending record: %v, want ErrStaleRecord", err)
	}
	r, err := ParseRecord(b)
	if err != nil || r.State != RecordPending || string(r.Key) != "key" || string(r.Value) != "value" {
		t.Errorf("ParseRecord = %+v, %v; want the pending record", r, err)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	b := encode(t, 42, 0, "user:1", "hello world")
	if len(b)%RecordAlign != 0 {
		t.Fatalf("record size %d not aligned", len(b))
	}
	r, err := VerifyRecord(b, []byte("user:1"), 42)
	if err != nil {
		t.Fatal(err)
	}
	if string(r.Value) != "hello world" || r.Version != 42 || r.Tombstone() {
		t.Fatalf("decoded %+v", r)
	}
	if r, err := VerifyRecord(encode(t, 7, RecordTombstone, "k", ""), []byte("k"), 0); err != nil || !r.Tombstone() {
		t.Fatalf("tombstone: %+v, %v", r, err)
	}
}

func TestRecordVerificationCatchesEveryCorruption(t *testing.T) {
	good := encode(t, 9, 0, "key", "value bytes")
	for i := range RecordHeaderSize + len("key") + len("value bytes") {
		if i >= RecordStateOffset && i < RecordStateOffset+4 {
			continue // the state word is checked by value, below
		}
		b := bytes.Clone(good)
		b[i] ^= 0x40
		if _, err := VerifyRecord(b, []byte("key"), 9); !errors.Is(err, ErrBadRecord) {
			t.Errorf("flipping a bit of byte %d: %v, want ErrBadRecord", i, err)
		}
	}
	for cut := range RecordHeaderSize + len("key") + len("value bytes") { // padding is optional
		if _, err := VerifyRecord(good[:cut], []byte("key"), 9); !errors.Is(err, ErrBadRecord) {
			t.Errorf("truncated to %d bytes: %v, want ErrBadRecord", cut, err)
		}
	}
}

func TestRecordStaleness(t *testing.T) {
	b := encode(t, 9, 0, "key", "v")
	if _, err := VerifyRecord(b, []byte("other"), 9); !errors.Is(err, ErrStaleRecord) {
		t.Errorf("other key: %v", err)
	}
	if _, err := VerifyRecord(b, []byte("key"), 10); !errors.Is(err, ErrStaleRecord) {
		t.Errorf("other version: %v", err)
	}
	if _, err := VerifyRecord(b, []byte("key"), 10); errors.Is(err, ErrOtherKey) {
		t.Errorf("another version of the key taken for another key: %v", err)
	}
	binary.LittleEndian.PutUint32(b[RecordStateOffset:], RecordDead)
	if _, err := VerifyRecord(b, []byte("key"), 9); !errors.Is(err, ErrStaleRecord) || errors.Is(err, ErrOtherKey) {
		t.Errorf("dead record: %v", err)
	}
	// Another key's record is that whatever its state: an index
	// candidate of another key says nothing about this one.
	if _, err := VerifyRecord(b, []byte("other"), 0); !errors.Is(err, ErrOtherKey) || !errors.Is(err, ErrStaleRecord) {
		t.Errorf("dead record of another key: %v", err)
	}
}

func TestEncodeRecordRejectsBadInput(t *testing.T) {
	if _, err := EncodeRecord(make([]byte, 64), 1, 0, nil, nil); err == nil {
		t.Error("empty key accepted")
	}
	if _, err := EncodeRecord(make([]byte, 1<<17), 1, 0, make([]byte, MaxKeyLen+1), nil); err == nil {
		t.Error("oversized key accepted")
	}
	if _, err := EncodeRecord(make([]byte, 40), 1, 0, []byte("key"), []byte("too long")); err == nil {
		t.Error("short buffer accepted")
	}
}

func FuzzVerifyRecord(f *testing.F) {
	f.Add(encode(f, 1, 0, "k", "v"), []byte("k"))
	f.Add(encode(f, 2, RecordTombstone, "key", ""), []byte("key"))
	f.Add([]byte{}, []byte("k"))
	f.Fuzz(func(t *testing.T, b, key []byte) {
		r, err := VerifyRecord(b, key, 0)
		if err != nil {
			return
		}
		again := make([]byte, RecordSize(len(r.Key), len(r.Value)))
		if _, err := EncodeRecord(again, r.Version, r.Flags, r.Key, r.Value); err != nil {
			t.Fatalf("verified record does not re-encode: %v", err)
		}
		binary.LittleEndian.PutUint32(again[RecordStateOffset:], RecordLive) // as verified
		if !bytes.Equal(again[:RecordHeaderSize+len(r.Key)+len(r.Value)], b[:RecordHeaderSize+len(r.Key)+len(r.Value)]) {
			t.Fatalf("verified record differs from its re-encoding")
		}
	})
}

// TestRecordCRCFormat pins the CRC to its definition: over the header with
// the state and CRC words zero, then the key and the value. recordCRC reads
// the header in pieces; records already written must still verify.
func TestRecordCRCFormat(t *testing.T) {
	b := encode(t, 7, 0, "key", "some value")
	hdr := bytes.Clone(b[:RecordHeaderSize])
	clear(hdr[4:8])
	clear(hdr[24:28])
	want := crc32.Checksum(append(append(hdr, "key"...), "some value"...), castagnoli)
	if got := binary.LittleEndian.Uint32(b[24:]); got != want {
		t.Fatalf("record CRC %#x, want %#x", got, want)
	}
	if got := recordCRC(b[:RecordHeaderSize], []byte("keysome value")); got != want {
		t.Fatalf("recordCRC %#x, want %#x", got, want)
	}
}

// BenchmarkVerifyRecord verifies a 1 KiB value's record, as a one-sided
// GET does each one it reads:
//
//	go test -run '^$' -bench VerifyRecord ./proto/
func BenchmarkVerifyRecord(b *testing.B) {
	key, value := []byte("bench-key-0001"), bytes.Repeat([]byte{'v'}, 1024)
	rec := make([]byte, RecordSize(len(key), len(value)))
	if _, err := EncodeRecord(rec, 1, 0, key, value); err != nil {
		b.Fatal(err)
	}
	binary.LittleEndian.PutUint32(rec[4:], RecordLive)
	b.SetBytes(int64(len(rec)))
	for b.Loop() {
		if _, err := VerifyRecord(rec, key, 0); err != nil {
			b.Fatal(err)
		}
	}
}
