// Command rdmaread shows rkv's one idea on its own: a server registers memory
// and goes idle; a client reads it with one-sided RDMA_READs that never run
// server code. `rdmaread serve` and `rdmaread read` are its two halves.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/rkv-io/rkv/rdma"
	_ "github.com/rkv-io/rkv/rdma/soft"
)

const slotSize = 64

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	provider := fs.String("provider", "auto", "RDMA provider: auto, soft or verbs")
	device := fs.String("device", "auto", "RDMA device name")
	addr := fs.String("addr", "127.0.0.1:7470", "control address: listen (serve) or connect (read)")
	size := fs.Int("size", 64<<20, "serve: bytes of memory to register")
	count := fs.Int("count", 20000, "read: number of READs")
	_ = fs.Parse(os.Args[2:])

	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(*provider, *device, *addr, *size)
	case "read":
		err = read(*provider, *device, *addr, *count)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rdmaread:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: rdmaread serve|read [flags]  (rdmaread serve -h for the flags)")
	os.Exit(2)
}

func open(provider, device string) (rdma.Device, rdma.PD, rdma.CQ, error) {
	dev, err := rdma.Open(provider, device, rdma.Options{})
	if err != nil {
		return nil, nil, nil, err
	}
	pd, err := dev.AllocPD()
	if err != nil {
		return nil, nil, nil, errors.Join(err, dev.Close())
	}
	cq, err := dev.CreateCQ(256)
	if err != nil {
		return nil, nil, nil, errors.Join(err, pd.Close(), dev.Close())
	}
	slog.Info("rdma device open", "provider", dev.Provider(), "device", dev.Name())
	return dev, pd, cq, nil
}

// serve registers size bytes of slots in the background, then hands every
// client a QP and the region's (addr, rkey, length), and does nothing else.
func serve(provider, device, addr string, size int) error {
	dev, pd, cq, err := open(provider, device)
	if err != nil {
		return err
	}
	defer dev.Close()
	defer pd.Close()
	defer cq.Close()
	mem, err := rdma.Alloc(size)
	if err != nil {
		return err
	}
	defer mem.Close()
	for i := 0; i+slotSize <= size; i += slotSize {
		fillSlot(mem.Bytes()[i:i+slotSize], uint64(i/slotSize))
	}
	reg := rdma.NewRegistrar(pd, rdma.RegistrarOptions{})
	defer reg.Close()
	start := time.Now()
	future := reg.Register(context.Background(), mem.Bytes(), rdma.AccessRemoteRead)

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	slog.Info("listening; registering memory in the background", "addr", ln.Addr(), "bytes", size, "after", time.Since(start))
	mr, err := future.Wait(context.Background())
	if err != nil {
		return err
	}
	slog.Info("memory registered", "addr", fmt.Sprintf("%#x", mr.Addr()), "rkey", fmt.Sprintf("%#x", mr.RKey()), "took", time.Since(start))

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	go func() { <-stop; ln.Close() }()
	for {
		conn, err := ln.Accept()
		if err != nil {
			slog.Info("shutting down")
			return nil
		}
		go handle(conn, pd, cq, mr)
	}
}

// handle connects one client and then only waits for it to hang up: every
// READ the client makes is served by the RDMA device, not by this code.
func handle(conn net.Conn, pd rdma.PD, cq rdma.CQ, mr rdma.MR) {
	defer conn.Close()
	qp, err := pd.CreateQP(rdma.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		slog.Error("CreateQP", "err", err)
		return
	}
	defer qp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rdma.ConnectQP(ctx, conn, qp); err != nil {
		slog.Error("connect", "client", conn.RemoteAddr(), "err", err)
		return
	}
	var region [20]byte
	binary.BigEndian.PutUint64(region[0:], mr.Addr())
	binary.BigEndian.PutUint32(region[8:], mr.RKey())
	binary.BigEndian.PutUint64(region[12:], uint64(mr.Len()))
	if _, err := conn.Write(region[:]); err != nil {
		return
	}
	slog.Info("client connected; serving it one-sided", "client", conn.RemoteAddr(), "qp", qp.Num())
	var b [1]byte
	_, _ = conn.Read(b[:]) // returns when the client hangs up
	slog.Info("client gone", "client", conn.RemoteAddr())
}

func read(provider, device, addr string, count int) error {
	dev, pd, cq, err := open(provider, device)
	if err != nil {
		return err
	}
	defer dev.Close()
	defer pd.Close()
	defer cq.Close()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	qp, err := pd.CreateQP(rdma.QPConfig{SendCQ: cq, RecvCQ: cq})
	if err != nil {
		return err
	}
	defer qp.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rdma.ConnectQP(ctx, conn, qp); err != nil {
		return err
	}
	var region [20]byte
	if _, err := conn.Read(region[:]); err != nil {
		return fmt.Errorf("reading the region from the server: %w", err)
	}
	raddr, rkey := binary.BigEndian.Uint64(region[0:]), binary.BigEndian.Uint32(region[8:])
	slots := binary.BigEndian.Uint64(region[12:]) / slotSize
	fmt.Printf("server region: addr %#x rkey %#x, %d slots of %d bytes\n", raddr, rkey, slots, slotSize)

	mem, err := rdma.Alloc(slotSize)
	if err != nil {
		return err
	}
	defer mem.Close()
	local, err := pd.Register(mem.Bytes(), rdma.AccessLocalWrite)
	if err != nil {
		return err
	}
	defer local.Deregister()

	want := make([]byte, slotSize)
	wr := []rdma.SendWR{{Op: rdma.OpRead, Flags: rdma.Signaled, SGL: []rdma.SGE{{MR: local, Length: slotSize}}, RKey: rkey}}
	wc := make([]rdma.Completion, 1)
	lat := make([]time.Duration, 0, count)
	begin := time.Now()
	for i := range count {
		slot := rand.Uint64N(slots)
		wr[0].ID, wr[0].RemoteAddr = uint64(i), raddr+slot*slotSize
		t0 := time.Now()
		if err := qp.PostSend(wr); err != nil {
			return err
		}
		if _, err := cq.Wait(ctx, wc); err != nil {
			return err
		}
		lat = append(lat, time.Since(t0))
		if err := wc[0].Err(); err != nil {
			return err
		}
		fillSlot(want, slot)
		if string(mem.Bytes()) != string(want) {
			return fmt.Errorf("READ of slot %d returned %q, want %q", slot, mem.Bytes(), want)
		}
	}
	total := time.Since(begin)
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))] }
	fmt.Printf("%d one-sided READs of %d bytes, all verified: %.0f reads/s, latency p50 %v p99 %v max %v\n",
		count, slotSize, float64(count)/total.Seconds(), pct(0.50), pct(0.99), lat[len(lat)-1])
	return nil
}

// fillSlot writes slot i's self-describing content.
func fillSlot(b []byte, i uint64) {
	copy(b, fmt.Sprintf("slot %012d ", i))
	for j := 18; j < len(b); j++ {
		b[j] = 'a' + byte((i+uint64(j))%26)
	}
}
