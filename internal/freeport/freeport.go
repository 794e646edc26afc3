// Package freeport finds ports on 127.0.0.1 for the multi-process tests and benchmarks.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// A port the kernel picks for a listener on port 0, or for the local end of
// an outgoing connection, comes from its ephemeral range; a test that names
// such a port for a server it starts later races every connection any
// process on the machine opens meanwhile (go test runs packages in
// parallel). So Loopback hands out ports below that range, which the
// kernel never picks, and takes a lock per port (a record lock in one
// file in the temporary directory), held until the process exits, so that
// no two processes using this package hand out the same one.

const (
	// lowestPort is the bottom of the range handed out: clear of the
	// well-known and registered ports services commonly listen on.
	lowestPort = 10000
	// minRange is the fewest ports below the ephemeral range that make it
	// worth using; with fewer, Loopback lets the kernel choose.
	minRange = 1000
)

// errPortLocked: another process holds the port's lock.
var errPortLocked = errors.New("freeport: port locked by another process")

var state = struct {
	sync.Mutex
	given map[int]bool // every port returned in this process
	locks *portLocks   // open for the life of the process, once needed
}{given: map[int]bool{}}

// locksPath is the file the port locks are taken in.
func locksPath() string { return filepath.Join(os.TempDir(), "rkv-freeport.lock") }

// Loopback returns a port that is free on 127.0.0.1 for both TCP and UDP
// (a gossip address needs both) at the time of the call, and that no
// earlier call in this process, nor any other process using this package
// while it runs, returned. The port lies below the kernel's ephemeral
// range where that leaves room, so no listener on port 0 or outgoing
// connection takes it before the caller binds it; a process outside this
// package still can, so callers that start servers on it should report a
// bind failure clearly.
func Loopback() (int, error) {
	state.Lock()
	defer state.Unlock()
	if lo, hi, ok := reservedRange(); ok {
		if port, ok := lockedPort(lo, hi); ok {
			return port, nil
		}
	}
	return kernelPort()
}

// reservedRange is the range of ports below the kernel's ephemeral range.
func reservedRange() (lo, hi int, ok bool) {
	ephemeralLow := 32768 // Linux's default, where /proc cannot be read
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				ephemeralLow = n
			}
		}
	}
	hi = ephemeralLow - 1
	return lowestPort, hi, hi-lowestPort+1 >= minRange
}

// lockedPort tries the ports of [lo, hi] from a random start and returns
// the first whose lock it takes and that is free. The caller holds state.
func lockedPort(lo, hi int) (int, bool) {
	if state.locks == nil {
		l, err := openPortLocks(locksPath())
		if err != nil {
			return 0, false
		}
		state.locks = l
	}
	n := hi - lo + 1
	start := rand.IntN(n)
	for i := range min(n, 2000) {
		port := lo + (start+i)%n
		if state.given[port] {
			continue
		}
		if err := state.locks.lock(port); err != nil {
			if errors.Is(err, errPortLocked) {
				continue
			}
			return 0, false // locks unusable here: let the kernel choose
		}
		if !free(port) {
			state.locks.unlock(port)
			continue
		}
		state.given[port] = true
		return port, true
	}
	return 0, false
}

// kernelPort lets the kernel choose a free port, as a last resort: it lies
// in the ephemeral range, so another process may take it first.
func kernelPort() (int, error) {
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("freeport: %w", err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if state.given[port] || !free(port) {
			continue
		}
		state.given[port] = true
		return port, nil
	}
	return 0, errors.New("freeport: no port free for both TCP and UDP on 127.0.0.1 after 50 tries")
}

// free reports whether port can be bound on 127.0.0.1 for TCP and UDP now.
func free(port int) bool {
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer ln.Close()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	pc.Close()
	return true
}
