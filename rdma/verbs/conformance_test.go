//go:build verbs

package verbs

import (
	"testing"
	"time"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/rdmatest"
)

// TestConformance runs the shared provider suite between the first and the
// last device (rxe0 and rxe1 in `deploy/rxevm/run.sh --rxe 2`), or through
// one device when there is only one. Soft-RoCE under TCG moves ~40 MB/s:
// 1 GiB each way would take most of a minute. 128 MiB still spans many
// MRs' worth of pages.
func TestConformance(t *testing.T) {
	runConformance(t, testOptions(t), 128<<20)
}

// TestConformanceSpinning runs the suite again with both devices' Waits
// polling before they sleep (Options.Spin), as rkv's clients run: the
// spin must not change what a Wait returns, to whom, or when it gives up.
// The large region is smaller: the first run covers it.
func TestConformanceSpinning(t *testing.T) {
	opts := testOptions(t)
	opts.Spin = 200 * time.Microsecond
	runConformance(t, opts, 8<<20)
}

// runConformance runs the suite with opts on both devices and a large
// region of largeSize bytes.
func runConformance(t *testing.T, opts rdma.Options, largeSize int) {
	devs := testDevices(t)
	rdmatest.Run(t, rdmatest.Config{
		Provider:  ProviderName,
		DeviceA:   devs[0],
		DeviceB:   devs[len(devs)-1],
		OptionsA:  opts,
		OptionsB:  opts,
		LargeSize: largeSize,
	})
}
