// Package rkvtarget runs loadgen workloads on rkv clients: the one adapter
// rkv-client bench and the comparison in bench/ share.
package rkvtarget

import (
	"context"
	"errors"
	"strings"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/loadgen"
)

// CounterReads is the Counters name of the RDMA READs the clients posted.
// Retried attempts are "retries_" and the operation in lower case
// ("retries_get", "retries_put", ...).
const CounterReads = "rdma_reads"

// RetriesPrefix starts the Counters names of retried attempts.
const RetriesPrefix = "retries_"

// Target is a loadgen.Target over one or more clients: worker i uses
// Clients[i % len(Clients)] (loadgen.WorkerTargets), Get and Put the
// first. Its counters sum over the clients. Clients must not be empty.
type Target struct {
	Clients []*client.Client
}

// ForWorker returns worker i's client as a Target.
func (t Target) ForWorker(i int) loadgen.Target { return Client{t.Clients[i%len(t.Clients)]} }

// Get reads key with the first client.
func (t Target) Get(ctx context.Context, key []byte) ([]byte, error) {
	return Client{t.Clients[0]}.Get(ctx, key)
}

// Put writes key with the first client.
func (t Target) Put(ctx context.Context, key, value []byte) error {
	return t.Clients[0].Put(ctx, key, value)
}

// Counters reports the RDMA READs the clients posted (CounterReads) and
// the attempts they retried, by operation (loadgen.Counters).
func (t Target) Counters() map[string]uint64 {
	m := map[string]uint64{CounterReads: 0}
	for _, c := range t.Clients {
		m[CounterReads] += c.Reads()
		for op, n := range c.Retries() {
			m[RetriesPrefix+strings.ToLower(op)] += n
		}
	}
	return m
}

// Client is one client as a loadgen.Target, loadgen.MultiGetter and
// loadgen.MultiPutter.
type Client struct{ C *client.Client }

// Get reads key; an absent key is loadgen.ErrNotFound.
func (c Client) Get(ctx context.Context, key []byte) ([]byte, error) {
	v, err := c.C.Get(ctx, key)
	if errors.Is(err, client.ErrNotFound) {
		return nil, loadgen.ErrNotFound
	}
	return v, err
}

// Put writes key.
func (c Client) Put(ctx context.Context, key, value []byte) error { return c.C.Put(ctx, key, value) }

// MultiGet reads keys (nil for an absent one).
func (c Client) MultiGet(ctx context.Context, keys [][]byte) ([][]byte, error) {
	return c.C.MultiGet(ctx, keys)
}

// MultiPut writes keys[i] = values[i] with one client.MultiPut.
func (c Client) MultiPut(ctx context.Context, keys, values [][]byte) error {
	kvs := make([]client.KV, len(keys))
	for i := range keys {
		kvs[i] = client.KV{Key: keys[i], Value: values[i]}
	}
	return c.C.MultiPut(ctx, kvs)
}
