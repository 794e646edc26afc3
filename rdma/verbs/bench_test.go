//go:build verbs

package verbs

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// Latency benchmarks: one request in flight, posted signaled and waited
// for, so ns/op is the round-trip latency of one RDMA_READ or RDMA_WRITE
// as the application sees it. Sub-benchmarks:
//
//	<topology>/<wait|poll>/<size>
//
// topology is loopback (one device) or cross (first to last device);
// "wait" uses CQ.Wait (completion channel, the production path), "poll"
// spins on CQ.Poll. Inside the rxe VM:
//
//	deploy/rxevm/run.sh --rxe 2 -- /tmp/verbs.test -test.run XXX -test.bench . -test.benchtime 2000x
func BenchmarkRead(b *testing.B)  { benchLatency(b, rdma.OpRead) }
func BenchmarkWrite(b *testing.B) { benchLatency(b, rdma.OpWrite) }

func benchLatency(b *testing.B, op rdma.Opcode) {
	devs := testDevices(b)
	topos := [][3]string{{"loopback", devs[0], devs[0]}}
	if len(devs) > 1 {
		topos = append(topos, [3]string{"cross", devs[0], devs[len(devs)-1]})
	}
	for _, tp := range topos {
		b.Run(tp[0], func(b *testing.B) {
			p := newTPair(b, tp[1], tp[2], rdma.QPConfig{}, false)
			for _, mode := range []string{"wait", "poll"} {
				b.Run(mode, func(b *testing.B) {
					for _, size := range []int{2, 64, 1024, 65536} {
						b.Run(sizeName(size), func(b *testing.B) { latencyLoop(b, p, op, size, mode == "poll") })
					}
				})
			}
		})
	}
}

func sizeName(n int) string {
	if n >= 1024 {
		return fmt.Sprintf("%dKiB", n/1024)
	}
	return fmt.Sprintf("%dB", n)
}

func latencyLoop(b *testing.B, p *tpair, op rdma.Opcode, size int, spin bool) {
	wr := []rdma.SendWR{{ID: 1, Op: op, Flags: rdma.Signaled, SGL: []rdma.SGE{{MR: p.a.mr, Length: size}}, RemoteAddr: p.b.mr.Addr(), RKey: p.b.mr.RKey()}}
	var wc [1]rdma.Completion
	ctx := context.Background()
	timeEach(b, size, func() error {
		if err := p.a.qp.PostSend(wr); err != nil {
			return err
		}
		var n int
		var err error
		for n == 0 && err == nil {
			if spin {
				n, err = p.a.cq.Poll(wc[:])
			} else {
				n, err = p.a.cq.Wait(ctx, wc[:])
			}
		}
		if err != nil {
			return err
		}
		return wc[0].Err()
	})
}

// timeEach runs op b.N times, timing each, and reports their p50 and p99
// beside ns/op: the mean of a TCG guest on a shared host is dominated by
// a few scheduling hiccups, the percentiles say more.
func timeEach(b *testing.B, size int, op func() error) {
	lat := make([]time.Duration, b.N)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		lat[i] = time.Since(start)
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
}

// BenchmarkWriteSendReply is a PUT's shape on the bare provider: A posts a
// RECV for the reply, then a WRITE of size bytes and a 64-byte SEND (the
// commit) in one post; B's goroutine takes the SEND's RECV, posts it
// again and SENDs a 64-byte reply; A waits for the reply. ns/op is that
// round trip, the floor under an rkv PUT on verbs (make bench-rxe sets
// the two side by side). Sub-benchmarks:
//
//	<topology>/<wait|poll>/<size>
//
// with both sides waiting on the completion channel ("wait"), waiting
// after a spin of benchSpin ("spin", Options.Spin on both devices), or
// spinning on Poll alone ("poll").
func BenchmarkWriteSendReply(b *testing.B) {
	devs := testDevices(b)
	topos := [][3]string{{"loopback", devs[0], devs[0]}}
	if len(devs) > 1 {
		topos = append(topos, [3]string{"cross", devs[0], devs[len(devs)-1]})
	}
	spinning := testOptions(b)
	spinning.Spin = benchSpin
	for _, tp := range topos {
		b.Run(tp[0], func(b *testing.B) {
			pairs := map[string]*tpair{"wait": newTPair(b, tp[1], tp[2], rdma.QPConfig{}, false)}
			pairs["poll"] = pairs["wait"]
			pairs["spin"] = newTPairWith(b, tp[1], tp[2], spinning, spinning, rdma.QPConfig{}, false)
			for _, mode := range []string{"wait", "spin", "poll"} {
				b.Run(mode, func(b *testing.B) {
					for _, size := range []int{64, 1024, 65536} {
						b.Run(sizeName(size), func(b *testing.B) { writeSendReplyLoop(b, pairs[mode], size, mode == "poll") })
					}
				})
			}
		})
	}
}

// benchSpin is the "spin" mode's Options.Spin: long enough to catch an
// answer on a NIC (microseconds) and under the rxe VM's emulation (a few
// hundred).
const benchSpin = time.Millisecond

// Where in each side's buffer the loop's messages go: the commit (A) or
// the reply (B) to send, the RECV slot, and A's record, written to the
// same offset at B. A commit whose first byte is 1 ends B's loop.
const (
	wsrMsg    = 64
	wsrSend   = 0
	wsrRecv   = 4096
	wsrRecord = 2 * 4096
)

// Work request IDs of the loop.
const (
	wsrRecvID = iota + 1
	wsrSendID
	wsrWriteID
)

func writeSendReplyLoop(b *testing.B, p *tpair, size int, spin bool) {
	ctx := context.Background()
	// next returns the next completion on s's CQ, or the error.
	next := func(s *tside, wc []rdma.Completion) (rdma.Completion, error) {
		for {
			var n int
			var err error
			if spin {
				n, err = s.cq.Poll(wc)
			} else {
				n, err = s.cq.Wait(ctx, wc)
			}
			if err == nil && n > 0 {
				err = wc[0].Err()
			}
			if err != nil || n > 0 {
				return wc[0], err
			}
		}
	}
	recvWR := func(s *tside) []rdma.RecvWR {
		return []rdma.RecvWR{{ID: wsrRecvID, SGL: []rdma.SGE{{MR: s.mr, Offset: wsrRecv, Length: wsrMsg}}}}
	}
	sendWR := func(s *tside) rdma.SendWR {
		return rdma.SendWR{ID: wsrSendID, Op: rdma.OpSend, Flags: rdma.Signaled, SGL: []rdma.SGE{{MR: s.mr, Offset: wsrSend, Length: wsrMsg}}}
	}
	// B keeps one RECV posted and answers each commit once it has
	// posted the RECV again.
	bRecv, reply := recvWR(p.b), []rdma.SendWR{sendWR(p.b)}
	if err := p.b.qp.PostRecv(bRecv); err != nil {
		b.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		var wc [1]rdma.Completion
		for {
			w, err := next(p.b, wc[:])
			switch {
			case err != nil:
				done <- err
				return
			case w.ID != wsrRecvID:
				continue // a reply's SEND completion
			case p.b.mem.Bytes()[wsrRecv] == 1:
				done <- nil
				return
			}
			if err := p.b.qp.PostRecv(bRecv); err != nil {
				done <- err
				return
			}
			if err := p.b.qp.PostSend(reply); err != nil {
				done <- err
				return
			}
		}
	}()
	aRecv := recvWR(p.a)
	put := []rdma.SendWR{
		{ID: wsrWriteID, Op: rdma.OpWrite, SGL: []rdma.SGE{{MR: p.a.mr, Offset: wsrRecord, Length: size}}, RemoteAddr: p.b.mr.Addr() + wsrRecord, RKey: p.b.mr.RKey()},
		sendWR(p.a),
	}
	p.a.mem.Bytes()[wsrSend] = 0
	var wc [1]rdma.Completion
	timeEach(b, size, func() error {
		if err := p.a.qp.PostRecv(aRecv); err != nil {
			return err
		}
		if err := p.a.qp.PostSend(put); err != nil {
			return err
		}
		for sent, replied := false, false; !sent || !replied; {
			w, err := next(p.a, wc[:])
			if err != nil {
				return err
			}
			sent = sent || w.ID == wsrSendID
			replied = replied || w.ID == wsrRecvID
		}
		return nil
	})
	// End B's loop with a commit marked 1, and wait for its SEND.
	p.a.mem.Bytes()[wsrSend] = 1
	if err := p.a.qp.PostSend(put[1:]); err != nil {
		b.Fatal(err)
	}
	if _, err := next(p.a, wc[:]); err != nil {
		b.Fatal(err)
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}
