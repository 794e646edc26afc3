// The one-sided hash index's layout: geometry, key hashing, and the 16-byte slot.

package proto

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// The hash index is a hopscotch table in registered memory that clients read
// with one RDMA_READ per lookup: a key hashes to a home slot, and the server
// keeps every key within Neighborhood slots of its home, so the reader
// fetches exactly [home, home+Neighborhood) and scans it. The table has
// Slots home positions and Slots+Neighborhood-1 physical slots, so a
// neighborhood never wraps and is always one contiguous READ.
//
// A slot is 16 bytes, two little-endian words:
//
//	w0: fingerprint (hash >> 32) << 32 | record length in bytes
//	w1: check (12 bits) << 52 | arena (12 bits) << 40 | offset (40 bits)
//
// An empty slot has w0 == 0. The server writes w1 before w0 and clears w0
// first, each with one aligned 8-byte store; a read that sees a slot half
// written fails the check bits or, at worst, leads to a record that fails
// VerifyRecord, and the reader retries.
const (
	IndexSlotSize        = 16
	DefaultNeighborhood  = 64
	MaxArenas            = 1 << 12
	MaxArenaOffset       = 1<<40 - 1
	indexOffsetMask      = MaxArenaOffset
	indexCheckShift      = 52
	indexArenaShift      = 40
	indexArenaMask       = MaxArenas - 1
	indexCheckMask       = 1<<12 - 1
	maxIndexNeighborhood = 256

	// MaxArenaRegions bounds a server's advertised arena regions (arenas
	// registered in units advertise one per unit): 2 TiB in the default
	// 128 MiB units.
	MaxArenaRegions = 1 << 14
)

// IndexGeometry is what a reader needs to locate a key's neighborhood. It
// travels in gossip with the table's (addr, rkey).
type IndexGeometry struct {
	Slots        uint64 // home positions; a power of two
	Neighborhood int    // slots read per lookup
	Seed         uint64 // per-table hash seed
}

// Validate checks the geometry a peer advertised.
func (g IndexGeometry) Validate() error {
	if g.Slots == 0 || g.Slots&(g.Slots-1) != 0 || g.Slots > 1<<40 {
		return fmt.Errorf("proto: index of %d slots: must be a power of two up to 2^40", g.Slots)
	}
	if g.Neighborhood < 1 || g.Neighborhood > maxIndexNeighborhood {
		return fmt.Errorf("proto: index neighborhood %d: must be 1 to %d", g.Neighborhood, maxIndexNeighborhood)
	}
	return nil
}

// TableBytes is the size of the table's memory.
func (g IndexGeometry) TableBytes() int {
	return int(g.Slots+uint64(g.Neighborhood)-1) * IndexSlotSize
}

// NeighborhoodBytes is the size of one lookup's READ.
func (g IndexGeometry) NeighborhoodBytes() int { return g.Neighborhood * IndexSlotSize }

// Hash is the key's 64-bit hash under the table's seed.
func (g IndexGeometry) Hash(key []byte) uint64 {
	h := xxhash.Sum64(key) ^ g.Seed
	// splitmix64's finalizer, so the seed changes every bit.
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}

// Home is the key's home slot for a hash.
func (g IndexGeometry) Home(hash uint64) uint64 { return hash & (g.Slots - 1) }

// NeighborhoodOffset is the byte offset in the table of the neighborhood of
// the slot home.
func (g IndexGeometry) NeighborhoodOffset(home uint64) int { return int(home) * IndexSlotSize }

// Location is where a record lies: which arena, at what offset, how long
// (the record's full size, header and padding included).
type Location struct {
	Arena  uint16
	Offset uint64
	Length uint32
}

// IndexSlot is a decoded slot.
type IndexSlot struct {
	Fingerprint uint32
	Location
}

// Fingerprint is the part of a hash a slot stores.
func Fingerprint(hash uint64) uint32 { return uint32(hash >> 32) }

// EncodeIndexSlot returns the two words of a slot for a key with the given
// hash at loc.
func EncodeIndexSlot(hash uint64, loc Location) (w0, w1 uint64, err error) {
	if loc.Length == 0 || loc.Offset > MaxArenaOffset || loc.Arena >= MaxArenas {
		return 0, 0, fmt.Errorf("proto: location %+v cannot be indexed", loc)
	}
	w0 = uint64(Fingerprint(hash))<<32 | uint64(loc.Length)
	w1 = uint64(loc.Arena)<<indexArenaShift | loc.Offset
	return w0, w1 | slotCheck(w0, w1)<<indexCheckShift, nil
}

func slotCheck(w0, w1 uint64) uint64 {
	x := w0 ^ (w1&(1<<indexCheckShift-1))*0x9e3779b97f4a7c15
	x ^= x >> 29
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 32
	return x & indexCheckMask
}

// DecodeIndexSlot decodes a slot's words. ok is false for an empty slot;
// err is set for a torn one.
func DecodeIndexSlot(w0, w1 uint64) (slot IndexSlot, ok bool, err error) {
	if w0 == 0 {
		return IndexSlot{}, false, nil
	}
	if w1>>indexCheckShift != slotCheck(w0, w1) {
		return IndexSlot{}, false, fmt.Errorf("%w: index slot check bits", ErrBadRecord)
	}
	return IndexSlot{
		Fingerprint: uint32(w0 >> 32),
		Location: Location{
			Arena:  uint16(w1 >> indexArenaShift & indexArenaMask),
			Offset: w1 & indexOffsetMask,
			Length: uint32(w0),
		},
	}, true, nil
}

// FindInNeighborhood scans a neighborhood that a reader fetched and returns
// the locations of the slots whose fingerprint matches hash, nearest the
// home first (usually zero or one). A torn slot makes it return
// ErrBadRecord: the reader re-reads the neighborhood.
func FindInNeighborhood(nb []byte, hash uint64, dst []Location) ([]Location, error) {
	fp := Fingerprint(hash)
	for off := 0; off+IndexSlotSize <= len(nb); off += IndexSlotSize {
		w0 := binary.LittleEndian.Uint64(nb[off:])
		if w0 == 0 || uint32(w0>>32) != fp {
			continue
		}
		s, _, err := DecodeIndexSlot(w0, binary.LittleEndian.Uint64(nb[off+8:]))
		if err != nil {
			return dst, err
		}
		dst = append(dst, s.Location)
	}
	return dst, nil
}
