package server

import (
	"testing"
	"time"
)

// TestReadLeaseServesTheGrantItsShardsReflect: a grant at an epoch the
// server's shards do not reflect yet does not serve, an older one does
// meanwhile, ended and outlasted grants are forgotten, and a closing
// server serves none.
func TestReadLeaseServesTheGrantItsShardsReflect(t *testing.T) {
	var l readLease
	now := time.Now()
	l.add(leaseGrant{until: now.Add(2 * time.Second), epoch: 5})
	l.add(leaseGrant{until: now.Add(3 * time.Second), epoch: 7})
	if left := l.left(4); left != 0 {
		t.Fatalf("shards at epoch 4, grants at 5 and 7: %v left, want none", left)
	}
	if left := l.left(6); left <= time.Second || left > 2*time.Second {
		t.Fatalf("shards at epoch 6: %v left, want the epoch-5 grant's (under 2s)", left)
	}
	if left := l.left(7); left <= 2*time.Second {
		t.Fatalf("shards at epoch 7: %v left, want the epoch-7 grant's (about 3s)", left)
	}
	l.add(leaseGrant{until: now.Add(4 * time.Second), epoch: 7}) // outlasts the epoch-7 one
	l.add(leaseGrant{until: now.Add(-time.Second), epoch: 3})    // ended already: kept only until the next grant
	l.add(leaseGrant{until: now.Add(5 * time.Second), epoch: 8})
	if len(l.grants) != 3 || l.grants[0].epoch != 5 || l.grants[1].until != now.Add(4*time.Second) || l.grants[2].epoch != 8 {
		t.Fatalf("grants kept: %+v, want those at epochs 5, 7 (the longer) and 8", l.grants)
	}
	if u := l.until(); u != now.Add(5*time.Second) {
		t.Fatalf("the latest grant ends %v, want %v", u, now.Add(5*time.Second))
	}
	l.closed = true
	if left := l.left(8); left != 0 {
		t.Fatalf("closing: %v left, want none", left)
	}
}
