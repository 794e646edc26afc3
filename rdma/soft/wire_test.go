// Tests of the frame codec: round trips, rejections, and fuzzing of every decoder.

package soft

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/rkv-io/rkv/rdma"
)

func validRequests() []request {
	return []request{
		{op: wireWrite, dst: 2, seq: 1, rkey: 0xdeadbeef, addr: 0x7f0000001000, length: 4096},
		{op: wireWriteImm, dst: maxQPN, seq: 2, rkey: 7, addr: 8, length: 0, imm: 0xcafe},
		{op: wireSend, dst: 1, seq: 3, length: 100},
		{op: wireSendImm, dst: 0xabcdef, seq: 4, length: 1, imm: 9},
		{op: wireWrite, ackMayWait: true, dst: 6, seq: 7, rkey: 1, addr: 2, length: 3},
		{op: wireSend, ackMayWait: true, dst: 6, seq: 8, length: 64},
		{op: wireRead, dst: 3, seq: 0xffffffff, rkey: 1, addr: 1 << 40, length: MaxMessageSize},
		{op: wireCompareSwap, dst: 4, seq: 5, rkey: 2, addr: 64, length: 8, compareAdd: 1, swap: 2},
		{op: wireFetchAdd, dst: 5, seq: 6, rkey: 3, addr: 72, length: 8, compareAdd: 1 << 63},
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
		encodeRequest(b, &request{op: wireWrite, dst: 9, seq: 1, rkey: 2, addr: 3, length: 16})
		return b
	}
	cases := map[string]func(b []byte) []byte{
		"short":         func(b []byte) []byte { return b[:requestHeaderSize-1] },
		"long":          func(b []byte) []byte { return append(b, 0) },
		"opcode 0":      func(b []byte) []byte { b[4] = 0; return b },
		"attach opcode": func(b []byte) []byte { b[4] = wireAttach; return b },
		"detach opcode": func(b []byte) []byte { b[4] = wireDetach; return b },
		"opcode end":    func(b []byte) []byte { b[4] = wireOpEnd; return b },
		"reserved":      func(b []byte) []byte { b[6] = 1; return b },
		"unknown flag":  func(b []byte) []byte { b[5] = flagAckMayWait << 1; return b },
		"waiting ACK on read": func(b []byte) []byte {
			b[4], b[5] = wireRead, flagAckMayWait
			binary.BigEndian.PutUint32(b, 0)
			return b
		},
		"QP 0":              func(b []byte) []byte { binary.BigEndian.PutUint32(b[8:], 0); return b },
		"QP above 24 bits":  func(b []byte) []byte { binary.BigEndian.PutUint32(b[8:], maxQPN+1); return b },
		"payload mismatch":  func(b []byte) []byte { binary.BigEndian.PutUint32(b, 17); return b },
		"oversized":         func(b []byte) []byte { put2(b, 0, 28, MaxMessageSize+1); return b },
		"huge":              func(b []byte) []byte { put2(b, 0, 28, 0xffffffff); return b },
		"imm on write":      func(b []byte) []byte { binary.BigEndian.PutUint32(b[32:], 1); return b },
		"operand on write":  func(b []byte) []byte { binary.BigEndian.PutUint64(b[36:], 1); return b },
		"swap on write":     func(b []byte) []byte { binary.BigEndian.PutUint64(b[44:], 1); return b },
		"read with payload": func(b []byte) []byte { b[4] = wireRead; return b },
		"atomic length":     func(b []byte) []byte { b[4] = wireFetchAdd; put2(b, 0, 28, 0); return b },
		"send names memory": func(b []byte) []byte { b[4] = wireSend; return b },
		"swap on fetch-add": func(b []byte) []byte {
			b[4] = wireFetchAdd
			put2(b, 0, 28, 8)
			binary.BigEndian.PutUint32(b, 0)
			binary.BigEndian.PutUint64(b[44:], 1)
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

func validResponses() []response {
	return []response{
		{kind: respAck, dst: 7, seq: 1},
		{kind: respNAK, dst: maxQPN, seq: 2, status: rdma.StatusRemAccessErr},
		{kind: respNAK, dst: 1, seq: 3, status: rdma.StatusRNRRetryExcErr},
		{kind: respReadData, dst: 2, seq: 4, length: 65536},
		{kind: respAtomic, dst: 3, seq: 5, value: 0x0102030405060708},
	}
}

func TestResponseRoundTrip(t *testing.T) {
	for _, r := range validResponses() {
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
		"kind 0":          {dst: 1},
		"attach ack kind": {kind: respAttachAck, dst: 1},
		"gone kind":       {kind: respGone, dst: 1},
		"kind end":        {kind: respKindEnd, dst: 1},
		"QP 0":            {kind: respAck},
		"QP above 24 bit": {kind: respAck, dst: maxQPN + 1},
		"NAK success":     {kind: respNAK, dst: 1},
		"NAK local":       {kind: respNAK, dst: 1, status: rdma.StatusLocProtErr},
		"NAK flush":       {kind: respNAK, dst: 1, status: rdma.StatusWRFlushErr},
		"status on ack":   {kind: respAck, dst: 1, status: rdma.StatusRemOpErr},
		"ack payload":     {kind: respAck, dst: 1, length: 1},
		"atomic payload":  {kind: respAtomic, dst: 1, length: 8},
		"oversized read":  {kind: respReadData, dst: 1, length: MaxMessageSize + 1},
		"value on ack":    {kind: respAck, dst: 1, value: 1},
		"value on a read": {kind: respReadData, dst: 1, value: 1},
	} {
		b := make([]byte, responseHeaderSize)
		encodeResponse(b, &r)
		if _, err := decodeResponse(b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	b := make([]byte, responseHeaderSize)
	encodeResponse(b, &response{kind: respAck, dst: 1})
	b[7] = 1
	if _, err := decodeResponse(b); err == nil {
		t.Error("reserved byte accepted")
	}
}

func TestHelloRoundTrip(t *testing.T) {
	b := make([]byte, helloSize)
	encodeHello(b)
	if err := decodeHello(b); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func([]byte) []byte{
		"magic":     func(b []byte) []byte { b[0] = 'X'; return b },
		"version 2": func(b []byte) []byte { b[4] = wireVersion - 1; return b },
		"version 4": func(b []byte) []byte { b[4] = wireVersion + 1; return b },
		"reserved":  func(b []byte) []byte { b[7] = 1; return b },
		"short":     func(b []byte) []byte { return b[:helloSize-1] },
		"long":      func(b []byte) []byte { return append(b, 0) },
	} {
		if err := decodeHello(mutate(bytes.Clone(b))); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestControlRoundTrip(t *testing.T) {
	b := make([]byte, requestHeaderSize)
	a := attach{dst: 0xabcdef, src: 0x123456, psn: 77}
	encodeAttach(b, a)
	if got, err := decodeAttach(b); err != nil || got != a {
		t.Fatalf("attach round trip %+v -> %+v, %v", a, got, err)
	}
	d := qpEnds{dst: 5, src: maxQPN}
	encodeDetach(b, d)
	if got, err := decodeDetach(b); err != nil || got != d {
		t.Fatalf("detach round trip %+v -> %+v, %v", d, got, err)
	}
	r := make([]byte, responseHeaderSize)
	ack := attachAck{qpEnds: qpEnds{dst: 9, src: 10}, code: ackBusy}
	encodeAttachAck(r, ack)
	if got, err := decodeAttachAck(r); err != nil || got != ack {
		t.Fatalf("attach ack round trip %+v -> %+v, %v", ack, got, err)
	}
	g := qpEnds{dst: 11, src: 12}
	encodeGone(r, g)
	if got, err := decodeGone(r); err != nil || got != g {
		t.Fatalf("gone round trip %+v -> %+v, %v", g, got, err)
	}
}

func TestControlRejects(t *testing.T) {
	attachFrame := func() []byte {
		b := make([]byte, requestHeaderSize)
		encodeAttach(b, attach{dst: 2, src: 3, psn: 4})
		return b
	}
	for name, mutate := range map[string]func([]byte) []byte{
		"payload":      func(b []byte) []byte { b[3] = 1; return b },
		"code byte":    func(b []byte) []byte { b[5] = 1; return b },
		"reserved":     func(b []byte) []byte { b[6] = 1; return b },
		"dst QP 0":     func(b []byte) []byte { binary.BigEndian.PutUint32(b[8:], 0); return b },
		"src QP 0":     func(b []byte) []byte { binary.BigEndian.PutUint32(b[12:], 0); return b },
		"src QP big":   func(b []byte) []byte { binary.BigEndian.PutUint32(b[12:], maxQPN+1); return b },
		"trailing":     func(b []byte) []byte { b[requestHeaderSize-1] = 1; return b },
		"after PSN":    func(b []byte) []byte { b[20] = 1; return b },
		"not attach":   func(b []byte) []byte { b[4] = wireDetach; return b },
		"short":        func(b []byte) []byte { return b[:requestHeaderSize-1] },
		"request size": func(b []byte) []byte { return b[:responseHeaderSize] },
	} {
		if a, err := decodeAttach(mutate(attachFrame())); err == nil {
			t.Errorf("attach %s: decoded %+v", name, a)
		}
	}
	detachFrame := func() []byte {
		b := make([]byte, requestHeaderSize)
		encodeDetach(b, qpEnds{dst: 2, src: 3})
		return b
	}
	for name, mutate := range map[string]func([]byte) []byte{
		"PSN":        func(b []byte) []byte { b[19] = 1; return b },
		"not detach": func(b []byte) []byte { b[4] = wireAttach; return b },
		"dst QP 0":   func(b []byte) []byte { binary.BigEndian.PutUint32(b[8:], 0); return b },
	} {
		if p, err := decodeDetach(mutate(detachFrame())); err == nil {
			t.Errorf("detach %s: decoded %+v", name, p)
		}
	}
	ackFrame := func() []byte {
		b := make([]byte, responseHeaderSize)
		encodeAttachAck(b, attachAck{qpEnds: qpEnds{dst: 2, src: 3}, code: ackOK})
		return b
	}
	for name, mutate := range map[string]func([]byte) []byte{
		"unknown code": func(b []byte) []byte { b[5] = ackCodeEnd; return b },
		"value":        func(b []byte) []byte { b[23] = 1; return b },
		"PSN":          func(b []byte) []byte { b[16] = 1; return b },
		"not an ack":   func(b []byte) []byte { b[4] = respGone; return b },
	} {
		if a, err := decodeAttachAck(mutate(ackFrame())); err == nil {
			t.Errorf("attach ack %s: decoded %+v", name, a)
		}
	}
	goneFrame := func() []byte {
		b := make([]byte, responseHeaderSize)
		encodeGone(b, qpEnds{dst: 2, src: 3})
		return b
	}
	for name, mutate := range map[string]func([]byte) []byte{
		"code byte": func(b []byte) []byte { b[5] = 1; return b },
		"not gone":  func(b []byte) []byte { b[4] = respAttachAck; return b },
		"src QP 0":  func(b []byte) []byte { binary.BigEndian.PutUint32(b[12:], 0); return b },
	} {
		if p, err := decodeGone(mutate(goneFrame())); err == nil {
			t.Errorf("gone %s: decoded %+v", name, p)
		}
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
	for _, r := range validResponses() {
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
	encodeHello(b)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		if decodeHello(b) != nil {
			return
		}
		out := make([]byte, helloSize)
		encodeHello(out)
		if !bytes.Equal(out, b) {
			t.Fatalf("accepted % x, the hello is % x", b, out)
		}
	})
}

// FuzzDecodeControl feeds the control decoders of both directions: at
// most one accepts a header, and what it accepts re-encodes to the same
// bytes; no data decoder accepts a control frame.
func FuzzDecodeControl(f *testing.F) {
	b := make([]byte, requestHeaderSize)
	encodeAttach(b, attach{dst: 2, src: 3, psn: 4})
	f.Add(bytes.Clone(b))
	encodeDetach(b, qpEnds{dst: 5, src: 6})
	f.Add(bytes.Clone(b))
	r := make([]byte, responseHeaderSize)
	encodeAttachAck(r, attachAck{qpEnds: qpEnds{dst: 7, src: 8}, code: ackWrongPeer})
	f.Add(bytes.Clone(r))
	encodeGone(r, qpEnds{dst: 9, src: 10})
	f.Add(bytes.Clone(r))
	f.Fuzz(func(t *testing.T, b []byte) {
		out := make([]byte, len(b))
		accepted := 0
		if a, err := decodeAttach(b); err == nil {
			accepted++
			encodeAttach(out, a)
			if !bytes.Equal(out, b) {
				t.Fatalf("attach %+v from % x, re-encoded % x", a, b, out)
			}
		}
		if p, err := decodeDetach(b); err == nil {
			accepted++
			encodeDetach(out, p)
			if !bytes.Equal(out, b) {
				t.Fatalf("detach %+v from % x, re-encoded % x", p, b, out)
			}
		}
		if a, err := decodeAttachAck(b); err == nil {
			accepted++
			encodeAttachAck(out, a)
			if !bytes.Equal(out, b) {
				t.Fatalf("attach ack %+v from % x, re-encoded % x", a, b, out)
			}
		}
		if p, err := decodeGone(b); err == nil {
			accepted++
			encodeGone(out, p)
			if !bytes.Equal(out, b) {
				t.Fatalf("gone %+v from % x, re-encoded % x", p, b, out)
			}
		}
		if accepted > 1 {
			t.Fatalf("% x decodes as %d kinds of control frame", b, accepted)
		}
		if _, err := decodeRequest(b); err == nil && accepted > 0 {
			t.Fatalf("% x decodes as a request and a control frame", b)
		}
		if _, err := decodeResponse(b); err == nil && accepted > 0 {
			t.Fatalf("% x decodes as a response and a control frame", b)
		}
	})
}
