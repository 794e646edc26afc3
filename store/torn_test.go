package store

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// tornValue is self-describing: the key and a counter, repeated to fill
// size bytes, so any mix of two versions is recognisable.
func tornValue(key []byte, n, size int) []byte {
	unit := fmt.Appendf(nil, "%s#%d;", key, n)
	return bytes.Repeat(unit, size/len(unit)+1)[:size]
}

func checkTornValue(key, v []byte) error {
	i := bytes.IndexByte(v, ';')
	if i < 0 {
		return fmt.Errorf("no unit in %q", v)
	}
	unit := v[:i+1]
	if !bytes.HasPrefix(unit, append(append([]byte{}, key...), '#')) {
		return fmt.Errorf("value of another key: %q", unit)
	}
	for j := 0; j < len(v); j += len(unit) {
		if !bytes.HasPrefix(unit, v[j:min(len(v), j+len(unit))]) {
			return fmt.Errorf("mixed versions at byte %d: %q", j, v[j:min(len(v), j+len(unit))])
		}
	}
	return nil
}

// One-sided readers race a writer that keeps overwriting the same keys: no
// read may return a wrong or mixed value; torn reads are retried.
func TestOneSidedReadsNeverReturnTornValues(t *testing.T) {
	opts := smallOptions()
	opts.ArenaSize, opts.ArenaCount = 32<<20, 2
	sv := newServer(t, opts)
	waitArenas(t, sv.s, 2)
	wc := newClient(t, sv)
	keys := [][]byte{[]byte("hot-0"), []byte("hot-1"), []byte("hot-2")}
	w := wc.newWriter()
	put := func(k []byte, n int) {
		if w.off+8192 > w.lease.Size {
			w = wc.newWriter()
		}
		if _, err := w.put(k, tornValue(k, n, 3000+n%1000)); err != nil {
			t.Fatal(err)
		}
	}
	for _, k := range keys {
		put(k, 0)
	}
	stop := make(chan struct{})
	var reads, retries, wrong atomic.Int64
	var firstWrong atomic.Value
	var wg sync.WaitGroup
	for range 2 {
		rc := newClient(t, sv)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := keys[i%len(keys)]
				v, found, retry := rc.get(k)
				reads.Add(1)
				switch {
				case retry:
					retries.Add(1)
				case !found:
					wrong.Add(1)
					firstWrong.CompareAndSwap(nil, fmt.Sprintf("%s not found", k))
				default:
					if err := checkTornValue(k, v); err != nil {
						wrong.Add(1)
						firstWrong.CompareAndSwap(nil, err.Error())
					}
				}
			}
		}()
	}
	deadline := time.Now().Add(3 * time.Second)
	writes := 0
	for n := 1; time.Now().Before(deadline); n++ {
		put(keys[n%len(keys)], n)
		writes++
	}
	close(stop)
	wg.Wait()
	t.Logf("%d writes, %d one-sided reads, %d retried, %d wrong", writes, reads.Load(), retries.Load(), wrong.Load())
	if wrong.Load() != 0 {
		t.Fatalf("%d reads returned a wrong value; first: %v", wrong.Load(), firstWrong.Load())
	}
	if reads.Load() < 100 || writes < 100 {
		t.Fatalf("too little concurrency to mean anything: %d reads, %d writes", reads.Load(), writes)
	}
}
