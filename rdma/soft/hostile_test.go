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

func TestHostileHandshakes(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	valid := func(dst, src, psn uint32) []byte {
		h := make([]byte, helloSize)
		encodeHello(h, hello{dstQPN: dst, srcQPN: src, psn: psn})
		return h
	}
	ack := func(code uint8) []byte {
		b := make([]byte, helloAckSize)
		encodeHelloAck(b, code)
		return b
	}
	huge := make([]byte, 1<<20)
	for i := range huge {
		huge[i] = 0xff
	}
	for name, c := range map[string]struct {
		send []byte
		ack  []byte
	}{
		"garbage":        {send: []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n")},
		"all ones":       {send: huge},
		"short hello":    {send: valid(1, 2, 3)[:10]},
		"bad version":    {send: append(append([]byte("RKVS"), 9), make([]byte, 19)...)},
		"unknown QP":     {send: valid(0xfffffe, 2, 3), ack: ack(ackNoQP)},
		"wrong peer QP":  {send: valid(b.qp.Num(), a.qp.Num()+1, a.qp.Info().PSN), ack: ack(ackWrongPeer)},
		"wrong PSN":      {send: valid(b.qp.Num(), a.qp.Num(), a.qp.Info().PSN+1), ack: ack(ackWrongPeer)},
		"second connect": {send: valid(b.qp.Num(), a.qp.Num(), a.qp.Info().PSN), ack: ack(ackBusy)},
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

// A hostile requester that passes the handshake and then misbehaves costs
// its own QP, nothing else.
func TestHostileFrames(t *testing.T) {
	const fakeQPN, fakePSN = 4242, 77
	frame := func(r request) []byte {
		b := make([]byte, requestHeaderSize)
		encodeRequest(b, &r)
		return b
	}
	for name, frames := range map[string]func(rkey uint32, addr uint64) []byte{
		"garbage header": func(uint32, uint64) []byte { return bytes.Repeat([]byte{0xee}, requestHeaderSize) },
		"unknown opcode": func(uint32, uint64) []byte {
			b := frame(request{op: wireRead, seq: fakePSN})
			b[4] = 42
			return b
		},
		"payload length of 4 GiB": func(rkey uint32, addr uint64) []byte {
			b := frame(request{op: wireWrite, seq: fakePSN, rkey: rkey, addr: addr, length: 8})
			binary.BigEndian.PutUint32(b, 0xffffffff)
			binary.BigEndian.PutUint32(b[24:], 0xffffffff)
			return b
		},
		"wrong sequence": func(rkey uint32, addr uint64) []byte {
			return frame(request{op: wireRead, seq: fakePSN + 5, rkey: rkey, addr: addr, length: 8})
		},
		"truncated header": func(uint32, uint64) []byte { return frame(request{op: wireRead, seq: fakePSN})[:20] },
		"truncated payload": func(rkey uint32, addr uint64) []byte {
			return append(frame(request{op: wireWrite, seq: fakePSN, rkey: rkey, addr: addr, length: 64}), 1, 2, 3)
		},
		"write past the MR": func(rkey uint32, addr uint64) []byte {
			return frame(request{op: wireWrite, seq: fakePSN, rkey: rkey, addr: addr, length: MaxMessageSize})
		},
	} {
		t.Run(name, func(t *testing.T) {
			a, b := newPair(t, rdma.QPConfig{})
			victim := createQP(t, b.pd, rdma.QPConfig{SendCQ: b.cq, RecvCQ: b.cq})
			victim.ModifyToInit()
			victim.ModifyToRTR(rdma.QPInfo{Provider: "soft", QPNum: fakeQPN, PSN: fakePSN, Addr: "127.0.0.1:1"})
			postRecv(t, victim, rdma.RecvWR{ID: 31})
			mr := register(t, b.pd, 4096, rw)

			conn := dialDevice(t, b.dev)
			h := make([]byte, helloSize)
			encodeHello(h, hello{dstQPN: victim.Num(), srcQPN: fakeQPN, psn: fakePSN})
			conn.Write(h)
			okAck := make([]byte, helloAckSize)
			encodeHelloAck(okAck, ackOK)
			got := make([]byte, helloAckSize)
			if _, err := io.ReadFull(conn, got); err != nil || !bytes.Equal(got, okAck) {
				t.Fatalf("hello: % x %v", got, err)
			}
			conn.Write(frames(mr.RKey(), mr.Addr()))
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
