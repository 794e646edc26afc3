// Fuzz targets for the store's on-disk decoders: Pebble keys, index, journal, shard and session entries.

package store

import (
	"bytes"
	"testing"

	"github.com/rkv-io/rkv/proto"
)

func FuzzDecodeEntry(f *testing.F) {
	f.Add(entry{loc: proto.Location{Arena: 3, Offset: 1 << 20, Length: 96}, version: 42}.encode())
	f.Add([]byte{})
	f.Add([]byte{2})
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEntry(b)
		if err != nil {
			return
		}
		if again := e.encode(); !bytes.Equal(again, b) {
			t.Fatalf("entry %x decodes to %+v, which encodes to %x", b, e, again)
		}
	})
}

func FuzzDecodeJournalEntry(f *testing.F) {
	rec := make([]byte, proto.RecordSize(3, 5))
	if _, err := proto.EncodeRecord(rec, 7, 0, []byte("key"), []byte("value")); err != nil {
		f.Fatal(err)
	}
	f.Add(appendJournalEntry(nil, proto.Location{Arena: 1, Offset: 4096, Length: uint32(len(rec))}, rec))
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, off, r, err := decodeJournalEntry(b)
		if err != nil {
			return
		}
		if len(r) < proto.RecordHeaderSize {
			t.Fatalf("journal entry %x decodes to a %d-byte record, shorter than a header", b, len(r))
		}
		if again := appendJournalEntry(nil, proto.Location{Arena: id, Offset: off}, r); !bytes.Equal(again, b) {
			t.Fatalf("journal entry %x decodes to arena %d offset %d, which encodes to %x", b, id, off, again)
		}
	})
}

func FuzzDecodeShardRecord(f *testing.F) {
	f.Add(encodeShardRecord(ShardOwned, 42))
	f.Add(encodeShardRecord(ShardIncoming, 17))
	f.Add(encodeShardRecord(ShardReleased, 42))
	f.Add(encodeShardRecord(ShardOwned, 0))
	f.Add([]byte{1, 9})
	f.Fuzz(func(t *testing.T, b []byte) {
		st, since, err := decodeShardRecord(b)
		if err != nil {
			return
		}
		if st == ShardNone || st >= shardStateEnd || (st == ShardOwned && since == 0) {
			t.Fatalf("shard record %x decodes to %v since %d", b, st, since)
		}
		if again := encodeShardRecord(st, since); !bytes.Equal(again, b) {
			t.Fatalf("shard record %x decodes to %v since %d, which encodes to %x", b, st, since, again)
		}
	})
}

func FuzzDecodeSession(f *testing.F) {
	r := sessionRecord{seq: 7, version: 1 << 40, loc: proto.Location{Arena: 2, Offset: 4096, Length: 64}, time: 1_700_000_000_000_000_000}
	f.Add(sessionKey(1023, 0xfeed), r.encode())
	f.Add(sessionKey(0, 1), sessionRecord{seq: 1}.encode())
	f.Add([]byte{'w', 4, 0}, []byte{1})
	f.Fuzz(func(t *testing.T, k, v []byte) {
		if sh, session, err := decodeSessionKey(k); err == nil {
			if sh >= proto.NumShards || session == 0 {
				t.Fatalf("session key %x decodes to %v, session %d", k, sh, session)
			}
			if again := sessionKey(sh, session); !bytes.Equal(again, k) {
				t.Fatalf("session key %x decodes to %v session %d, which encodes to %x", k, sh, session, again)
			}
		}
		r, err := decodeSessionRecord(v)
		if err != nil {
			return
		}
		if r.time < 0 {
			t.Fatalf("session entry %x decodes to time %d", v, r.time)
		}
		if again := r.encode(); !bytes.Equal(again, v) {
			t.Fatalf("session entry %x decodes to %+v, which encodes to %x", v, r, again)
		}
	})
}

func FuzzSplitDataKey(f *testing.F) {
	f.Add(dataKey([]byte("key")))
	f.Add(shardDataKey(5, []byte("key"))) // filed under the wrong shard
	f.Add([]byte{'k', 0xff, 0xff, 'x'})
	f.Fuzz(func(t *testing.T, b []byte) {
		sh, key, err := splitDataKey(b)
		if err != nil {
			return
		}
		if len(key) == 0 || proto.ShardOf(key) != sh {
			t.Fatalf("data key %x decodes to %v and key %q", b, sh, key)
		}
		if again := dataKey(key); !bytes.Equal(again, b) {
			t.Fatalf("data key %x decodes to key %q, which encodes to %x", b, key, again)
		}
	})
}

// FuzzIndexLog decodes a log of any bytes from any position: it must
// stop, never panic, and return only entries that passed their checks.
func FuzzIndexLog(f *testing.F) {
	l := &indexLog{mem: make([]byte, 2048), next: logPos{gen: 5}}
	appendEntry := func(e *logEntry) uint64 {
		seq, err := l.append(e)
		if err != nil {
			f.Fatal(err)
		}
		return seq
	}
	seq := appendEntry(&logEntry{kind: logPut, shard: proto.ShardOf([]byte("k1")), key: []byte("k1"), loc: proto.Location{Length: 40}, version: 9, session: 3, wseq: 1})
	appendEntry(&logEntry{kind: logVoid, version: seq})
	rec := make([]byte, proto.RecordSize(2, 5))
	if _, err := proto.EncodeRecord(rec, 10, 0, []byte("k1"), []byte("value")); err != nil {
		f.Fatal(err)
	}
	appendEntry(&logEntry{kind: logPut, shard: proto.ShardOf([]byte("k1")), key: []byte("k1"), loc: proto.Location{Length: uint32(len(rec))}, version: 10, rec: rec})
	for l.next.total < 3000 { // round the end: a pad, then entries from 0
		appendEntry(&logEntry{kind: logDelete, shard: proto.ShardOf([]byte("k2")), key: []byte("k2")})
	}
	f.Add(append([]byte(nil), l.mem...), uint64(5), uint64(0), uint64(0))
	f.Add(make([]byte, 1024), uint64(0), uint64(0), uint64(8))
	f.Fuzz(func(t *testing.T, mem []byte, gen, seq, total uint64) {
		mem = mem[:len(mem)&^7]
		if len(mem) < logPadMin {
			return
		}
		l := &indexLog{mem: mem}
		entries, _ := l.entriesFrom(logPos{gen: gen, seq: seq, total: total})
		for i, e := range entries {
			if e.seq < seq || i > 0 && e.seq <= entries[i-1].seq {
				t.Fatalf("entry %d has seq %d after %d, from %d", i, e.seq, entries[max(i-1, 0)].seq, seq)
			}
			if len(e.key) == 0 || proto.ShardOf(e.key) != e.shard {
				t.Fatalf("entry %+v: its key is not of its shard", e)
			}
			if e.rec != nil && !holdsPut(e.rec, e) {
				t.Fatalf("entry %+v: its record is not the put's", e)
			}
		}
	})
}
