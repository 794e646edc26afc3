package client_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/server"
)

// exampleCluster starts one server in a temporary directory and a client
// joined to it; stop undoes both.
func exampleCluster() (cl *client.Client, stop func()) {
	dir, err := os.MkdirTemp("", "rkv-example")
	if err != nil {
		panic(err)
	}
	cfg := serverConfig(dir, "s1", 0, nil)
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := server.New(context.Background(), cfg)
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err = client.New(ctx, client.Config{
		Seeds:      []string{s.GossipAddr()},
		Logger:     slog.New(slog.DiscardHandler),
		Membership: membership.Config{Tuning: fast},
	})
	if err != nil {
		panic(err)
	}
	return cl, func() {
		cl.Close()
		s.Close()
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
	fmt.Println(err == client.ErrNotFound)
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
	kvs, err := cl.Scan(ctx, []byte("fruit/"), []byte("fruit0"), 0)
	for _, kv := range kvs {
		fmt.Printf("%s=%s\n", kv.Key, kv.Value)
	}
	fmt.Println(err)
	// Output:
	// fruit/apple=x
	// <nil>
}
