// Tests of hostile traffic on a device's data endpoint: the device drops it and keeps serving everyone else.

package soft

import (
	"bytes"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// dial connects to a device's data endpoint like a peer requester.
func dialDevice(t *testing.T, d rdma.Device) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", d.(*device).addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	return c
}

// expectClosed checks that the device closed c, after answering ack
// (when given).
func expectClosed(t *testing.T, c net.Conn, ack []byte) {
	t.Helper()
	got, err := io.ReadAll(c)
	if err != nil && !isReset(err) {
		t.Fatalf("reading until close: %v", err)
	}
	if !bytes.HasPrefix(got, ack) || len(got) > len(ack)+responseHeaderSize {
		t.Fatalf("device sent % x before closing", got)
	}
}

func isReset(err error) bool {
	return err != nil && (bytes.Contains([]byte(err.Error()), []byte("reset")))
}

// healthy checks that a connected pair still works.
func healthy(t *testing.T, a, b *side) {
	t.Helper()
	local := register(t, a.pd, 64, rw)
	remote := register(t, b.pd, 64, rw)
	copy(remote.Bytes(), "alive")
	post(t, a.qp, rdma.SendWR{ID: 1000, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(local, 0, 5), RemoteAddr: remote.Addr(), RKey: remote.RKey()})
	expectStatus(t, a.cq, 1000, rdma.StatusSuccess)
	if string(local.Bytes()[:5]) != "alive" {
		t.Fatal("pair broken")
	}
}

// linkOpening is a hello and an attach of QP src to QP dst.
func linkOpening(dst, src, psn uint32) []byte {
	b := make([]byte, helloSize+requestHeaderSize)
	encodeHello(b)
	encodeAttach(b[helloSize:], attach{dst: dst, src: src, psn: psn})
	return b
}

// ackOf is the acknowledgement of an attach of src to dst.
func ackOf(dst, src uint32, code uint8) []byte {
	b := make([]byte, responseHeaderSize)
	encodeAttachAck(b, attachAck{qpEnds: qpEnds{dst: src, src: dst}, code: code})
	return b
}

func TestHostileHandshakes(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	huge := make([]byte, 1<<20)
	for i := range huge {
		huge[i] = 0xff
	}
	an, bn, apsn := a.qp.Num(), b.qp.Num(), a.qp.Info().PSN
	// Both attaches answered before the first hostile one: an attach that
	// reaches b's QP before a's does is served (the first one wins), and
	// then it is a's that is refused.
	healthy(t, a, b)
	healthy(t, b, a)
	for name, c := range map[string]struct {
		send []byte
		ack  []byte
	}{
		"garbage":        {send: []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
		"all ones":       {send: huge},
		"short hello":    {send: linkOpening(1, 2, 3)[:5]},
		"version 1":      {send: append([]byte("RKVS\x01\x00\x00\x00"), make([]byte, 16)...)},
		"bad version":    {send: append(append([]byte("RKVS"), 9), make([]byte, 19)...)},
		"unknown QP":     {send: linkOpening(0xfffffe, 2, 3), ack: ackOf(0xfffffe, 2, ackNoQP)},
		"wrong peer QP":  {send: linkOpening(bn, an+1, apsn), ack: ackOf(bn, an+1, ackWrongPeer)},
		"wrong PSN":      {send: linkOpening(bn, an, apsn+1), ack: ackOf(bn, an, ackWrongPeer)},
		"second connect": {send: linkOpening(bn, an, apsn), ack: ackOf(bn, an, ackBusy)},
	} {
		t.Run(name, func(t *testing.T) {
			conn := dialDevice(t, b.dev)
			conn.Write(c.send) // may fail once the device hangs up
			if tc, ok := conn.(*net.TCPConn); ok {
				tc.CloseWrite()
			}
			expectClosed(t, conn, c.ack)
			healthy(t, a, b)
			healthy(t, b, a)
		})
	}
}

// A refused attach leaves the link up: the requester may attach another QP
// on it, and the refused QP's later requests are dropped.
func TestRefusedAttachKeepsLink(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	victim := createQP(t, b.pd, rdma.QPConfig{SendCQ: b.cq, RecvCQ: b.cq})
	const fakeQPN, fakePSN = 4242, 77
	bringUpTo(t, victim, rdma.QPInfo{Provider: "soft", QPNum: fakeQPN, PSN: fakePSN, Addr: "127.0.0.1:1"})
	mr := register(t, b.pd, 64, rw)
	copy(mr.Bytes(), "on the link")
	conn := dialDevice(t, b.dev)
	conn.Write(linkOpening(victim.Num(), fakeQPN+1, fakePSN)) // the wrong peer
	got := make([]byte, responseHeaderSize)
	if _, err := io.ReadFull(conn, got); err != nil || !bytes.Equal(got, ackOf(victim.Num(), fakeQPN+1, ackWrongPeer)) {
		t.Fatalf("first attach: % x %v", got, err)
	}
	// A READ for the refused pairing is dropped, unanswered.
	req := make([]byte, requestHeaderSize)
	encodeRequest(req, &request{op: wireRead, dst: victim.Num(), seq: fakePSN, rkey: mr.RKey(), addr: mr.Addr(), length: 11})
	conn.Write(req)
	var second [requestHeaderSize]byte
	encodeAttach(second[:], attach{dst: victim.Num(), src: fakeQPN, psn: fakePSN})
	conn.Write(second[:])
	if _, err := io.ReadFull(conn, got); err != nil || !bytes.Equal(got, ackOf(victim.Num(), fakeQPN, ackOK)) {
		t.Fatalf("second attach: % x %v", got, err)
	}
	conn.Write(req)
	resp := make([]byte, responseHeaderSize+11)
	if _, err := io.ReadFull(conn, resp); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, responseHeaderSize)
	encodeResponse(want, &response{kind: respReadData, dst: fakeQPN, seq: fakePSN, length: 11})
	if !bytes.Equal(resp[:responseHeaderSize], want) || string(resp[responseHeaderSize:]) != "on the link" {
		t.Fatalf("READ answered % x", resp)
	}
	healthy(t, a, b)
}

// bringUpTo moves q to RTR against remote.
func bringUpTo(t *testing.T, q rdma.QP, remote rdma.QPInfo) {
	t.Helper()
	if err := q.ModifyToInit(); err != nil {
		t.Fatal(err)
	}
	if err := q.ModifyToRTR(remote); err != nil {
		t.Fatal(err)
	}
}

// A hostile requester that passes the handshake and then misbehaves costs
// the QPs on its link, nothing else.
func TestHostileFrames(t *testing.T) {
	const fakeQPN, fakePSN = 4242, 77
	frame := func(r request) []byte {
		b := make([]byte, requestHeaderSize)
		encodeRequest(b, &r)
		return b
	}
	for name, frames := range map[string]func(dst, rkey uint32, addr uint64) []byte{
		"garbage header": func(uint32, uint32, uint64) []byte { return bytes.Repeat([]byte{0xee}, requestHeaderSize) },
		"unknown opcode": func(dst, _ uint32, _ uint64) []byte {
			b := frame(request{op: wireRead, dst: dst, seq: fakePSN})
			b[4] = 42
			return b
		},
		"payload length of 4 GiB": func(dst, rkey uint32, addr uint64) []byte {
			b := frame(request{op: wireWrite, dst: dst, seq: fakePSN, rkey: rkey, addr: addr, length: 8})
			binary.BigEndian.PutUint32(b, 0xffffffff)
			binary.BigEndian.PutUint32(b[28:], 0xffffffff)
			return b
		},
		"wrong sequence": func(dst, rkey uint32, addr uint64) []byte {
			return frame(request{op: wireRead, dst: dst, seq: fakePSN + 5, rkey: rkey, addr: addr, length: 8})
		},
		"truncated header": func(dst, _ uint32, _ uint64) []byte { return frame(request{op: wireRead, dst: dst, seq: fakePSN})[:20] },
		"truncated payload": func(dst, rkey uint32, addr uint64) []byte {
			return append(frame(request{op: wireWrite, dst: dst, seq: fakePSN, rkey: rkey, addr: addr, length: 64}), 1, 2, 3)
		},
		"write past the MR": func(dst, rkey uint32, addr uint64) []byte {
			return frame(request{op: wireWrite, dst: dst, seq: fakePSN, rkey: rkey, addr: addr, length: MaxMessageSize})
		},
		"malformed attach": func(dst, _ uint32, _ uint64) []byte {
			b := make([]byte, requestHeaderSize)
			encodeAttach(b, attach{dst: dst, src: 1, psn: 2})
			b[30] = 1
			return b
		},
	} {
		t.Run(name, func(t *testing.T) {
			a, b := newPair(t, rdma.QPConfig{})
			victim := createQP(t, b.pd, rdma.QPConfig{SendCQ: b.cq, RecvCQ: b.cq})
			bringUpTo(t, victim, rdma.QPInfo{Provider: "soft", QPNum: fakeQPN, PSN: fakePSN, Addr: "127.0.0.1:1"})
			postRecv(t, victim, rdma.RecvWR{ID: 31})
			mr := register(t, b.pd, 4096, rw)

			conn := dialDevice(t, b.dev)
			conn.Write(linkOpening(victim.Num(), fakeQPN, fakePSN))
			got := make([]byte, responseHeaderSize)
			if _, err := io.ReadFull(conn, got); err != nil || !bytes.Equal(got, ackOf(victim.Num(), fakeQPN, ackOK)) {
				t.Fatalf("attach: % x %v", got, err)
			}
			conn.Write(frames(victim.Num(), mr.RKey(), mr.Addr()))
			conn.(*net.TCPConn).CloseWrite()
			expectClosed(t, conn, nil)
			// The victim QP went to ERR and flushed its RECV.
			expectStatus(t, b.cq, 31, rdma.StatusWRFlushErr)
			if victim.State() != rdma.QPStateError {
				t.Fatalf("victim in %v", victim.State())
			}
			healthy(t, a, b)
			healthy(t, b, a)
		})
	}
}

// A link that gets no QP attached within its time is closed: a peer that
// cannot attach a QP has no use for it. One that attached in time stays.
func TestLinkWithoutAttachClosed(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	const within = 200 * time.Millisecond
	b.dev.(*device).attachWithin.Store(int64(within))
	victim := createQP(t, b.pd, rdma.QPConfig{SendCQ: b.cq, RecvCQ: b.cq})
	const fakeQPN, fakePSN = 4242, 77
	bringUpTo(t, victim, rdma.QPInfo{Provider: "soft", QPNum: fakeQPN, PSN: fakePSN, Addr: "127.0.0.1:1"})
	mr := register(t, b.pd, 64, rw)

	read := make([]byte, requestHeaderSize)
	encodeRequest(read, &request{op: wireRead, dst: victim.Num(), seq: fakePSN, rkey: mr.RKey(), addr: mr.Addr(), length: 8})
	for name, opening := range map[string][]byte{
		"hello only":              linkOpening(1, 2, 3)[:helloSize],
		"requests, no attach":     append(linkOpening(1, 2, 3)[:helloSize], read...),
		"refused attaches only":   linkOpening(victim.Num(), fakeQPN+1, fakePSN),
		"half a hello, then none": linkOpening(1, 2, 3)[:4],
	} {
		t.Run(name, func(t *testing.T) {
			conn := dialDevice(t, b.dev)
			start := time.Now()
			conn.Write(opening)
			io.Copy(io.Discard, conn) // until the device closes it
			if d := time.Since(start); d < within/2 || d > 10*within {
				t.Fatalf("closed after %v, want about %v", d, within)
			}
		})
	}
	conn := dialDevice(t, b.dev)
	conn.Write(linkOpening(victim.Num(), fakeQPN, fakePSN))
	got := make([]byte, responseHeaderSize)
	if _, err := io.ReadFull(conn, got); err != nil || !bytes.Equal(got, ackOf(victim.Num(), fakeQPN, ackOK)) {
		t.Fatalf("attach: % x %v", got, err)
	}
	time.Sleep(2 * within)
	conn.Write(read)
	resp := make([]byte, responseHeaderSize+8)
	if _, err := io.ReadFull(conn, resp); err != nil {
		t.Fatalf("a link with a QP attached was closed: %v", err)
	}
	healthy(t, a, b)
}
