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
					for _, size := range []int{2, 64, 1024} {
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
	lat := make([]time.Duration, b.N)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		if err := p.a.qp.PostSend(wr); err != nil {
			b.Fatal(err)
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
			b.Fatal(err)
		}
		if wc[0].Status != rdma.StatusSuccess {
			b.Fatalf("completion %+v", wc[0])
		}
		lat[i] = time.Since(start)
	}
	b.StopTimer()
	// The mean (ns/op) of a TCG guest on a shared host is dominated by a
	// few scheduling hiccups; the percentiles say more.
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
}
