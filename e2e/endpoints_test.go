// rkv-client --endpoints: a command that asks a server's control port for the view instead of joining gossip.

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/testpki"
)

// controlAddr is the control address n's last "ready" line gives.
func (c *cluster) controlAddr(n *node) string {
	c.t.Helper()
	m := regexp.MustCompile(`msg=ready .*control=(\S+)`).FindAllStringSubmatch(readLog(c.t, n), -1)
	if len(m) == 0 {
		c.t.Fatalf("no control address in %s's ready line", n.name)
	}
	return m[len(m)-1][1]
}

// TestCLIThroughEndpoints: with --endpoints (one server's control address)
// instead of --join, rkv-client puts and gets every server's keys without
// joining gossip (no server ever sees it as a member), its GetView takes
// the auth token and TLS as any session does, and a killed server's keys
// are unavailable (exit 3) while the others' read.
func TestCLIThroughEndpoints(t *testing.T) {
	pki := testpki.New(t, "127.0.0.1")
	files := pki.WriteFiles(t, t.TempDir())
	const token = "e2e-endpoints-token"
	// The servers talk to each other with a token of their own, which
	// the clients do not have: the cluster converges all the same.
	peerToken := filepath.Join(t.TempDir(), "peer-token")
	if err := os.WriteFile(peerToken, []byte("e2e-servers-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := newCluster(t, 3, smallStore)
	for _, n := range c.nodes {
		n.args = []string{"--auth-token", token, "--peer-token-file", peerToken, "--tls-cert", files.ServerCert, "--tls-key", files.ServerKey, "--tls-peer-ca", files.CA}
	}
	c.cliEnv = []string{"RKV_AUTH_TOKEN=" + token, "RKV_TLS_CA=" + files.CA}
	for i, n := range c.nodes {
		c.start(n, i > 0)
	}
	c.waitConverged()
	joinsBefore := clientJoins(t, c)
	if joinsBefore == 0 {
		t.Fatal("the servers logged no client joining for the set-up's --join commands: the count below would prove nothing")
	}
	entry := c.controlAddr(c.nodes[0])
	ep := []string{"RKV_ENDPOINTS=" + entry}
	must := func(args ...string) string {
		t.Helper()
		out, errs, code := c.runEnv(ep, "", args...)
		if code != 0 {
			t.Fatalf("rkv-client --endpoints %s %v: exit %d\n%s%s", entry, args, code, out, errs)
		}
		return out
	}

	var ms []memberJSON
	if err := json.Unmarshal([]byte(must("members", "-o", "json")), &ms); err != nil {
		t.Fatal(err)
	}
	if len(ms) != 3 || slices.ContainsFunc(ms, func(m memberJSON) bool { return m.State != "alive" || m.ControlAddr == "" }) {
		t.Fatalf("members through %s: %+v; want the 3 servers alive, with their control addresses", entry, ms)
	}

	const nkeys = 12
	owner := map[string]string{}
	var took []time.Duration
	for i := range nkeys {
		k, v := fmt.Sprintf("ep-%02d", i), fmt.Sprintf("value %d", i)
		if out := must("put", k, v); strings.TrimSpace(out) != "OK" {
			t.Fatalf("put %s: %q", k, out)
		}
		start := time.Now()
		if out := must("get", k); out != v {
			t.Fatalf("get %s: %q, want %q", k, out, v)
		}
		took = append(took, time.Since(start))
		var o struct {
			Owner string `json:"owner"`
		}
		if err := json.Unmarshal([]byte(must("owner", k, "-o", "json")), &o); err != nil {
			t.Fatal(err)
		}
		owner[k] = o.Owner
	}
	slices.Sort(took)
	t.Logf("rkv-client --endpoints get: median %v over %d processes", took[len(took)/2].Round(100*time.Microsecond), len(took))
	byServer := map[string]int{}
	for _, o := range owner {
		byServer[o]++
	}
	if len(byServer) < 2 {
		t.Fatalf("keys on %v: the test needs more than one server's", byServer)
	}
	// No command joined gossip: the servers logged no client joining
	// since the set-up's last --join command.
	if now := clientJoins(t, c); now != joinsBefore {
		t.Fatalf("clients joined gossip during the --endpoints commands: %d join lines, %d before", now, joinsBefore)
	}

	// GetView is an authenticated request like any other: a wrong token,
	// no TLS or a CA that did not sign the servers fail at once (exit 4).
	other := testpki.New(t, "127.0.0.1").WriteFiles(t, t.TempDir())
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"wrong token", []string{"RKV_AUTH_TOKEN=nope"}, "wrong auth token"},
		{"no TLS", []string{"RKV_TLS_CA="}, "this control port speaks TLS only"},
		{"another CA", []string{"RKV_TLS_CA=" + other.CA}, "certificate signed by unknown authority"},
	} {
		out, errs, code := c.runEnv(append(slices.Clone(ep), tc.env...), "", "get", "ep-00")
		if code != 4 || !strings.Contains(errs, tc.want) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 4 and %q", tc.name, code, out, errs, tc.want)
		}
	}

	// SIGKILL a server that is not the entry: its keys are unavailable
	// (exit 3, naming it), the others' read.
	victim := c.nodes[1]
	if byServer[c.nodes[2].name] > byServer[victim.name] {
		victim = c.nodes[2]
	}
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	down, up := 0, 0
	for i := range nkeys {
		k, v := fmt.Sprintf("ep-%02d", i), fmt.Sprintf("value %d", i)
		out, errs, code := c.runEnv(ep, "", "get", k)
		switch {
		case owner[k] == victim.name:
			if code != exitUnavailable || !strings.Contains(errs, victim.name) {
				t.Fatalf("get %s (on the killed %s): exit %d, stdout %q, stderr %q; want exit 3 naming the server", k, victim.name, code, out, errs)
			}
			down++
		case code != 0 || out != v:
			t.Fatalf("get %s on %s with %s down: exit %d, %q, %s", k, owner[k], victim.name, code, out, errs)
		default:
			up++
		}
	}
	if down == 0 || up == 0 {
		t.Fatalf("%d keys checked down, %d up: want some of each", down, up)
	}
}

// clientJoins counts the lines of the servers' logs that saw a client
// join gossip.
func clientJoins(t *testing.T, c *cluster) int {
	t.Helper()
	n := 0
	for _, nd := range c.nodes {
		for _, l := range strings.Split(readLog(t, nd), "\n") {
			if strings.Contains(l, `msg="member joined"`) && strings.Contains(l, "role=client") {
				n++
			}
		}
	}
	return n
}

func readLog(t *testing.T, n *node) string {
	t.Helper()
	b, err := os.ReadFile(n.log)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
