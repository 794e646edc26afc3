package freeport

import (
	"fmt"
	"net"
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
