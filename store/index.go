// The server's side of the one-sided hash index: hopscotch inserts, in-place updates, deletes.

package store

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/rkv-io/rkv/proto"
)

// ErrIndexFull is returned when a key's neighborhood cannot take another
// entry even after hopscotch displacement: the table needs to be larger.
var ErrIndexFull = errors.New("store: hash index full")

// KeyReader returns the key of the record at loc. The index stores only
// fingerprints, so it asks the arenas to resolve collisions.
type KeyReader func(loc proto.Location) ([]byte, error)

// Index maintains the hopscotch table that clients read one-sidedly (see
// proto/index.go for the layout). The table lives in memory the caller
// registered; Index writes it with aligned atomic stores in the order the
// layout promises readers. It is safe for concurrent use; mutations are
// serialized.
//
// Moving an entry to make room (hopscotch displacement) writes it to its new
// slot before the old slot is reused. A reader whose one READ saw the new
// slot still empty and the old one already reused would miss the key, so,
// once Publish has been called, the old slot is reused only after Grace has
// passed since the move: longer than any READ of a neighborhood takes to
// execute.
type Index struct {
	geo   proto.IndexGeometry
	words []uint64 // the table, two words per slot
	keyAt KeyReader
	grace time.Duration

	mu        sync.Mutex
	dist      []uint8 // per physical slot: distance from its entry's home
	count     int
	published bool
	moves     uint64
}

// DefaultIndexGrace is the default wait before a slot vacated by a move is
// reused in a published table.
const DefaultIndexGrace = 2 * time.Millisecond

// NewIndex formats table (which must be exactly geo.TableBytes() long and
// 8-byte aligned) as an empty index.
func NewIndex(table []byte, geo proto.IndexGeometry, keyAt KeyReader, grace time.Duration) (*Index, error) {
	if err := geo.Validate(); err != nil {
		return nil, err
	}
	if len(table) != geo.TableBytes() {
		return nil, fmt.Errorf("store: index table of %d bytes, geometry %+v needs %d", len(table), geo, geo.TableBytes())
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(table)))%8 != 0 {
		return nil, fmt.Errorf("store: index table not 8-byte aligned")
	}
	x := &Index{
		geo:   geo,
		words: unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(table))), len(table)/8),
		keyAt: keyAt,
		grace: grace,
		dist:  make([]uint8, len(table)/proto.IndexSlotSize),
	}
	for i := range x.words {
		atomic.StoreUint64(&x.words[i], 0)
	}
	return x, nil
}

// Geometry returns the table's geometry.
func (x *Index) Geometry() proto.IndexGeometry { return x.geo }

// Publish marks the table as visible to remote readers: from now on
// displacement waits out the grace period. Before it (while rebuilding at
// start) inserts run at full speed.
func (x *Index) Publish() {
	x.mu.Lock()
	x.published = true
	x.mu.Unlock()
}

// Len is the number of keys in the index.
func (x *Index) Len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.count
}

// LoadFactor is Len divided by the number of home slots.
func (x *Index) LoadFactor() float64 { return float64(x.Len()) / float64(x.geo.Slots) }

// Moves is the number of displacements done so far.
func (x *Index) Moves() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.moves
}

func (x *Index) load(slot uint64) (proto.IndexSlot, bool) {
	s, ok, _ := proto.DecodeIndexSlot(atomic.LoadUint64(&x.words[2*slot]), atomic.LoadUint64(&x.words[2*slot+1]))
	return s, ok // the server is the only writer: its own slots are never torn
}

func (x *Index) store(slot uint64, w0, w1 uint64) {
	atomic.StoreUint64(&x.words[2*slot+1], w1)
	atomic.StoreUint64(&x.words[2*slot], w0)
}

func (x *Index) clearSlot(slot uint64) {
	atomic.StoreUint64(&x.words[2*slot], 0)
	atomic.StoreUint64(&x.words[2*slot+1], 0)
}

// find returns the physical slot holding key, or ok=false.
func (x *Index) find(key []byte, hash uint64) (slot uint64, loc proto.Location, ok bool, err error) {
	home := x.geo.Home(hash)
	fp := proto.Fingerprint(hash)
	for i := home; i < home+uint64(x.geo.Neighborhood); i++ {
		s, used := x.load(i)
		if !used || s.Fingerprint != fp || uint64(x.dist[i]) != i-home {
			continue
		}
		k, err := x.keyAt(s.Location)
		if err != nil {
			return 0, proto.Location{}, false, fmt.Errorf("store: index slot %d points at an unreadable record %+v: %w", i, s.Location, err)
		}
		if bytes.Equal(k, key) {
			return i, s.Location, true, nil
		}
	}
	return 0, proto.Location{}, false, nil
}

// Get returns the location of key's record.
func (x *Index) Get(key []byte) (proto.Location, bool, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	_, loc, ok, err := x.find(key, x.geo.Hash(key))
	return loc, ok, err
}

// Put points key at loc and returns the location it replaced, if any.
func (x *Index) Put(key []byte, loc proto.Location) (old proto.Location, replaced bool, err error) {
	hash := x.geo.Hash(key)
	w0, w1, err := proto.EncodeIndexSlot(hash, loc)
	if err != nil {
		return proto.Location{}, false, err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	slot, old, ok, err := x.find(key, hash)
	if err != nil {
		return proto.Location{}, false, err
	}
	if ok {
		x.store(slot, w0, w1) // in place: a racing reader sees old, new, or torn
		return old, true, nil
	}
	home := x.geo.Home(hash)
	free, err := x.makeRoom(home)
	if err != nil {
		return proto.Location{}, false, fmt.Errorf("%w: no room within %d slots of slot %d for key %q at load %.2f",
			ErrIndexFull, x.geo.Neighborhood, home, key, float64(x.count)/float64(x.geo.Slots))
	}
	x.dist[free] = uint8(free - home)
	x.store(free, w0, w1)
	x.count++
	return proto.Location{}, false, nil
}

// Delete removes key and returns the location it had.
func (x *Index) Delete(key []byte) (proto.Location, bool, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	slot, loc, ok, err := x.find(key, x.geo.Hash(key))
	if err != nil || !ok {
		return proto.Location{}, false, err
	}
	x.clearSlot(slot)
	x.count--
	return loc, true, nil
}

// maxProbe bounds the search for a free slot beyond the neighborhood.
const maxProbe = 4096

// makeRoom returns a free slot within the neighborhood of home, moving
// entries towards the end of the table (hopscotch) when the nearest free
// slot is too far.
func (x *Index) makeRoom(home uint64) (uint64, error) {
	h := uint64(x.geo.Neighborhood)
	end := min(home+maxProbe, uint64(len(x.dist)))
	free := home
	for ; free < end; free++ {
		if atomic.LoadUint64(&x.words[2*free]) == 0 {
			break
		}
	}
	if free == end {
		return 0, ErrIndexFull
	}
	for free-home >= h {
		// Find the entry furthest from free that may move there: its
		// home must stay within a neighborhood of free.
		moved := false
		for k := free - h + 1; k < free; k++ {
			kHome := k - uint64(x.dist[k])
			if free-kHome >= h {
				continue
			}
			w0, w1 := atomic.LoadUint64(&x.words[2*k]), atomic.LoadUint64(&x.words[2*k+1])
			x.dist[free] = uint8(free - kHome)
			x.store(free, w0, w1)
			x.moves++
			if x.published {
				// k still holds the entry; a reader that missed the
				// copy at free finds it there until the grace ends.
				time.Sleep(x.grace)
			}
			x.clearSlot(k)
			free = k
			moved = true
			break
		}
		if !moved {
			return 0, ErrIndexFull
		}
	}
	return free, nil
}
