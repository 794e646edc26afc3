// Retry counters by operation, for benchmarks and diagnosis (Client.Retries).
package client

import "sync/atomic"

// retriedOps are the operations whose retries are counted, as named by
// Client.do and Client.Retries.
var retriedOps = [...]string{"GET", "PUT", "DELETE"}

// retryCounters counts retried attempts by operation; the last slot
// counts any other. The zero value is ready.
type retryCounters struct {
	n [len(retriedOps) + 1]atomic.Uint64
}

func (r *retryCounters) add(op string) {
	for i, o := range retriedOps {
		if o == op {
			r.n[i].Add(1)
			return
		}
	}
	r.n[len(retriedOps)].Add(1)
}

// Retries returns how many attempts the client has retried since it was
// created, by operation: "GET" (MultiGet's single reads included),
// "PUT", "DELETE" and "other". An attempt is retried when it failed in
// a way a fresh view or connection may fix (a torn read, a lost
// connection, a revoked lease, a server at a newer generation...).
// It is safe to call concurrently with operations; the counts only grow.
func (c *Client) Retries() map[string]uint64 {
	m := make(map[string]uint64, len(retriedOps)+1)
	for i, o := range retriedOps {
		m[o] = c.retries.n[i].Load()
	}
	m["other"] = c.retries.n[len(retriedOps)].Load()
	return m
}
