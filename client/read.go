// The one read path: Get, MultiGet and Scan's values all resolve keys here, one-sidedly.

package client

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// maxReadBatch is how many READs share one post: well within a QP's send
// queue and the CQ.
const maxReadBatch = 64

// read resolves keys on this connection's server, t.name, which the map
// names as their owner. Each key goes:
//
//  1. With a cached location: READ the record; a live record of the key
//     is the value.
//  2. Otherwise READ the key's index neighborhood and, for every slot
//     whose fingerprint matches, the record. A live record of the key is
//     the value. Records of other keys (fingerprint collisions) say
//     nothing; a torn neighborhood, or a record of the key that is torn
//     or superseded, means retry.
//  3. No record of the key: confirm the miss with the shard's word
//     (misses): only if the server owned the shard since the epoch the map
//     says, for the whole time, is the key absent; otherwise the map is
//     behind (or the server's is): refresh and retry.
//
// Each step posts the READs of every key that needs it together, in
// batches that fit the buffer. It returns one value per key (nil: absent;
// a present empty value is non-nil). When some keys need another attempt
// it returns a retryable error for the first of them, with done telling
// the keys it resolved anyway (done is nil without an error): their values hold, and a retry asks for the
// others only (so a MultiGet over a server whose shards move one after the
// other does not start over at each move).
func (sc *serverConn) read(ctx context.Context, t *target, keys [][]byte) (vals [][]byte, done []bool, err error) {
	if err := sc.lock(ctx); err != nil {
		return nil, nil, err
	}
	defer sc.unlock()
	if err := sc.ready(ctx, t.member); err != nil {
		return nil, nil, err
	}
	if err := sc.ensureReadLease(ctx, t); err != nil {
		return nil, nil, err
	}
	r := sc.startReads(t, keys)
	if err := r.cached(ctx); err != nil {
		return nil, nil, err
	}
	vals, done, err = r.resolve(ctx)
	if lerr := sc.trustReads(t); lerr != nil {
		return nil, nil, lerr
	}
	return vals, done, err
}

// get is read of one key, with a straight path for the common GET: a
// cached location the record is still at, one READ. It appends the value
// to dst; found is false for an absent key.
func (sc *serverConn) get(ctx context.Context, t *target, dst, key []byte) (_ []byte, found bool, _ error) {
	if err := sc.lock(ctx); err != nil {
		return dst, false, err
	}
	defer sc.unlock()
	if err := sc.ready(ctx, t.member); err != nil {
		return dst, false, err
	}
	if err := sc.ensureReadLease(ctx, t); err != nil {
		return dst, false, err
	}
	if cl := sc.c.cacheGet(key); sc.holds(cl) {
		raddr, rkey, err := sc.recordAt(&t.member.Meta, key, cl.loc)
		if err != nil {
			return dst, false, err
		}
		n := int(cl.loc.Length)
		if err := sc.post(ctx, rdma.OpRead, 0, n, raddr, rkey); err != nil {
			return dst, false, err
		}
		if rec, err := proto.VerifyRecord(sc.buf()[:n], key, 0); err == nil {
			if err := sc.trustReads(t); err != nil {
				return dst, false, err
			}
			return append(dst, rec.Value...), true, nil
		}
		sc.c.cacheDrop(key) // superseded, deleted or moved: the index knows
	}
	sc.one[0] = key
	defer func() { sc.one[0] = nil }()
	vals, _, err := sc.startReads(t, sc.one[:]).resolve(ctx)
	if lerr := sc.trustReads(t); lerr != nil {
		return dst, false, lerr
	}
	switch {
	case err != nil || vals[0] == nil:
		return dst, false, err
	case dst == nil:
		return vals[0], true, nil // already a copy of its own
	}
	return append(dst, vals[0]...), true, nil
}

// startReads begins a read of keys on sc, reusing its key states.
func (sc *serverConn) startReads(t *target, keys [][]byte) *keyReads {
	r := &sc.reads
	*r = keyReads{sc: sc, t: t, keys: keys, vals: make([][]byte, len(keys)), state: slices.Grow(r.state[:0], len(keys))[:len(keys)], locs: r.locs}
	clear(r.state)
	return r
}

// resolve runs the steps after the cached one: the index, then misses.
func (r *keyReads) resolve(ctx context.Context) (vals [][]byte, done []bool, err error) {
	candidates, err := r.indexed(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := r.misses(ctx, candidates); err != nil {
		return nil, nil, err
	}
	vals, err = r.vals, r.again
	if err != nil {
		done = make([]bool, len(r.keys))
		for i, st := range r.state {
			done[i] = st == found || st == absent
		}
	}
	r.keys, r.vals, r.again, r.shared = nil, nil, nil, nil // the state slice stays, for the next read
	return vals, done, err
}

// any reports whether some key is in state st.
func (r *keyReads) any(st readState) bool { return slices.Contains(r.state, st) }

// readState is where one key's resolution stands.
type readState uint8

const (
	unresolved readState = iota
	found
	missing // no record of the key in the index: ask the shard word
	absent
	retrying // this attempt cannot tell: the key needs another
)

// keyReads is one call of read.
type keyReads struct {
	sc    *serverConn
	t     *target
	keys  [][]byte
	vals  [][]byte
	state []readState
	locs  []cachedLoc // the keys' cached locations (cacheGetAll), reused
	again error       // why the first key marked retrying needs another attempt
	// shared holds the small values of the keys read at cached locations
	// (cachedRead), one allocation for them all.
	shared []byte
}

// retryKey marks key i as needing another attempt, for reason.
func (r *keyReads) retryKey(i int, reason error) {
	r.state[i] = retrying
	if r.again == nil {
		r.again = reason
	}
}

func (r *keyReads) meta() *proto.NodeMeta { return &r.t.member.Meta }

// cached READs the records of keys with a cached location. Their READs
// carry the key's number instead of a callback (cachedRead): a MultiGet
// of cached keys allocates nothing per key but its value.
func (r *keyReads) cached(ctx context.Context) error {
	b := r.sc.batch()
	small := 0 // the bytes of the small records read
	r.locs = r.sc.c.cacheGetAll(r.keys, r.locs)
	for i, k := range r.keys {
		cl := r.locs[i]
		if !r.sc.holds(cl) {
			continue
		}
		raddr, rkey, err := r.sc.recordAt(r.meta(), k, cl.loc)
		if err != nil {
			return err
		}
		if err := b.addRead(ctx, int(cl.loc.Length), raddr, rkey, false, readDone{cached: r, key: i}); err != nil {
			return err
		}
		if cl.loc.Length <= sharedValueMax {
			small += int(cl.loc.Length)
		}
	}
	if small > 0 && len(r.keys) > 1 {
		r.shared = make([]byte, 0, small)
	}
	return b.flush(ctx)
}

// sharedValueMax is the largest record whose value a read of several keys
// copies into one buffer with the other small ones (each value capped, so
// that appending to it copies): a value kept then keeps the others' bytes
// too, at most this much each.
const sharedValueMax = 4 << 10

// cachedRead takes the READ of key i's record at its cached location.
func (r *keyReads) cachedRead(i int, buf []byte) {
	rec, err := proto.VerifyRecord(buf, r.keys[i], 0)
	if err != nil {
		r.sc.c.cacheDrop(r.keys[i]) // superseded, deleted or moved: the index knows
		return
	}
	r.state[i] = found
	if n := len(r.shared); cap(r.shared) > 0 && len(buf) <= sharedValueMax && n+len(rec.Value) <= cap(r.shared) {
		r.shared = append(r.shared, rec.Value...)
		r.vals[i] = r.shared[n:len(r.shared):len(r.shared)]
		return
	}
	r.vals[i] = append([]byte{}, rec.Value...)
}

// record adds a READ of the record at loc to b, calling then with its
// verification once it arrived; a location outside the advertised arenas
// (an arena not in the view yet) is a retry.
func (r *keyReads) record(ctx context.Context, b *readBatch, i int, loc proto.Location, then func(proto.Record, error)) error {
	raddr, rkey, err := r.sc.recordAt(r.meta(), r.keys[i], loc)
	if err != nil {
		return err
	}
	return b.add(ctx, int(loc.Length), raddr, rkey, func(buf []byte) {
		then(proto.VerifyRecord(buf, r.keys[i], 0))
	})
}

// recordAt is where key's record at loc lies in the server's memory, as
// meta advertises it; a location outside the advertised arenas (an arena
// not in the view yet) is a retry, a record larger than the buffer an
// error.
func (sc *serverConn) recordAt(meta *proto.NodeMeta, key []byte, loc proto.Location) (raddr uint64, rkey uint32, err error) {
	a, ok := proto.LocateRecord(meta.Arenas, loc)
	if !ok {
		return 0, 0, retryStale(sc.name, "record of %q at %+v: that part of arena %d of %s is not in the view yet", key, loc, loc.Arena, sc.name)
	}
	if err := sc.fits(int(loc.Length)); err != nil {
		return 0, 0, err
	}
	return a.RemoteAddr(loc.Offset), a.RKey, nil
}

// located is the location cache's entry for a record at loc on this
// server, at its current generation.
func (sc *serverConn) located(loc proto.Location) cachedLoc {
	return cachedLoc{node: sc.node, gen: sc.gen, loc: loc}
}

// holds reports whether cl is a location on this server at its current
// generation: one to read here (not the zero cachedLoc, which is none).
func (sc *serverConn) holds(cl cachedLoc) bool {
	return cl.loc.Length != 0 && cl.node == sc.node && cl.gen == sc.gen
}

// fits checks that a READ of n bytes fits the client buffer.
func (sc *serverConn) fits(n int) error {
	if size := len(sc.buf()); n > size {
		return fmt.Errorf("%w: a record of %d bytes does not fit the client buffer (%d)", ErrTooLarge, n, size)
	}
	return nil
}

// indexed reads the neighborhoods of the unresolved keys, then every
// candidate record; it returns each key's candidate locations, which the
// check of a miss compares with a second READ.
func (r *keyReads) indexed(ctx context.Context) ([][]proto.Location, error) {
	if !r.any(unresolved) {
		return nil, nil // every location cached was current: the common GET
	}
	idx := r.meta().Index
	geo := idx.Geometry
	nb := geo.NeighborhoodBytes()
	candidates := make([][]proto.Location, len(r.keys))
	b := r.sc.batch()
	for i, k := range r.keys {
		if r.state[i] != unresolved {
			continue
		}
		h := geo.Hash(k)
		if err := b.add(ctx, nb, idx.Addr+uint64(geo.NeighborhoodOffset(geo.Home(h))), idx.RKey, func(buf []byte) {
			found, err := proto.FindInNeighborhood(buf, h, nil)
			if err != nil {
				r.retryKey(i, retry(r.sc.name, "torn index neighborhood of %q: %w", k, err))
				return
			}
			candidates[i] = found
		}); err != nil {
			return nil, err
		}
	}
	if err := b.flush(ctx); err != nil {
		return nil, err
	}
	stale := make([]error, len(r.keys))
	for i := range r.keys {
		if r.state[i] != unresolved {
			continue
		}
		r.state[i] = missing
		for _, loc := range candidates[i] {
			if err := r.record(ctx, b, i, loc, func(rec proto.Record, err error) {
				switch {
				case err == nil:
					r.vals[i], r.state[i] = append([]byte{}, rec.Value...), found
					r.sc.c.cachePut(r.keys[i], r.sc.located(loc))
				case errors.Is(err, proto.ErrOtherKey):
					// A fingerprint collision: not this key's.
				default:
					stale[i] = retry(r.sc.name, "record of %q at %+v: %w", r.keys[i], loc, err)
				}
			}); err != nil {
				return nil, err
			}
		}
	}
	if err := b.flush(ctx); err != nil {
		return nil, err
	}
	for i := range r.keys {
		if r.state[i] == missing && stale[i] != nil {
			// A record of the key was there but torn or superseded: the
			// key may well exist.
			r.retryKey(i, stale[i])
		}
	}
	return candidates, nil
}

// misses confirms each missing key's absence with its shard's word: it
// READs the word, the key's neighborhood again and the word again, each
// fenced behind the one before, in one post. A miss is an answer only if
// both words are equal and say the server owns the shard since the epoch
// the map says, and the neighborhood still holds no slot for the key but
// those of other keys seen before: the server then owned the shard, with
// every key of it indexed, for the whole time the index was read (see
// proto's shard words).
func (r *keyReads) misses(ctx context.Context, candidates [][]proto.Location) error {
	idx := r.meta().Index
	if !r.any(missing) {
		return nil
	}
	geo := idx.Geometry
	nb := geo.NeighborhoodBytes()
	// A group is the missing keys of one shard that one post checks:
	// word, neighborhoods, word.
	type group struct {
		shard         proto.Shard
		keys          []int
		before, after uint64
	}
	var groups []*group
	open := map[proto.Shard]*group{}
	for i, k := range r.keys {
		if r.state[i] != missing {
			continue
		}
		s := proto.ShardOf(k)
		g := open[s]
		if g == nil || len(g.keys) == maxReadBatch-2 {
			g = &group{shard: s}
			open[s] = g
			groups = append(groups, g)
		}
		g.keys = append(g.keys, i)
	}
	again := make([]bool, len(r.keys)) // the neighborhood changed: read the key again
	b := r.sc.batch()
	for _, g := range groups {
		word := idx.Addr + uint64(geo.ShardWordOffset(g.shard))
		if err := b.addFenced(ctx, proto.ShardWordSize, word, idx.RKey, false, func(buf []byte) { g.before = proto.DecodeShardWord(buf) }); err != nil {
			return err
		}
		for _, i := range g.keys {
			h := geo.Hash(r.keys[i])
			if err := b.addFenced(ctx, nb, idx.Addr+uint64(geo.NeighborhoodOffset(geo.Home(h))), idx.RKey, true, func(buf []byte) {
				found, err := proto.FindInNeighborhood(buf, h, nil)
				again[i] = err != nil || !slices.Equal(found, candidates[i])
			}); err != nil {
				return err
			}
		}
		if err := b.addFenced(ctx, proto.ShardWordSize, word, idx.RKey, true, func(buf []byte) { g.after = proto.DecodeShardWord(buf) }); err != nil {
			return err
		}
	}
	if err := b.flush(ctx); err != nil {
		return err
	}
	for _, g := range groups {
		since := r.t.since(g.shard)
		if since == 0 || g.before != g.after || proto.ShardWordSince(g.before) != since {
			err := retryMoving(r.sc.name, "%s: %v's word read %#x then %#x, the map (epoch %d) says it owns the shard since %d",
				r.sc.name, g.shard, g.before, g.after, r.t.epoch, since)
			for _, i := range g.keys {
				r.retryKey(i, err)
			}
			continue
		}
		for _, i := range g.keys {
			if again[i] {
				r.retryKey(i, retry(r.sc.name, "the index of %q changed while its absence was checked", r.keys[i]))
				continue
			}
			r.state[i] = absent
		}
	}
	return nil
}

// readBatch gathers READs into the connection's buffer and posts them
// together: when the next one would not fit, or maxReadBatch are waiting,
// or at flush. Each READ's callback gets its bytes once the post
// completed; the bytes are the buffer's, valid until the next post. A
// connection has one, reused (its reads run one at a time).
type readBatch struct {
	sc   *serverConn
	off  int
	done []readDone // one per READ of the post, in order
}

// readDone is what takes a READ's bytes: then, or, for a cached
// location's record, cached.cachedRead of key.
type readDone struct {
	then   func([]byte)
	cached *keyReads
	key    int
}

func (sc *serverConn) batch() *readBatch {
	sc.wrs, sc.sges = sc.wrs[:0], sc.sges[:0]
	b := &sc.rb
	b.sc, b.off, b.done = sc, 0, b.done[:0]
	return b
}

func (b *readBatch) add(ctx context.Context, n int, raddr uint64, rkey uint32, then func([]byte)) error {
	return b.addRead(ctx, n, raddr, rkey, false, readDone{then: then})
}

// addFenced is add, with the READ fenced behind the READs before it in
// the post when fence is set (rdma.Fence): the target reads its memory
// only after theirs is read. A fenced READ is never the first of a post,
// so the batch is not flushed in front of it.
func (b *readBatch) addFenced(ctx context.Context, n int, raddr uint64, rkey uint32, fence bool, then func([]byte)) error {
	return b.addRead(ctx, n, raddr, rkey, fence, readDone{then: then})
}

// addRead adds a READ, its bytes for done.
func (b *readBatch) addRead(ctx context.Context, n int, raddr uint64, rkey uint32, fence bool, done readDone) error {
	sc := b.sc
	if err := sc.fits(n); err != nil {
		return err
	}
	size := len(sc.buf())
	if !fence && (b.off+n > size || len(b.done) >= maxReadBatch) {
		if err := b.flush(ctx); err != nil {
			return err
		}
	}
	if b.off+n > size {
		return fmt.Errorf("rkv: %d READs of up to %d bytes do not fit the client buffer (%d)", len(b.done)+1, n, size)
	}
	var flags rdma.SendFlags
	if fence {
		flags = rdma.Fence
	}
	sc.sges = append(sc.sges, rdma.SGE{MR: sc.mr, Offset: b.off, Length: n})
	sc.wrs = append(sc.wrs, rdma.SendWR{Op: rdma.OpRead, Flags: flags, RemoteAddr: raddr, RKey: rkey})
	b.done = append(b.done, done)
	b.off += n
	return nil
}

func (b *readBatch) flush(ctx context.Context) error {
	if len(b.done) == 0 {
		return nil
	}
	sc := b.sc
	for i := range sc.wrs {
		sc.wrs[i].SGL = sc.sges[i : i+1]
	}
	err := sc.postAll(ctx)
	if err == nil {
		buf := sc.buf()
		for i, d := range b.done {
			g := sc.sges[i]
			if d.then != nil {
				d.then(buf[g.Offset : g.Offset+g.Length])
			} else {
				d.cached.cachedRead(d.key, buf[g.Offset:g.Offset+g.Length])
			}
		}
	}
	clear(b.done) // the callbacks hold the read's state
	sc.wrs, sc.sges, b.done, b.off = sc.wrs[:0], sc.sges[:0], b.done[:0], 0
	return err
}
