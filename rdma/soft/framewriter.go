// Frame output: small frames are batched in a buffer, large payloads leave by writev straight from registered memory.

package soft

import (
	"net"
	"sync/atomic"
	"time"
)

const (
	frameBufSize = 16 << 10 // batched small frames
	readBufSize  = 16 << 10 // bufio.Reader size of both ends
	copyMax      = 4 << 10  // payloads up to this size are copied into the batch
	chunkSize    = 1 << 20  // large payloads are written, and deadlines renewed, per chunk
)

type frameWriter struct {
	conn *net.TCPConn
	buf  []byte // pending bytes, cap frameBufSize
	iov  [2][]byte
	bufs net.Buffers
	// timeout, when set, bounds each large write: the responder's
	// defence against a requester that stops reading.
	timeout time.Duration
	// writes counts the write and writev calls made: what tests check to
	// see that frames ready together leave in one call. An atomic, as the
	// test reads it from another goroutine; it is one per syscall.
	writes atomic.Uint64
}

// write queues p, copying it when small; large p is written at once.
func (w *frameWriter) write(p []byte) error {
	if len(p) > copyMax {
		return w.writeLarge(p, nil)
	}
	if len(w.buf)+len(p) > cap(w.buf) {
		if err := w.flush(); err != nil {
			return err
		}
	}
	w.buf = append(w.buf, p...)
	return nil
}

// writeLarge writes the pending bytes and p with writev, without copying
// p, in chunks; after each it stores the time in progress, if not nil.
// With a timeout, each chunk must leave within it.
func (w *frameWriter) writeLarge(p []byte, progress *atomic.Int64) error {
	for len(p) > 0 {
		n := min(len(p), chunkSize)
		w.iov[0], w.iov[1] = w.buf, p[:n]
		w.bufs = w.iov[:]
		if w.timeout > 0 {
			_ = w.conn.SetWriteDeadline(time.Now().Add(w.timeout))
		}
		w.writes.Add(1)
		_, err := w.bufs.WriteTo(w.conn)
		if w.timeout > 0 {
			_ = w.conn.SetWriteDeadline(time.Time{})
		}
		w.buf = w.buf[:0]
		w.iov = [2][]byte{}
		if err != nil {
			return err
		}
		p = p[n:]
		if progress != nil {
			progress.Store(now())
		}
	}
	return nil
}

func (w *frameWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	w.writes.Add(1)
	_, err := w.conn.Write(w.buf)
	w.buf = w.buf[:0]
	return err
}
