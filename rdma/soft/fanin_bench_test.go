// Benchmarks of many QPs with one request in flight each, the traffic of
// rkv's GETs from a pool of connections: soft itself, and raw TCP models
// of the ways it could carry that traffic, to tell what one shared
// connection and coalesced writes would buy before building either.

package soft

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/rdmatest"
)

// fanInSize is the READ size of the fan-in benchmarks: a 1 KiB value and
// its record header, as in the client's BenchmarkThroughput.
const fanInSize = 1024

// fanInParallelism times GOMAXPROCS is the number of goroutines, each
// with its own QP, as BenchmarkThroughput in package client has them.
const fanInParallelism = 8

// BenchmarkReadParallel runs 8 x GOMAXPROCS goroutines, each posting one
// 1 KiB READ on its own QP (own CQ) and waiting for it; all the QPs join
// the same two devices, as a client's pool of connections to one server.
func BenchmarkReadParallel(b *testing.B) {
	n := fanInParallelism * runtime.GOMAXPROCS(0)
	type conn struct {
		qp    rdma.QP
		cq    rdma.CQ
		wr    []rdma.SendWR
		wc    []rdma.Completion
		inUse atomic.Bool
	}
	dx, dy := openDev(b), openDev(b)
	px, py := allocPD(b, dx), allocPD(b, dy)
	local := register(b, px, n*fanInSize, rw)
	remote := register(b, py, fanInSize, rw)
	conns := make([]*conn, n)
	for i := range conns {
		cx, cy := createCQ(b, dx, 16), createCQ(b, dy, 16)
		x := createQP(b, px, rdma.QPConfig{SendCQ: cx, RecvCQ: cx})
		y := createQP(b, py, rdma.QPConfig{SendCQ: cy, RecvCQ: cy})
		rdmatest.Connect(b, x, y)
		conns[i] = &conn{qp: x, cq: cx, wc: make([]rdma.Completion, 1),
			wr: []rdma.SendWR{{Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(local, i*fanInSize, fanInSize), RemoteAddr: remote.Addr(), RKey: remote.RKey()}}}
	}
	var next atomic.Int64
	ctx := context.Background()
	// One READ on each QP first: its link is up (attached) once it
	// completes, and its write counter is there to read.
	for _, c := range conns {
		if err := c.qp.PostSend(c.wr); err != nil {
			b.Fatal(err)
		}
		if _, err := c.cq.Wait(ctx, c.wc); err != nil || c.wc[0].Status != rdma.StatusSuccess {
			b.Fatal(err, c.wc[0].Status)
		}
	}
	writes := func() (n int64) {
		out, _ := links(dx)
		for _, l := range out {
			n += int64(l.w.writes.Load())
		}
		return n
	}
	writes0 := writes()
	b.SetParallelism(fanInParallelism)
	b.SetBytes(fanInSize)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := conns[int(next.Add(1)-1)%n]
		if !c.inUse.CompareAndSwap(false, true) {
			b.Error("two goroutines on one QP")
			return
		}
		for pb.Next() {
			if err := c.qp.PostSend(c.wr); err != nil {
				b.Error(err)
				return
			}
			if _, err := c.cq.Wait(ctx, c.wc); err != nil || c.wc[0].Status != rdma.StatusSuccess {
				b.Error(err, c.wc[0].Status)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	b.ReportMetric(float64(b.N)/float64(writes()-writes0), "READs/write")
}

// BenchmarkTCPFanIn models BenchmarkReadParallel in raw TCP: 8 x
// GOMAXPROCS goroutines, each sending a 48-byte request and waiting for a
// 20-byte header and 1 KiB back.
//
//   - conns: a connection per goroutine and a server goroutine per
//     connection, as soft carries its QPs today: four syscalls a request.
//   - shared: one connection for all, a write per request each way, a
//     client reader goroutine handing each response to its goroutine:
//     what the connection count alone buys.
//   - coalesced: one connection, and whatever is ready goes out in one
//     write on both sides (a poster finding a write in progress leaves its
//     frame for that writer; the server answers all it read in one write):
//     what coalescing buys on top.
func BenchmarkTCPFanIn(b *testing.B) {
	b.Run("conns", benchFanInConns)
	b.Run("shared", func(b *testing.B) { benchFanInShared(b, false) })
	b.Run("coalesced", func(b *testing.B) { benchFanInShared(b, true) })
}

func benchFanInConns(b *testing.B) {
	n := fanInParallelism * runtime.GOMAXPROCS(0)
	clients := make([]net.Conn, n)
	var wg sync.WaitGroup
	for i := range clients {
		var server net.Conn
		clients[i], server = tcpPair(b)
		wg.Add(1)
		go func() {
			defer wg.Done()
			in, out := make([]byte, requestHeaderSize), make([]byte, responseHeaderSize+fanInSize)
			for {
				if _, err := io.ReadFull(server, in); err != nil {
					return
				}
				if _, err := server.Write(out); err != nil {
					return
				}
			}
		}()
	}
	var next atomic.Int64
	b.SetParallelism(fanInParallelism)
	b.SetBytes(fanInSize)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c := clients[int(next.Add(1)-1)%n]
		out, in := make([]byte, requestHeaderSize), make([]byte, responseHeaderSize+fanInSize)
		for pb.Next() {
			if _, err := c.Write(out); err != nil {
				b.Error(err)
				return
			}
			if _, err := io.ReadFull(c, in); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	for _, c := range clients {
		c.Close()
	}
	wg.Wait()
}

// fanInWriter writes frames to a shared connection. Coalescing, a frame
// posted while another goroutine writes is appended to a pending buffer,
// which that writer sends next: one write for all that arrived meanwhile.
type fanInWriter struct {
	conn     net.Conn
	coalesce bool

	mu       sync.Mutex
	pending  []byte
	spare    []byte
	flushing bool
}

func (w *fanInWriter) send(frame []byte) error {
	w.mu.Lock()
	if !w.coalesce {
		defer w.mu.Unlock()
		_, err := w.conn.Write(frame)
		return err
	}
	w.pending = append(w.pending, frame...)
	if w.flushing {
		w.mu.Unlock()
		return nil
	}
	w.flushing = true
	for len(w.pending) > 0 {
		out := w.pending
		w.pending, w.spare = w.spare[:0], out
		w.mu.Unlock()
		_, err := w.conn.Write(out)
		w.mu.Lock()
		if err != nil {
			w.flushing = false
			w.mu.Unlock()
			return err
		}
	}
	w.flushing = false
	w.mu.Unlock()
	return nil
}

func benchFanInShared(b *testing.B, coalesce bool) {
	n := fanInParallelism * runtime.GOMAXPROCS(0)
	client, server := tcpPair(b)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { // the server: one goroutine for every tag
		defer wg.Done()
		br := bufio.NewReaderSize(server, 64<<10)
		in := make([]byte, requestHeaderSize)
		resp := make([]byte, responseHeaderSize+fanInSize)
		var out []byte
		for {
			if _, err := io.ReadFull(br, in); err != nil {
				return
			}
			copy(resp, in[:4]) // the tag
			if !coalesce {
				if _, err := server.Write(resp); err != nil {
					return
				}
				continue
			}
			out = append(out, resp...)
			if br.Buffered() < requestHeaderSize {
				if _, err := server.Write(out); err != nil {
					return
				}
				out = out[:0]
			}
		}
	}()
	done := make([]chan struct{}, n)
	for i := range done {
		done[i] = make(chan struct{}, 1)
	}
	go func() { // the client's reader: hands each response to its goroutine
		defer wg.Done()
		br := bufio.NewReaderSize(client, 64<<10)
		in := make([]byte, responseHeaderSize+fanInSize)
		for {
			if _, err := io.ReadFull(br, in); err != nil {
				return
			}
			done[binary.BigEndian.Uint32(in)] <- struct{}{}
		}
	}()
	w := &fanInWriter{conn: client, coalesce: coalesce}
	var next atomic.Int64
	b.SetParallelism(fanInParallelism)
	b.SetBytes(fanInSize)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		tag := int(next.Add(1)-1) % n
		out := make([]byte, requestHeaderSize)
		binary.BigEndian.PutUint32(out, uint32(tag))
		for pb.Next() {
			if err := w.send(out); err != nil {
				b.Error(err)
				return
			}
			<-done[tag]
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	client.Close()
	server.Close()
	wg.Wait()
}
