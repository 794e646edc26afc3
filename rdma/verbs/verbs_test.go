//go:build verbs

package verbs

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/internal/memlimit"
)

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// The tests need RDMA devices; on a host without any they skip, except
// TestNoDevice, which needs their absence. In the rxe VM
// (deploy/rxevm/run.sh --rxe 2) RKV_RXE_DEVICES names the devices and
// RKV_RXE_GID_INDEX the GID index to use.

// testDevices returns the devices to test on, or skips.
func testDevices(t testing.TB) []string {
	t.Helper()
	if env := os.Getenv("RKV_RXE_DEVICES"); env != "" {
		return strings.Split(env, ",")
	}
	names, err := provider{}.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	if len(names) == 0 {
		t.Skip("no RDMA device (run in the rxe VM: deploy/rxevm/run.sh)")
	}
	return names
}

// testOptions returns Open options: the GID index of RKV_RXE_GID_INDEX, or
// auto.
func testOptions(t testing.TB) rdma.Options {
	t.Helper()
	return rdma.Options{GID: os.Getenv("RKV_RXE_GID_INDEX")}
}

func TestNoDevice(t *testing.T) {
	names, err := provider{}.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	if len(names) > 0 {
		t.Skipf("devices %v exist; this test checks the error without any", names)
	}
	for _, name := range []string{"", "auto", "rxe0"} {
		_, err := rdma.Open("verbs", name, rdma.Options{})
		if !errors.Is(err, rdma.ErrNoDevice) {
			t.Fatalf("Open(verbs, %q) = %v, want ErrNoDevice", name, err)
		}
		for _, want := range []string{"no RDMA device found", "--provider=soft", "rdma link add rxe0 type rxe netdev IFACE"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("Open(verbs, %q) error %q does not say %q", name, err, want)
			}
		}
		t.Logf("Open(verbs, %q): %v", name, err)
	}
}

func TestOpenGIDByAddress(t *testing.T) {
	devs := testDevices(t)
	addrs := strings.Split(os.Getenv("RKV_RXE_ADDRS"), ",")
	if len(addrs) < len(devs) || addrs[0] == "" {
		t.Fatalf("RKV_RXE_ADDRS=%q does not name an address per device %v (run inside deploy/rxevm)", os.Getenv("RKV_RXE_ADDRS"), devs)
	}
	for i, name := range devs {
		d, err := rdma.Open("verbs", name, rdma.Options{GID: addrs[i]})
		if err != nil {
			t.Fatalf("Open(%s, GID %s): %v", name, addrs[i], err)
		}
		if got := net.IP(d.(*device).gid[:]); !got.Equal(net.ParseIP(addrs[i])) {
			t.Errorf("%s: GID %v for address %s", name, got, addrs[i])
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenErrors(t *testing.T) {
	devs := testDevices(t)
	_, err := rdma.Open("verbs", "nosuchdev", rdma.Options{})
	if !errors.Is(err, rdma.ErrNoDevice) || !strings.Contains(err.Error(), devs[0]) {
		t.Errorf("Open(nosuchdev) = %v, want ErrNoDevice listing %s", err, devs[0])
	}
	if _, err := rdma.Open("verbs", devs[0], rdma.Options{Port: 2}); err == nil || !strings.Contains(err.Error(), "port 2") {
		t.Errorf("Open(port 2) = %v, want an error naming port 2", err)
	}
	for _, gid := range []string{"10000", "-1", "not-an-address", "203.0.113.9"} {
		if _, err := rdma.Open("verbs", devs[0], rdma.Options{GID: gid}); err == nil {
			t.Errorf("Open(GID %q) succeeded", gid)
		}
	}
}

func TestOpenAutoGID(t *testing.T) {
	devs := testDevices(t)
	for _, name := range append([]string{"auto"}, devs...) {
		d, err := rdma.Open("verbs", name, rdma.Options{})
		if err != nil {
			t.Fatalf("Open(%s): %v", name, err)
		}
		vd := d.(*device)
		t.Logf("%v: GID %v, MTU %d, LID %d, ethernet %v, limits %+v", vd, net.IP(vd.gid[:]), vd.MTU(), vd.lid, vd.ethernet, vd.lim)
		if vd.ethernet && !isIPv4Mapped(vd.gid) {
			t.Errorf("%s: auto GID %v (index %d) is not IPv4-mapped", name, net.IP(vd.gid[:]), vd.gidIndex)
		}
		if want := os.Getenv("RKV_RXE_GID_INDEX"); want != "" && strconv.Itoa(vd.gidIndex) != want {
			t.Errorf("%s: auto GID index %d, the VM says %s", name, vd.gidIndex, want)
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		if err := d.Close(); !errors.Is(err, rdma.ErrClosed) {
			t.Errorf("second Close = %v, want ErrClosed", err)
		}
	}
}

// tpair is two connected QPs with a registered buffer on each side.
type tpair struct {
	devA, devB rdma.Device
	a, b       *tside
}

type tside struct {
	dev    rdma.Device
	pd     rdma.PD
	cq     rdma.CQ
	qp     rdma.QP
	mem    *rdma.Memory
	mr     rdma.MR
	closed bool
}

const tbufSize = 1 << 20

func openSide(t testing.TB, dev rdma.Device, qcfg rdma.QPConfig, access rdma.Access) *tside {
	t.Helper()
	s := &tside{dev: dev}
	var err error
	if s.pd, err = dev.AllocPD(); err != nil {
		t.Fatal(err)
	}
	if s.cq, err = dev.CreateCQ(256); err != nil {
		t.Fatal(err)
	}
	qcfg.SendCQ, qcfg.RecvCQ = s.cq, s.cq
	if s.qp, err = s.pd.CreateQP(qcfg); err != nil {
		t.Fatal(err)
	}
	if s.mem, err = rdma.Alloc(tbufSize); err != nil {
		t.Fatal(err)
	}
	if s.mr, err = s.pd.Register(s.mem.Bytes(), access); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.close(t) })
	return s
}

// close tears the side down in the required order, checking every step.
func (s *tside) close(t testing.TB) {
	if s.closed {
		return
	}
	s.closed = true
	for _, step := range []struct {
		what string
		fn   func() error
	}{{"QP", s.qp.Close}, {"MR", s.mr.Deregister}, {"memory", s.mem.Close}, {"CQ", s.cq.Close}, {"PD", s.pd.Close}} {
		if err := step.fn(); err != nil {
			t.Errorf("closing %s: %v", step.what, err)
		}
	}
}

// newTPair opens devices nameA and nameB (the same device twice is a
// loopback through it) and connects a QP on each over conn.
func newTPair(t testing.TB, nameA, nameB string, qcfg rdma.QPConfig, tcp bool) *tpair {
	t.Helper()
	return newTPairWith(t, nameA, nameB, testOptions(t), testOptions(t), qcfg, tcp)
}

// newTPairWith is newTPair with each device opened with its own options.
func newTPairWith(t testing.TB, nameA, nameB string, optsA, optsB rdma.Options, qcfg rdma.QPConfig, tcp bool) *tpair {
	t.Helper()
	p := &tpair{}
	var err error
	if p.devA, err = rdma.Open("verbs", nameA, optsA); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.devA.Close(); err != nil {
			t.Errorf("closing device A: %v", err)
		}
	})
	if p.devB, err = rdma.Open("verbs", nameB, optsB); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.devB.Close(); err != nil {
			t.Errorf("closing device B: %v", err)
		}
	})
	all := rdma.AccessLocalWrite | rdma.AccessRemoteWrite | rdma.AccessRemoteRead | rdma.AccessRemoteAtomic
	p.a = openSide(t, p.devA, qcfg, all)
	p.b = openSide(t, p.devB, qcfg, all)
	ca, cb := pipe(t, tcp)
	defer ca.Close()
	defer cb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var errB error
	wg.Add(1)
	go func() { defer wg.Done(); _, errB = rdma.ConnectQP(ctx, cb, p.b.qp) }()
	info, errA := rdma.ConnectQP(ctx, ca, p.a.qp)
	wg.Wait()
	if err := errors.Join(errA, errB); err != nil {
		t.Fatalf("ConnectQP: %v", err)
	}
	if info.QPNum != p.b.qp.Num() || info.Provider != "verbs" || info.MTU == 0 {
		t.Fatalf("peer info %+v", info)
	}
	return p
}

// pipe returns a connected pair: net.Pipe, or a TCP loopback connection.
func pipe(t testing.TB, tcp bool) (net.Conn, net.Conn) {
	t.Helper()
	if !tcp {
		return net.Pipe()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := ln.Accept(); ch <- res{c, err} }()
	ca, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	return ca, r.c
}

func wait1(t testing.TB, cq rdma.CQ) rdma.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wc [1]rdma.Completion
	n, err := cq.Wait(ctx, wc[:])
	if err != nil || n != 1 {
		t.Fatalf("Wait = %d, %v", n, err)
	}
	return wc[0]
}

func expect(t testing.TB, cq rdma.CQ, id uint64, op rdma.Opcode, st rdma.Status) rdma.Completion {
	t.Helper()
	c := wait1(t, cq)
	if c.ID != id || c.Status != st || (st == rdma.StatusSuccess && c.Op != op) {
		t.Fatalf("completion %+v (%v %v), want ID %d %v %v", c, c.Op, c.Status, id, op, st)
	}
	return c
}

// TestDataPath runs every operation over a loopback QP pair on the first
// device and, with two devices, between them, over net.Pipe and TCP.
func TestDataPath(t *testing.T) {
	devs := testDevices(t)
	type topo struct{ name, a, b string }
	topos := []topo{{"loopback-" + devs[0], devs[0], devs[0]}}
	if len(devs) > 1 {
		topos = append(topos, topo{devs[0] + "-" + devs[1], devs[0], devs[1]})
	}
	for i, tp := range topos {
		t.Run(tp.name, func(t *testing.T) {
			p := newTPair(t, tp.a, tp.b, rdma.QPConfig{}, i%2 == 1)
			testOps(t, p)
		})
	}
}

func testOps(t *testing.T, p *tpair) {
	la, lb := p.a.mem.Bytes(), p.b.mem.Bytes()
	raddr, rkey := p.b.mr.Addr(), p.b.mr.RKey()
	sge := func(off, n int) []rdma.SGE { return []rdma.SGE{{MR: p.a.mr, Offset: off, Length: n}} }

	// WRITE then READ back, several sizes.
	for _, n := range []int{1, 2, 64, 1024, 4096, 100000} {
		for i := range n {
			la[i] = byte(i*31 + n)
		}
		if err := p.a.qp.PostSend([]rdma.SendWR{{ID: 1, Op: rdma.OpWrite, Flags: rdma.Signaled, SGL: sge(0, n), RemoteAddr: raddr + 8, RKey: rkey}}); err != nil {
			t.Fatal(err)
		}
		expect(t, p.a.cq, 1, rdma.OpWrite, rdma.StatusSuccess)
		if string(lb[8:8+n]) != string(la[:n]) {
			t.Fatalf("WRITE of %d bytes: remote differs", n)
		}
		if err := p.a.qp.PostSend([]rdma.SendWR{{ID: 2, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sge(200000, n), RemoteAddr: raddr + 8, RKey: rkey}}); err != nil {
			t.Fatal(err)
		}
		c := expect(t, p.a.cq, 2, rdma.OpRead, rdma.StatusSuccess)
		if int(c.ByteLen) != n || c.QPNum != p.a.qp.Num() {
			t.Errorf("READ completion %+v, want %d bytes on QP %d", c, n, p.a.qp.Num())
		}
		if string(la[200000:200000+n]) != string(la[:n]) {
			t.Fatalf("READ of %d bytes: local differs", n)
		}
	}

	// WRITE_WITH_IMM consumes a RECV; SEND and SEND_WITH_IMM fill RECVs.
	if err := p.b.qp.PostRecv([]rdma.RecvWR{{ID: 10}, {ID: 11, SGL: []rdma.SGE{{MR: p.b.mr, Offset: 4096, Length: 512}}}, {ID: 12, SGL: []rdma.SGE{{MR: p.b.mr, Offset: 8192, Length: 512}}}}); err != nil {
		t.Fatal(err)
	}
	copy(la, "hello, rxe")
	if err := p.a.qp.PostSend([]rdma.SendWR{
		{ID: 20, Op: rdma.OpWriteImm, Flags: rdma.Signaled, SGL: sge(0, 10), RemoteAddr: raddr + 100, RKey: rkey, Imm: 0x01020304},
		{ID: 21, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: sge(0, 5)},
		{ID: 22, Op: rdma.OpSendImm, Flags: rdma.Signaled, SGL: sge(0, 10), Imm: 0xcafef00d},
	}); err != nil {
		t.Fatal(err)
	}
	// The CQ is shared on a loopback device: sort by QP.
	var got []rdma.Completion
	for len(got) < 6 {
		got = append(got, wait1(t, p.a.cq))
		if p.b.cq != p.a.cq && len(got) == 3 {
			break
		}
	}
	for len(got) < 6 {
		got = append(got, wait1(t, p.b.cq))
	}
	var recvs []rdma.Completion
	for _, c := range got {
		if c.Status != rdma.StatusSuccess {
			t.Fatalf("completion %+v: %v", c, c.Status)
		}
		if c.QPNum == p.b.qp.Num() {
			recvs = append(recvs, c)
		}
	}
	if len(recvs) != 3 {
		t.Fatalf("recv completions %+v", recvs)
	}
	if c := recvs[0]; c.ID != 10 || c.Op != rdma.OpRecvImm || !c.HasImm || c.Imm != 0x01020304 {
		t.Errorf("WRITE_WITH_IMM recv %+v", c)
	}
	if c := recvs[1]; c.ID != 11 || c.Op != rdma.OpRecv || c.HasImm || c.ByteLen != 5 || string(lb[4096:4101]) != "hello" {
		t.Errorf("SEND recv %+v, payload %q", c, lb[4096:4101])
	}
	if c := recvs[2]; c.ID != 12 || c.Op != rdma.OpRecv || !c.HasImm || c.Imm != 0xcafef00d || c.ByteLen != 10 {
		t.Errorf("SEND_WITH_IMM recv %+v", c)
	}
	if string(lb[100:110]) != "hello, rxe" {
		t.Errorf("WRITE_WITH_IMM payload %q", lb[100:110])
	}

	// Atomics on an aligned word of B.
	binary.NativeEndian.PutUint64(lb[512:], 41)
	if err := p.a.qp.PostSend([]rdma.SendWR{
		{ID: 30, Op: rdma.OpFetchAdd, Flags: rdma.Signaled, SGL: sge(1024, 8), RemoteAddr: raddr + 512, RKey: rkey, CompareAdd: 1},
		{ID: 31, Op: rdma.OpCompareSwap, Flags: rdma.Signaled, SGL: sge(1032, 8), RemoteAddr: raddr + 512, RKey: rkey, CompareAdd: 42, Swap: 7},
	}); err != nil {
		t.Fatal(err)
	}
	expect(t, p.a.cq, 30, rdma.OpFetchAdd, rdma.StatusSuccess)
	expect(t, p.a.cq, 31, rdma.OpCompareSwap, rdma.StatusSuccess)
	if old, cas, now := binary.NativeEndian.Uint64(la[1024:]), binary.NativeEndian.Uint64(la[1032:]), binary.NativeEndian.Uint64(lb[512:]); old != 41 || cas != 42 || now != 7 {
		t.Errorf("atomics: FAA returned %d (want 41), CAS returned %d (want 42), word %d (want 7)", old, cas, now)
	}
}

// TestErrors covers the error statuses and the flush that follows, on a
// fresh pair per case (devices[0] to the last device).
func TestErrors(t *testing.T) {
	devs := testDevices(t)
	readOnly := func(t *testing.T, p *tpair) rdma.MR {
		m, err := rdma.Alloc(4096)
		if err != nil {
			t.Fatal(err)
		}
		mr, err := p.b.pd.Register(m.Bytes(), rdma.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = mr.Deregister(); _ = m.Close() })
		return mr
	}
	local := func(p *tpair) []rdma.SGE { return []rdma.SGE{{MR: p.a.mr, Length: 8}} }
	cases := []struct {
		name string
		wr   func(t *testing.T, p *tpair) rdma.SendWR
		want rdma.Status
	}{
		{"wrong rkey", func(t *testing.T, p *tpair) rdma.SendWR {
			return rdma.SendWR{Op: rdma.OpRead, SGL: local(p), RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey() ^ 0x100}
		}, rdma.StatusRemAccessErr},
		{"out of bounds", func(t *testing.T, p *tpair) rdma.SendWR {
			return rdma.SendWR{Op: rdma.OpRead, SGL: local(p), RemoteAddr: p.b.mr.Addr() + tbufSize - 4, RKey: p.b.mr.RKey()}
		}, rdma.StatusRemAccessErr},
		{"write to a read-only MR", func(t *testing.T, p *tpair) rdma.SendWR {
			ro := readOnly(t, p)
			return rdma.SendWR{Op: rdma.OpWrite, SGL: local(p), RemoteAddr: ro.Addr(), RKey: ro.RKey()}
		}, rdma.StatusRemAccessErr},
		{"local SGE past the MR", func(t *testing.T, p *tpair) rdma.SendWR {
			return rdma.SendWR{Op: rdma.OpWrite, SGL: []rdma.SGE{{MR: p.a.mr, Offset: tbufSize - 4, Length: 8}}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}
		}, rdma.StatusLocProtErr},
		{"local SGE of another PD", func(t *testing.T, p *tpair) rdma.SendWR {
			return rdma.SendWR{Op: rdma.OpWrite, SGL: []rdma.SGE{{MR: p.b.mr, Length: 8}}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}
		}, rdma.StatusLocProtErr},
		{"SEND without a RECV", func(t *testing.T, p *tpair) rdma.SendWR {
			return rdma.SendWR{Op: rdma.OpSend, SGL: local(p)}
		}, rdma.StatusRNRRetryExcErr},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newTPair(t, devs[0], devs[len(devs)-1], rdma.QPConfig{AckTimeout: 100 * time.Millisecond, RetryCount: 2}, false)
			// Two more requests behind the failing one are flushed.
			follow := rdma.SendWR{Op: rdma.OpRead, SGL: []rdma.SGE{{MR: p.a.mr, Offset: 64, Length: 8}}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}
			wrs := []rdma.SendWR{tc.wr(t, p), follow, follow}
			for j := range wrs {
				wrs[j].ID = uint64(100 + j)
			}
			start := time.Now()
			if err := p.a.qp.PostSend(wrs); err != nil {
				t.Fatal(err)
			}
			c := wait1(t, p.a.cq)
			if c.ID != 100 || c.Status != tc.want {
				t.Fatalf("completion %+v (%v), want ID 100 %v", c, c.Status, tc.want)
			}
			t.Logf("%s: %v after %v", tc.name, c.Status, time.Since(start))
			for j := 1; j < 3; j++ {
				if c := wait1(t, p.a.cq); c.ID != uint64(100+j) || c.Status != rdma.StatusWRFlushErr {
					t.Errorf("completion %+v (%v), want ID %d WR_FLUSH_ERR", c, c.Status, 100+j)
				}
			}
			if st := p.a.qp.State(); st != rdma.QPStateError {
				t.Errorf("QP in %v after the error, want ERR", st)
			}
			// Posting in ERR: accepted and flushed, sends and recvs alike.
			if err := p.a.qp.PostSend([]rdma.SendWR{{ID: 200, Op: rdma.OpRead, SGL: follow.SGL, RemoteAddr: follow.RemoteAddr, RKey: follow.RKey}}); err != nil {
				t.Fatal(err)
			}
			if c := wait1(t, p.a.cq); c.ID != 200 || c.Status != rdma.StatusWRFlushErr {
				t.Errorf("send posted in ERR completed %+v (%v), want WR_FLUSH_ERR", c, c.Status)
			}
			if err := p.a.qp.PostRecv([]rdma.RecvWR{{ID: 201, SGL: follow.SGL}}); err != nil {
				t.Fatal(err)
			}
			if c := wait1(t, p.a.cq); c.ID != 201 || c.Status != rdma.StatusWRFlushErr {
				t.Errorf("recv posted in ERR completed %+v (%v), want WR_FLUSH_ERR", c, c.Status)
			}
		})
	}
}

func TestPostValidation(t *testing.T) {
	devs := testDevices(t)
	p := newTPair(t, devs[0], devs[0], rdma.QPConfig{MaxSendWR: 4, MaxSGE: 2}, false)
	sge := rdma.SGE{MR: p.a.mr, Length: 8}
	for _, tc := range []struct {
		name string
		wrs  []rdma.SendWR
		idx  int
		want error
	}{
		{"bad opcode", []rdma.SendWR{{Op: rdma.OpRecv}}, 0, rdma.ErrInvalidWR},
		{"too many SGEs", []rdma.SendWR{{Op: rdma.OpWrite, SGL: []rdma.SGE{sge, sge, sge}}}, 0, rdma.ErrInvalidWR},
		{"negative length", []rdma.SendWR{{Op: rdma.OpWrite, SGL: []rdma.SGE{{MR: p.a.mr, Length: -1}}}}, 0, rdma.ErrInvalidWR},
		{"queue full", make([]rdma.SendWR, 9), 0, rdma.ErrInvalidWR},
	} {
		err := p.a.qp.PostSend(tc.wrs)
		var pe *rdma.PostError
		if !errors.As(err, &pe) || pe.Index != tc.idx || !errors.Is(err, tc.want) {
			t.Errorf("%s: PostSend = %v, want PostError at %d wrapping %v", tc.name, err, tc.idx, tc.want)
		}
	}
	// Fill the send queue with unsignaled WRITEs the responder will not
	// see completed before we post more; the device reports ENOMEM.
	wrs := make([]rdma.SendWR, 64)
	for i := range wrs {
		wrs[i] = rdma.SendWR{ID: uint64(i), Op: rdma.OpWrite, SGL: []rdma.SGE{sge}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}
	}
	err := p.a.qp.PostSend(wrs)
	var pe *rdma.PostError
	if !errors.As(err, &pe) || !errors.Is(err, rdma.ErrQueueFull) || pe.Index < 4 {
		t.Errorf("posting 64 on a queue of 4 = %v, want ErrQueueFull at index >= 4", err)
	} else {
		t.Logf("queue full at request %d (MaxSendWR 4; the device rounds up)", pe.Index)
	}
}

// TestWaitSpins checks Options.Spin: a Wait takes a completion that comes
// within the spin without arming the CQ, sleeps once the spin is over and
// is woken by one that comes later, and leaves its spin when ctx ends. A
// negative Spin is refused at Open.
func TestWaitSpins(t *testing.T) {
	devs := testDevices(t)
	if _, err := rdma.Open("verbs", devs[0], rdma.Options{Spin: -time.Microsecond}); err == nil || !strings.Contains(err.Error(), "Spin") {
		t.Errorf("Open with a negative Spin: %v, want an error naming Spin", err)
	}
	// The spin is long enough for the emulated VM (a SEND takes about
	// 0.1-1 ms there) and short against the test's patience.
	const spin = 400 * time.Millisecond
	spinning := testOptions(t)
	spinning.Spin = spin
	p := newTPairWith(t, devs[0], devs[len(devs)-1], testOptions(t), spinning, rdma.QPConfig{}, true)
	bcq := p.b.cq.(*cq)
	sendAfter := func(d time.Duration, id uint64) {
		if err := p.b.qp.PostRecv([]rdma.RecvWR{{ID: id}}); err != nil {
			t.Fatal(err)
		}
		go func() {
			time.Sleep(d)
			if err := p.a.qp.PostSend([]rdma.SendWR{{ID: id, Op: rdma.OpSend}}); err != nil {
				t.Error(err)
			}
		}()
	}

	// A completion within the spin: taken without arming the CQ.
	arms := bcq.arms.Load()
	sendAfter(20*time.Millisecond, 1)
	if c := wait1(t, p.b.cq); c.ID != 1 || c.Op != rdma.OpRecv {
		t.Fatalf("Wait = %+v, want the RECV of the SEND", c)
	}
	if got := bcq.arms.Load() - arms; got != 0 {
		t.Errorf("the CQ was armed %d times for a completion within the spin", got)
	}

	// A completion after the spin: the Wait sleeps, armed, and wakes.
	arms = bcq.arms.Load()
	sendAfter(spin+300*time.Millisecond, 2)
	if c := wait1(t, p.b.cq); c.ID != 2 || c.Op != rdma.OpRecv {
		t.Fatalf("Wait = %+v, want the RECV of the later SEND", c)
	}
	if bcq.arms.Load() == arms {
		t.Error("the CQ was not armed for a completion after the spin")
	}

	// A context that ends within the spin ends the Wait then.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	var wc [1]rdma.Completion
	if n, err := p.b.cq.Wait(ctx, wc[:]); n != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait under a context that ends during the spin = %d, %v", n, err)
	}
	if took := time.Since(start); took > spin/2 {
		t.Errorf("Wait under a 30 ms context took %v: it spun on after the context ended", took)
	}
}

// TestWait checks that Wait sleeps and wakes, honours ctx, and that Close
// wakes it.
func TestWait(t *testing.T) {
	devs := testDevices(t)
	p := newTPair(t, devs[0], devs[0], rdma.QPConfig{}, true)

	// Nothing to wait for: the context ends the wait.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	start := time.Now()
	var wc [4]rdma.Completion
	n, err := p.a.cq.Wait(ctx, wc[:])
	cancel()
	if n != 0 || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Errorf("Wait on an idle CQ = %d, %v after %v", n, err, time.Since(start))
	}

	// A sleeping Wait is woken by a completion that arrives later.
	done := make(chan rdma.Completion, 1)
	go func() { done <- wait1(t, p.b.cq) }()
	time.Sleep(100 * time.Millisecond)
	if err := p.b.qp.PostRecv([]rdma.RecvWR{{ID: 5}}); err != nil {
		t.Fatal(err)
	}
	if err := p.a.qp.PostSend([]rdma.SendWR{{ID: 6, Op: rdma.OpWriteImm, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey(), Imm: 9}}); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-done:
		if c.ID != 5 && c.ID != 6 {
			t.Errorf("woken with %+v", c)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Wait was not woken by a completion")
	}

	// Concurrent waiters on one CQ each get their own completion.
	const k = 4
	res := make(chan uint64, k)
	for range k {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			var wc [1]rdma.Completion
			if n, err := p.a.cq.Wait(ctx, wc[:]); err != nil || n != 1 {
				t.Errorf("concurrent Wait = %d, %v", n, err)
				res <- 0
				return
			}
			res <- wc[0].ID
		}()
	}
	time.Sleep(50 * time.Millisecond)
	for i := range k {
		if err := p.a.qp.PostSend([]rdma.SendWR{{ID: uint64(1000 + i), Op: rdma.OpRead, Flags: rdma.Signaled, SGL: []rdma.SGE{{MR: p.a.mr, Length: 8}}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	seen := map[uint64]bool{}
	for range k {
		seen[<-res] = true
	}
	if len(seen) != k {
		t.Errorf("concurrent waiters got %v", seen)
	}

	// Close of a CQ with a sleeping Wait: the waiter returns ErrClosed.
	cq, err := p.devA.CreateCQ(16)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		var wc [1]rdma.Completion
		_, err := cq.Wait(context.Background(), wc[:])
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := cq.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, rdma.ErrClosed) {
			t.Errorf("Wait on a closed CQ = %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not wake the waiter")
	}
}

// TestNoAllocs checks the hot path: posting, polling and a Wait that finds
// a completion allocate nothing.
func TestNoAllocs(t *testing.T) {
	devs := testDevices(t)
	p := newTPair(t, devs[0], devs[0], rdma.QPConfig{}, false)
	wr := []rdma.SendWR{{ID: 1, Op: rdma.OpWrite, Flags: rdma.Signaled, SGL: []rdma.SGE{{MR: p.a.mr, Length: 64}}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}}
	recv := []rdma.RecvWR{{ID: 2}}
	var wc [1]rdma.Completion
	allocs := testing.AllocsPerRun(200, func() {
		if err := p.a.qp.PostSend(wr); err != nil {
			t.Fatal(err)
		}
		for {
			n, err := p.a.cq.Poll(wc[:])
			if err != nil {
				t.Fatal(err)
			}
			if n == 1 {
				break
			}
		}
		if err := p.b.qp.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("PostSend+Poll+PostRecv allocate %.1f times per run", allocs)
	}
}

// TestCloseOrder checks ErrBusy and exactly-once Close on every object.
func TestCloseOrder(t *testing.T) {
	devs := testDevices(t)
	d, err := rdma.Open("verbs", devs[0], testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	scq, _ := d.CreateCQ(8)
	rcq, _ := d.CreateCQ(8)
	qp, err := pd.CreateQP(rdma.QPConfig{SendCQ: scq, RecvCQ: rcq})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := rdma.Alloc(8192)
	mr, err := pd.Register(m.Bytes()[100:5000], rdma.AccessLocalWrite|rdma.AccessRemoteRead)
	if err != nil {
		t.Fatal(err)
	}
	if mr.Addr() != uint64(uintptrOf(m.Bytes()[100:])) || mr.Len() != 4900 {
		t.Errorf("MR addr %#x len %d", mr.Addr(), mr.Len())
	}
	busy := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, rdma.ErrBusy) {
			t.Errorf("%s = %v, want ErrBusy", what, err)
		}
	}
	busy("Device.Close with a PD", d.Close())
	busy("PD.Close with an MR and a QP", pd.Close())
	busy("CQ.Close attached to a QP", scq.Close())
	busy("Memory.Close while registered", m.Close())
	if err := qp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := qp.Close(); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("second QP.Close = %v", err)
	}
	if err := qp.PostSend([]rdma.SendWR{{Op: rdma.OpWrite}}); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("PostSend on a closed QP = %v", err)
	}
	busy("PD.Close with an MR", pd.Close())
	if err := mr.Deregister(); err != nil {
		t.Fatal(err)
	}
	if err := mr.Deregister(); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("second Deregister = %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := pd.Close(); err != nil {
		t.Fatal(err)
	}
	busy("Device.Close with CQs", d.Close())
	for _, c := range []rdma.CQ{scq, rcq} {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Poll(make([]rdma.Completion, 1)); !errors.Is(err, rdma.ErrClosed) {
			t.Errorf("Poll on a closed CQ = %v", err)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := d.AllocPD(); !errors.Is(err, rdma.ErrClosed) {
		t.Errorf("AllocPD on a closed device = %v", err)
	}
}

func TestAckTimeoutCode(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want uint8
	}{{time.Nanosecond, 1}, {8192 * time.Nanosecond, 1}, {8193 * time.Nanosecond, 2}, {100 * time.Millisecond, 15}, {500 * time.Millisecond, 17}, {time.Hour, 30}, {2 * time.Hour, 31}} {
		if got := ackTimeoutCode(tc.d); got != tc.want {
			t.Errorf("ackTimeoutCode(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
	if retryCount(3) != 3 || retryCount(100) != 7 {
		t.Errorf("retryCount")
	}
	for b, want := range map[int]int{256: 256, 1000: 512, 1024: 1024, 1500: 1024, 4096: 4096, 9000: 4096, 100: 256} {
		if got := mtuBytes(mtuEnum(b)); got != want {
			t.Errorf("mtu(%d) = %d, want %d", b, got, want)
		}
	}
}

// TestAtomicEmulation checks the atomics this provider treats specially: a
// misaligned one completes with REM_INV_REQ_ERR without touching the peer's
// memory (rxe's driver would refuse it at post), one with an unusable
// result buffer with LOC_PROT_ERR, and a malformed one is refused at post.
func TestAtomicEmulation(t *testing.T) {
	devs := testDevices(t)
	for _, tc := range []struct {
		name string
		wr   func(p *tpair) rdma.SendWR
		want rdma.Status
	}{
		{"misaligned", func(p *tpair) rdma.SendWR {
			return rdma.SendWR{Op: rdma.OpFetchAdd, CompareAdd: 1, SGL: []rdma.SGE{{MR: p.a.mr, Length: 8}}, RemoteAddr: p.b.mr.Addr() + 4, RKey: p.b.mr.RKey()}
		}, rdma.StatusRemInvReqErr},
		{"result buffer of another PD", func(p *tpair) rdma.SendWR {
			return rdma.SendWR{Op: rdma.OpCompareSwap, CompareAdd: 0, Swap: 1, SGL: []rdma.SGE{{MR: p.b.mr, Length: 8}}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}
		}, rdma.StatusLocProtErr},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTPair(t, devs[0], devs[len(devs)-1], rdma.QPConfig{}, false)
			clear(p.b.mem.Bytes()[:16])
			ok := rdma.SendWR{ID: 1, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: []rdma.SGE{{MR: p.a.mr, Offset: 64, Length: 8}}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}
			bad := tc.wr(p)
			bad.ID = 2
			follow := ok
			follow.ID = 3
			if err := p.a.qp.PostSend([]rdma.SendWR{ok, bad, follow}); err != nil {
				t.Fatal(err)
			}
			expect(t, p.a.cq, 1, rdma.OpRead, rdma.StatusSuccess)
			expect(t, p.a.cq, 2, 0, tc.want)
			expect(t, p.a.cq, 3, 0, rdma.StatusWRFlushErr)
			if st := p.a.qp.State(); st != rdma.QPStateError {
				t.Errorf("QP in %v, want ERR", st)
			}
			if w := binary.NativeEndian.Uint64(p.b.mem.Bytes()); w != 0 && tc.want == rdma.StatusRemInvReqErr {
				t.Errorf("the peer's word changed to %#x", w)
			}
		})
	}
	p := newTPair(t, devs[0], devs[0], rdma.QPConfig{}, false)
	for _, sgl := range [][]rdma.SGE{nil, {{MR: p.a.mr, Length: 4}}, {{MR: p.a.mr, Length: 4}, {MR: p.a.mr, Length: 4}}} {
		err := p.a.qp.PostSend([]rdma.SendWR{{Op: rdma.OpFetchAdd, SGL: sgl, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}})
		if !errors.Is(err, rdma.ErrInvalidWR) {
			t.Errorf("FETCH_AND_ADD with SGL %v = %v, want ErrInvalidWR", sgl, err)
		}
	}
}

// TestResponderErrors records what the device reports, at both ends, for
// a SEND longer than the RECV's buffer and for a RECV whose buffer the
// responder cannot use. The statuses are the device's own; the test
// checks that both ends fail and logs them.
func TestResponderErrors(t *testing.T) {
	devs := testDevices(t)
	for _, tc := range []struct {
		name string
		recv func(p *tpair) []rdma.SGE
		n    int
	}{
		{"SEND longer than the RECV", func(p *tpair) []rdma.SGE { return []rdma.SGE{{MR: p.b.mr, Length: 16}} }, 100},
		{"RECV buffer past its MR", func(p *tpair) []rdma.SGE { return []rdma.SGE{{MR: p.b.mr, Offset: tbufSize - 8, Length: 64}} }, 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newTPair(t, devs[0], devs[len(devs)-1], rdma.QPConfig{}, false)
			if err := p.b.qp.PostRecv([]rdma.RecvWR{{ID: 1, SGL: tc.recv(p)}}); err != nil {
				t.Fatal(err)
			}
			if err := p.a.qp.PostSend([]rdma.SendWR{{ID: 2, Op: rdma.OpSend, SGL: []rdma.SGE{{MR: p.a.mr, Length: tc.n}}}}); err != nil {
				t.Fatal(err)
			}
			var sc, rc rdma.Completion
			if p.a.cq == p.b.cq {
				t.Fatal("one CQ")
			}
			sc, rc = wait1(t, p.a.cq), wait1(t, p.b.cq)
			t.Logf("%s: requester %v, responder's RECV %v", tc.name, sc.Status, rc.Status)
			if sc.ID != 2 || sc.Status == rdma.StatusSuccess || rc.ID != 1 || rc.Status == rdma.StatusSuccess {
				t.Errorf("completions %+v and %+v: want both failed", sc, rc)
			}
			if a, b := p.a.qp.State(), p.b.qp.State(); a != rdma.QPStateError || b != rdma.QPStateError {
				t.Errorf("QPs in %v and %v, want ERR", a, b)
			}
		})
	}
}

// TestMemlockError drops CAP_IPC_LOCK on one thread, lowers RLIMIT_MEMLOCK
// and registers more than it allows: the error must name the limit.
func TestMemlockError(t *testing.T) {
	devs := testDevices(t)
	d, err := rdma.Open("verbs", devs[0], testOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	pd, err := d.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	m, err := rdma.Alloc(4 << 20)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()

	err = memlimit.Run(64<<10, func() error {
		mr, err := pd.Register(m.Bytes(), rdma.AccessRemoteRead)
		if err == nil {
			_ = mr.Deregister()
			return errors.New("Register of 4 MiB under a 64 KiB RLIMIT_MEMLOCK without CAP_IPC_LOCK succeeded")
		}
		var me *rdma.MemlockError
		if !errors.As(err, &me) || !strings.Contains(err.Error(), "RLIMIT_MEMLOCK") {
			return fmt.Errorf("Register error %q is not a MemlockError naming RLIMIT_MEMLOCK", err)
		}
		t.Logf("Register: %v", err)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestCQOverrun overfills a small CQ: Poll must then fail with
// ErrCQOverrun (the device reports the overrun as an async event).
func TestCQOverrun(t *testing.T) {
	devs := testDevices(t)
	p := newTPair(t, devs[0], devs[len(devs)-1], rdma.QPConfig{}, false)
	small, err := p.devA.CreateCQ(2)
	if err != nil {
		t.Fatal(err)
	}
	qp, err := p.a.pd.CreateQP(rdma.QPConfig{SendCQ: small, RecvCQ: small, MaxSendWR: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	defer qp.Close()
	peer, err := p.b.pd.CreateQP(rdma.QPConfig{SendCQ: p.b.cq, RecvCQ: p.b.cq})
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	ca, cb := net.Pipe()
	defer ca.Close()
	defer cb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() { _, _ = rdma.ConnectQP(ctx, cb, peer) }()
	if _, err := rdma.ConnectQP(ctx, ca, qp); err != nil {
		t.Fatal(err)
	}
	size := small.(*cq).size
	wrs := make([]rdma.SendWR, size+8)
	for i := range wrs {
		wrs[i] = rdma.SendWR{ID: uint64(i), Op: rdma.OpWrite, Flags: rdma.Signaled, SGL: []rdma.SGE{{MR: p.a.mr, Length: 8}}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}
	}
	if err := qp.PostSend(wrs); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	wc := make([]rdma.Completion, 1)
	for time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		if _, err := small.Poll(wc[:0]); errors.Is(err, rdma.ErrCQOverrun) {
			t.Logf("CQ of %d entries after %d completions: %v", size, len(wrs), err)
			return
		}
	}
	t.Fatalf("no ErrCQOverrun from a CQ of %d entries after %d signaled completions", size, len(wrs))
}

// TestPortDown takes the first device's netdev down (in the rxe VM only):
// Open must name the port and its state, and work again once it is up.
func TestPortDown(t *testing.T) {
	devs := testDevices(t)
	netdevs := strings.Split(os.Getenv("RKV_RXE_NETDEVS"), ",")
	if os.Getenv("RKV_RXE_VM") != "1" || netdevs[0] == "" {
		t.Skip("changes the network: only in the rxe VM (RKV_RXE_VM=1, RKV_RXE_NETDEVS)")
	}
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	ip("link", "set", netdevs[0], "down")
	defer ip("link", "set", netdevs[0], "up")
	var err error
	for range 100 { // the port follows the netdev asynchronously
		var d rdma.Device
		if d, err = rdma.Open("verbs", devs[0], testOptions(t)); err != nil {
			break
		}
		d.Close()
		time.Sleep(50 * time.Millisecond)
	}
	if err == nil || !strings.Contains(err.Error(), "port 1 of "+devs[0]+" is") {
		t.Fatalf("Open with %s down = %v, want an error naming port 1 and its state", netdevs[0], err)
	}
	t.Logf("Open(%s) with %s down: %v", devs[0], netdevs[0], err)
	ip("link", "set", netdevs[0], "up")
	for range 200 {
		var d rdma.Device
		if d, err = rdma.Open("verbs", devs[0], testOptions(t)); err == nil {
			d.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("Open after %s came back up: %v", netdevs[0], err)
}

// TestLocalErrorAfterRead: a request failing on a local SGE right behind a
// READ in flight. Without the fence PostSend adds to such requests, rxe 6.1
// lost both completions in about 1 run in 10.
func TestLocalErrorAfterRead(t *testing.T) {
	devs := testDevices(t)
	for i := range 10 {
		p := newTPair(t, devs[0], devs[len(devs)-1], rdma.QPConfig{}, false)
		ok := rdma.SendWR{ID: 1, Op: rdma.OpRead, Flags: rdma.Signaled, SGL: []rdma.SGE{{MR: p.a.mr, Offset: 64, Length: 8}}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}
		bad := rdma.SendWR{ID: 2, Op: rdma.OpWrite, SGL: []rdma.SGE{{MR: p.a.mr, Offset: tbufSize - 4, Length: 8}}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}
		if err := p.a.qp.PostSend([]rdma.SendWR{ok, bad}); err != nil {
			t.Fatal(err)
		}
		if c := wait1(t, p.a.cq); c.ID != 1 || c.Status != rdma.StatusSuccess {
			t.Fatalf("run %d: first completion %+v", i, c)
		}
		if c := wait1(t, p.a.cq); c.ID != 2 || c.Status != rdma.StatusLocProtErr {
			t.Fatalf("run %d: second completion %+v", i, c)
		}
	}
}
