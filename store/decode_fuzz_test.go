// Fuzz targets for the store's on-disk decoders: index entries and journal entries from Pebble.

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
	f.Add(journalEntry(proto.Location{Arena: 1, Offset: 4096, Length: uint32(len(rec))}, rec))
	f.Add([]byte{1, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, off, r, err := decodeJournalEntry(b)
		if err != nil {
			return
		}
		if len(r) < proto.RecordHeaderSize {
			t.Fatalf("journal entry %x decodes to a %d-byte record, shorter than a header", b, len(r))
		}
		if again := journalEntry(proto.Location{Arena: id, Offset: off}, r); !bytes.Equal(again, b) {
			t.Fatalf("journal entry %x decodes to arena %d offset %d, which encodes to %x", b, id, off, again)
		}
	})
}
