// Load tests: many QPs with many requests in flight, a 64 MiB transfer, and deregistration racing copies.

package soft

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/rdmatest"
)

func TestManyQPs(t *testing.T) {
	const qps, outstanding, rounds, size = 64, 16, 4, 256
	a, b := newSide(t, rdma.QPConfig{}), newSide(t, rdma.QPConfig{})
	local := register(t, a.pd, qps*outstanding*size, rw)
	remote := register(t, b.pd, qps*outstanding*size, rw)
	for i := range remote.Bytes() {
		remote.Bytes()[i] = byte(i * 7)
	}
	var wg sync.WaitGroup
	errs := make(chan error, qps)
	for i := range qps {
		cq := createCQ(t, a.dev, outstanding)
		qa := createQP(t, a.pd, rdma.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: outstanding})
		qb := createQP(t, b.pd, rdma.QPConfig{SendCQ: b.cq, RecvCQ: b.cq})
		rdmatest.Connect(t, qa, qb)
		wg.Add(1)
		go func() {
			defer wg.Done()
			wrs := make([]rdma.SendWR, outstanding)
			wc := make([]rdma.Completion, outstanding)
			for r := range rounds {
				for j := range wrs {
					off := (i*outstanding + j) * size
					op := rdma.OpRead
					if r%2 == 1 {
						op = rdma.OpWrite
					}
					wrs[j] = rdma.SendWR{ID: uint64(j), Op: op, Flags: rdma.Signaled, SGL: sgl(local, off, size), RemoteAddr: remote.Addr() + uint64(off), RKey: remote.RKey()}
				}
				if err := qa.PostSend(wrs); err != nil {
					errs <- err
					return
				}
				for got := 0; got < outstanding; {
					n, err := cq.Wait(context.Background(), wc[got:])
					if err != nil {
						errs <- err
						return
					}
					for _, c := range wc[got : got+n] {
						if c.Status != rdma.StatusSuccess || c.ID != uint64(got) {
							errs <- fmt.Errorf("QP %d: completion %+v, want ID %d", i, c, got)
							return
						}
						got++
					}
				}
			}
		}()
	}
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatal(err)
	default:
	}
	if !bytes.Equal(local.Bytes(), remote.Bytes()) {
		t.Fatal("data differs after READs and WRITEs")
	}
}

func TestLargeTransfer(t *testing.T) {
	const total, chunk = 64 << 20, 1 << 20
	a, b := newPair(t, rdma.QPConfig{MaxSendWR: 16})
	src := register(t, a.pd, total, rw)
	dst := register(t, a.pd, total, rw)
	remote := register(t, b.pd, total, rw)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < total; i += 8 {
		binary.LittleEndian.PutUint64(src.Bytes()[i:], rng.Uint64())
	}
	move := func(op rdma.Opcode, local rdma.MR) {
		t.Helper()
		wr := make([]rdma.SendWR, 1)
		inflight := 0
		for off := 0; off < total; off += chunk {
			wr[0] = rdma.SendWR{ID: uint64(off), Op: op, Flags: rdma.Signaled, SGL: sgl(local, off, chunk), RemoteAddr: remote.Addr() + uint64(off), RKey: remote.RKey()}
			for inflight >= 8 {
				if wc := wait(t, a.cq); wc.Status != rdma.StatusSuccess {
					t.Fatalf("%+v", wc)
				}
				inflight--
			}
			post(t, a.qp, wr...)
			inflight++
		}
		for ; inflight > 0; inflight-- {
			if wc := wait(t, a.cq); wc.Status != rdma.StatusSuccess {
				t.Fatalf("%+v", wc)
			}
		}
	}
	move(rdma.OpWrite, src)
	move(rdma.OpRead, dst)
	if !bytes.Equal(dst.Bytes(), src.Bytes()) {
		t.Fatal("64 MiB round trip corrupted")
	}
}

// Deregistering (then unmapping) an MR while READs and WRITEs hit it must
// never let the responder touch unmapped memory: Deregister waits for
// copies in progress; requests after it get REM_ACCESS_ERR.
func TestDeregisterDuringTraffic(t *testing.T) {
	for round := range 5 {
		a, b := newPair(t, rdma.QPConfig{})
		local := register(t, a.pd, 1<<20, rw)
		mem, err := rdma.Alloc(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		remote, err := b.pd.Register(mem.Bytes(), rw)
		if err != nil {
			t.Fatal(err)
		}
		wrs := make([]rdma.SendWR, 64)
		for i := range wrs {
			op := rdma.OpRead
			if i%2 == 1 {
				op = rdma.OpWrite
			}
			wrs[i] = rdma.SendWR{ID: uint64(i), Op: op, Flags: rdma.Signaled, SGL: sgl(local, 0, 256<<10), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
		}
		post(t, a.qp, wrs...)
		wait(t, a.cq)
		if err := remote.Deregister(); err != nil {
			t.Fatal(err)
		}
		if err := mem.Close(); err != nil {
			t.Fatal(err)
		}
		failed := false
		for range 63 {
			wc := wait(t, a.cq)
			switch {
			case wc.Status == rdma.StatusRemAccessErr && !failed:
				failed = true
			case wc.Status == rdma.StatusWRFlushErr && failed:
			case wc.Status == rdma.StatusSuccess && !failed:
			default:
				t.Fatalf("round %d: completion %+v", round, wc)
			}
		}
	}
}

func TestPostFromManyGoroutines(t *testing.T) {
	const posters, each = 8, 200
	cfg := rdma.QPConfig{MaxSendWR: 64, SignalAll: true}
	a, b := newSide(t, cfg), newSide(t, cfg)
	cq := createCQ(t, a.dev, posters*each)
	qa := createQP(t, a.pd, rdma.QPConfig{SendCQ: cq, RecvCQ: cq, MaxSendWR: 64, SignalAll: true})
	rdmatest.Connect(t, qa, b.qp)
	local := register(t, a.pd, posters*8, rw)
	remote := register(t, b.pd, 8, allRW)
	var wg sync.WaitGroup
	for i := range posters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wr := []rdma.SendWR{{ID: uint64(i), Op: rdma.OpFetchAdd, SGL: sgl(local, 8*i, 8), RemoteAddr: remote.Addr(), RKey: remote.RKey(), CompareAdd: 1}}
			for range each {
				for {
					err := qa.PostSend(wr)
					if err == nil {
						break
					}
					if !errors.Is(err, rdma.ErrQueueFull) {
						t.Error(err)
						return
					}
					runtime.Gosched()
				}
			}
		}()
	}
	wg.Wait()
	for range posters * each {
		if wc := wait(t, cq); wc.Status != rdma.StatusSuccess {
			t.Fatalf("%+v", wc)
		}
	}
	if got := binary.NativeEndian.Uint64(remote.Bytes()); got != posters*each {
		t.Fatalf("counter %d, want %d", got, posters*each)
	}
}
