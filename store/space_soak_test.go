//go:build soak

package store

import (
	"fmt"
	"testing"
)

// The utilization the cleaner sustains: the soak of space_test.go with a
// working set of 80% and 90% of the capacity (make test-soak).
func TestSustainableUtilization(t *testing.T) {
	for _, fill := range []float64{0.8, 0.9} {
		t.Run(fmt.Sprintf("working-set=%.0f%%", fill*100), func(t *testing.T) {
			wa := soak(t, fill, 20)
			t.Logf("working set %.0f%% of the capacity: 20x the capacity written without a full error, write amplification %.2f", fill*100, wa)
		})
	}
}

// TestLargeValuesNeverStrandTheCleaner at 70% of the capacity, 10 times
// written over.
func TestLargeValuesAt70Percent(t *testing.T) {
	wa := largeValuesSoak(t, 0.7, 10)
	t.Logf("values of 200 KB in segments of 4 MiB at 70%%: 10x the capacity written, write amplification %.2f", wa)
}
