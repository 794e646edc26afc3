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
//
// An Index also grows (BeginGrow, CopyForGrow, FinishGrow): while a larger
// table is filled, every change goes to both, so that the new table holds
// every key once the copy has passed over the old one.
type Index struct {
	keyAt KeyReader
	grace time.Duration

	mu      sync.Mutex
	cur     *table
	next    *table // the larger table a growth fills; nil when none is under way
	growErr error  // why the last growth was abandoned
	moves   uint64
}

// table is one hopscotch table: its slots and the server's bookkeeping.
type table struct {
	geo       proto.IndexGeometry
	words     []uint64 // two per slot
	dist      []uint8  // per physical slot: distance from its entry's home
	count     int
	published bool
}

// DefaultIndexGrace is the default wait before a slot vacated by a move is
// reused in a published table.
const DefaultIndexGrace = 2 * time.Millisecond

// NewIndex formats table (which must be exactly geo.TableBytes() long and
// 8-byte aligned) as an empty index.
func NewIndex(table []byte, geo proto.IndexGeometry, keyAt KeyReader, grace time.Duration) (*Index, error) {
	t, err := newTable(table, geo)
	if err != nil {
		return nil, err
	}
	return &Index{cur: t, keyAt: keyAt, grace: grace}, nil
}

func newTable(mem []byte, geo proto.IndexGeometry) (*table, error) {
	if err := geo.Validate(); err != nil {
		return nil, err
	}
	if len(mem) != geo.TableBytes() {
		return nil, fmt.Errorf("store: index table of %d bytes, geometry %+v needs %d", len(mem), geo, geo.TableBytes())
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(mem)))%8 != 0 {
		return nil, fmt.Errorf("store: index table not 8-byte aligned")
	}
	t := &table{
		geo:   geo,
		words: unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(mem))), len(mem)/8),
		dist:  make([]uint8, len(mem)/proto.IndexSlotSize),
	}
	for i := range t.words {
		atomic.StoreUint64(&t.words[i], 0)
	}
	return t, nil
}

// Geometry returns the table's geometry (the one readers use).
func (x *Index) Geometry() proto.IndexGeometry {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.cur.geo
}

// Publish marks the table as visible to remote readers: from now on
// displacement waits out the grace period. Before it (while rebuilding at
// start) inserts run at full speed.
func (x *Index) Publish() {
	x.mu.Lock()
	x.cur.published = true
	x.mu.Unlock()
}

// Len is the number of keys in the index.
func (x *Index) Len() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.cur.count
}

// LoadFactor is Len divided by the number of home slots.
func (x *Index) LoadFactor() float64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return float64(x.cur.count) / float64(x.cur.geo.Slots)
}

// Growing reports whether a growth is filling a next table.
func (x *Index) Growing() bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.next != nil
}

// Moves is the number of displacements done so far.
func (x *Index) Moves() uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.moves
}

func (t *table) load(slot uint64) (proto.IndexSlot, bool) {
	s, ok, _ := proto.DecodeIndexSlot(atomic.LoadUint64(&t.words[2*slot]), atomic.LoadUint64(&t.words[2*slot+1]))
	return s, ok // the server is the only writer: its own slots are never torn
}

func (t *table) store(slot uint64, w0, w1 uint64) {
	atomic.StoreUint64(&t.words[2*slot+1], w1)
	atomic.StoreUint64(&t.words[2*slot], w0)
}

func (t *table) clearSlot(slot uint64) {
	atomic.StoreUint64(&t.words[2*slot], 0)
	atomic.StoreUint64(&t.words[2*slot+1], 0)
}

// find returns the physical slot of t holding key, or ok=false.
func (x *Index) find(t *table, key []byte, hash uint64) (slot uint64, loc proto.Location, ok bool, err error) {
	home := t.geo.Home(hash)
	fp := proto.Fingerprint(hash)
	for i := home; i < home+uint64(t.geo.Neighborhood); i++ {
		s, used := t.load(i)
		if !used || s.Fingerprint != fp || uint64(t.dist[i]) != i-home {
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
	_, loc, ok, err := x.find(x.cur, key, x.cur.geo.Hash(key))
	return loc, ok, err
}

// Put points key at loc and returns the location it replaced, if any.
func (x *Index) Put(key []byte, loc proto.Location) (old proto.Location, replaced bool, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old, replaced, err = x.put(x.cur, key, loc, true)
	if err == nil && x.next != nil {
		if _, _, nerr := x.put(x.next, key, loc, true); nerr != nil {
			x.abandonLocked(nerr)
		}
	}
	return old, replaced, err
}

// put points key at loc in t; an existing entry is replaced only if
// replace is set.
func (x *Index) put(t *table, key []byte, loc proto.Location, replace bool) (old proto.Location, had bool, err error) {
	hash := t.geo.Hash(key)
	w0, w1, err := proto.EncodeIndexSlot(hash, loc)
	if err != nil {
		return proto.Location{}, false, err
	}
	slot, old, ok, err := x.find(t, key, hash)
	if err != nil {
		return proto.Location{}, false, err
	}
	if ok {
		if replace {
			t.store(slot, w0, w1) // in place: a racing reader sees old, new, or torn
		}
		return old, true, nil
	}
	home := t.geo.Home(hash)
	free, err := x.makeRoom(t, home)
	if err != nil {
		return proto.Location{}, false, fmt.Errorf("%w: no room within %d slots of slot %d for key %q at load %.2f",
			ErrIndexFull, t.geo.Neighborhood, home, key, float64(t.count)/float64(t.geo.Slots))
	}
	t.dist[free] = uint8(free - home)
	t.store(free, w0, w1)
	t.count++
	return proto.Location{}, false, nil
}

// Delete removes key and returns the location it had.
func (x *Index) Delete(key []byte) (proto.Location, bool, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	loc, ok, err := x.delete(x.cur, key)
	if err == nil && x.next != nil {
		if _, _, nerr := x.delete(x.next, key); nerr != nil {
			x.abandonLocked(nerr)
		}
	}
	return loc, ok, err
}

func (x *Index) delete(t *table, key []byte) (proto.Location, bool, error) {
	slot, loc, ok, err := x.find(t, key, t.geo.Hash(key))
	if err != nil || !ok {
		return proto.Location{}, false, err
	}
	t.clearSlot(slot)
	t.count--
	return loc, true, nil
}

// maxProbe bounds the search for a free slot beyond the neighborhood.
const maxProbe = 4096

// makeRoom returns a free slot of t within the neighborhood of home,
// moving entries towards the end of the table (hopscotch) when the nearest
// free slot is too far.
func (x *Index) makeRoom(t *table, home uint64) (uint64, error) {
	h := uint64(t.geo.Neighborhood)
	end := min(home+maxProbe, uint64(len(t.dist)))
	free := home
	for ; free < end; free++ {
		if atomic.LoadUint64(&t.words[2*free]) == 0 {
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
			kHome := k - uint64(t.dist[k])
			if free-kHome >= h {
				continue
			}
			w0, w1 := atomic.LoadUint64(&t.words[2*k]), atomic.LoadUint64(&t.words[2*k+1])
			t.dist[free] = uint8(free - kHome)
			t.store(free, w0, w1)
			x.moves++
			if t.published {
				// k still holds the entry; a reader that missed the
				// copy at free finds it there until the grace ends.
				time.Sleep(x.grace)
			}
			t.clearSlot(k)
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

// BeginGrow starts filling mem (geo.TableBytes() long, 8-byte aligned) as
// the index's next table. From now on every Put and Delete goes to both
// tables; CopyForGrow copies the entries that were there before. It fails
// if a growth is under way already.
func (x *Index) BeginGrow(mem []byte, geo proto.IndexGeometry) error {
	t, err := newTable(mem, geo)
	if err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.next != nil {
		return errors.New("store: the index is growing already")
	}
	x.next = t
	x.growErr = nil
	return nil
}

// CopyForGrow copies the entries of physical slots [from, from+n) of the
// current table into the next one, keeping an entry the next table has
// already (a Put since BeginGrow: newer). It returns where to go on from,
// and done once the whole table was copied. Copying in ascending order
// misses nothing: a displacement moves an entry only towards the end of the
// table, so an entry not yet copied stays ahead of the copy.
func (x *Index) CopyForGrow(from uint64, n int) (next uint64, done bool, err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.next == nil {
		return from, false, fmt.Errorf("store: growing the index: %w", x.abandoned())
	}
	end := min(from+uint64(n), uint64(len(x.cur.dist)))
	for i := from; i < end; i++ {
		s, used := x.cur.load(i)
		if !used {
			continue
		}
		key, err := x.keyAt(s.Location)
		if err != nil {
			return i, false, fmt.Errorf("store: growing the index: slot %d points at an unreadable record %+v: %w", i, s.Location, err)
		}
		if _, _, err := x.put(x.next, key, s.Location, false); err != nil {
			x.abandonLocked(err)
			return i, false, fmt.Errorf("store: growing the index: %w", err)
		}
	}
	return end, end == uint64(len(x.cur.dist)), nil
}

// FinishGrow makes the next table the current one, published, after
// swap ran: under the index's lock, so that no Put or Delete falls between
// them (the caller retires the old table's shard words there). It returns
// the number of keys.
func (x *Index) FinishGrow(swap func()) (int, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.next == nil {
		return 0, fmt.Errorf("store: growing the index: %w", x.abandoned())
	}
	if x.next.count != x.cur.count {
		err := fmt.Errorf("store: growing the index: the new table holds %d keys, the current one %d", x.next.count, x.cur.count)
		x.abandonLocked(err)
		return 0, err
	}
	swap()
	x.next.published = true
	x.cur, x.next = x.next, nil
	return x.cur.count, nil
}

// AbortGrow drops the next table, if any.
func (x *Index) AbortGrow() {
	x.mu.Lock()
	x.next = nil
	x.mu.Unlock()
}

// abandonLocked drops the next table after a failure to change it (the
// current one is unaffected); the growth then fails with err.
func (x *Index) abandonLocked(err error) {
	x.next, x.growErr = nil, err
}

func (x *Index) abandoned() error {
	if x.growErr != nil {
		return x.growErr
	}
	return errors.New("no growth under way")
}
