// Tests of the frame codec: round trips, rejections, and fuzzing of every decoder.

package soft

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

func validRequests() []request {
	return []request{
		{op: wireWrite, seq: 1, rkey: 0xdeadbeef, addr: 0x7f0000001000, length: 4096},
		{op: wireWriteImm, seq: 2, rkey: 7, addr: 8, length: 0, imm: 0xcafe},
		{op: wireSend, seq: 3, length: 100},
		{op: wireSendImm, seq: 4, length: 1, imm: 9},
		{op: wireRead, seq: 0xffffffff, rkey: 1, addr: 1 << 40, length: MaxMessageSize},
		{op: wireCompareSwap, seq: 5, rkey: 2, addr: 64, length: 8, compareAdd: 1, swap: 2},
		{op: wireFetchAdd, seq: 6, rkey: 3, addr: 72, length: 8, compareAdd: 1 << 63},
	}
}

func TestRequestRoundTrip(t *testing.T) {
	for _, r := range validRequests() {
		b := make([]byte, requestHeaderSize)
		encodeRequest(b, &r)
		got, err := decodeRequest(b)
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if got != r {
			t.Fatalf("round trip %+v -> %+v", r, got)
		}
	}
}

func TestRequestRejects(t *testing.T) {
	base := func() []byte {
		b := make([]byte, requestHeaderSize)
		encodeRequest(b, &request{op: wireWrite, seq: 1, rkey: 2, addr: 3, length: 16})
		return b
	}
	cases := map[string]func(b []byte) []byte{
		"short":             func(b []byte) []byte { return b[:requestHeaderSize-1] },
		"long":              func(b []byte) []byte { return append(b, 0) },
		"opcode 0":          func(b []byte) []byte { b[4] = 0; return b },
		"opcode 8":          func(b []byte) []byte { b[4] = wireOpEnd; return b },
		"reserved":          func(b []byte) []byte { b[6] = 1; return b },
		"payload mismatch":  func(b []byte) []byte { binary.BigEndian.PutUint32(b, 17); return b },
		"oversized":         func(b []byte) []byte { put2(b, 0, 24, MaxMessageSize+1); return b },
		"huge":              func(b []byte) []byte { put2(b, 0, 24, 0xffffffff); return b },
		"imm on write":      func(b []byte) []byte { binary.BigEndian.PutUint32(b[28:], 1); return b },
		"operand on write":  func(b []byte) []byte { binary.BigEndian.PutUint64(b[32:], 1); return b },
		"swap on write":     func(b []byte) []byte { binary.BigEndian.PutUint64(b[40:], 1); return b },
		"read with payload": func(b []byte) []byte { b[4] = wireRead; return b },
		"atomic length":     func(b []byte) []byte { b[4] = wireFetchAdd; put2(b, 0, 24, 0); return b },
		"send names memory": func(b []byte) []byte { b[4] = wireSend; return b },
		"swap on fetch-add": func(b []byte) []byte {
			b[4] = wireFetchAdd
			put2(b, 0, 24, 8)
			binary.BigEndian.PutUint32(b, 0)
			binary.BigEndian.PutUint64(b[40:], 1)
			return b
		},
	}
	for name, mutate := range cases {
		if r, err := decodeRequest(mutate(base())); err == nil {
			t.Errorf("%s: decoded %+v", name, r)
		}
	}
}

// put2 stores v as both the payload length (at p) and the length (at l).
func put2(b []byte, p, l int, v uint32) {
	binary.BigEndian.PutUint32(b[p:], v)
	binary.BigEndian.PutUint32(b[l:], v)
}

func TestResponseRoundTrip(t *testing.T) {
	for _, r := range []response{
		{kind: respAck, seq: 1},
		{kind: respNAK, seq: 2, status: rdma.StatusRemAccessErr},
		{kind: respNAK, seq: 3, status: rdma.StatusRNRRetryExcErr},
		{kind: respReadData, seq: 4, length: 65536},
		{kind: respAtomic, seq: 5, value: 0x0102030405060708},
	} {
		b := make([]byte, responseHeaderSize)
		encodeResponse(b, &r)
		got, err := decodeResponse(b)
		if err != nil || got != r {
			t.Fatalf("round trip %+v -> %+v, %v", r, got, err)
		}
	}
}

func TestResponseRejects(t *testing.T) {
	for name, r := range map[string]response{
		"kind 0":          {},
		"kind 5":          {kind: respKindEnd},
		"NAK success":     {kind: respNAK},
		"NAK local":       {kind: respNAK, status: rdma.StatusLocProtErr},
		"NAK flush":       {kind: respNAK, status: rdma.StatusWRFlushErr},
		"status on ack":   {kind: respAck, status: rdma.StatusRemOpErr},
		"ack payload":     {kind: respAck, length: 1},
		"atomic payload":  {kind: respAtomic, length: 8},
		"oversized read":  {kind: respReadData, length: MaxMessageSize + 1},
		"value on ack":    {kind: respAck, value: 1},
		"value on a read": {kind: respReadData, value: 1},
	} {
		b := make([]byte, responseHeaderSize)
		encodeResponse(b, &r)
		if _, err := decodeResponse(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	b := make([]byte, responseHeaderSize)
	encodeResponse(b, &response{kind: respAck})
	b[7] = 1
	if _, err := decodeResponse(b); err == nil {
		t.Error("reserved byte accepted")
	}
}

func TestHelloRoundTrip(t *testing.T) {
	h := hello{dstQPN: 0xabcdef, srcQPN: 0x123456, psn: 77, rnrBudget: 1500 * time.Millisecond}
	b := make([]byte, helloSize)
	encodeHello(b, h)
	got, err := decodeHello(b)
	if err != nil || got != h {
		t.Fatalf("round trip %+v -> %+v, %v", h, got, err)
	}
	for name, mutate := range map[string]func([]byte){
		"magic":    func(b []byte) { b[0] = 'X' },
		"version":  func(b []byte) { b[4] = 2 },
		"reserved": func(b []byte) { b[7] = 1 },
		"rnr":      func(b []byte) { binary.BigEndian.PutUint32(b[20:], 3600_000) },
	} {
		c := bytes.Clone(b)
		mutate(c)
		if _, err := decodeHello(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	a := make([]byte, helloAckSize)
	encodeHelloAck(a, ackBusy)
	if code, err := decodeHelloAck(a); err != nil || code != ackBusy {
		t.Fatalf("ack round trip: %d, %v", code, err)
	}
	a[4] = ackCodeEnd
	if _, err := decodeHelloAck(a); err == nil {
		t.Error("unknown ack code accepted")
	}
}

// The decoders must never panic, and whatever they accept must re-encode
// to the very same bytes: no field is silently ignored.

func FuzzDecodeRequest(f *testing.F) {
	for _, r := range validRequests() {
		b := make([]byte, requestHeaderSize)
		encodeRequest(b, &r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRequest(b)
		if err != nil {
			return
		}
		out := make([]byte, requestHeaderSize)
		encodeRequest(out, &r)
		if !bytes.Equal(out, b) {
			t.Fatalf("decoded %+v from % x, re-encoded % x", r, b, out)
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	for _, r := range []response{{kind: respAck, seq: 1}, {kind: respReadData, length: 64}, {kind: respAtomic, value: 5}, {kind: respNAK, status: rdma.StatusRemInvReqErr}} {
		b := make([]byte, responseHeaderSize)
		encodeResponse(b, &r)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeResponse(b)
		if err != nil {
			return
		}
		out := make([]byte, responseHeaderSize)
		encodeResponse(out, &r)
		if !bytes.Equal(out, b) {
			t.Fatalf("decoded %+v from % x, re-encoded % x", r, b, out)
		}
	})
}

func FuzzDecodeHello(f *testing.F) {
	b := make([]byte, helloSize)
	encodeHello(b, hello{dstQPN: 2, srcQPN: 3, psn: 4, rnrBudget: time.Second})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := decodeHello(b)
		if err != nil {
			return
		}
		out := make([]byte, helloSize)
		encodeHello(out, h)
		if !bytes.Equal(out, b) {
			t.Fatalf("decoded %+v from % x, re-encoded % x", h, b, out)
		}
	})
}

func FuzzDecodeHelloAck(f *testing.F) {
	b := make([]byte, helloAckSize)
	encodeHelloAck(b, ackOK)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		code, err := decodeHelloAck(b)
		if err != nil {
			return
		}
		out := make([]byte, helloAckSize)
		encodeHelloAck(out, code)
		if !bytes.Equal(out, b) {
			t.Fatalf("decoded %d from % x, re-encoded % x", code, b, out)
		}
	})
}
