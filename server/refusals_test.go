// Refused requests: counted by code, and logged without flooding the log.

package server

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// A full store's refusals are counted by code and logged at WARN with the
// reason, one line for a burst of them rather than one per refusal.
func TestFullStoreIsLoggedNotFlooded(t *testing.T) {
	var logs logBuffer
	s := startServer(t, func(c *Config) { c.Logger = logs.logger() })
	ss := openSession(t, s, "")
	granted, full := 0, 0
	begin := time.Now()
	for i := 0; full < 50 && i < 1000; i++ {
		ss.id++
		switch r := call(t, ss.nc, ss.id, &proto.GrantLease{Size: 256 << 10, Min: 256 << 10}).(type) {
		case *proto.LeaseReply:
			granted++
		case *proto.Error:
			if r.Code != proto.CodeFull {
				t.Fatalf("grant %d: %v, want a lease or %v", i, r, proto.CodeFull)
			}
			full++
		}
	}
	took := time.Since(begin)
	if granted == 0 || full < 50 {
		t.Fatalf("%d leases granted and %d refused as full, want leases until the store is full, then refusals", granted, full)
	}
	if got := s.Stats().Refused[proto.CodeFull]; got != uint64(full) {
		t.Fatalf("Stats().Refused[full] = %d, want %d", got, full)
	}
	lines := logs.records(t, "store full: refusing writes")
	// One line at once, and at most one more per refusalLogEvery after.
	if len(lines) == 0 || len(lines) > 1+int(took/refusalLogEvery) {
		t.Fatalf("%d \"store full\" lines for %d refusals in %v", len(lines), full, took)
	}
	if l := lines[0]; l["level"] != "WARN" || l["request"] != "GrantLease" || !strings.Contains(fmt.Sprint(l["reason"]), "store: full") {
		t.Fatalf("first line %v: want the request and the store's reason", l)
	}
}

// refusalLog logs the first of a kind, counts the rest into one line per
// period, and starts over after a quiet period. The period is long: the
// test ends the periods itself.
func TestRefusalLog(t *testing.T) {
	var logs logBuffer
	l := newRefusalLog(logs.logger(), time.Hour)
	defer l.close()
	for i := range 5 {
		l.note("full", slog.LevelWarn, "store full", "i", i)
	}
	l.note("lease", slog.LevelInfo, "lease refused")
	if r := logs.records(t, "store full"); len(r) != 1 || r[0]["i"] != 0.0 {
		t.Fatalf("after 5 refusals: %v, want the first one alone", r)
	}
	r := l.kinds["full"]
	l.flush("full", r) // the period ends: the 4 others, with the last one's details
	got := logs.records(t, "store full")
	if len(got) != 2 || got[1]["count"] != 4.0 || got[1]["i"] != 4.0 {
		t.Fatalf("after the period: %v, want a line counting 4, with i=4", got)
	}
	l.flush("full", r) // a quiet period: the kind is forgotten
	if _, ok := l.kinds["full"]; ok {
		t.Fatal("a quiet period did not end the kind's periods")
	}
	l.note("full", slog.LevelWarn, "store full", "i", 5)
	if got := logs.records(t, "store full"); len(got) != 3 || got[2]["i"] != 5.0 || got[2]["count"] != nil {
		t.Fatalf("a refusal after a quiet period: %v, want it logged at once", got)
	}
	if got := logs.records(t, "lease refused"); len(got) != 1 || got[0]["level"] != "INFO" {
		t.Fatalf("another kind: %v, want its own line", got)
	}
}
