//go:build soak

package e2e

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// A thousand rkv-client processes, one put each, into one server of one
// 64 MiB arena: each takes a lease as small as its put and gives its tail
// back when it exits, so none finds the store full (before leases fit the
// write, the 65th did).
func TestThousandCLIPutsFitOneArena(t *testing.T) {
	c := startClusterWith(t, 1, []string{"--arena-size", "64MiB", "--arena-count", "1", "--index-slots", "4096"})
	const puts, parallel = 1000, 8
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make(chan string, puts)
	next := make(chan int)
	for range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out, stderr, code := c.run("", "put", fmt.Sprintf("k%d", i), fmt.Sprintf("smallvalue %d", i))
				if code != 0 || strings.TrimSpace(out) != "OK" {
					errs <- fmt.Sprintf("put k%d: exit %d, %q, %s", i, code, out, stderr)
				}
			}
		}()
	}
	for i := range puts {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	if n := len(errs); n > 0 {
		t.Fatalf("%d of %d puts failed; the first: %s", n, puts, <-errs)
	}
	t.Logf("%d CLI puts in %v", puts, time.Since(t0).Round(time.Millisecond))
	for _, i := range []int{0, 1, 499, 998, 999} {
		if out := c.must("get", fmt.Sprintf("k%d", i)); out != fmt.Sprintf("smallvalue %d", i) {
			t.Fatalf("get k%d: %q", i, out)
		}
	}
	status := c.must("status", "-o", "json")
	if !strings.Contains(status, `"live_bytes"`) || !strings.Contains(status, `"free_bytes"`) {
		t.Fatalf("status -o json says nothing of the space: %s", status)
	}
	t.Logf("status: %s", status)
}
