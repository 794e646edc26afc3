package freeport

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

func TestLoopbackIsFreeForTCPAndUDP(t *testing.T) {
	port, err := Loopback()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("TCP %s: %v", addr, err)
	}
	defer ln.Close()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		t.Fatalf("UDP %s: %v", addr, err)
	}
	pc.Close()
}

// TestLoopbackNeverRepeats: ports handed out together differ, though each
// is closed again before the next is asked for.
func TestLoopbackNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		port, err := Loopback()
		if err != nil {
			t.Fatal(err)
		}
		if seen[port] {
			t.Fatalf("port %d handed out twice", port)
		}
		seen[port] = true
	}
}

func TestLoopbackStaysOutOfTheEphemeralRange(t *testing.T) {
	lo, hi, ok := reservedRange()
	if !ok {
		t.Skipf("this kernel leaves fewer than %d ports below its ephemeral range", minRange)
	}
	for range 20 {
		port, err := Loopback()
		if err != nil {
			t.Fatal(err)
		}
		if port < lo || port > hi {
			t.Fatalf("port %d outside [%d, %d], below the ephemeral range", port, lo, hi)
		}
	}
}

// TestLoopbackPortsAreLockedAcrossProcesses: a second process (this test
// binary again) can take none of the ports this one was handed.
func TestLoopbackPortsAreLockedAcrossProcesses(t *testing.T) {
	if ports := os.Getenv("FREEPORT_TRY_LOCKS"); ports != "" {
		locks, err := openPortLocks(locksPath())
		if err != nil {
			fmt.Printf("port locks: %v\n", err)
			return
		}
		for _, p := range strings.Split(ports, ",") {
			port, _ := strconv.Atoi(p)
			err := locks.lock(port)
			if err == nil {
				locks.unlock(port)
				fmt.Printf("took %d\n", port)
			} else if !errors.Is(err, errPortLocked) {
				fmt.Printf("port %d: %v\n", port, err)
			}
		}
		return
	}
	if _, _, ok := reservedRange(); !ok {
		t.Skipf("this kernel leaves fewer than %d ports below its ephemeral range", minRange)
	}
	var ports []string
	for range 20 {
		port, err := Loopback()
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, strconv.Itoa(port))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLoopbackPortsAreLockedAcrossProcesses$")
	cmd.Env = append(os.Environ(), "FREEPORT_TRY_LOCKS="+strings.Join(ports, ","))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "took ") || strings.HasPrefix(line, "port ") {
			t.Errorf("another process: %s", line)
		}
	}
}
