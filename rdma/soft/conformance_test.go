// The provider-independent conformance suite, run against the soft provider.

package soft

import (
	"fmt"
	"testing"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/rdmatest"
)

func TestConformance(t *testing.T) {
	// The full 1 GiB large-region case (about 20 s under -race here); -short
	// skips it.
	rdmatest.Run(t, rdmatest.Config{Provider: ProviderName})
}

// TestConformanceOverLinks runs the suite again on devices that spread
// their QPs to a peer over three links, as a client's do; the large
// region is 64 MiB there, its 1 GiB case having run above.
func TestConformanceOverLinks(t *testing.T) {
	opts := rdma.Options{Links: 3}
	rdmatest.Run(t, rdmatest.Config{Provider: ProviderName, OptionsA: opts, OptionsB: opts, LargeSize: 64 << 20})
}

// BenchmarkRegistrar is the server-shaped registration case: 8 arenas of
// 1 GiB. Run it alone: go test -run '^$' -bench Registrar -benchtime 1x.
func BenchmarkRegistrar(b *testing.B) {
	for _, workers := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			rdmatest.BenchmarkRegistrar(b, rdmatest.Config{Provider: ProviderName}, 8, 1<<30, workers)
		})
	}
}
