// Package session is one control connection to an rkv server: the dial
// (TCP or TLS), the Hello, QPs connected over it, and request/reply RPCs.
// The client library and the servers' own peer connections (migration,
// map changes, Raft) all open sessions this way.
package session

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// Config says who opens a session and how.
type Config struct {
	// Name goes in the Hello (Hello.Client).
	Name string
	// Token is the cluster's auth token, if it has one.
	Token []byte
	// Kind is the session's kind; SessionRaft sessions carry no QP.
	Kind proto.SessionKind
	// TLS, when set, secures the connection; the handshake completes
	// before the Hello, so a server that fails verification never sees
	// the token.
	TLS *tls.Config
	// PD and Device, when set, get two QPs connected over the connection
	// after the Hello (rdma.ConnectQP): the read QP and the write QP
	// (Conn.QP, Conn.WriteQP); QP gives their AckTimeout and RetryCount,
	// and the read QP's Lane (the write QP's is writeLane), CQSize the
	// depth of the read QP's CQ (default 128). Without them
	// the session carries control requests only (Hello.NoQP).
	Device rdma.Device
	PD     rdma.PD
	QP     rdma.QPConfig
	CQSize int
	// QPCalls, with PD, registers two slots in PD at Dial for requests
	// sent on the write QP (CallOnQP).
	QPCalls bool
	// DialTimeout bounds the dial, the TLS handshake, the Hello and the
	// QP handshake together, within the ctx given to Dial. Default 5s.
	DialTimeout time.Duration
}

// Errors.
var (
	// ErrBroken: the connection is unusable (an I/O error, a reply out of
	// step, the server refusing the session); Close it and dial again.
	ErrBroken = errors.New("session: connection broken")
	// ErrRefused: the server or its TLS refused this client for good: a
	// certificate one side rejected, a wrong token. A retry cannot fix it.
	ErrRefused = errors.New("session: refused")
)

// Conn is one session. It carries one request at a time: Call is not safe
// for concurrent use, and neither are the QPs and CQs (the caller owns
// them). Close is safe to call once the caller is done.
type Conn struct {
	NC net.Conn
	// QP reaches the server's arenas and index (READ); its PD there
	// holds no lease. nil without Config.PD.
	QP rdma.QP
	CQ rdma.CQ
	// WriteQP reaches the session's leases (WRITE), and nothing else: the
	// server's end is in a PD of this session's own. It has a CQ of its
	// own, so a WRITE's wait does not share a CQ with READs (soft reads
	// a lone QP's responses in the waiter's goroutine).
	WriteQP rdma.QP
	WriteCQ rdma.CQ
	Hello   proto.HelloReply

	addr   string
	nextID uint64
	rbuf   []byte
	broken bool
	slots  *qpSlots // CallOnQP's; nil without Config.QPCalls
	// replies reads NC once Dial is done: a reply is written in one
	// piece, so one read syscall takes its header and body. Dial's own
	// Hello reads NC directly, as the QP exchange after it does.
	replies *bufio.Reader
}

// Dial connects to a server's control address, says Hello (with target,
// the server ID meant, "" for any), and connects a QP when cfg has a PD.
// A Hello the server refuses, a TLS failure or a wrong token fails with an
// error wrapping ErrRefused; anything else that fails is worth a retry.
func Dial(ctx context.Context, addr, target string, cfg Config) (_ *Conn, err error) {
	timeout := cfg.DialTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var nc net.Conn
	if cfg.TLS == nil {
		var d net.Dialer
		nc, err = d.DialContext(ctx, "tcp", addr)
	} else {
		d := tls.Dialer{Config: cfg.TLS}
		nc, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, refusal(addr, fmt.Errorf("dialing %s: %w", addr, err))
	}
	c := &Conn{NC: nc, addr: addr}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	noQP := cfg.PD == nil || cfg.Kind == proto.SessionRaft
	r, err := c.Call(ctx, &proto.Hello{Client: cfg.Name, Token: cfg.Token, Kind: cfg.Kind, Target: target, NoQP: noQP})
	if err != nil {
		var pe *proto.Error
		if errors.As(err, &pe) && (pe.Code == proto.CodeUnauthenticated || pe.Code == proto.CodeBadRequest) {
			return nil, fmt.Errorf("%w: %s: %w", ErrRefused, addr, err)
		}
		return nil, refusal(addr, err)
	}
	c.Hello = *r.(*proto.HelloReply)
	if noQP {
		c.replies = bufio.NewReader(nc)
		return c, nil
	}
	size := cfg.CQSize
	if size <= 0 {
		size = 128
	}
	if c.CQ, err = cfg.Device.CreateCQ(size); err != nil {
		return nil, err
	}
	qcfg := rdma.QPConfig{SendCQ: c.CQ, RecvCQ: c.CQ, AckTimeout: cfg.QP.AckTimeout, RetryCount: cfg.QP.RetryCount, Lane: cfg.QP.Lane}
	if c.QP, err = cfg.PD.CreateQP(qcfg); err != nil {
		return nil, err
	}
	if _, err := rdma.ConnectQP(ctx, nc, c.QP); err != nil {
		return nil, fmt.Errorf("%w: connecting a QP to %s: %w", ErrBroken, addr, err)
	}
	// One WRITE at a time is in flight on it (the caller waits for each).
	if c.WriteCQ, err = cfg.Device.CreateCQ(writeCQSize); err != nil {
		return nil, err
	}
	qcfg.SendCQ, qcfg.RecvCQ, qcfg.Lane = c.WriteCQ, c.WriteCQ, writeLane
	if c.WriteQP, err = cfg.PD.CreateQP(qcfg); err != nil {
		return nil, err
	}
	if _, err := rdma.ConnectQP(ctx, nc, c.WriteQP); err != nil {
		return nil, fmt.Errorf("%w: connecting the write QP to %s: %w", ErrBroken, addr, err)
	}
	if cfg.QPCalls {
		if c.slots, err = newQPSlots(cfg.PD); err != nil {
			return nil, err
		}
	}
	c.replies = bufio.NewReader(nc)
	return c, nil
}

// writeCQSize is the depth of the write QP's CQ.
const writeCQSize = 16

// writeLane is the write QPs' lane (rdma.QPConfig.Lane): on a soft device
// with several links to a server, every session's commits ride one link,
// so that they reach the server in the same reads, which it commits
// together, while the read QPs spread over the links.
const writeLane = 1

// refusal marks a TLS failure that no retry can fix (a certificate one
// side refused) as ErrRefused; any other error is returned as it is.
// With TLS 1.3 a server refusing the client's certificate is only seen at
// the first read after the handshake, so the Hello's error comes here too.
func refusal(addr string, err error) error {
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
		op      *net.OpError
	)
	switch {
	case errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &host), errors.As(err, &invalid):
		return fmt.Errorf("%w: the certificate of %s: %w", ErrRefused, addr, err)
	case errors.As(err, &op) && op.Op == "remote error": // a TLS alert from the server
		return fmt.Errorf("%w: %s refused the TLS session: %w", ErrRefused, addr, err)
	}
	return err
}

// Call sends req and waits for its reply. It returns the reply (of the
// type req.Type().Reply()), or the server's *proto.Error for this request,
// or an error wrapping ErrBroken after which the connection must be
// closed. ctx bounds the call, its cancellation included (the error then
// wraps ctx's, for errors.Is).
func (c *Conn) Call(ctx context.Context, req proto.Message) (proto.Message, error) {
	p, err := c.Send(ctx, req)
	if err != nil {
		return nil, err
	}
	return p.Reply()
}

// Pending is a request sent and not yet answered (Send); Reply waits for
// the answer.
type Pending struct {
	c    *Conn
	ctx  context.Context
	req  proto.Message
	id   uint64
	stop func() bool
}

// Send sends req and returns without waiting for the reply, which the
// Pending's Reply reads: a caller with requests for several servers sends
// every one before it waits for any, and pays one wait instead of one per
// server. Until Reply returns the Conn carries nothing else. ctx bounds
// the request until its reply is read, as Call's does; an error is one
// Call would return, and then there is no reply to wait for.
func (c *Conn) Send(ctx context.Context, req proto.Message) (Pending, error) {
	if c.broken {
		return Pending{}, fmt.Errorf("%w: %s", ErrBroken, c.addr)
	}
	c.nextID++
	p := Pending{c: c, ctx: ctx, req: req, id: c.nextID}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(30 * time.Second)
	}
	_ = c.NC.SetDeadline(deadline)
	p.stop = context.AfterFunc(ctx, func() { _ = c.NC.SetDeadline(time.Unix(1, 0)) })
	if err := proto.WriteFrame(c.NC, p.id, req); err != nil {
		p.stop()
		return Pending{}, p.fail("%v to %s: %w", req.Type(), c.addr, err)
	}
	return p, nil
}

// Reply waits for the reply to the request Send sent, and returns what
// Call would.
func (p Pending) Reply() (proto.Message, error) {
	c, req := p.c, p.req
	defer p.stop()
	var from io.Reader = c.NC
	if c.replies != nil {
		from = c.replies
	}
	rid, reply, b, err := proto.ReadFrame(from, c.rbuf)
	c.rbuf = b
	if err != nil {
		return nil, p.fail("%v to %s: reading the reply: %w", req.Type(), c.addr, err)
	}
	if e, ok := reply.(*proto.Error); ok && rid == 0 {
		// The server refused the connection itself, saying why.
		c.broken = true
		return nil, fmt.Errorf("%w: %v to %s: %w", ErrBroken, req.Type(), c.addr, e)
	}
	if rid != p.id {
		return nil, p.fail("%v to %s: reply to request %d, want %d", req.Type(), c.addr, rid, p.id)
	}
	if e, ok := reply.(*proto.Error); ok {
		return nil, e
	}
	if reply.Type() != req.Type().Reply() {
		return nil, p.fail("%v to %s answered with %v", req.Type(), c.addr, reply.Type())
	}
	return reply, nil
}

// fail marks the connection broken and returns the error, wrapping
// ErrBroken and, when it ended, the request's context's error.
func (p Pending) fail(format string, args ...any) error {
	p.c.broken = true
	err := fmt.Errorf(format, args...)
	if p.ctx.Err() != nil {
		err = fmt.Errorf("%w (%w)", err, p.ctx.Err())
	}
	return fmt.Errorf("%w: %w", ErrBroken, err)
}

// PeerGone reports whether the server has closed the connection (or it
// broke), without waiting: the server sends nothing unasked, so a read
// that finds anything but a timeout means the session is over. It is for
// a caller waiting on the session's QPs for a reply that a dead server
// would never send (a verbs RECV never times out). Not concurrently with
// Call.
func (c *Conn) PeerGone() bool {
	if c.broken || c.replies == nil {
		return c.broken
	}
	_ = c.NC.SetReadDeadline(time.Now().Add(time.Millisecond))
	_, err := c.replies.Peek(1)
	_ = c.NC.SetReadDeadline(time.Time{})
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return false
	}
	c.broken = true
	return true
}

// Broken reports whether a call failed in a way that left the connection
// unusable.
func (c *Conn) Broken() bool { return c.broken }

// Addr is the address the connection was dialed to.
func (c *Conn) Addr() string { return c.addr }

// Close closes the connection (the server then ends the session's leases
// and releases its PD) and the QPs and CQs.
func (c *Conn) Close() error {
	c.broken = true
	errs := []error{c.NC.Close()}
	for _, qp := range []rdma.QP{c.QP, c.WriteQP} {
		if qp != nil {
			errs = append(errs, qp.Close())
		}
	}
	for _, cq := range []rdma.CQ{c.CQ, c.WriteCQ} {
		if cq != nil {
			errs = append(errs, cq.Close())
		}
	}
	if c.slots != nil {
		errs = append(errs, c.slots.free())
		c.slots = nil
	}
	return errors.Join(errs...)
}
