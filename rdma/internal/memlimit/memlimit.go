// Package memlimit lets tests see what an unprivileged process sees when it
// pins memory: root's CAP_IPC_LOCK ignores RLIMIT_MEMLOCK, so the memlock
// errors of both providers cannot be reached otherwise.
package memlimit

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// Run calls fn on a thread without CAP_IPC_LOCK (capabilities are per
// thread) while the process's RLIMIT_MEMLOCK is lowered to limit bytes,
// and restores the limit afterwards. The thread is never returned to the
// Go scheduler: it exits with its lowered capabilities. Other goroutines
// pinning memory meanwhile see the low limit too, so call it from tests
// that run alone.
func Run(limit uint64, fn func() error) error {
	var old unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_MEMLOCK, &old); err != nil {
		return fmt.Errorf("memlimit: getrlimit: %w", err)
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // no UnlockOSThread: the thread dies with the goroutine
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("memlimit: capget: %w", err)
			return
		}
		data[0].Effective &^= 1 << unix.CAP_IPC_LOCK
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- fmt.Errorf("memlimit: dropping CAP_IPC_LOCK: %w", err)
			return
		}
		if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: limit, Max: old.Max}); err != nil {
			errc <- fmt.Errorf("memlimit: setrlimit: %w", err)
			return
		}
		err := fn()
		if rerr := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &old); rerr != nil && err == nil {
			err = fmt.Errorf("memlimit: restoring RLIMIT_MEMLOCK: %w", rerr)
		}
		errc <- err
	}()
	return <-errc
}
