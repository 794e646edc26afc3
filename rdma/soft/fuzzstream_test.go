// Stream fuzzing: arbitrary bytes after a valid hello must cost the victim QP at most, never the device.

package soft

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

func FuzzResponderStream(f *testing.F) {
	frame := func(r request, payload int) []byte {
		b := make([]byte, requestHeaderSize, requestHeaderSize+payload)
		encodeRequest(b, &r)
		return append(b, make([]byte, payload)...)
	}
	const psn = 1000
	f.Add(frame(request{op: wireRead, seq: psn, length: 8}, 0))
	f.Add(frame(request{op: wireWrite, seq: psn, length: 16}, 16))
	f.Add(append(frame(request{op: wireSend, seq: psn, length: 4}, 4), frame(request{op: wireFetchAdd, seq: psn + 1, length: 8, compareAdd: 1}, 0)...))
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
		h := make([]byte, helloSize)
		encodeHello(h, hello{dstQPN: q.Num(), srcQPN: 7, psn: psn})
		c.Write(h)
		ack := make([]byte, helloAckSize)
		if _, err := io.ReadFull(c, ack); err != nil {
			t.Fatal(err)
		}
		// Point the fuzzer's rkeys and addresses at the MR now and then.
		if len(stream) >= requestHeaderSize && stream[12] == 0xAA {
			b := append([]byte(nil), stream...)
			put32(b[12:], mr.RKey())
			put64(b[16:], mr.Addr())
			stream = b
		}
		c.Write(stream)
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

func put32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
}

func put64(b []byte, v uint64) {
	put32(b, uint32(v>>32))
	put32(b[4:], uint32(v))
}
