// Stream fuzzing: arbitrary bytes on a link after a valid hello and attach must cost the QPs on that link at most, never the device.

package soft

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// fuzzTarget is a marker in a fuzzed frame's destination QP (offset 8,
// invalid as it stands): the harness replaces it with the victim's number,
// and an rkey starting with it (offset 16) with the MR's rkey and address.
const fuzzTarget = 0xAA

func FuzzResponderStream(f *testing.F) {
	const psn = 1000
	frame := func(r request, payload int) []byte {
		b := make([]byte, requestHeaderSize, requestHeaderSize+payload)
		encodeRequest(b, &r)
		b[8] = fuzzTarget
		return append(b, make([]byte, payload)...)
	}
	const dst = 1
	f.Add(frame(request{op: wireRead, dst: dst, seq: psn, length: 8}, 0))
	f.Add(frame(request{op: wireWrite, dst: dst, seq: psn, length: 16}, 16))
	f.Add(append(frame(request{op: wireSend, dst: dst, seq: psn, length: 4}, 4), frame(request{op: wireFetchAdd, dst: dst, seq: psn + 1, length: 8, compareAdd: 1}, 0)...))
	f.Add(append(frame(request{op: wireSend, dst: dst, seq: psn, length: 4}, 4), frame(request{op: wireSend, dst: dst, seq: psn + 1, length: 4}, 4)...))
	f.Add(append(frame(request{op: wireWrite, ackMayWait: true, dst: dst, seq: psn, length: 16}, 16), frame(request{op: wireRead, dst: dst, seq: psn + 1, length: 8}, 0)...))
	detach := make([]byte, requestHeaderSize)
	encodeDetach(detach, qpEnds{dst: dst, src: 7})
	detach[8] = fuzzTarget
	f.Add(append(frame(request{op: wireRead, dst: dst, seq: psn, length: 8}, 0), detach...))
	f.Add([]byte("\x00\x00\x00\x10garbage"))

	dev, err := rdma.Open("soft", "", rdma.Options{})
	if err != nil {
		f.Fatal(err)
	}
	pd, _ := dev.AllocPD()
	cq, _ := dev.CreateCQ(1024)
	mem, _ := rdma.Alloc(1 << 16)
	mr, err := pd.Register(mem.Bytes(), allRW)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		mr.Deregister()
		mem.Close()
		cq.Close()
		pd.Close()
		dev.Close()
	})
	addr := dev.(*device).addr

	f.Fuzz(func(t *testing.T, stream []byte) {
		q, err := pd.CreateQP(rdma.QPConfig{SendCQ: cq, RecvCQ: cq, AckTimeout: 20 * time.Millisecond, RetryCount: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer q.Close()
		q.ModifyToInit()
		q.ModifyToRTR(rdma.QPInfo{Provider: "soft", QPNum: 7, PSN: psn, Addr: "127.0.0.1:1"})
		q.PostRecv([]rdma.RecvWR{{ID: 1, SGL: sgl(mr, 0, 64)}})
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		h := make([]byte, helloSize+requestHeaderSize)
		encodeHello(h)
		encodeAttach(h[helloSize:], attach{dst: q.Num(), src: 7, psn: psn})
		c.Write(h)
		ack := make([]byte, responseHeaderSize)
		if _, err := io.ReadFull(c, ack); err != nil {
			t.Fatal(err)
		}
		b := append([]byte(nil), stream...)
		for off := 0; off+requestHeaderSize <= len(b); off += requestHeaderSize {
			h := b[off : off+requestHeaderSize]
			if h[8] == fuzzTarget {
				binary.BigEndian.PutUint32(h[8:], q.Num())
			}
			if h[16] == fuzzTarget {
				binary.BigEndian.PutUint32(h[16:], mr.RKey())
				binary.BigEndian.PutUint64(h[20:], mr.Addr())
			}
			if n := binary.BigEndian.Uint32(h); hasPayload(h[4]) && int64(n) <= int64(len(b)-off-requestHeaderSize) {
				off += int(n)
			}
		}
		c.Write(b)
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c) // the device answers, then closes or waits for more
		wc := make([]rdma.Completion, 16)
		for {
			if n, err := cq.Poll(wc); n == 0 || err != nil {
				break
			}
		}
	})
}
