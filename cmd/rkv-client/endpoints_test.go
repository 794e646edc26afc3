package main

import (
	"strings"
	"testing"
)

// --endpoints takes control addresses and works without gossip; --join
// keeps gossip; an address given to the wrong one is named in one line,
// with the flag that wants it (exit 2); both at once are a usage error,
// but one on the command line overrides the other's variable.
func TestEndpointsAndJoinTakeTheirOwnPorts(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	srv := startServer(t, nil, nil)
	ctl, gossip := srv.ControlAddr(), srv.GossipAddr()

	if out, errs, code := runCLI(map[string]string{"RKV_ENDPOINTS": ctl}, "put", "k", "v"); code != exitOK {
		t.Fatalf("put through RKV_ENDPOINTS: exit %d\n%s%s", code, out, errs)
	}
	if out, errs, code := runCLI(nil, "--endpoints", ctl, "get", "k"); code != exitOK || out != "v" {
		t.Fatalf("get through --endpoints: exit %d, %q\n%s", code, out, errs)
	}
	if out, errs, code := runCLI(nil, "--join", gossip, "get", "k"); code != exitOK || out != "v" {
		t.Fatalf("get through --join: exit %d, %q\n%s", code, out, errs)
	}
	// The command line's --endpoints wins over RKV_JOIN (no "give one").
	if out, errs, code := runCLI(map[string]string{"RKV_JOIN": "127.0.0.1:1"}, "--endpoints", ctl, "get", "k"); code != exitOK || out != "v" {
		t.Fatalf("--endpoints with RKV_JOIN set: exit %d, %q\n%s", code, out, errs)
	}

	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{"a control port to --join", nil, []string{"--join", ctl}, []string{"--join " + ctl + ": a control port (of s1)", "give it to --endpoints"}},
		{"a gossip port to --endpoints", nil, []string{"--endpoints", gossip}, []string{"--endpoints " + gossip + ": not a control port", "--join takes gossip addresses"}},
		{"both flags", nil, []string{"--endpoints", ctl, "--join", gossip}, []string{"give one"}},
		{"both variables", map[string]string{"RKV_ENDPOINTS": ctl, "RKV_JOIN": gossip}, nil, []string{"give one"}},
	} {
		_, errs, code := runCLI(tc.env, append(append([]string{"--timeout", "5s"}, tc.args...), "get", "k")...)
		if code != exitUsage {
			t.Errorf("%s: exit %d, want %d (stderr %q)", tc.name, code, exitUsage, errs)
		}
		if n := strings.Count(strings.TrimSpace(errs), "\n"); tc.name != "both flags" && tc.name != "both variables" && n != 0 {
			t.Errorf("%s: %d lines on stderr, want one: %q", tc.name, n+1, errs)
		}
		for _, w := range tc.want {
			if !strings.Contains(errs, w) {
				t.Errorf("%s: stderr %q, want it to contain %q", tc.name, errs, w)
			}
		}
	}
}
