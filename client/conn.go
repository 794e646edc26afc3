// One server's connection: control TCP, a QP, a registered buffer, a lease.

package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// serverConn is one connection to a server. Its pool hands it to one
// request at a time; mu still serializes that request with close.
type serverConn struct {
	c    *Client
	name string

	mu     chanMutex
	closed bool
	// The buffer lives as long as the serverConn: only the connection is
	// rebuilt.
	mem *rdma.Memory
	mr  rdma.MR
	// The connection, nil while down.
	nc     net.Conn
	cq     rdma.CQ
	qp     rdma.QP
	gen    uint64 // the server's generation, from its HelloReply
	nextID uint64
	rbuf   []byte
	wc     [1]rdma.Completion
	lease  *clientLease
}

// chanMutex is a mutex whose Lock respects a context.
type chanMutex struct{ ch chan struct{} }

type clientLease struct {
	proto.LeaseReply
	expires time.Time // local clock, with a margin
	off     uint64
	version uint64
}

func (sc *serverConn) lock(ctx context.Context) error {
	select {
	case sc.mu.ch <- struct{}{}:
		if sc.closed {
			<-sc.mu.ch
			return ErrClosed
		}
		return nil
	case <-ctx.Done():
		return retry("waiting for the connection to %s: %w", sc.name, ctx.Err())
	}
}

func (sc *serverConn) unlock() { <-sc.mu.ch }

func (sc *serverConn) close() error {
	sc.mu.ch <- struct{}{}
	defer sc.unlock()
	sc.closed = true
	sc.drop()
	var errs []error
	if sc.mr != nil {
		errs = append(errs, sc.mr.Deregister())
	}
	if sc.mem != nil {
		errs = append(errs, sc.mem.Close())
	}
	return errors.Join(errs...)
}

// drop tears the connection down; the next request redials.
func (sc *serverConn) drop() {
	if sc.nc != nil {
		sc.nc.Close() // the server ends our leases
	}
	if sc.qp != nil {
		_ = sc.qp.Close()
	}
	if sc.cq != nil {
		_ = sc.cq.Close()
	}
	sc.nc, sc.qp, sc.cq, sc.lease = nil, nil, nil, nil
}

// ready makes sure a connection to the server of generation m.Meta.Generation
// is up.
func (sc *serverConn) ready(ctx context.Context, m membership.Member) error {
	if m.Meta.Index == nil {
		return retry("server %s has not advertised its index yet", sc.name)
	}
	if sc.nc != nil && sc.gen != m.Meta.Generation {
		if sc.gen > m.Meta.Generation {
			// The server restarted and our view has not caught up:
			// its rkeys are not known yet.
			return retry("server %s is at generation %d, the view still shows %d", sc.name, sc.gen, m.Meta.Generation)
		}
		sc.c.log.Info("server restarted: reconnecting", "server", sc.name, "old_generation", sc.gen, "generation", m.Meta.Generation)
		sc.drop()
	}
	if sc.nc != nil {
		return nil
	}
	c := sc.c
	var err error
	if sc.mem == nil {
		if sc.mem, err = rdma.Alloc(c.cfg.BufferSize); err != nil {
			return fmt.Errorf("rkv: client buffer: %w", err)
		}
		if sc.mr, err = c.pd.Register(sc.mem.Bytes(), rdma.AccessLocalWrite); err != nil {
			_ = sc.mem.Close()
			sc.mem = nil
			return fmt.Errorf("rkv: registering the client buffer: %w", err)
		}
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nc, err := c.dialControl(dctx, m.Meta.ControlAddr)
	if err != nil {
		if refused := tlsRefusal(sc.name, err); refused != err {
			return refused
		}
		return retry("dialing %s at %s: %w", sc.name, m.Meta.ControlAddr, err)
	}
	sc.nc = nc
	// Hello first: the server creates a QP on its PD only for a client
	// that has authenticated.
	sc.gen = 0
	r, err := sc.rpc(ctx, &proto.Hello{Client: c.ml.Name(), Token: []byte(c.cfg.AuthToken)})
	if err != nil {
		sc.drop()
		return tlsRefusal(sc.name, err)
	}
	sc.gen = r.(*proto.HelloReply).Generation
	qcfg := c.cfg.QP
	if sc.cq, err = c.dev.CreateCQ(2 * multiGetBatch); err != nil {
		sc.drop()
		return err
	}
	qcfg.SendCQ, qcfg.RecvCQ = sc.cq, sc.cq
	if sc.qp, err = c.pd.CreateQP(qcfg); err != nil {
		sc.drop()
		return err
	}
	if _, err := rdma.ConnectQP(dctx, nc, sc.qp); err != nil {
		sc.drop()
		return retry("connecting a QP to %s: %w", sc.name, err)
	}
	c.log.Debug("connected", "server", sc.name, "generation", sc.gen)
	if sc.gen != m.Meta.Generation {
		return retry("server %s answered with generation %d, the view shows %d", sc.name, sc.gen, m.Meta.Generation)
	}
	return nil
}

// call runs one control request on the server's connection.
func (sc *serverConn) call(ctx context.Context, m membership.Member, req proto.Message) (proto.Message, error) {
	if err := sc.lock(ctx); err != nil {
		return nil, err
	}
	defer sc.unlock()
	if err := sc.ready(ctx, m); err != nil {
		return nil, err
	}
	return sc.rpc(ctx, req)
}

// rpc sends req and reads its reply; a server Error becomes a typed error.
func (sc *serverConn) rpc(ctx context.Context, req proto.Message) (proto.Message, error) {
	sc.nextID++
	id := sc.nextID
	if d, ok := ctx.Deadline(); ok {
		_ = sc.nc.SetDeadline(d)
	} else {
		_ = sc.nc.SetDeadline(time.Now().Add(30 * time.Second))
	}
	if err := proto.WriteFrame(sc.nc, id, req); err != nil {
		sc.drop()
		return nil, retry("%v to %s: %w", req.Type(), sc.name, err)
	}
	rid, reply, b, err := proto.ReadFrame(sc.nc, sc.rbuf)
	sc.rbuf = b
	if err != nil {
		sc.drop()
		return nil, retry("%v to %s: reading the reply: %w", req.Type(), sc.name, err)
	}
	if e, ok := reply.(*proto.Error); ok && rid == 0 {
		sc.drop() // the server refused the connection, saying why
		return nil, serverError(sc.name, req.Type(), e)
	}
	if rid != id {
		sc.drop()
		return nil, retry("%v to %s: reply to request %d, want %d", req.Type(), sc.name, rid, id)
	}
	if e, ok := reply.(*proto.Error); ok {
		return nil, serverError(sc.name, req.Type(), e)
	}
	if !replyMatches(req.Type(), reply.Type()) {
		sc.drop()
		return nil, fmt.Errorf("rkv: %v to %s answered with %v", req.Type(), sc.name, reply.Type())
	}
	return reply, nil
}

func replyMatches(req, reply proto.MsgType) bool {
	switch req {
	case proto.MsgHello:
		return reply == proto.MsgHelloReply
	case proto.MsgGrantLease:
		return reply == proto.MsgLeaseReply
	case proto.MsgCommit:
		return reply == proto.MsgCommitReply
	case proto.MsgDelete, proto.MsgEndLease:
		return reply == proto.MsgAck
	case proto.MsgScan:
		return reply == proto.MsgScanReply
	case proto.MsgStats:
		return reply == proto.MsgStatsReply
	}
	return false
}

func serverError(node string, req proto.MsgType, e *proto.Error) error {
	var kind error
	switch e.Code {
	case proto.CodeNotFound:
		kind = ErrNotFound
	case proto.CodeLeaseInvalid:
		return retry("%v on %s: %w", req, node, e) // a new lease, from a fresh view
	case proto.CodeRecordInvalid, proto.CodeBadRequest:
		kind = ErrInvalid
	case proto.CodeFull, proto.CodeIndexFull:
		kind = ErrFull
	case proto.CodeUnauthenticated:
		kind = ErrUnauthenticated
	default:
		return fmt.Errorf("rkv: %v on %s: %w", req, node, e)
	}
	return fmt.Errorf("%w: %v on %s: %w", kind, req, node, e)
}

// post runs one signaled work request on [off, off+n) of the buffer and
// waits for it. A failure drops the connection (the QP is in ERR).
func (sc *serverConn) post(ctx context.Context, op rdma.Opcode, off, n int, raddr uint64, rkey uint32) error {
	wr := [1]rdma.SendWR{{Op: op, Flags: rdma.Signaled, SGL: []rdma.SGE{{MR: sc.mr, Offset: off, Length: n}}, RemoteAddr: raddr, RKey: rkey}}
	if op == rdma.OpRead {
		sc.c.reads.Add(1)
	}
	if err := sc.qp.PostSend(wr[:]); err != nil {
		sc.drop()
		return retry("%v to %s: %w", op, sc.name, err)
	}
	if _, err := sc.cq.Wait(ctx, sc.wc[:]); err != nil {
		sc.drop() // the buffer may still be the NIC's: the QP goes
		return retry("%v to %s: %w", op, sc.name, err)
	}
	if err := sc.wc[0].Err(); err != nil {
		sc.drop()
		what := "connection lost"
		if sc.wc[0].Status == rdma.StatusRemAccessErr {
			what = "rkey refused (server restarted or lease revoked)"
		}
		return retry("%v to %s: %s: %w", op, sc.name, what, err)
	}
	return nil
}

// get reads key one-sidedly.
func (sc *serverConn) get(ctx context.Context, m membership.Member, key []byte) ([]byte, error) {
	if err := sc.lock(ctx); err != nil {
		return nil, err
	}
	defer sc.unlock()
	if err := sc.ready(ctx, m); err != nil {
		return nil, err
	}
	meta := &m.Meta
	buf := sc.mem.Bytes()
	geo := meta.Index.Geometry
	nb := geo.NeighborhoodBytes()
	readRecord := func(loc proto.Location) ([]byte, error) {
		a, ok := arenaOf(meta, loc.Arena)
		if !ok {
			return nil, retry("arena %d of %s is not in the view yet", loc.Arena, sc.name)
		}
		if int(loc.Length) > len(buf)-nb || loc.Offset+uint64(loc.Length) > a.Length {
			return nil, retry("record at %+v does not fit the buffer or arena", loc)
		}
		if err := sc.post(ctx, rdma.OpRead, nb, int(loc.Length), a.Addr+loc.Offset, a.RKey); err != nil {
			return nil, err
		}
		r, err := proto.VerifyRecord(buf[nb:nb+int(loc.Length)], key, 0)
		if err != nil {
			return nil, err
		}
		return append([]byte(nil), r.Value...), nil
	}
	// A cache hit is one READ.
	if cl, ok := sc.c.cacheGet(key); ok {
		if cl.node == sc.name && cl.gen == sc.gen {
			v, err := readRecord(cl.loc)
			if err == nil {
				return v, nil
			}
			var r *retryable
			if errors.As(err, &r) && sc.nc == nil {
				return nil, err // the connection broke
			}
		}
		sc.c.cacheDrop(key)
	}
	h := geo.Hash(key)
	if err := sc.post(ctx, rdma.OpRead, 0, nb, meta.Index.Addr+uint64(geo.NeighborhoodOffset(geo.Home(h))), meta.Index.RKey); err != nil {
		return nil, err
	}
	var locs [4]proto.Location
	found, err := proto.FindInNeighborhood(buf[:nb], h, locs[:0])
	if err != nil {
		return nil, retry("torn index neighborhood: %w", err)
	}
	for _, loc := range found {
		v, err := readRecord(loc)
		if errors.Is(err, proto.ErrStaleRecord) && len(found) > 1 {
			continue // a fingerprint collision with another key
		}
		if errors.Is(err, proto.ErrBadRecord) || errors.Is(err, proto.ErrStaleRecord) {
			return nil, retry("record of %q at %+v: %w", key, loc, err)
		}
		if err != nil {
			return nil, err
		}
		sc.c.cachePut(key, cachedLoc{node: sc.name, gen: sc.gen, loc: loc})
		return v, nil
	}
	return nil, ErrNotFound
}

// put writes the record into the lease and commits it.
func (sc *serverConn) put(ctx context.Context, m membership.Member, key, value []byte) error {
	if err := sc.lock(ctx); err != nil {
		return err
	}
	defer sc.unlock()
	if err := sc.ready(ctx, m); err != nil {
		return err
	}
	size := uint64(proto.RecordSize(len(key), len(value)))
	l := sc.lease
	if l != nil && (time.Now().After(l.expires) || l.off+size > l.Size || l.version >= l.VersionBase+l.VersionCount) {
		_, _ = sc.rpc(ctx, &proto.EndLease{ID: l.ID})
		sc.lease, l = nil, nil
		if sc.nc == nil {
			return retry("ending a lease on %s: connection lost", sc.name)
		}
	}
	if l == nil {
		r, err := sc.rpc(ctx, &proto.GrantLease{})
		if err != nil {
			return err
		}
		lr := r.(*proto.LeaseReply)
		l = &clientLease{LeaseReply: *lr, expires: time.Now().Add(lr.TTL * 9 / 10), version: lr.VersionBase}
		sc.lease = l
		if size > l.Size {
			return fmt.Errorf("%w: a record of %d bytes exceeds a %d-byte lease", ErrTooLarge, size, l.Size)
		}
	}
	n, err := proto.EncodeRecord(sc.mem.Bytes(), l.version, 0, key, value)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrTooLarge, err)
	}
	if err := sc.post(ctx, rdma.OpWrite, 0, n, l.Addr+l.off, l.RKey); err != nil {
		return err
	}
	off := l.off
	l.off += uint64(n)
	l.version++
	r, err := sc.rpc(ctx, &proto.Commit{LeaseID: l.ID, Offset: off, Length: uint64(n)})
	if err != nil {
		sc.lease = nil // whatever happened, start a fresh lease
		return err
	}
	cr := r.(*proto.CommitReply)
	sc.c.cachePut(key, cachedLoc{node: sc.name, gen: sc.gen, loc: proto.Location{Arena: cr.Arena, Offset: cr.Offset, Length: cr.Length}})
	return nil
}

// postBatch posts wrs (reads into the buffer) with only the last one
// signaled and waits for it: on an RC QP its completion means every
// earlier request has completed too. A failure drops the connection.
func (sc *serverConn) postBatch(ctx context.Context, wrs []rdma.SendWR) error {
	for i := range wrs {
		wrs[i].ID, wrs[i].Flags = uint64(i), 0
	}
	wrs[len(wrs)-1].Flags = rdma.Signaled
	sc.c.reads.Add(uint64(len(wrs)))
	if err := sc.qp.PostSend(wrs); err != nil {
		sc.drop()
		return retry("batch of %d READs to %s: %w", len(wrs), sc.name, err)
	}
	if _, err := sc.cq.Wait(ctx, sc.wc[:]); err != nil {
		sc.drop()
		return retry("batch of %d READs to %s: %w", len(wrs), sc.name, err)
	}
	if err := sc.wc[0].Err(); err != nil {
		sc.drop()
		return retry("batch of %d READs to %s: %w", len(wrs), sc.name, err)
	}
	return nil
}

// multiGet resolves keys on this server in batches: one post of index
// neighborhood READs, then one of record READs. It returns the values
// (nil for absent keys) and the positions of the keys it could not settle
// in a batch (torn or stale reads, fingerprint collisions, records too
// large for the buffer), which the caller resolves one by one.
func (sc *serverConn) multiGet(ctx context.Context, m membership.Member, keys [][]byte) (vals [][]byte, single []int, err error) {
	if err := sc.lock(ctx); err != nil {
		return nil, nil, err
	}
	defer sc.unlock()
	if err := sc.ready(ctx, m); err != nil {
		return nil, nil, err
	}
	meta := &m.Meta
	geo := meta.Index.Geometry
	nb := geo.NeighborhoodBytes()
	buf := sc.mem.Bytes()
	batch := min(multiGetBatch, len(buf)/2/nb)
	vals = make([][]byte, len(keys))
	wrs := make([]rdma.SendWR, 0, batch)
	sges := make([]rdma.SGE, batch)
	locs := make([]proto.Location, batch)
	var scratch [4]proto.Location
	for start := 0; start < len(keys); start += batch {
		chunk := keys[start:min(start+batch, len(keys))]
		wrs = wrs[:0]
		hashes := make([]uint64, len(chunk))
		cached := make([]bool, len(chunk))
		for i, k := range chunk {
			// A cached location skips the index, as in get.
			if cl, ok := sc.c.cacheGet(k); ok && cl.node == sc.name && cl.gen == sc.gen {
				locs[i], cached[i] = cl.loc, true
				continue
			}
			hashes[i] = geo.Hash(k)
			sges[i] = rdma.SGE{MR: sc.mr, Offset: i * nb, Length: nb}
			wrs = append(wrs, rdma.SendWR{Op: rdma.OpRead, SGL: sges[i : i+1],
				RemoteAddr: meta.Index.Addr + uint64(geo.NeighborhoodOffset(geo.Home(hashes[i]))), RKey: meta.Index.RKey})
		}
		if len(wrs) > 0 {
			if err := sc.postBatch(ctx, wrs); err != nil {
				return nil, nil, err
			}
		}
		// Records go after the neighborhoods, as long as they fit.
		wrs = wrs[:0]
		var pending []int // chunk positions with a record READ posted
		off := len(chunk) * nb
		for i := range chunk {
			loc := locs[i]
			if !cached[i] {
				found, err := proto.FindInNeighborhood(buf[i*nb:(i+1)*nb], hashes[i], scratch[:0])
				switch {
				case err != nil || len(found) > 1:
					single = append(single, start+i)
					continue
				case len(found) == 0:
					continue // absent
				}
				loc = found[0]
			}
			a, ok := arenaOf(meta, loc.Arena)
			if !ok || off+int(loc.Length) > len(buf) || loc.Offset+uint64(loc.Length) > a.Length {
				single = append(single, start+i)
				continue
			}
			locs[i] = loc
			sges[i] = rdma.SGE{MR: sc.mr, Offset: off, Length: int(loc.Length)}
			wrs = append(wrs, rdma.SendWR{Op: rdma.OpRead, SGL: sges[i : i+1], RemoteAddr: a.Addr + loc.Offset, RKey: a.RKey})
			pending = append(pending, i)
			off += int(loc.Length)
		}
		if len(wrs) == 0 {
			continue
		}
		if err := sc.postBatch(ctx, wrs); err != nil {
			return nil, nil, err
		}
		for _, i := range pending {
			r, err := proto.VerifyRecord(buf[sges[i].Offset:sges[i].Offset+sges[i].Length], chunk[i], 0)
			if err != nil {
				if cached[i] {
					sc.c.cacheDrop(chunk[i]) // superseded or deleted: get reads the index
				}
				single = append(single, start+i)
				continue
			}
			vals[start+i] = append([]byte{}, r.Value...) // non-nil: present, maybe empty
			sc.c.cachePut(chunk[i], cachedLoc{node: sc.name, gen: sc.gen, loc: locs[i]})
		}
	}
	return vals, single, nil
}

// multiGetBatch is how many keys share one post: well within the QP's
// send queue and the CQ.
const multiGetBatch = 64

func arenaOf(meta *proto.NodeMeta, id uint16) (proto.ArenaRegion, bool) {
	for _, a := range meta.Arenas {
		if a.ID == id {
			return a, true
		}
	}
	return proto.ArenaRegion{}, false
}
