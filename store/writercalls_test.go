package store

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// withProcs runs the test with n Ps.
func withProcs(t *testing.T, n int) {
	old := runtime.GOMAXPROCS(n)
	t.Cleanup(func() { runtime.GOMAXPROCS(old) })
}

func TestWriterCallsWriteAndSync(t *testing.T) {
	withProcs(t, 2)
	for _, raw := range []bool{true, false} {
		f, err := os.Create(filepath.Join(t.TempDir(), "log"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		c := writerCalls{slow: !raw}
		if c.raw() != raw {
			t.Fatalf("slow %v: raw() = %v", c.slow, c.raw())
		}
		// Larger than one write of a pipe or a page, at an odd offset,
		// after bytes it must leave alone.
		want := make([]byte, 3<<20+5)
		for i := range want {
			want[i] = byte(rand.Uint32())
		}
		const off = 4097
		if err := c.pwrite(f, want[:off], 0); err != nil {
			t.Fatal(err)
		}
		if err := c.pwrite(f, want[off:], off); err != nil {
			t.Fatalf("raw %v: %v", raw, err)
		}
		if err := c.fdatasync(f); err != nil {
			t.Fatalf("raw %v: %v", raw, err)
		}
		got, err := os.ReadFile(f.Name())
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("raw %v: the file holds %d bytes, not the %d written", raw, len(got), len(want))
		}
	}
}

func TestWriterCallsErrors(t *testing.T) {
	withProcs(t, 2)
	path := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	readOnly, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer readOnly.Close()
	var c writerCalls
	if !c.raw() {
		t.Fatal("a fresh writerCalls with 2 Ps makes ordinary calls")
	}
	err = c.pwrite(readOnly, []byte("x"), 0)
	if !errors.Is(err, unix.EBADF) || !strings.Contains(err.Error(), path) {
		t.Errorf("pwrite to a read-only file: %v; want EBADF naming %s", err, path)
	}
	closed, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	for _, slow := range []bool{false, true} {
		c.slow = slow
		if err := c.fdatasync(closed); !errors.Is(err, unix.EBADF) {
			t.Errorf("raw %v: fdatasync of a closed file: %v; want EBADF", !slow, err)
		}
	}
}

// TestWriterCallsRawOnlyWhileShort checks when the calls are raw: with
// more than one P, and after a call under rawCallLimit.
func TestWriterCallsRawOnlyWhileShort(t *testing.T) {
	withProcs(t, 2)
	var c writerCalls
	c.took(time.Now().Add(-rawCallLimit))
	if c.raw() {
		t.Error("raw after a call of rawCallLimit")
	}
	c.took(time.Now())
	if !c.raw() {
		t.Error("not raw after a short call")
	}
	runtime.GOMAXPROCS(1)
	if c.raw() {
		t.Error("raw with one P")
	}
}

// TestYieldBeforeSyncRunsWokenGoroutines: a goroutine the writer woke,
// queued on the writer's P while the other P is busy (so that nothing
// steals it), runs at the yield, before the raw sync would keep the P.
func TestYieldBeforeSyncRunsWokenGoroutines(t *testing.T) {
	withProcs(t, 2)
	stop := make(chan struct{})
	defer close(stop)
	busy := make(chan struct{})
	go func() { // the other P's: spins until the test ends
		close(busy)
		for {
			select {
			case <-stop:
				return
			default:
			}
		}
	}()
	<-busy
	const trials = 100
	ranAtYield := 0
	for range trials {
		var ran atomic.Bool
		parked, wake, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
		go func() {
			close(parked)
			<-wake
			ran.Store(true)
			close(done)
		}()
		<-parked
		wake <- struct{}{} // readies it on this goroutine's P
		var c writerCalls
		c.yieldBeforeSync()
		if ran.Load() {
			ranAtYield++
		}
		<-done
	}
	// Not every trial: a test run under the race detector queues a woken
	// goroutine behind the yielder now and then. Without the yield it
	// runs in none (the other P is busy).
	if ranAtYield < trials/2 {
		t.Fatalf("the woken goroutine ran at the yield in %d of %d trials", ranAtYield, trials)
	}
}
