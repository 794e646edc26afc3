// The one read path: Get, MultiGet and Scan's values all resolve keys here, one-sidedly.

package client

import (
	"context"
	"errors"
	"fmt"

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
//  3. No record of the key: READ the shard's word in the index region. If
//     it is the epoch since which the map says the server owns the shard,
//     the key is absent; otherwise the map is behind (or the server's
//     is): refresh and retry.
//
// Each step posts the READs of every key that needs it together, in
// batches that fit the buffer. It returns one value per key (nil: absent;
// a present empty value is non-nil), or a retryable error when any key
// needs another attempt.
func (sc *serverConn) read(ctx context.Context, t target, keys [][]byte) ([][]byte, error) {
	if err := sc.lock(ctx); err != nil {
		return nil, err
	}
	defer sc.unlock()
	if err := sc.ready(ctx, t.member); err != nil {
		return nil, err
	}
	r := &keyReads{sc: sc, t: t, keys: keys, vals: make([][]byte, len(keys)), state: make([]readState, len(keys))}
	for _, step := range []func(context.Context) error{r.cached, r.indexed, r.misses} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	return r.vals, nil
}

// readState is where one key's resolution stands.
type readState uint8

const (
	unresolved readState = iota
	found
	missing // no record of the key in the index: ask the shard word
	absent
)

// keyReads is one call of read.
type keyReads struct {
	sc    *serverConn
	t     target
	keys  [][]byte
	vals  [][]byte
	state []readState
}

func (r *keyReads) meta() *proto.NodeMeta { return &r.t.member.Meta }

// cached READs the records of keys with a cached location.
func (r *keyReads) cached(ctx context.Context) error {
	b := r.sc.batch()
	for i, k := range r.keys {
		cl, ok := r.sc.c.cacheGet(k)
		if !ok || cl.node != r.sc.name || cl.gen != r.sc.gen {
			continue
		}
		if err := r.record(ctx, b, i, cl.loc, func(rec proto.Record, err error) {
			if err == nil {
				r.vals[i], r.state[i] = append([]byte{}, rec.Value...), found
				return
			}
			r.sc.c.cacheDrop(k) // superseded, deleted or moved: the index knows
		}); err != nil {
			return err
		}
	}
	return b.flush(ctx)
}

// record adds a READ of the record at loc to b, calling then with its
// verification once it arrived; a location outside the advertised arenas
// (an arena not in the view yet) is a retry.
func (r *keyReads) record(ctx context.Context, b *readBatch, i int, loc proto.Location, then func(proto.Record, error)) error {
	a, ok := arenaOf(r.meta(), loc.Arena)
	if !ok || loc.Offset+uint64(loc.Length) > a.Length {
		return retry(r.sc.name, "record of %q at %+v: arena %d of %s is not in the view yet", r.keys[i], loc, loc.Arena, r.sc.name)
	}
	return b.add(ctx, int(loc.Length), a.Addr+loc.Offset, a.RKey, func(buf []byte) {
		then(proto.VerifyRecord(buf, r.keys[i], 0))
	})
}

// indexed reads the neighborhoods of the unresolved keys, then every
// candidate record.
func (r *keyReads) indexed(ctx context.Context) error {
	idx := r.meta().Index
	geo := idx.Geometry
	nb := geo.NeighborhoodBytes()
	candidates := make([][]proto.Location, len(r.keys))
	var torn error
	b := r.sc.batch()
	for i, k := range r.keys {
		if r.state[i] != unresolved {
			continue
		}
		h := geo.Hash(k)
		if err := b.add(ctx, nb, idx.Addr+uint64(geo.NeighborhoodOffset(geo.Home(h))), idx.RKey, func(buf []byte) {
			found, err := proto.FindInNeighborhood(buf, h, nil)
			if err != nil && torn == nil {
				torn = retry(r.sc.name, "torn index neighborhood of %q: %w", k, err)
			}
			candidates[i] = found
		}); err != nil {
			return err
		}
	}
	if err := b.flush(ctx); err != nil {
		return err
	}
	if torn != nil {
		return torn
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
					r.sc.c.cachePut(r.keys[i], cachedLoc{node: r.sc.name, gen: r.sc.gen, loc: loc})
				case errors.Is(err, proto.ErrOtherKey):
					// A fingerprint collision: not this key's.
				default:
					stale[i] = retry(r.sc.name, "record of %q at %+v: %w", r.keys[i], loc, err)
				}
			}); err != nil {
				return err
			}
		}
	}
	if err := b.flush(ctx); err != nil {
		return err
	}
	for i := range r.keys {
		if r.state[i] == missing && stale[i] != nil {
			// A record of the key was there but torn or superseded: the
			// key may well exist.
			return stale[i]
		}
	}
	return nil
}

// misses READs the shard word of each missing key's shard: a miss is an
// answer only from the shard's owner at the map's epoch.
func (r *keyReads) misses(ctx context.Context) error {
	idx := r.meta().Index
	words := map[proto.Shard]uint64{}
	b := r.sc.batch()
	for i, k := range r.keys {
		if r.state[i] != missing {
			continue
		}
		s := proto.ShardOf(k)
		if _, ok := words[s]; ok {
			continue
		}
		words[s] = 0
		if err := b.add(ctx, proto.ShardWordSize, idx.Addr+uint64(idx.Geometry.ShardWordOffset(s)), idx.RKey, func(buf []byte) {
			words[s] = proto.DecodeShardWord(buf)
		}); err != nil {
			return err
		}
	}
	if err := b.flush(ctx); err != nil {
		return err
	}
	for i, k := range r.keys {
		if r.state[i] != missing {
			continue
		}
		s := proto.ShardOf(k)
		since := r.t.since(s)
		if w := words[s]; since == 0 || w != since {
			return retryWithMap(r.sc.name, newerMap, "%s: shard %d's word is %d, the map (epoch %d) says it owns the shard since %d", r.sc.name, s, w, r.t.epoch, since)
		}
		r.state[i] = absent
	}
	return nil
}

// readBatch gathers READs into the connection's buffer and posts them
// together: when the next one would not fit, or maxReadBatch are waiting,
// or at flush. Each READ's callback gets its bytes once the post
// completed; the bytes are the buffer's, valid until the next post.
type readBatch struct {
	sc   *serverConn
	off  int
	then []func([]byte)
}

func (sc *serverConn) batch() *readBatch {
	sc.wrs, sc.sges = sc.wrs[:0], sc.sges[:0]
	return &readBatch{sc: sc}
}

func (b *readBatch) add(ctx context.Context, n int, raddr uint64, rkey uint32, then func([]byte)) error {
	sc := b.sc
	size := len(sc.mem.Bytes())
	if n > size {
		return fmt.Errorf("%w: a record of %d bytes does not fit the client buffer (%d)", ErrTooLarge, n, size)
	}
	if b.off+n > size || len(b.then) == maxReadBatch {
		if err := b.flush(ctx); err != nil {
			return err
		}
	}
	sc.sges = append(sc.sges, rdma.SGE{MR: sc.mr, Offset: b.off, Length: n})
	sc.wrs = append(sc.wrs, rdma.SendWR{Op: rdma.OpRead, RemoteAddr: raddr, RKey: rkey})
	b.then = append(b.then, then)
	b.off += n
	return nil
}

func (b *readBatch) flush(ctx context.Context) error {
	if len(b.then) == 0 {
		return nil
	}
	sc := b.sc
	for i := range sc.wrs {
		sc.wrs[i].SGL = sc.sges[i : i+1]
	}
	err := sc.postAll(ctx)
	if err == nil {
		buf := sc.mem.Bytes()
		for i, then := range b.then {
			g := sc.sges[i]
			then(buf[g.Offset : g.Offset+g.Length])
		}
	}
	sc.wrs, sc.sges, b.then, b.off = sc.wrs[:0], sc.sges[:0], b.then[:0], 0
	return err
}

func arenaOf(meta *proto.NodeMeta, id uint16) (proto.ArenaRegion, bool) {
	for _, a := range meta.Arenas {
		if a.ID == id {
			return a, true
		}
	}
	return proto.ArenaRegion{}, false
}
