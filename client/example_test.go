package client_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/rdma"
	_ "github.com/rkv-io/rkv/rdma/soft"
	"github.com/rkv-io/rkv/server"
	"github.com/rkv-io/rkv/store"
)

// exampleCluster starts one server in a temporary directory, bootstrapping
// a cluster of its own, and a client joined to it; stop undoes both.
func exampleCluster() (cl *client.Client, stop func()) {
	dir, err := os.MkdirTemp("", "rkv-example")
	if err != nil {
		panic(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	// main picks the RDMA provider: here the pure-Go one, on loopback.
	sdev, err := rdma.Open("soft", "", rdma.Options{ListenAddr: "127.0.0.1:0"})
	if err != nil {
		panic(err)
	}
	s, err := server.New(context.Background(), server.Config{
		Name: "s1", Device: sdev, Bootstrap: true, Logger: quiet,
		Store: store.Options{Dir: dir, ArenaSize: 4 << 20, ArenaCount: 1, IndexSlots: 1 << 12, LeaseSize: 256 << 10},
	})
	if err != nil {
		panic(err)
	}
	cdev, err := rdma.Open("soft", "", rdma.Options{ListenAddr: "127.0.0.1:0"})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err = client.New(ctx, client.Config{Seeds: []string{s.GossipAddr()}, Device: cdev, Logger: quiet})
	if err != nil {
		panic(err)
	}
	return cl, func() {
		cl.Close()
		cdev.Close()
		s.Close()
		sdev.Close()
		os.RemoveAll(dir)
	}
}

func ExampleClient_Get() {
	cl, stop := exampleCluster()
	defer stop()
	ctx := context.Background()
	if err := cl.Put(ctx, []byte("greeting"), []byte("hello, RDMA")); err != nil {
		fmt.Println(err)
		return
	}
	v, err := cl.Get(ctx, []byte("greeting")) // two RDMA_READs, no server code
	fmt.Printf("%s %v\n", v, err)
	_, err = cl.Get(ctx, []byte("nothing"))
	fmt.Println(errors.Is(err, client.ErrNotFound))
	// Output:
	// hello, RDMA <nil>
	// true
}

func ExampleClient_Scan() {
	cl, stop := exampleCluster()
	defer stop()
	ctx := context.Background()
	for _, k := range []string{"fruit/apple", "fruit/pear", "veg/leek"} {
		if err := cl.Put(ctx, []byte(k), []byte("x")); err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := cl.Delete(ctx, []byte("fruit/pear")); err != nil {
		fmt.Println(err)
		return
	}
	kvs, err := cl.Scan(ctx, []byte("fruit/"), nil, client.WithPrefix())
	for _, kv := range kvs {
		fmt.Printf("%s=%s\n", kv.Key, kv.Value)
	}
	fmt.Println(err)
	// Output:
	// fruit/apple=x
	// <nil>
}
