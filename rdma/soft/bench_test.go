// Benchmarks: READ latency against raw TCP on loopback, READ throughput, and allocation checks.

package soft

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

var benchSizes = []int{64, 1024, 65536}

// BenchmarkRead measures one READ in flight: post, wait for the completion.
func BenchmarkRead(b *testing.B) { benchOneInFlight(b, rdma.OpRead) }

// BenchmarkWrite measures one signaled WRITE in flight.
func BenchmarkWrite(b *testing.B) { benchOneInFlight(b, rdma.OpWrite) }

func benchOneInFlight(b *testing.B, op rdma.Opcode) {
	for _, size := range benchSizes {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			x, y := newPair(b, rdma.QPConfig{})
			local := register(b, x.pd, size, rw)
			remote := register(b, y.pd, size, rw)
			wr := []rdma.SendWR{{Op: op, Flags: rdma.Signaled, SGL: sgl(local, 0, size), RemoteAddr: remote.Addr(), RKey: remote.RKey()}}
			wc := make([]rdma.Completion, 1)
			ctx := context.Background()
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if err := x.qp.PostSend(wr); err != nil {
					b.Fatal(err)
				}
				if _, err := x.cq.Wait(ctx, wc); err != nil || wc[0].Status != rdma.StatusSuccess {
					b.Fatal(err, wc[0].Status)
				}
			}
		})
	}
}

// BenchmarkSendRecv measures one SEND in flight, the RECV reposted each time.
func BenchmarkSendRecv(b *testing.B) {
	x, y := newPair(b, rdma.QPConfig{})
	src := register(b, x.pd, 64, rw)
	dst := register(b, y.pd, 64, rw)
	send := []rdma.SendWR{{Op: rdma.OpSend, Flags: rdma.Signaled, SGL: sgl(src, 0, 64)}}
	recv := []rdma.RecvWR{{SGL: sgl(dst, 0, 64)}}
	wc := make([]rdma.Completion, 1)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := y.qp.PostRecv(recv); err != nil {
			b.Fatal(err)
		}
		if err := x.qp.PostSend(send); err != nil {
			b.Fatal(err)
		}
		if _, err := x.cq.Wait(ctx, wc); err != nil || wc[0].Status != rdma.StatusSuccess {
			b.Fatal(err, wc[0].Status)
		}
		if _, err := y.cq.Wait(ctx, wc); err != nil || wc[0].Status != rdma.StatusSuccess {
			b.Fatal(err, wc[0].Status)
		}
	}
}

// BenchmarkReadThroughput keeps depth 64 KiB READs in flight.
func BenchmarkReadThroughput(b *testing.B) {
	const size = 64 << 10
	for _, depth := range []int{16, 64} {
		b.Run(strconv.Itoa(depth), func(b *testing.B) {
			x, y := newPair(b, rdma.QPConfig{MaxSendWR: depth})
			local := register(b, x.pd, size*depth, rw)
			remote := register(b, y.pd, size, rw)
			wrs := make([]rdma.SendWR, depth)
			for i := range wrs {
				wrs[i] = rdma.SendWR{ID: uint64(i), Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(local, i*size, size), RemoteAddr: remote.Addr(), RKey: remote.RKey()}
			}
			wc := make([]rdma.Completion, depth)
			ctx := context.Background()
			b.SetBytes(size)
			b.ReportAllocs()
			b.ResetTimer()
			posted := min(depth, b.N)
			if err := x.qp.PostSend(wrs[:posted]); err != nil {
				b.Fatal(err)
			}
			for done := 0; done < b.N; {
				n, err := x.cq.Wait(ctx, wc)
				if err != nil {
					b.Fatal(err)
				}
				for _, c := range wc[:n] {
					if c.Status != rdma.StatusSuccess {
						b.Fatal(c.Status)
					}
					if posted < b.N {
						if err := x.qp.PostSend(wrs[c.ID : c.ID+1]); err != nil {
							b.Fatal(err)
						}
						posted++
					}
				}
				done += n
			}
		})
	}
}

// tcpPair returns both ends of a loopback TCP connection, closed when the
// test or benchmark ends.
func tcpPair(tb testing.TB) (client, server net.Conn) {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		client.Close()
		tb.Fatal("accept failed")
	}
	tb.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// benchTCP runs a client that sends req bytes and reads resp bytes back
// from a server goroutine doing the reverse.
func benchTCP(b *testing.B, req, resp int) {
	client, server := tcpPair(b)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		in, out := make([]byte, req), make([]byte, resp)
		for {
			if _, err := io.ReadFull(server, in); err != nil {
				return
			}
			if _, err := server.Write(out); err != nil {
				return
			}
		}
	}()
	out, in := make([]byte, req), make([]byte, resp)
	b.SetBytes(int64(resp))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := client.Write(out); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(client, in); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	client.Close()
	wg.Wait()
}

// BenchmarkTCPEcho is the baseline for BenchmarkRead: size bytes to a Go
// server and back over loopback.
func BenchmarkTCPEcho(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(strconv.Itoa(size), func(b *testing.B) { benchTCP(b, size, size) })
	}
}

// BenchmarkTCPRequestResponse is a stricter baseline: a READ-sized request
// out, size bytes back.
func BenchmarkTCPRequestResponse(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(strconv.Itoa(size), func(b *testing.B) { benchTCP(b, requestHeaderSize, size) })
	}
}

// BenchmarkReadVsEcho alternates one READ and one TCP echo of the same
// size, so both see the same machine load, and reports each one's mean
// latency and their ratio.
func BenchmarkReadVsEcho(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(strconv.Itoa(size), func(b *testing.B) {
			x, y := newPair(b, rdma.QPConfig{})
			local := register(b, x.pd, size, rw)
			remote := register(b, y.pd, size, rw)
			wr := []rdma.SendWR{{Op: rdma.OpRead, Flags: rdma.Signaled, SGL: sgl(local, 0, size), RemoteAddr: remote.Addr(), RKey: remote.RKey()}}
			wc := make([]rdma.Completion, 1)
			ctx := context.Background()

			client, server := tcpPair(b)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, size)
				for {
					if _, err := io.ReadFull(server, buf); err != nil {
						return
					}
					if _, err := server.Write(buf); err != nil {
						return
					}
				}
			}()
			out, in := make([]byte, size), make([]byte, size)
			var readNS, echoNS time.Duration
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				if err := x.qp.PostSend(wr); err != nil {
					b.Fatal(err)
				}
				if _, err := x.cq.Wait(ctx, wc); err != nil || wc[0].Status != rdma.StatusSuccess {
					b.Fatal(err, wc[0].Status)
				}
				t1 := time.Now()
				if _, err := client.Write(out); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(client, in); err != nil {
					b.Fatal(err)
				}
				t2 := time.Now()
				readNS += t1.Sub(t0)
				echoNS += t2.Sub(t1)
			}
			b.StopTimer()
			client.Close()
			wg.Wait()
			b.ReportMetric(float64(readNS)/float64(b.N), "read-ns/op")
			b.ReportMetric(float64(echoNS)/float64(b.N), "echo-ns/op")
			b.ReportMetric(float64(readNS)/float64(echoNS), "read/echo")
		})
	}
}

// BenchmarkTCPThroughput is the raw TCP counterpart of
// BenchmarkReadThroughput: depth 48-byte requests in flight, each
// answered with 64 KiB.
func BenchmarkTCPThroughput(b *testing.B) {
	const size = 64 << 10
	for _, depth := range []int{16, 64} {
		b.Run(strconv.Itoa(depth), func(b *testing.B) {
			client, server := tcpPair(b)
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				in, out := make([]byte, requestHeaderSize), make([]byte, size)
				for {
					if _, err := io.ReadFull(server, in); err != nil {
						return
					}
					if _, err := server.Write(out); err != nil {
						return
					}
				}
			}()
			credits := make(chan struct{}, depth)
			for range depth {
				credits <- struct{}{}
			}
			b.SetBytes(size)
			b.ReportAllocs()
			b.ResetTimer()
			wg.Add(1)
			go func() {
				defer wg.Done()
				req := make([]byte, requestHeaderSize)
				for range b.N {
					<-credits
					if _, err := client.Write(req); err != nil {
						return
					}
				}
			}()
			in := make([]byte, size)
			for range b.N {
				if _, err := io.ReadFull(client, in); err != nil {
					b.Fatal(err)
				}
				credits <- struct{}{}
			}
			b.StopTimer()
			client.Close()
			wg.Wait()
		})
	}
}
