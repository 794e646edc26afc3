// Package rawsock reads and writes a connected socket with raw system
// calls, waiting in Go's network poller as net.Conn does.
//
// The runtime wraps each ordinary system call in a hand-off: it tells its
// monitor thread, waking it if it sleeps, and a call the monitor still
// finds under way one tick later (20 µs) loses its P, which another thread
// is woken to run. A loopback write also runs the receiver's TCP path, so
// it often takes that long: a busy connection paid a monitor wake-up or a
// P's hand-off to another thread every few calls. A socket that net opened
// is non-blocking, so its reads and writes never wait in the kernel, which
// is what a raw system call asks; the waiting stays the poller's
// (syscall.RawConn's Read and Write), within the connection's deadlines.
//
// A Reader and a Writer are made once per connection and allocate nothing
// per call. Neither is safe for concurrent use: one goroutine reads at a
// time, one writes at a time (a Reader and a Writer of one connection may
// be used at once).
package rawsock

import (
	"errors"
	"io"
	"os"
	"syscall"
	"unsafe"
)

// Reader reads a socket.
type Reader struct {
	conn syscall.RawConn
	read func(fd uintptr) bool // made once, so that a Read allocates nothing
	p    []byte
	n    int
	err  syscall.Errno
}

// NewReader returns a Reader of c, which must be a connected stream
// socket that net opened (so non-blocking).
func NewReader(c syscall.Conn) (*Reader, error) {
	r := &Reader{}
	return r, r.Init(c)
}

// Init readies a Reader of c in place (for one embedded in a larger
// struct). It fails only if c's SyscallConn does (never for a
// *net.TCPConn).
func (r *Reader) Init(c syscall.Conn) error {
	var err error
	if r.conn, err = c.SyscallConn(); err != nil {
		return err
	}
	r.read = func(fd uintptr) bool {
		for {
			n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(unsafe.SliceData(r.p))), uintptr(len(r.p)))
			switch e {
			case syscall.EINTR:
				continue
			case syscall.EAGAIN:
				return false // nothing yet: the poller waits
			case 0:
				r.n = int(n)
			default:
				r.err = e
			}
			return true
		}
	}
	return nil
}

// Read reads what the socket holds, up to len(p), waiting for some if it
// holds nothing. It returns io.EOF once the peer closed and everything
// was read, a deadline's error (os.ErrDeadlineExceeded) as net.Conn
// does, and a failed read's error as an *os.SyscallError.
func (r *Reader) Read(p []byte) (int, error) {
	if r.conn == nil {
		return 0, errNoConn
	}
	if len(p) == 0 {
		return 0, nil
	}
	r.p = p
	err := r.conn.Read(r.read)
	n, e := r.n, r.err
	r.p, r.n, r.err = nil, 0, 0
	switch {
	case err != nil:
		return 0, err
	case e != 0:
		return 0, os.NewSyscallError("read", e)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Writer writes a socket.
type Writer struct {
	conn  syscall.RawConn
	write func(fd uintptr) bool // made once, so that a write allocates nothing
	iov   []syscall.Iovec       // what is left to write
	n     int                   // bytes written
	err   syscall.Errno
	once  bool      // write what the socket takes at once, and return
	one   [1][]byte // Write's p, as one piece
}

// maxIovecs bounds the pieces of one writev (IOV_MAX is 1024).
const maxIovecs = 1024

// NewWriter returns a Writer of c, which must be a connected stream
// socket that net opened (so non-blocking).
func NewWriter(c syscall.Conn) (*Writer, error) {
	w := &Writer{}
	return w, w.Init(c)
}

// Init readies a Writer of c in place (for one embedded in a larger
// struct). It fails only if c's SyscallConn does (never for a
// *net.TCPConn).
func (w *Writer) Init(c syscall.Conn) error {
	var err error
	if w.conn, err = c.SyscallConn(); err != nil {
		return err
	}
	w.write = func(fd uintptr) bool {
		for len(w.iov) > 0 {
			n, _, e := syscall.RawSyscall(syscall.SYS_WRITEV, fd, uintptr(unsafe.Pointer(&w.iov[0])), uintptr(min(len(w.iov), maxIovecs)))
			switch e {
			case 0:
				w.n += int(n)
				w.advance(int(n))
			case syscall.EINTR:
			case syscall.EAGAIN:
				return w.once // full: the poller waits for room, unless once
			default:
				w.err = e
				return true
			}
		}
		return true
	}
	return nil
}

// advance drops the first n bytes written from the pieces left.
func (w *Writer) advance(n int) {
	for n > 0 && len(w.iov) > 0 {
		v := &w.iov[0]
		if l := int(v.Len); n < l {
			v.Base = (*byte)(unsafe.Add(unsafe.Pointer(v.Base), n))
			v.SetLen(l - n)
			return
		}
		n -= int(v.Len)
		w.iov = w.iov[1:]
	}
}

// Write writes all of p, waiting for room in the socket as it must
// (within the write deadline). A failed write's error is an
// *os.SyscallError.
func (w *Writer) Write(p []byte) (int, error) {
	w.one[0] = p
	n, err := w.do(w.one[:], false)
	w.one[0] = nil
	return n, err
}

// WriteOnce writes as much of p as the socket takes at once: a full
// socket is no error, and it never waits.
func (w *Writer) WriteOnce(p []byte) (int, error) {
	w.one[0] = p
	n, err := w.do(w.one[:], true)
	w.one[0] = nil
	return n, err
}

// WriteBuffers writes all of the pieces in order, by writev, as Write
// does p. It keeps no reference to pieces after it returns.
func (w *Writer) WriteBuffers(pieces [][]byte) (int, error) {
	return w.do(pieces, false)
}

// errNoConn is the error of a Writer or Reader never initialized.
var errNoConn = errors.New("rawsock: not initialized")

func (w *Writer) do(pieces [][]byte, once bool) (int, error) {
	if w.conn == nil {
		return 0, errNoConn
	}
	vs := w.iov[:0]
	for _, p := range pieces {
		if len(p) > 0 {
			v := syscall.Iovec{Base: unsafe.SliceData(p)}
			v.SetLen(len(p))
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return 0, nil
	}
	w.iov, w.once = vs, once
	err := w.conn.Write(w.write)
	n, e := w.n, w.err
	clear(vs) // hold no pointer into the caller's buffers
	w.iov, w.n, w.err = vs[:0], 0, 0
	switch {
	case err != nil:
		return n, err
	case e != 0:
		return n, os.NewSyscallError("writev", e)
	}
	return n, nil
}
