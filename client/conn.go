// One server's connection: a control session, its QPs, a registered buffer, a write lease.

package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rkv-io/rkv/internal/session"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// serverConn is one connection to a server. Its pool hands it to one
// request at a time; mu still serializes that request with close.
type serverConn struct {
	c    *Client
	name string
	node uint64 // name's xxhash, as the location cache names servers
	lane int    // of the pool's lanes (serverPool), for its read QP's

	mu     chanMutex
	closed bool
	// The buffer lives as long as the serverConn: only the session is
	// rebuilt.
	mem *rdma.Memory
	mr  rdma.MR
	s   *session.Conn // nil while down
	gen uint64        // the server's generation, from its HelloReply
	wc  [2]rdma.Completion
	// The last commit sent on the write QP: its request ID, and its frame
	// before it is copied to its slot (qpcommit.go); then the reply it was
	// answered with, decoded into the same message each time.
	qpSeq      uint64
	frame      []byte
	commit     proto.Commit
	reply      proto.CommitReply
	posted     rdma.Opcode // the first request of the last postOnly, for errors
	commitSGEs [2]rdma.SGE // the reply's RECV, the commit's SEND
	recv       [1]rdma.RecvWR
	// Scratch for posts of READs, and for one read's key states.
	wrs   []rdma.SendWR
	sges  []rdma.SGE
	reads keyReads
	rb    readBatch // reads' READs, reused
	one   [1][]byte // a GET's key, as read's keys
	lease *clientLease
	// leaseAsk is the size of the next lease to ask for: small at first,
	// so a short-lived writer holds little, and doubled each time a lease
	// is used up, so a bulk writer soon takes the server's largest.
	leaseAsk uint64
	// readLease is how long reads of the server are trusted, when the
	// map has more than one replica (readlease.go).
	readLease readLease
}

// Lease sizes the client asks for: the first, and the most (the server
// grants at most its own largest).
const (
	firstLeaseAsk = 16 << 10
	maxLeaseAsk   = 64 << 20
)

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
		return retry(sc.name, "waiting for the connection to %s: %w", sc.name, ctx.Err())
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

// drop tears the session down (the server ends its leases); the next
// request redials.
func (sc *serverConn) drop() {
	if sc.s != nil {
		_ = sc.s.Close()
	}
	sc.s, sc.lease = nil, nil
}

// ready makes sure a session to the server of generation
// mb.Meta.Generation is up.
func (sc *serverConn) ready(ctx context.Context, mb *membership.Member) error {
	if mb.Meta.Index == nil {
		return retryStale(sc.name, "server %s has not advertised its index yet", sc.name)
	}
	if sc.s != nil && sc.gen != mb.Meta.Generation {
		if sc.gen > mb.Meta.Generation {
			// The server restarted and our view has not caught up:
			// its rkeys are not known yet.
			return retryStale(sc.name, "server %s is at generation %d, the view still shows %d", sc.name, sc.gen, mb.Meta.Generation)
		}
		sc.c.log.Info("server restarted: reconnecting", "server", sc.name, "old_generation", sc.gen, "generation", mb.Meta.Generation)
		sc.drop()
	}
	if sc.s != nil {
		return nil
	}
	c := sc.c
	var err error
	want := max(c.cfg.BufferSize, proto.RecordSize(int(mb.Meta.Limits.MaxKeyLen), int(mb.Meta.Limits.MaxValueLen)))
	if sc.mem != nil && len(sc.buf()) < want { // the server restarted taking larger records
		_ = sc.mr.Deregister()
		_ = sc.mem.Close()
		sc.mem = nil
	}
	if sc.mem == nil {
		if sc.mem, err = rdma.Alloc(want + commitSlots*proto.CommitSlotSize); err != nil {
			return fmt.Errorf("rkv: client buffer: %w", err)
		}
		if sc.mr, err = c.pd.Register(sc.mem.Bytes(), rdma.AccessLocalWrite); err != nil {
			_ = sc.mem.Close()
			sc.mem = nil
			return fmt.Errorf("rkv: registering the client buffer: %w", err)
		}
	}
	s, err := session.Dial(ctx, mb.Meta.ControlAddr, mb.Meta.ServerID, session.Config{
		Name: c.name, Token: []byte(c.cfg.AuthToken), Kind: proto.SessionClient, TLS: c.cfg.TLS,
		Device: c.dev, PD: c.pd, QP: rdma.QPConfig{AckTimeout: c.cfg.AckTimeout, RetryCount: c.cfg.RetryCount, Lane: sc.readLane()},
		CQSize: 2 * maxReadBatch,
	})
	switch {
	case errors.Is(err, session.ErrRefused):
		return fmt.Errorf("%w: %w", ErrUnauthenticated, err)
	case err != nil:
		return retryLost(sc.name, "connecting to %s at %s: %w", sc.name, mb.Meta.ControlAddr, err)
	}
	sc.s, sc.gen = s, s.Hello.Generation
	sc.readLease = readLease{} // a lease is the process's: a new session asks afresh
	c.log.Debug("connected", "server", sc.name, "generation", sc.gen)
	if sc.gen != mb.Meta.Generation {
		return retryStale(sc.name, "server %s answered with generation %d, the view shows %d", sc.name, sc.gen, mb.Meta.Generation)
	}
	return nil
}

// call runs one control request on the server's connection.
func (sc *serverConn) call(ctx context.Context, mb *membership.Member, req proto.Message) (proto.Message, error) {
	if err := sc.lock(ctx); err != nil {
		return nil, err
	}
	defer sc.unlock()
	if err := sc.ready(ctx, mb); err != nil {
		return nil, err
	}
	return sc.rpc(ctx, req)
}

// rpc sends req and reads its reply on the session; a server Error becomes
// a typed error, a broken session is dropped and retried.
func (sc *serverConn) rpc(ctx context.Context, req proto.Message) (proto.Message, error) {
	r, err := sc.s.Call(ctx, req)
	if err == nil {
		return r, nil
	}
	var pe *proto.Error
	if errors.Is(err, session.ErrBroken) {
		sc.drop()
		if errors.As(err, &pe) {
			return nil, serverError(sc.name, req.Type(), pe) // the server refused the session, saying why
		}
		return nil, retryLost(sc.name, "%w", err)
	}
	if errors.As(err, &pe) {
		return nil, serverError(sc.name, req.Type(), pe)
	}
	return nil, err
}

// serverError is a server's Error as the client's error for it.
func serverError(node string, req proto.MsgType, e *proto.Error) error {
	var kind error
	switch e.Code {
	case proto.CodeNotFound:
		kind = ErrNotFound
	case proto.CodeLeaseInvalid:
		return retry(node, "%v on %s: %w", req, node, e) // a new lease, from a fresh view
	case proto.CodeNotOwner, proto.CodeShardMoving:
		// The server's map is newer than ours, or a move of the shard is
		// in its last copy: refresh, and retry in a moment.
		return retryMoving(node, "%v on %s: %w", req, node, e)
	case proto.CodeUnavailable:
		return retry(node, "%v on %s: %w", req, node, e)
	case proto.CodeRecordInvalid, proto.CodeBadRequest, proto.CodeSuperseded:
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

// put writes the record into the lease and commits it; of a key whose
// shard has backups, it writes the same record into a lease on each (a
// copy) and names them in the commit, for the primary to forward.
func (sc *serverConn) put(ctx context.Context, t *target, key, value []byte, w proto.Write) error {
	if err := sc.lock(ctx); err != nil {
		return err
	}
	defer sc.unlock()
	if err := sc.ready(ctx, t.member); err != nil {
		return err
	}
	if err := checkLimits(sc.name, t.member.Meta.Limits, key, value); err != nil {
		return err
	}
	size := uint64(proto.RecordSize(len(key), len(value)))
	l, err := sc.leaseFor(ctx, t, size)
	if err != nil {
		return err
	}
	n, err := proto.EncodeRecord(sc.buf(), l.version, 0, key, value)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrTooLarge, err)
	}
	// The copies for the backups, if the shard has any, are posted first
	// and not waited for: the commit follows at once (postCopies).
	var copies []proto.ReplicaCopy
	finishCopies := func() {}
	if sh := proto.ShardOf(key); t.m.Holders(sh) > 1 {
		if copies, finishCopies, err = sc.c.postCopies(ctx, t, sh, sc.buf()[:n]); err != nil {
			return err
		}
	}
	defer finishCopies()
	off := l.off
	l.off += uint64(n)
	l.version++
	sc.commit = proto.Commit{LeaseID: l.ID, Offset: off, Length: uint64(n), Epoch: t.epoch, Write: w, Copies: copies}
	commit := &sc.commit // the connection's: a Message of its own would be an allocation per PUT
	// With a commit on the write QP the WRITE is not waited for: the
	// commit's SEND follows it on the QP, in the same post, and RC
	// delivers them in order.
	var r proto.Message
	sent := false
	if sc.s.Hello.CommitSlot > 0 {
		sc.sges = append(sc.sges[:0], rdma.SGE{MR: sc.mr, Length: n})
		r, sent, err = sc.commitOnQP(ctx, commit, &rdma.SendWR{Op: rdma.OpWrite, SGL: sc.sges[:1], RemoteAddr: l.Addr + off, RKey: l.RKey})
	}
	if !sent && err == nil {
		// A control request, once the WRITE completed.
		err = sc.post(ctx, rdma.OpWrite, 0, n, l.Addr+off, l.RKey)
	}
	if !sent && err == nil {
		r, err = sc.rpc(ctx, commit)
	}
	if err != nil {
		var pe *proto.Error
		if errors.As(err, &pe) && (pe.Code == proto.CodeShardMoving || pe.Code == proto.CodeNotOwner) {
			// Refused before it took anything of the lease: the next
			// attempt here writes over the same bytes, so retries that
			// wait out a move do not spend a lease each.
			l.off, l.version = off, l.version-1
		} else {
			sc.lease = nil // whatever else happened, start a fresh lease
		}
		return err
	}
	if cr := r.(*proto.CommitReply); cr.Length != 0 {
		sc.c.cachePut(key, sc.located(proto.Location{Arena: cr.Arena, Offset: cr.Offset, Length: cr.Length}))
	} else {
		sc.c.cacheDrop(key) // a retry answered from the first attempt, since superseded
	}
	return nil
}

// leaseFor returns the connection's lease with room for a record of size
// bytes (and a version), ending the current one and taking a new one when
// it has none.
func (sc *serverConn) leaseFor(ctx context.Context, t *target, size uint64) (*clientLease, error) {
	if size > uint64(len(sc.buf())) {
		return nil, fmt.Errorf("%w: a record of %d bytes exceeds the client buffer (%d)", ErrTooLarge, size, len(sc.buf()))
	}
	l := sc.lease
	if l != nil && (time.Now().After(l.expires) || l.off+size > l.Size || l.version >= l.VersionBase+l.VersionCount) {
		if time.Now().After(l.expires) {
			sc.leaseAsk = max(firstLeaseAsk, 2*l.off) // what this writer writes in a lease's life
		} else {
			sc.leaseAsk = min(2*l.Size, maxLeaseAsk)
		}
		_, _ = sc.rpc(ctx, &proto.EndLease{ID: l.ID})
		sc.lease, l = nil, nil
		if sc.s == nil {
			return nil, retry(sc.name, "ending a lease on %s: connection lost", sc.name)
		}
	}
	if l == nil {
		r, err := sc.rpc(ctx, &proto.GrantLease{Epoch: t.epoch, Size: max(size, sc.leaseAsk, firstLeaseAsk), Min: size})
		if err != nil {
			return nil, err
		}
		lr := r.(*proto.LeaseReply)
		l = &clientLease{LeaseReply: *lr, expires: time.Now().Add(lr.TTL * 9 / 10), version: lr.VersionBase}
		sc.lease = l
		if size > l.Size {
			return nil, fmt.Errorf("%w: a record of %d bytes exceeds %s's largest lease (%d bytes)", ErrTooLarge, size, sc.name, l.Size)
		}
	}
	return l, nil
}

// postCopies posts record rec, of a key of shard sh whose primary is t,
// into a lease on each of the shard's backups, and returns where, in the
// backups' order, and what finishes them. The WRITEs are not waited for:
// the caller commits at the primary at once, which forwards the commit to
// each backup, and a backup looks again for a copy still landing
// (server/replicate.go); a round trip less than waiting here. finish waits
// for the WRITEs and gives the connections back; the caller calls it once
// the commit is done, and only then may it change rec.
func (c *Client) postCopies(ctx context.Context, t *target, sh proto.Shard, rec []byte) (_ []proto.ReplicaCopy, finish func(), _ error) {
	r := c.routes()
	backups := t.m.Shard(sh).Owners[1:]
	targets := make([]*target, len(backups))
	for i, name := range backups {
		targets[i] = r.server(name)
		if err := c.use(targets[i]); err != nil {
			// A backup down: the map's leader drops it from the shard
			// after BackupTimeout. Retried as for a moving shard, with the
			// map fetched again, for up to MoveWait.
			return nil, nil, retryMoving(name, "%v's backup %s is unavailable until the map drops it: %w", sh, name, err)
		}
	}
	type held struct {
		p      *serverPool
		sc     *serverConn
		posted *session.Conn // the session the WRITE went on, if it did
	}
	hold := make([]held, 0, len(backups))
	finish = func() {
		for _, h := range hold {
			if h.posted != nil {
				h.sc.awaitPosted(ctx, h.posted)
			}
			h.sc.unlock()
			h.p.release(h.sc)
		}
	}
	copies := make([]proto.ReplicaCopy, len(backups))
	// Connections held at once are taken in the order of the servers'
	// names: two writers whose shards list the same backups in other
	// orders would otherwise each hold what the other waits for.
	order := make([]int, len(backups))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(backups[a], backups[b]) })
	for _, i := range order {
		name := backups[i]
		p, sc, err := c.acquire(ctx, poolKey{name: name, copies: true})
		if err == nil {
			if err = sc.lock(ctx); err != nil {
				p.release(sc)
			}
		}
		if err == nil {
			hold = append(hold, held{p: p, sc: sc})
			if copies[i], err = sc.postCopy(ctx, targets[i], rec); err == nil {
				hold[len(hold)-1].posted = sc.s
			}
		}
		if err != nil {
			finish()
			return nil, nil, err
		}
	}
	return copies, finish, nil
}

// postCopy posts a record's copy into the connection's lease, and leaves
// its WRITE to complete (awaitPosted). The caller holds the connection.
func (sc *serverConn) postCopy(ctx context.Context, t *target, rec []byte) (proto.ReplicaCopy, error) {
	if err := sc.ready(ctx, t.member); err != nil {
		return proto.ReplicaCopy{}, err
	}
	l, err := sc.leaseFor(ctx, t, uint64(len(rec)))
	if err != nil {
		return proto.ReplicaCopy{}, err
	}
	n := copy(sc.buf(), rec)
	sc.sges = append(sc.sges[:0], rdma.SGE{MR: sc.mr, Length: n})
	sc.wrs = append(sc.wrs[:0], rdma.SendWR{Op: rdma.OpWrite, SGL: sc.sges[:1], RemoteAddr: l.Addr + l.off, RKey: l.RKey})
	if err := sc.postOnly(sc.s.WriteQP); err != nil {
		return proto.ReplicaCopy{}, err
	}
	cp := proto.ReplicaCopy{Server: sc.name, LeaseID: l.ID, Offset: l.off, Length: uint64(n)}
	l.off += uint64(n)
	return cp, nil
}

// checkLimits checks key and value against the limits server advertises
// (none: the server predates them, and its commit says).
func checkLimits(server string, lim proto.RecordLimits, key, value []byte) error {
	switch {
	case lim.MaxKeyLen != 0 && len(key) > int(lim.MaxKeyLen):
		return fmt.Errorf("%w: key too long: %d bytes, %s takes at most %d", ErrTooLarge, len(key), server, lim.MaxKeyLen)
	case lim.MaxKeyLen != 0 && len(value) > int(lim.MaxValueLen):
		return fmt.Errorf("%w: value too large: %d bytes, %s takes at most %d (its --lease-size less the record header and the key limit)",
			ErrTooLarge, len(value), server, lim.MaxValueLen)
	}
	return nil
}

// post runs one signaled work request on [off, off+n) of the buffer and
// waits for it. WRITEs, which only ever go to the connection's leases, take
// the write QP: the server registers leases in a PD of the connection's
// own, which the read QP does not reach. Everything else takes the read QP.
func (sc *serverConn) post(ctx context.Context, op rdma.Opcode, off, n int, raddr uint64, rkey uint32) error {
	sc.sges = append(sc.sges[:0], rdma.SGE{MR: sc.mr, Offset: off, Length: n})
	sc.wrs = append(sc.wrs[:0], rdma.SendWR{Op: op, SGL: sc.sges[:1], RemoteAddr: raddr, RKey: rkey})
	if op == rdma.OpWrite {
		return sc.postOn(ctx, sc.s.WriteQP, sc.s.WriteCQ)
	}
	return sc.postAll(ctx)
}

// postAll posts sc.wrs on the read QP with only the last one signaled and
// waits for it: on an RC QP its completion means every earlier request has
// completed too, so the buffers of the unsignaled ones are free as well.
// A failure drops the session (the QP is in ERR, and the buffer may still
// be the NIC's until the QP is gone).
func (sc *serverConn) postAll(ctx context.Context) error {
	return sc.postOn(ctx, sc.s.QP, sc.s.CQ)
}

// postOn is postAll on qp, whose CQ is cq.
func (sc *serverConn) postOn(ctx context.Context, qp rdma.QP, cq rdma.CQ) error {
	if err := sc.postOnly(qp); err != nil {
		return err
	}
	return sc.awaitOn(ctx, cq)
}

// postOnly posts sc.wrs on qp with only the last one signaled (postAll),
// for awaitOn to wait for. A failure drops the session.
func (sc *serverConn) postOnly(qp rdma.QP) error {
	wrs := sc.wrs
	reads := 0
	for i := range wrs {
		wrs[i].ID, wrs[i].Flags = uint64(i), 0
		if wrs[i].Op == rdma.OpRead {
			reads++
		}
	}
	wrs[len(wrs)-1].Flags = rdma.Signaled
	sc.c.reads.Add(uint64(reads))
	sc.posted = wrs[0].Op
	if err := qp.PostSend(wrs); err != nil {
		sc.drop()
		return retryLost(sc.name, "%d %v to %s: posting: %w", len(wrs), wrs[0].Op, sc.name, err)
	}
	return nil
}

// awaitOn waits for the signaled request postOnly posted to complete on
// cq. A failure drops the session (the QP is in ERR, and the buffer may
// still be the NIC's until the QP is gone).
func (sc *serverConn) awaitOn(ctx context.Context, cq rdma.CQ) error {
	fail := func(what string, err error) error {
		sc.drop()
		return retryLost(sc.name, "%v to %s: %s: %w", sc.posted, sc.name, what, err)
	}
	if _, err := cq.Wait(ctx, sc.wc[:1]); err != nil {
		return fail("waiting", err)
	}
	if err := sc.wc[0].Err(); err != nil {
		what := "connection lost"
		if sc.wc[0].Status == rdma.StatusRemAccessErr {
			what = "rkey refused (server restarted or lease revoked)"
		}
		return fail(what, err)
	}
	return nil
}

// awaitPosted waits for a copy's WRITE that postCopy posted on session s,
// if the session still stands (a failure dropped it, and the QP's close
// ended the WRITE), whatever ctx says: the buffer is the NIC's until then.
// Its error only drops the session: the commit, which the backup
// verified, says whether the copy arrived.
func (sc *serverConn) awaitPosted(ctx context.Context, s *session.Conn) {
	if sc.s != nil && sc.s == s {
		if err := sc.awaitOn(context.WithoutCancel(ctx), s.WriteCQ); err != nil {
			sc.c.log.Debug("a copy's WRITE failed", "server", sc.name, "err", err)
		}
	}
}

// readLane is the lane of sc's read QP (rdma.QPConfig.Lane): on a device
// with several links, lanes 2 to 1+links, which ride distinct links, one
// for each of the pool's lanes; 0 (spread by QP number) on one link.
func (sc *serverConn) readLane() int {
	if sc.c.lanes <= 1 {
		return 0
	}
	return 2 + sc.lane
}
