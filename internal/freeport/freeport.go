// Package freeport finds ports on 127.0.0.1 for the multi-process tests and benchmarks.
package freeport

import (
	"errors"
	"fmt"
	"net"
	"sync"
)

// given is every port Loopback returned in this process: the kernel may
// offer a port again once it is closed, and ports handed out together
// (a cluster's, before any server binds them) must differ.
var given = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// Loopback returns a port that is free on 127.0.0.1 for both TCP and UDP
// (a gossip address needs both) at the time of the call, and that no
// earlier call in this process returned. Another process may take it
// before the caller binds it: callers that start servers on it should
// expect, and report, a bind failure.
func Loopback() (int, error) {
	for range 50 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("freeport: %w", err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		pc, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		ln.Close()
		if err != nil {
			continue
		}
		pc.Close()
		given.Lock()
		seen := given.ports[port]
		given.ports[port] = true
		given.Unlock()
		if !seen {
			return port, nil
		}
	}
	return 0, errors.New("freeport: no port free for both TCP and UDP on 127.0.0.1 after 50 tries")
}
