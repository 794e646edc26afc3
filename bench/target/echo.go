// The raw TCP echo: the transport's floor on loopback, for the same payloads.

package target

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/rkv-io/rkv/internal/rawsock"
	"github.com/rkv-io/rkv/loadgen"
)

// The echo protocol. A request is a 9-byte header, op (1 byte:
// EchoGet or EchoPut), payload length and reply length (big-endian
// uint32 each), then the payload; the server reads it whole and answers
// with reply-length bytes. A GET sends its key and receives the value's
// size; a PUT sends the value (with its key) and receives an
// EchoAckSize-byte acknowledgement. The server does nothing else, so the
// echo is what the same bytes cost on the same transport.
const (
	EchoGet = 'G'
	EchoPut = 'P'

	// EchoAckSize is the size of a PUT's acknowledgement.
	EchoAckSize = 8

	echoHeader = 9
	// echoMaxFrame bounds a payload or reply (both ways).
	echoMaxFrame = 64 << 20
)

// EchoServer serves the echo protocol on a listener, one goroutine per
// connection.
type EchoServer struct {
	ln   net.Listener
	wg   sync.WaitGroup
	mu   sync.Mutex
	conn map[net.Conn]struct{}
}

// ListenEcho starts an echo server on addr ("127.0.0.1:0" picks a port).
func ListenEcho(addr string) (*EchoServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("echo server: listening on %s: %w", addr, err)
	}
	s := &EchoServer{ln: ln, conn: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// Addr is the server's address.
func (s *EchoServer) Addr() string { return s.ln.Addr().String() }

// Close stops the listener, closes every connection and waits for their
// goroutines.
func (s *EchoServer) Close() error {
	err := s.ln.Close()
	s.mu.Lock()
	for c := range s.conn {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

func (s *EchoServer) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conn[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_ = serveEcho(c)
			s.mu.Lock()
			delete(s.conn, c)
			s.mu.Unlock()
			c.Close()
		}()
	}
}

// serveEcho answers one connection's requests until it closes.
func serveEcho(c net.Conn) error {
	rd, wr, err := rawIO(c)
	if err != nil {
		return err
	}
	r := bufio.NewReaderSize(rd, 256<<10)
	var hdr [echoHeader]byte
	var reply []byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return err
		}
		n, m := binary.BigEndian.Uint32(hdr[1:5]), binary.BigEndian.Uint32(hdr[5:9])
		if (hdr[0] != EchoGet && hdr[0] != EchoPut) || n > echoMaxFrame || m > echoMaxFrame {
			return fmt.Errorf("echo server: bad request header %x", hdr)
		}
		if _, err := r.Discard(int(n)); err != nil {
			return err
		}
		if int(m) > len(reply) {
			reply = make([]byte, m)
		}
		if _, err := wr.Write(reply[:m]); err != nil {
			return err
		}
	}
}

// rawIO reads and writes c with raw system calls, as rkv's soft provider
// does its links: without it the echo paid the runtime's hand-offs around
// each call that rkv no longer does, and would be no floor.
func rawIO(c net.Conn) (*rawsock.Reader, *rawsock.Writer, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, nil, fmt.Errorf("connection to %s has no file descriptor", c.RemoteAddr())
	}
	r, err := rawsock.NewReader(sc)
	if err != nil {
		return nil, nil, err
	}
	w, err := rawsock.NewWriter(sc)
	return r, w, err
}

// EchoOptions configure an Echo target.
type EchoOptions struct {
	// Addr is the echo server's address. Required.
	Addr string
	// ValueSize is the size of a GET's reply. Required.
	ValueSize int
	// Workers is the number of connections: one per loadgen worker.
	// Default 1.
	Workers int
}

// Echo is a loadgen target speaking the echo protocol: one connection
// per worker (WorkerTargets), dialed by NewEcho.
type Echo struct {
	workers []*echoWorker
}

// NewEcho dials opts.Workers connections to the echo server.
func NewEcho(ctx context.Context, opts EchoOptions) (*Echo, error) {
	if opts.Addr == "" || opts.ValueSize <= 0 || opts.ValueSize > echoMaxFrame {
		return nil, fmt.Errorf("echo target: need an address and a value size in 1..%d (got %q, %d)", echoMaxFrame, opts.Addr, opts.ValueSize)
	}
	if opts.Workers <= 0 {
		opts.Workers = 1
	}
	e := &Echo{}
	var d net.Dialer
	for range opts.Workers {
		c, err := d.DialContext(ctx, "tcp", opts.Addr)
		if err != nil {
			e.Close()
			return nil, fmt.Errorf("echo target: dialing %s: %w", opts.Addr, err)
		}
		r, w, err := rawIO(c)
		if err != nil {
			c.Close()
			e.Close()
			return nil, fmt.Errorf("echo target: %w", err)
		}
		e.workers = append(e.workers, &echoWorker{conn: c, r: r, w: w, size: opts.ValueSize})
	}
	return e, nil
}

// ForWorker returns worker i's connection (loadgen.WorkerTargets).
func (e *Echo) ForWorker(i int) loadgen.Target { return e.workers[i%len(e.workers)] }

// Get sends key on the first connection (a target used without
// ForWorker serializes its callers on it).
func (e *Echo) Get(ctx context.Context, key []byte) ([]byte, error) {
	return e.workers[0].Get(ctx, key)
}

// Put sends value on the first connection.
func (e *Echo) Put(ctx context.Context, key, value []byte) error {
	return e.workers[0].Put(ctx, key, value)
}

// Close closes every connection.
func (e *Echo) Close() error {
	var errs []error
	for _, w := range e.workers {
		errs = append(errs, w.conn.Close())
	}
	return errors.Join(errs...)
}

// echoWorker is one connection; its mutex makes it safe for concurrent
// use, though loadgen gives each worker its own.
type echoWorker struct {
	mu   sync.Mutex
	conn net.Conn
	r    *rawsock.Reader
	w    *rawsock.Writer
	size int
	buf  []byte
	ack  [EchoAckSize]byte
	// deadline: a deadline is set on conn (skipped when ctx has none).
	deadline bool
}

// Get sends the key and reads the value; the value is a new slice, as
// any client's GET returns one.
func (w *echoWorker) Get(ctx context.Context, key []byte) ([]byte, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	v := make([]byte, w.size)
	if err := w.roundTrip(ctx, EchoGet, key, nil, v); err != nil {
		return nil, err
	}
	return v, nil
}

// Put sends key and value and reads the acknowledgement.
func (w *echoWorker) Put(ctx context.Context, key, value []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.roundTrip(ctx, EchoPut, key, value, w.ack[:])
}

func (w *echoWorker) roundTrip(ctx context.Context, op byte, a, b, reply []byte) error {
	n := len(a) + len(b)
	if cap(w.buf) < echoHeader+n {
		w.buf = make([]byte, echoHeader+n)
	}
	f := w.buf[:echoHeader+n]
	f[0] = op
	binary.BigEndian.PutUint32(f[1:5], uint32(n))
	binary.BigEndian.PutUint32(f[5:9], uint32(len(reply)))
	copy(f[echoHeader+copy(f[echoHeader:], a):], b)
	if dl, ok := ctx.Deadline(); ok {
		_ = w.conn.SetDeadline(dl)
		w.deadline = true
	} else if w.deadline {
		_ = w.conn.SetDeadline(time.Time{})
		w.deadline = false
	}
	if _, err := w.w.Write(f); err != nil {
		return fmt.Errorf("echo %c to %s: %w", op, w.conn.RemoteAddr(), err)
	}
	if _, err := io.ReadFull(w.r, reply); err != nil {
		return fmt.Errorf("echo %c reply from %s: %w", op, w.conn.RemoteAddr(), err)
	}
	return nil
}
