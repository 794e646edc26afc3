// Tests of the retry counters.
package client

import (
	"sync"
	"testing"
)

func TestRetriesCountByOperation(t *testing.T) {
	var c Client
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				c.retries.add("GET")
			}
			c.retries.add("PUT")
			c.retries.add("SCAN")
		})
	}
	wg.Wait()
	got := c.Retries()
	want := map[string]uint64{"GET": 400, "PUT": 4, "DELETE": 0, "other": 4}
	if len(got) != len(want) {
		t.Fatalf("Retries() = %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Fatalf("Retries() = %v, want %v", got, want)
		}
	}
}
