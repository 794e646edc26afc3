package proto

import (
	"encoding/binary"
	"errors"
	"testing"
)

func TestIndexSlotRoundTrip(t *testing.T) {
	g := IndexGeometry{Slots: 1 << 10, Neighborhood: DefaultNeighborhood, Seed: 7}
	h := g.Hash([]byte("key"))
	loc := Location{Arena: MaxArenas - 1, Offset: MaxArenaOffset, Length: 1<<32 - 1}
	w0, w1, err := EncodeIndexSlot(h, loc)
	if err != nil {
		t.Fatal(err)
	}
	s, ok, err := DecodeIndexSlot(w0, w1)
	if err != nil || !ok || s.Location != loc || s.Fingerprint != Fingerprint(h) {
		t.Fatalf("decoded %+v ok=%v err=%v, want %+v", s, ok, err, loc)
	}
	if _, ok, err := DecodeIndexSlot(0, 0); ok || err != nil {
		t.Fatalf("empty slot decoded as ok=%v err=%v", ok, err)
	}
	if _, _, err := EncodeIndexSlot(h, Location{Arena: MaxArenas, Length: 1}); err == nil {
		t.Error("arena out of range accepted")
	}
	if _, _, err := EncodeIndexSlot(h, Location{Length: 0}); err == nil {
		t.Error("zero length accepted")
	}
}

// A half-written slot (one word old, one new) is detected by the check bits
// nearly always; count how often it is not.
func TestTornSlotsAreDetected(t *testing.T) {
	g := IndexGeometry{Slots: 1 << 10, Neighborhood: DefaultNeighborhood}
	undetected := 0
	const n = 10000
	for i := range n {
		h := g.Hash(binary.LittleEndian.AppendUint64(nil, uint64(i)))
		a0, a1, _ := EncodeIndexSlot(h, Location{Arena: 1, Offset: uint64(i) * 64, Length: 64})
		b0, b1, _ := EncodeIndexSlot(h, Location{Arena: 2, Offset: uint64(i) * 128, Length: 96})
		for _, torn := range [][2]uint64{{a0, b1}, {b0, a1}} {
			if _, _, err := DecodeIndexSlot(torn[0], torn[1]); err == nil {
				undetected++
			} else if !errors.Is(err, ErrBadRecord) {
				t.Fatal(err)
			}
		}
	}
	// 12 check bits: about 2*n/4096 slip through, and VerifyRecord
	// catches those.
	if undetected > 2*n/1000 {
		t.Fatalf("%d of %d torn slots passed the check", undetected, 2*n)
	}
}

func TestFindInNeighborhood(t *testing.T) {
	g := IndexGeometry{Slots: 1 << 4, Neighborhood: 4}
	nb := make([]byte, g.NeighborhoodBytes())
	h := g.Hash([]byte("a"))
	w0, w1, _ := EncodeIndexSlot(h, Location{Arena: 3, Offset: 800, Length: 48})
	binary.LittleEndian.PutUint64(nb[2*IndexSlotSize:], w0)
	binary.LittleEndian.PutUint64(nb[2*IndexSlotSize+8:], w1)
	locs, err := FindInNeighborhood(nb, h, nil)
	if err != nil || len(locs) != 1 || locs[0] != (Location{Arena: 3, Offset: 800, Length: 48}) {
		t.Fatalf("found %+v, %v", locs, err)
	}
	if locs, _ := FindInNeighborhood(nb, g.Hash([]byte("b")), nil); len(locs) != 0 {
		t.Fatalf("found %+v for an absent key", locs)
	}
	binary.LittleEndian.PutUint64(nb[2*IndexSlotSize+8:], w1^1<<20)
	if _, err := FindInNeighborhood(nb, h, nil); !errors.Is(err, ErrBadRecord) {
		t.Fatalf("torn slot: %v, want ErrBadRecord", err)
	}
}

func TestGeometryValidate(t *testing.T) {
	for _, g := range []IndexGeometry{{Slots: 0, Neighborhood: 8}, {Slots: 3, Neighborhood: 8}, {Slots: 8, Neighborhood: 0}, {Slots: 8, Neighborhood: 1000}} {
		if g.Validate() == nil {
			t.Errorf("%+v accepted", g)
		}
	}
	if err := (IndexGeometry{Slots: 1 << 20, Neighborhood: 32}).Validate(); err != nil {
		t.Error(err)
	}
}

func FuzzFindInNeighborhood(f *testing.F) {
	f.Add(make([]byte, 64), uint64(1))
	f.Fuzz(func(t *testing.T, nb []byte, hash uint64) {
		locs, err := FindInNeighborhood(nb, hash, nil)
		if err == nil && len(locs) > len(nb)/IndexSlotSize {
			t.Fatalf("%d locations from %d bytes", len(locs), len(nb))
		}
	})
}
