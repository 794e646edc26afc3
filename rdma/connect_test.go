package rdma

import (
	"bytes"
	"testing"
)

func TestQPInfoRoundTrip(t *testing.T) {
	in := QPInfo{Provider: "soft", QPNum: 0x123456, PSN: 0xabcdef, LID: 7, MTU: 4096, Addr: "127.0.0.1:4791"}
	in.GID[15] = 1
	msg, err := MarshalQPInfo(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := readQPInfo(bytes.NewReader(msg))
	if err != nil {
		t.Fatal(err)
	}
	if out != in {
		t.Fatalf("round trip: got %+v, want %+v", out, in)
	}
	for cut := range len(msg) {
		if _, err := readQPInfo(bytes.NewReader(msg[:cut])); err == nil {
			t.Fatalf("truncated to %d of %d bytes: no error", cut, len(msg))
		}
	}
}

func TestQPInfoRejectsForeignPeers(t *testing.T) {
	msg, _ := MarshalQPInfo(QPInfo{Provider: "soft"})
	for name, mutate := range map[string]func([]byte){
		"magic":   func(b []byte) { b[0] = 'X' },
		"version": func(b []byte) { b[4] = 99 },
		"length":  func(b []byte) { b[6]++ },
	} {
		b := append([]byte(nil), msg...)
		mutate(b)
		if _, err := readQPInfo(bytes.NewReader(b)); err == nil {
			t.Errorf("bad %s accepted", name)
		}
	}
}

func FuzzUnmarshalQPInfo(f *testing.F) {
	msg, _ := MarshalQPInfo(QPInfo{Provider: "verbs", QPNum: 17, Addr: "x"})
	f.Add(msg[7:])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		info, err := UnmarshalQPInfo(b)
		if err != nil {
			return
		}
		again, err := MarshalQPInfo(info)
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", info, err)
		}
		if !bytes.Equal(again[7:], b) {
			t.Fatalf("decode/encode is not the identity: %x -> %+v -> %x", b, info, again[7:])
		}
	})
}
