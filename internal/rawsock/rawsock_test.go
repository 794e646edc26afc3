package rawsock

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rkv-io/rkv/internal/race"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pair returns the two ends of a loopback TCP connection.
func pair(t *testing.T) (a, b *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

func ends(t *testing.T) (w *Writer, r *Reader, wc, rc *net.TCPConn) {
	t.Helper()
	wc, rc = pair(t)
	w, err := NewWriter(wc)
	if err != nil {
		t.Fatal(err)
	}
	r, err = NewReader(rc)
	if err != nil {
		t.Fatal(err)
	}
	return w, r, wc, rc
}

// pattern is n bytes that differ from one offset to the next, so that a
// lost, doubled or reordered piece shows.
func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i>>8 + seed)
	}
	return b
}

func TestWriteThenReadEveryPieceInOrder(t *testing.T) {
	w, r, wc, rc := ends(t)
	// Small buffers, so that writes are taken in part and resumed.
	_ = wc.SetWriteBuffer(32 << 10)
	_ = rc.SetReadBuffer(32 << 10)
	want := pattern(256<<10+13, 1)
	go func() {
		// In assorted pieces, by all three calls, larger in total than
		// the socket's buffers: the writes wait for the reader.
		// First two pieces the socket cannot take whole before the
		// reader starts: each write resumes mid-piece.
		p := want
		if _, err := w.WriteBuffers([][]byte{p[:100<<10], p[100<<10 : 200<<10]}); err != nil {
			t.Error(err)
			return
		}
		p = p[200<<10:]
		for i := 0; len(p) > 0; i++ {
			k := min(len(p), 1+i*997%70000)
			var err error
			switch i % 3 {
			case 0:
				_, err = w.Write(p[:k])
			case 1:
				h := k / 2
				_, err = w.WriteBuffers([][]byte{p[:h], nil, p[h:k]})
			case 2:
				var n int
				n, err = w.WriteOnce(p[:k])
				k = n // what the socket took
			}
			if err != nil {
				t.Error(err)
				return
			}
			p = p[k:]
		}
		wc.CloseWrite()
	}()
	time.Sleep(20 * time.Millisecond)
	got, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, not the %d written in order", len(got), len(want))
	}
	// After the peer's close, every read says so.
	if n, err := r.Read(make([]byte, 8)); n != 0 || err != io.EOF {
		t.Fatalf("read after EOF: %d, %v; want 0, EOF", n, err)
	}
}

func TestReadWaitsUntilItsDeadline(t *testing.T) {
	_, r, _, rc := ends(t)
	_ = rc.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	start := time.Now()
	n, err := r.Read(make([]byte, 8))
	if n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read of an idle socket past its deadline: %d, %v; want 0 and the deadline's error", n, err)
	}
	if waited := time.Since(start); waited < 25*time.Millisecond {
		t.Fatalf("read returned after %v, before its deadline", waited)
	}
}

func TestReadWakesForData(t *testing.T) {
	w, r, _, _ := ends(t)
	go func() {
		time.Sleep(20 * time.Millisecond)
		_, _ = w.Write([]byte("late"))
	}()
	b := make([]byte, 8)
	n, err := r.Read(b)
	if err != nil || string(b[:n]) != "late" {
		t.Fatalf("read %q, %v; want the late write", b[:n], err)
	}
}

func TestWriteOnceNeverWaits(t *testing.T) {
	w, _, wc, _ := ends(t)
	_ = wc.SetWriteBuffer(64 << 10)
	big := make([]byte, 64<<20) // far more than the buffers hold; nobody reads
	n, err := w.WriteOnce(big)
	if err != nil || n <= 0 || n >= len(big) {
		t.Fatalf("WriteOnce of %d bytes to a socket nobody reads: %d, %v; want part of it, no error", len(big), n, err)
	}
	for {
		// Fill what room is left; then the socket takes nothing more.
		k, err := w.WriteOnce(big)
		if err != nil {
			t.Fatal(err)
		}
		if k == 0 {
			break
		}
	}
	if k, err := w.WriteOnce(big[:1]); k != 0 || err != nil {
		t.Fatalf("WriteOnce to a full socket: %d, %v; want 0, nil", k, err)
	}
}

func TestWriteWaitsUntilItsDeadline(t *testing.T) {
	w, _, wc, _ := ends(t)
	_ = wc.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	big := make([]byte, 64<<20)
	n, err := w.Write(big)
	if !errors.Is(err, os.ErrDeadlineExceeded) || n <= 0 || n >= len(big) {
		t.Fatalf("Write of %d bytes nobody reads, past its deadline: %d, %v; want part written and the deadline's error", len(big), n, err)
	}
}

func TestWriteToAResetPeerFails(t *testing.T) {
	w, _, _, rc := ends(t)
	_ = rc.SetLinger(0)
	rc.Close() // a reset
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = w.Write(make([]byte, 4096))
		time.Sleep(time.Millisecond)
	}
	var se *os.SyscallError
	if !errors.As(err, &se) {
		t.Fatalf("writes to a reset peer: %v; want an *os.SyscallError", err)
	}
}

func TestClosedOrUninitialized(t *testing.T) {
	var w Writer
	var r Reader
	if _, err := w.Write([]byte("x")); !errors.Is(err, errNoConn) {
		t.Fatalf("Write of a zero Writer: %v", err)
	}
	if _, err := r.Read(make([]byte, 1)); !errors.Is(err, errNoConn) {
		t.Fatalf("Read of a zero Reader: %v", err)
	}
	wc, rc := pair(t)
	wr, _ := NewWriter(wc)
	rd, _ := NewReader(rc)
	wc.Close()
	rc.Close()
	if _, err := wr.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v; want net.ErrClosed", err)
	}
	if _, err := rd.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Read after Close: %v; want net.ErrClosed", err)
	}
}

func TestReadAndWriteAllocateNothing(t *testing.T) {
	if race.Enabled {
		t.Skip("allocations are counted without the race detector: make test-allocs")
	}
	w, r, _, _ := ends(t)
	out, in := pattern(1000, 3), make([]byte, 1000)
	pieces := [][]byte{out[:300], out[300:]}
	if allocs := testing.AllocsPerRun(200, func() {
		if _, err := w.Write(out); err != nil {
			t.Fatal(err)
		}
		if _, err := w.WriteBuffers(pieces); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(r, in); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(r, in); err != nil {
			t.Fatal(err)
		}
	}); allocs != 0 {
		t.Fatalf("%v allocations a round of writes and reads; want 0", allocs)
	}
}
