package rdma

import (
	"testing"
	"time"
)

func TestLatencyBucket(t *testing.T) {
	for _, d := range []time.Duration{0, time.Microsecond, 1500 * time.Nanosecond, 2 * time.Microsecond, 3 * time.Microsecond, time.Millisecond, time.Second, time.Hour, 1000 * time.Hour} {
		i := latencyBucket(d)
		if d > LatencyBucketBound(i) {
			t.Errorf("%v in bucket %d whose bound is %v", d, i, LatencyBucketBound(i))
		}
		if i > 0 && d <= LatencyBucketBound(i-1) {
			t.Errorf("%v in bucket %d but fits bucket %d (bound %v)", d, i, i-1, LatencyBucketBound(i-1))
		}
	}
}
