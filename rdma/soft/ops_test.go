// Tests of the operations on a healthy connection: READ, WRITE, SEND, immediates, atomics, ordering, fence.

package soft

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/rdmatest"
)

func TestWriteThenReadOrdering(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	src := register(t, a.pd, 8192, rw)
	dst := register(t, a.pd, 8192, rw)
	remote := register(t, b.pd, 8192, rw)
	for round := range 50 {
		for i := range src.Bytes() {
			src.Bytes()[i] = byte(round + i)
		}
		// Unsignaled WRITE then signaled READ of the same bytes, posted
		// together: the READ must see the WRITE.
		post(t, a.qp,
			rdma.SendWR{ID: 1, Op: rdma.OpWrite, SGL: sgl(src, 0, 8192), RemoteAddr: remote.Addr(), RKey: remote.RKey()},
			rdma.SendWR{ID: 2, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(dst, 0, 8192), RemoteAddr: remote.Addr(), RKey: remote.RKey()})
		wc := expectStatus(t, a.cq, 2, rdma.StatusSuccess)
		if wc.Op != rdma.OpRead || wc.ByteLen != 8192 || wc.QPNum != a.qp.Num() {
			t.Fatalf("completion %+v", wc)
		}
		if !bytes.Equal(dst.Bytes(), src.Bytes()) {
			t.Fatalf("round %d: READ did not see the WRITE", round)
		}
	}
	expectNone(t, a.cq, 10*time.Millisecond)
}

func TestMultiSGE(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	local := register(t, a.pd, 1<<16, rw)
	remote := register(t, b.pd, 1<<16, rw)
	copy(local.Bytes(), "aaaa")
	copy(local.Bytes()[5000:], bytes.Repeat([]byte("b"), 10000))
	write := []rdma.SGE{{MR: local, Offset: 0, Length: 4}, {MR: local, Offset: 5000, Length: 10000}, {MR: local, Length: 0}}
	post(t, a.qp, rdma.SendWR{ID: 1, Op: rdma.OpWrite, Flags: rdma.Signaled, SGL: write, RemoteAddr: remote.Addr() + 100, RKey: remote.RKey()})
	expectStatus(t, a.cq, 1, rdma.StatusSuccess)
	want := append([]byte("aaaa"), bytes.Repeat([]byte("b"), 10000)...)
	if !bytes.Equal(remote.Bytes()[100:100+len(want)], want) {
		t.Fatal("gathered WRITE landed wrong")
	}
	read := []rdma.SGE{{MR: local, Offset: 30000, Length: 3}, {MR: local, Offset: 40000, Length: 10001}}
	post(t, a.qp, rdma.SendWR{ID: 2, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: read, RemoteAddr: remote.Addr() + 100, RKey: remote.RKey()})
	expectStatus(t, a.cq, 2, rdma.StatusSuccess)
	got := append(bytes.Clone(local.Bytes()[30000:30003]), local.Bytes()[40000:50001]...)
	if !bytes.Equal(got, want) {
		t.Fatal("scattered READ landed wrong")
	}
}

func TestSendRecv(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	src := register(t, a.pd, 4096, rw)
	dst := register(t, b.pd, 4096, rw)
	copy(src.Bytes(), "0123456789")
	postRecv(t, b.qp,
		rdma.RecvWR{ID: 10, SGL: []rdma.SGE{{MR: dst, Offset: 0, Length: 3}, {MR: dst, Offset: 100, Length: 50}}},
		rdma.RecvWR{ID: 11, SGL: sgl(dst, 200, 64)},
		rdma.RecvWR{ID: 12, SGL: sgl(dst, 300, 64)})
	post(t, a.qp,
		rdma.SendWR{ID: 1, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: sgl(src, 0, 10)},
		rdma.SendWR{ID: 2, Op: rdma.OpSendImm, Flags: rdma.Signaled, SGL: sgl(src, 0, 4), Imm: 0xfeedf00d},
		rdma.SendWR{ID: 3, Op: rdma.OpSend, Flags: rdma.Signaled})
	for i := uint64(1); i <= 3; i++ {
		expectStatus(t, a.cq, i, rdma.StatusSuccess)
	}
	wc := expectStatus(t, b.cq, 10, rdma.StatusSuccess)
	if wc.Op != rdma.OpRecv || wc.ByteLen != 10 || wc.HasImm || wc.QPNum != b.qp.Num() {
		t.Fatalf("recv %+v", wc)
	}
	if string(dst.Bytes()[:3]) != "012" || string(dst.Bytes()[100:107]) != "3456789" {
		t.Fatalf("scattered %q %q", dst.Bytes()[:3], dst.Bytes()[100:107])
	}
	wc = expectStatus(t, b.cq, 11, rdma.StatusSuccess)
	if wc.Op != rdma.OpRecv || wc.ByteLen != 4 || !wc.HasImm || wc.Imm != 0xfeedf00d {
		t.Fatalf("recv with imm %+v", wc)
	}
	wc = expectStatus(t, b.cq, 12, rdma.StatusSuccess)
	if wc.ByteLen != 0 {
		t.Fatalf("empty send %+v", wc)
	}
}

func TestWriteWithImm(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	src := register(t, a.pd, 4096, rw)
	remote := register(t, b.pd, 4096, rw)
	recvBuf := register(t, b.pd, 64, rdma.AccessLocalWrite)
	copy(src.Bytes(), "payload!")
	postRecv(t, b.qp, rdma.RecvWR{ID: 7, SGL: sgl(recvBuf, 0, 64)})
	post(t, a.qp, rdma.SendWR{ID: 1, Op: rdma.OpWriteImm, Flags: rdma.Signaled, SGL: sgl(src, 0, 8), RemoteAddr: remote.Addr() + 16, RKey: remote.RKey(), Imm: 1234})
	expectStatus(t, a.cq, 1, rdma.StatusSuccess)
	wc := expectStatus(t, b.cq, 7, rdma.StatusSuccess)
	if wc.Op != rdma.OpRecvImm || !wc.HasImm || wc.Imm != 1234 || wc.ByteLen != 8 {
		t.Fatalf("recv %+v", wc)
	}
	if string(remote.Bytes()[16:24]) != "payload!" {
		t.Fatalf("remote %q", remote.Bytes()[16:24])
	}
	if recvBuf.Bytes()[0] != 0 {
		t.Fatal("WRITE_WITH_IMM touched the RECV buffer")
	}
}

func TestAtomics(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	res := register(t, a.pd, 64, rdma.AccessLocalWrite)
	remote := register(t, b.pd, 64, allRW)
	ne := binary.NativeEndian
	ne.PutUint64(remote.Bytes()[8:], 100)
	result := func() uint64 { return ne.Uint64(res.Bytes()[8:]) }
	atomic := func(id uint64, op rdma.Opcode, cmp, swap uint64) {
		t.Helper()
		post(t, a.qp, rdma.SendWR{ID: id, Op: op, Flags: rdma.Signaled, SGL: sgl(res, 8, 8), RemoteAddr: remote.Addr() + 8, RKey: remote.RKey(), CompareAdd: cmp, Swap: swap})
		wc := expectStatus(t, a.cq, id, rdma.StatusSuccess)
		if wc.Op != op || wc.ByteLen != 8 {
			t.Fatalf("completion %+v", wc)
		}
	}
	atomic(1, rdma.OpFetchAdd, 5, 0)
	if result() != 100 || ne.Uint64(remote.Bytes()[8:]) != 105 {
		t.Fatalf("FAA: got %d, memory %d", result(), ne.Uint64(remote.Bytes()[8:]))
	}
	atomic(2, rdma.OpCompareSwap, 99, 7) // mismatch: no store
	if result() != 105 || ne.Uint64(remote.Bytes()[8:]) != 105 {
		t.Fatalf("failed CAS: got %d, memory %d", result(), ne.Uint64(remote.Bytes()[8:]))
	}
	atomic(3, rdma.OpCompareSwap, 105, 7)
	if result() != 105 || ne.Uint64(remote.Bytes()[8:]) != 7 {
		t.Fatalf("CAS: got %d, memory %d", result(), ne.Uint64(remote.Bytes()[8:]))
	}
	atomic(4, rdma.OpFetchAdd, ^uint64(0), 0) // wraps: adds -1
	if result() != 7 || ne.Uint64(remote.Bytes()[8:]) != 6 {
		t.Fatalf("FAA -1: got %d, memory %d", result(), ne.Uint64(remote.Bytes()[8:]))
	}
}

func TestConcurrentFetchAdd(t *testing.T) {
	const qps, each = 4, 200
	b := newSide(t, rdma.QPConfig{})
	counter := register(t, b.pd, 8, allRW)
	a := newSide(t, rdma.QPConfig{})
	res := register(t, a.pd, 8*qps, rdma.AccessLocalWrite)
	done := make(chan error, qps)
	for i := range qps {
		qa := createQP(t, a.pd, rdma.QPConfig{SendCQ: a.cq, RecvCQ: a.cq, SignalAll: true, MaxSendWR: each})
		qb := createQP(t, b.pd, rdma.QPConfig{SendCQ: b.cq, RecvCQ: b.cq})
		rdmatest.Connect(t, qa, qb)
		go func() {
			wr := []rdma.SendWR{{Op: rdma.OpFetchAdd, SGL: sgl(res, 8*i, 8), RemoteAddr: counter.Addr(), RKey: counter.RKey(), CompareAdd: 1}}
			for range each {
				if err := qa.PostSend(wr); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range qps {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for range qps * each {
		if wc := wait(t, a.cq); wc.Status != rdma.StatusSuccess {
			t.Fatalf("completion %+v", wc)
		}
	}
	if got := binary.NativeEndian.Uint64(counter.Bytes()); got != qps*each {
		t.Fatalf("counter %d, want %d", got, qps*each)
	}
}

func TestZeroLength(t *testing.T) {
	a, _ := newPair(t, rdma.QPConfig{})
	// No valid rkey is needed for zero-length READ and WRITE.
	post(t, a.qp,
		rdma.SendWR{ID: 1, Op: rdma.OpWrite, Flags: rdma.Signaled, RemoteAddr: 12345, RKey: 0xbad},
		rdma.SendWR{ID: 2, Op: rdma.OpRead, Flags: rdma.Signaled, RemoteAddr: 12345, RKey: 0xbad})
	expectStatus(t, a.cq, 1, rdma.StatusSuccess)
	expectStatus(t, a.cq, 2, rdma.StatusSuccess)
}

func TestSignaling(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	local := register(t, a.pd, 64, rw)
	remote := register(t, b.pd, 64, rw)
	w := rdma.SendWR{Op: rdma.OpWrite, SGL: sgl(local, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
	for i := range 10 {
		w.ID = uint64(i)
		post(t, a.qp, w)
	}
	w.ID, w.Flags = 99, rdma.Signaled
	post(t, a.qp, w)
	expectStatus(t, a.cq, 99, rdma.StatusSuccess)
	expectNone(t, a.cq, 10*time.Millisecond)

	// SignalAll signals everything.
	c, d := newPair(t, rdma.QPConfig{SignalAll: true})
	local = register(t, c.pd, 64, rw)
	remote = register(t, d.pd, 64, rw)
	w = rdma.SendWR{Op: rdma.OpWrite, SGL: sgl(local, 0, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
	for i := range 5 {
		w.ID = uint64(i)
		post(t, c.qp, w)
	}
	for i := range 5 {
		expectStatus(t, c.cq, uint64(i), rdma.StatusSuccess)
	}
}

func TestFence(t *testing.T) {
	a, b := newPair(t, rdma.QPConfig{})
	buf := register(t, a.pd, 4096, rw)
	remote := register(t, b.pd, 4096, rw)
	recv := register(t, b.pd, 4096, rw)
	for round := range 20 {
		copy(remote.Bytes(), bytes.Repeat([]byte{byte(round)}, 4096))
		postRecv(t, b.qp, rdma.RecvWR{ID: 1, SGL: sgl(recv, 0, 4096)})
		// READ into buf, then SEND buf with Fence: the SEND must carry
		// what the READ brought.
		post(t, a.qp,
			rdma.SendWR{ID: 1, Op: rdma.OpRead, SGL: sgl(buf, 0, 4096), RemoteAddr: remote.Addr(), RKey: remote.RKey()},
			rdma.SendWR{ID: 2, Op: rdma.OpSend, Flags: rdma.Signaled | rdma.Fence, SGL: sgl(buf, 0, 4096)})
		expectStatus(t, a.cq, 2, rdma.StatusSuccess)
		expectStatus(t, b.cq, 1, rdma.StatusSuccess)
		if !bytes.Equal(recv.Bytes(), remote.Bytes()) {
			t.Fatalf("round %d: fenced SEND overtook the READ", round)
		}
	}
}

// Both QPs on one device, connected over a real TCP loopback connection.
func TestLoopbackOneDevice(t *testing.T) {
	d := openDev(t)
	p := allocPD(t, d)
	c := createCQ(t, d, 64)
	a := createQP(t, p, rdma.QPConfig{SendCQ: c, RecvCQ: c})
	b := createQP(t, p, rdma.QPConfig{SendCQ: c, RecvCQ: c})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	errc := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			errc <- err
			return
		}
		defer conn.Close()
		_, err = rdma.ConnectQP(context.Background(), conn, b)
		errc <- err
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := rdma.ConnectQP(context.Background(), conn, a); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	m := register(t, p, 4096, allRW)
	copy(m.Bytes()[1024:], "same device")
	post(t, a, rdma.SendWR{ID: 1, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(m, 0, 11), RemoteAddr: m.Addr() + 1024, RKey: m.RKey()})
	expectStatus(t, c, 1, rdma.StatusSuccess)
	if string(m.Bytes()[:11]) != "same device" {
		t.Fatalf("%q", m.Bytes()[:11])
	}
	postRecv(t, a, rdma.RecvWR{ID: 2, SGL: sgl(m, 2048, 64)})
	post(t, b, rdma.SendWR{ID: 3, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: sgl(m, 0, 11)})
	got := map[uint64]bool{}
	for range 2 {
		wc := wait(t, c)
		if wc.Status != rdma.StatusSuccess {
			t.Fatalf("%+v", wc)
		}
		got[wc.ID] = true
	}
	if !got[2] || !got[3] || string(m.Bytes()[2048:2059]) != "same device" {
		t.Fatalf("completions %v, received %q", got, m.Bytes()[2048:2059])
	}
}
