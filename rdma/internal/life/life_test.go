package life

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/rkv-io/rkv/rdma/internal/mem"
)

const (
	kindA Kind = iota
	kindB
)

func newLife() *Lifetime {
	l := &Lifetime{}
	l.Init("test: thing", "PD", "CQ")
	return l
}

func TestCloseRefusesWhileChildrenExist(t *testing.T) {
	l := newLife()
	for range 2 {
		if err := l.Acquire(kindA); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Acquire(kindB); err != nil {
		t.Fatal(err)
	}
	released := 0
	release := func() error { released++; return nil }
	err := l.Close(release)
	if !errors.Is(err, mem.ErrBusy) || !strings.Contains(err.Error(), "test: thing: close with 2 PDs and 1 CQ open") {
		t.Fatalf("Close with children = %v, want ErrBusy naming them", err)
	}
	l.Release(kindA)
	l.Release(kindA)
	if err := l.Close(release); !errors.Is(err, mem.ErrBusy) || !strings.Contains(err.Error(), "1 CQ open") {
		t.Fatalf("Close with a CQ = %v", err)
	}
	l.Release(kindB)
	if released != 0 {
		t.Fatalf("release ran %d times while busy", released)
	}
	if err := l.Close(release); err != nil || released != 1 {
		t.Fatalf("Close = %v, release ran %d times", err, released)
	}
	if err := l.Close(release); !errors.Is(err, mem.ErrClosed) || released != 1 {
		t.Fatalf("second Close = %v, release ran %d times", err, released)
	}
	if err := l.Acquire(kindA); !errors.Is(err, mem.ErrClosed) {
		t.Fatalf("Acquire after Close = %v, want ErrClosed", err)
	}
}

func TestReleaseErrorClosesAnyway(t *testing.T) {
	l := newLife()
	boom := errors.New("boom")
	if err := l.Close(func() error { return boom }); err != boom {
		t.Fatalf("Close = %v, want release's error", err)
	}
	if err := l.Close(func() error { return nil }); !errors.Is(err, mem.ErrClosed) {
		t.Fatalf("Close after a failed release = %v, want ErrClosed", err)
	}
}

func TestStillOpenKeepsTheResourceOpen(t *testing.T) {
	l := newLife()
	boom := errors.New("dealloc failed")
	if err := l.Close(func() error { return StillOpen(boom) }); err != boom {
		t.Fatalf("Close = %v, want release's own error", err)
	}
	if err := l.Acquire(kindA); err != nil {
		t.Fatalf("Acquire after a Close that left the resource open: %v", err)
	}
	l.Release(kindA)
	if err := l.Close(func() error { return StillOpen(nil) }); err != nil {
		t.Fatalf("retried Close = %v", err)
	}
	if err := l.Acquire(kindA); !errors.Is(err, mem.ErrClosed) {
		t.Fatalf("Acquire after Close = %v, want ErrClosed", err)
	}
}

// TestAcquireWaitsForClose: a child created while release runs is either
// refused (release succeeded) or counted (it did not): never counted on a
// closed resource.
func TestAcquireWaitsForClose(t *testing.T) {
	for _, fail := range []bool{false, true} {
		l := newLife()
		inRelease, finish := make(chan struct{}), make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = l.Close(func() error {
				close(inRelease)
				<-finish
				if fail {
					return StillOpen(errors.New("no"))
				}
				return nil
			})
		}()
		<-inRelease
		got := make(chan error)
		go func() { got <- l.Acquire(kindB) }()
		close(finish)
		err := <-got
		wg.Wait()
		if fail && (err != nil || l.Count(kindB) != 1) || !fail && (!errors.Is(err, mem.ErrClosed) || l.Count(kindB) != 0) {
			t.Errorf("release failing %v: Acquire during Close = %v, count %d", fail, err, l.Count(kindB))
		}
	}
}

func TestReleaseBelowZeroPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	newLife().Release(kindA)
}
