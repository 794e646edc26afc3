package server

import (
	"fmt"
	"testing"
	"time"
)

// The watch holds a session to a server; when the server's process ends
// (its listener and connections closed, as its kernel does on a crash), the
// session ends and the address refuses connections: gone, since about
// then. The server back on its address is no longer gone; a watch stopped
// says nothing.
func TestProcessWatchSeesTheProcessGoAndComeBack(t *testing.T) {
	dir := t.TempDir()
	s := newTestServer(t, func(c *Config) { c.Store.Dir, c.AuthToken = dir, "tok" })
	addr, id := s.ControlAddr(), s.id
	w := newProcessWatch(s.peerConfig())
	defer w.stop()
	base := s.Stats().Connections
	w.sync(map[string][2]string{"s1": {id, addr}})
	waitFor(t, 10*time.Second, "the watch session", func() error {
		if n := s.Stats().Connections; n != base+1 {
			return fmt.Errorf("%d control connections, want %d", n, base+1)
		}
		return nil
	})
	if since, gone := w.goneSince("s1"); gone {
		t.Fatalf("gone since %v while serving", since)
	}
	closed := time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the watch to see the process gone", func() error {
		if _, gone := w.goneSince("s1"); !gone {
			return fmt.Errorf("not gone")
		}
		return nil
	})
	if since, _ := w.goneSince("s1"); since.Before(closed) || time.Since(since) > 2*time.Second {
		t.Fatalf("gone since %v; closed at %v", since, closed)
	}

	s2 := newTestServer(t, func(c *Config) { c.Store.Dir, c.AuthToken, c.ControlAddr = dir, "tok", addr })
	defer s2.Close()
	waitFor(t, 10*time.Second, "the watch to see the process back", func() error {
		if since, gone := w.goneSince("s1"); gone {
			return fmt.Errorf("gone since %v", since)
		}
		return nil
	})
	w.sync(nil)
	if _, gone := w.goneSince("s1"); gone {
		t.Fatal("an unwatched server is gone")
	}
}
