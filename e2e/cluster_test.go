// Package e2e runs the rkv-server and rkv-client binaries as separate
// processes: a three-server cluster on loopback driven through the CLI.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/freeport"
)

// Exit codes of rkv-client (cmd/rkv-client).
const (
	exitNotFound    = 1
	exitUnavailable = 3
)

// build compiles the two commands into dir.
func build(dir string) (server, cli string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	// -buildvcs=auto: stamp the commit (--version) in a checkout even where
	// GOFLAGS says -buildvcs=false.
	cmd := exec.CommandContext(ctx, "go", "build", "-buildvcs=auto", "-o", dir+"/", "github.com/rkv-io/rkv/cmd/rkv-server", "github.com/rkv-io/rkv/cmd/rkv-client")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return filepath.Join(dir, "rkv-server"), filepath.Join(dir, "rkv-client"), nil
}

// freePort returns a port free for both TCP and UDP on 127.0.0.1.
func freePort(t *testing.T) int {
	t.Helper()
	port, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

type node struct {
	name, dir, log string
	port           int
	starts         int      // how many times started: one "ready" log line each
	wrap           []string // a command that runs rkv-server (setpriv, prlimit), if any
	args           []string // flags of rkv-server besides the cluster's
	cmd            *exec.Cmd
	done           chan error
}

// smallStore is the store the servers run with unless a test says
// otherwise: 8 MiB, so that tests do not pin memory they do not use.
var smallStore = []string{"--arena-size", "4MiB", "--arena-count", "2", "--index-slots", "4096", "--lease-size", "256KiB"}

type cluster struct {
	t           *testing.T
	storeArgs   []string // rkv-server's store flags
	cliEnv      []string // RKV_ variables every rkv-client run gets (auth token, TLS)
	server, cli string
	root        string
	nodes       []*node
}

func (c *cluster) seeds(except string) string {
	var s []string
	for _, n := range c.nodes {
		if n.name != except {
			s = append(s, fmt.Sprintf("127.0.0.1:%d", n.port))
		}
	}
	return strings.Join(s, ",")
}

// start starts n (again), joining through the other nodes when join is set,
// and waits for its "ready" log line.
func (c *cluster) start(n *node, join bool) {
	c.t.Helper()
	c.launch(n, join)
	c.waitReady(n)
}

// launch starts n (again), joining through the other nodes when join is
// set, without waiting for it.
func (c *cluster) launch(n *node, join bool) {
	c.t.Helper()
	n.starts++
	args := []string{"--name", n.name, "--data-dir", n.dir, "--provider", "soft",
		"--gossip-addr", fmt.Sprintf("127.0.0.1:%d", n.port)}
	args = append(args, c.storeArgs...)
	if join {
		args = append(args, "--join", c.seeds(n.name))
	} else {
		args = append(args, "--bootstrap", "--replicas", "1") // a test's own --replicas, in n.args, comes later and wins
	}
	args = append(args, n.args...)
	logf, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	argv := append(append(slices.Clone(n.wrap), c.server), args...)
	n.cmd = exec.Command(argv[0], argv[1:]...)
	n.cmd.Stdout, n.cmd.Stderr = logf, logf
	if err := n.cmd.Start(); err != nil {
		c.t.Fatalf("starting %s: %v", n.name, err)
	}
	n.done = make(chan error, 1)
	go func(cmd *exec.Cmd, done chan error) { done <- cmd.Wait() }(n.cmd, n.done)
}

// waitReady waits for the "ready" line of n's last start.
func (c *cluster) waitReady(n *node) {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(n.log)
		// The log is appended across restarts: count ready lines.
		if strings.Count(string(b), "msg=ready") >= n.starts {
			return
		}
		select {
		case err := <-n.done:
			c.t.Fatalf("%s exited during start: %v\n%s", n.name, err, b)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s not ready after 20s:\n%s", n.name, b)
		}
	}
}

// run runs rkv-client with the cluster's seeds and returns its stdout,
// stderr and exit code.
func (c *cluster) run(stdin string, args ...string) (string, string, int) {
	c.t.Helper()
	return c.runVia(c.seeds(""), stdin, args...)
}

// runVia runs rkv-client joining through seeds only.
func (c *cluster) runVia(seeds, stdin string, args ...string) (string, string, int) {
	c.t.Helper()
	return c.runEnv([]string{"RKV_JOIN=" + seeds}, stdin, args...)
}

// runEnv runs rkv-client with env added to the test's environment and the
// cluster's cliEnv; the test's own RKV_ variables are left out.
func (c *cluster) runEnv(env []string, stdin string, args ...string) (string, string, int) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.cli, append([]string{"--timeout", "5s"}, args...)...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "RKV_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, c.cliEnv...), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		c.t.Fatalf("rkv-client %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// must runs rkv-client and fails the test unless it exits 0.
func (c *cluster) must(args ...string) string {
	c.t.Helper()
	out, errs, code := c.run("", args...)
	if code != 0 {
		c.t.Fatalf("rkv-client %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errs)
	}
	return out
}

func (c *cluster) waitConverged() {
	c.t.Helper()
	arenas := "2"
	for i, a := range c.storeArgs {
		if a == "--arena-count" {
			arenas = c.storeArgs[i+1]
		}
	}
	c.must("--timeout", "20s", "members", "--expect-servers", fmt.Sprint(len(c.nodes)), "--expect-arenas", arenas)
}

// memberJSON is the part of `members --output json` the test reads.
type memberJSON struct {
	Name        string `json:"name"`
	State       string `json:"state"`
	Role        string `json:"role"`
	ControlAddr string `json:"control_addr"`
	Generation  uint64 `json:"generation"`
}

// viewOf returns n's view of the cluster, through a client that joins
// through n alone (a client joining through several nodes merges their
// views), without the client itself.
func (c *cluster) viewOf(n *node) []memberJSON {
	c.t.Helper()
	out, errs, code := c.runVia(fmt.Sprintf("127.0.0.1:%d", n.port), "", "members", "--all", "-o", "json")
	if code != 0 {
		c.t.Fatalf("members through %s: exit %d\n%s", n.name, code, errs)
	}
	var ms []memberJSON
	if err := json.Unmarshal([]byte(out), &ms); err != nil {
		c.t.Fatalf("members through %s: %v\n%s", n.name, err, out)
	}
	return ms
}

// eventually looks at every node's view with check until it passes or d
// has gone, and says how many looks it took and how long.
func (c *cluster) eventually(d time.Duration, what string, check func(n *node, view []memberJSON) error) string {
	c.t.Helper()
	begin := time.Now()
	for looks := 1; ; looks++ {
		var err error
		for _, n := range c.nodes {
			if err = check(n, c.viewOf(n)); err != nil {
				break
			}
		}
		if err == nil {
			return fmt.Sprintf("%d look(s) at the %d views, %v", looks, len(c.nodes), time.Since(begin).Round(time.Millisecond))
		}
		if time.Since(begin) > d {
			c.t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *cluster) logs() string {
	var b strings.Builder
	for _, n := range c.nodes {
		l, _ := os.ReadFile(n.log)
		fmt.Fprintf(&b, "--- %s\n%s", n.name, l)
	}
	return b.String()
}

// binaries are rkv-server and rkv-client, built once per test binary.
var binaries struct {
	once        sync.Once
	dir         string
	server, cli string
	err         error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binaries.dir != "" {
		os.RemoveAll(binaries.dir)
	}
	os.Exit(code)
}

// startCluster builds the commands (once) and starts n servers: n1
// bootstraps the cluster, the others join it; it returns once the map
// holds them all, settled. The servers are killed at the end of the test.
func startCluster(t *testing.T, n int) *cluster {
	t.Helper()
	return startClusterWith(t, n, smallStore)
}

// startClusterWith is startCluster with the servers' store flags.
func startClusterWith(t *testing.T, n int, storeArgs []string) *cluster {
	t.Helper()
	t0 := time.Now()
	c := newCluster(t, n, storeArgs)
	for i, n := range c.nodes {
		c.start(n, i > 0)
	}
	c.waitConverged()
	t.Logf("cluster of %d up in %v", n, time.Since(t0).Round(time.Millisecond))
	return c
}

// newCluster builds the commands (once) and names n servers, none started;
// those started are killed at the end of the test.
func newCluster(t *testing.T, n int, storeArgs []string) *cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("builds binaries and runs a multi-process cluster")
	}
	binaries.once.Do(func() {
		if binaries.dir, binaries.err = os.MkdirTemp("", "rkv-e2e-bin"); binaries.err == nil {
			binaries.server, binaries.cli, binaries.err = build(binaries.dir)
		}
	})
	if binaries.err != nil {
		t.Fatal(binaries.err)
	}
	c := &cluster{t: t, server: binaries.server, cli: binaries.cli, root: t.TempDir(), storeArgs: storeArgs}
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("n%d", i)
		c.nodes = append(c.nodes, &node{name: name, dir: filepath.Join(c.root, name), log: filepath.Join(c.root, name+".log"), port: freePort(t)})
	}
	t.Cleanup(func() {
		for _, n := range c.nodes {
			if n.cmd != nil && n.cmd.ProcessState == nil {
				_ = n.cmd.Process.Signal(syscall.SIGCONT)
				_ = n.cmd.Process.Kill()
			}
		}
		if t.Failed() {
			t.Log(c.logs())
		}
	})
	return c
}

func TestClusterThroughCLI(t *testing.T) {
	t0 := time.Now()
	c := startCluster(t, 3)

	// put/get/del/scan.
	const nkeys = 20
	vals := map[string]string{}
	for i := range nkeys {
		k, v := fmt.Sprintf("key-%02d", i), fmt.Sprintf("value %d", i)
		if i%2 == 0 {
			if out := c.must("put", k, v); strings.TrimSpace(out) != "OK" {
				t.Fatalf("put %s: %q", k, out)
			}
		} else { // the value from stdin
			if out, errs, code := c.run(v, "put", k); code != 0 || strings.TrimSpace(out) != "OK" {
				t.Fatalf("put %s from stdin: exit %d, %q, %s", k, code, out, errs)
			}
		}
		vals[k] = v
	}
	for k, v := range vals {
		if out := c.must("get", k); out != v {
			t.Fatalf("get %s: %q, want %q", k, out, v)
		}
	}
	if out, errs, code := c.run("", "del", "key-00"); code != 0 {
		t.Fatalf("del: exit %d %s %s", code, out, errs)
	}
	delete(vals, "key-00")
	if out, errs, code := c.run("", "get", "key-00"); code != exitNotFound || out != "" || !strings.Contains(errs, "key not found") {
		t.Fatalf("get of a deleted key: exit %d, stdout %q, stderr %q; want exit 1 and \"key not found\"", code, out, errs)
	}
	var scanned []struct {
		Key   string `json:"key"`
		Size  int    `json:"size"`
		Value string `json:"value"`
	}
	if err := json.Unmarshal([]byte(c.must("scan", "--prefix", "key-", "--values", "-o", "json")), &scanned); err != nil {
		t.Fatal(err)
	}
	if len(scanned) != len(vals) {
		t.Fatalf("scan: %d keys, want %d", len(scanned), len(vals))
	}
	for i, kv := range scanned {
		if vals[kv.Key] != kv.Value || kv.Size != len(kv.Value) || (i > 0 && scanned[i-1].Key >= kv.Key) {
			t.Fatalf("scan entry %d: %+v (want value %q, keys in order)", i, kv, vals[kv.Key])
		}
	}
	// Into a pipe, scan prints its rows alone: no header, no count.
	if out := c.must("scan", "--start", "key-05", "--end", "key-08"); !strings.HasPrefix(out, "key-05\t") || !strings.Contains(out, "\nkey-07\t") ||
		strings.Contains(out, "key-08") || strings.Count(out, "\n") != 3 {
		t.Fatalf("scan --start key-05 --end key-08: want the rows of key-05, -06 and -07 alone:\n%s", out)
	}
	if _, _, code := c.run("", "get"); code != 2 {
		t.Fatalf("get without a key: exit %d, want 2 (usage)", code)
	}

	// Every command's client left as it closed: no node's view holds one
	// (they used to linger as alive members when their leave was lost).
	took := c.eventually(3*time.Second, "no client left behind", func(n *node, view []memberJSON) error {
		for _, m := range view {
			if m.Role == "client" {
				return fmt.Errorf("%s's view holds %s (%s)", n.name, m.Name, m.State)
			}
		}
		return nil
	})
	t.Logf("after about 45 commands, no client in any node's view (%s)", took)

	// Owners: pick a victim that holds keys, among n2 and n3 (n1 is the
	// cluster's first node, but any would do: every node joins through all).
	owner := map[string]string{}
	count := map[string]int{}
	for k := range vals {
		var o struct {
			Owner string `json:"owner"`
		}
		if err := json.Unmarshal([]byte(c.must("owner", k, "-o", "json")), &o); err != nil {
			t.Fatal(err)
		}
		owner[k] = o.Owner
		count[o.Owner]++
	}
	victim := c.nodes[1]
	if count["n3"] > count["n2"] {
		victim = c.nodes[2]
	}
	if count[victim.name] == 0 || count[victim.name] == len(vals) {
		t.Fatalf("placement of %d keys: %v; want keys on the victim and on others", len(vals), count)
	}
	t.Logf("keys per server: %v; killing %s", count, victim.name)

	// SIGKILL the victim: its keys are unavailable (exit 3), others work.
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	checkedDown, checkedUp := 0, 0
	for k, v := range vals {
		if owner[k] == victim.name && checkedDown < 2 {
			if out, errs, code := c.run("", "get", k); code != exitUnavailable || !strings.Contains(errs, victim.name) {
				t.Fatalf("get %s (on the killed %s): exit %d, stdout %q, stderr %q; want exit 3 naming the server", k, victim.name, code, out, errs)
			}
			checkedDown++
		}
		if owner[k] != victim.name && checkedUp < 3 {
			if out := c.must("get", k); out != v {
				t.Fatalf("get %s with %s down: %q, want %q", k, victim.name, out, v)
			}
			checkedUp++
		}
	}
	// A put to a survivor works too.
	for k := range vals {
		if owner[k] != victim.name {
			c.must("put", k, vals[k]+" (updated)")
			vals[k] += " (updated)"
			break
		}
	}

	// Restart the victim on its data dir: every node's own view has its
	// new generation and control address at once (before, one could keep
	// the old ones for minutes, and hand them to clients joining through
	// it); every acknowledged write reads back.
	c.start(victim, true)
	var newGen uint64
	var newCtl string
	for _, m := range c.viewOf(victim) {
		if m.Name == victim.name {
			newGen, newCtl = m.Generation, m.ControlAddr
		}
	}
	if newGen < 2 {
		t.Fatalf("the restarted %s sees itself at generation %d", victim.name, newGen)
	}
	took = c.eventually(5*time.Second, "the restarted "+victim.name+" everywhere", func(n *node, view []memberJSON) error {
		for _, m := range view {
			if m.Name != victim.name {
				continue
			}
			if m.State != "alive" || m.Generation != newGen || m.ControlAddr != newCtl {
				return fmt.Errorf("%s sees %s %s at generation %d, control %s; want alive at %d, %s", n.name, m.Name, m.State, m.Generation, m.ControlAddr, newGen, newCtl)
			}
			return nil
		}
		return fmt.Errorf("%s does not see %s", n.name, victim.name)
	})
	t.Logf("%s restarted at generation %d, in every node's view once it was ready (%s)", victim.name, newGen, took)
	c.waitConverged()
	deadline := time.Now().Add(15 * time.Second)
	for k, v := range vals {
		for {
			out, errs, code := c.run("", "get", k)
			if code == 0 && out == v {
				break
			}
			if code != exitUnavailable || time.Now().After(deadline) {
				t.Fatalf("get %s after restarting %s: exit %d, %q (want %q), %s", k, victim.name, code, out, v, errs)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if out, errs, code := c.run("", "get", "key-00"); code != exitNotFound {
		t.Fatalf("get of the deleted key after the restart: exit %d %q %s", code, out, errs)
	}
	if out := c.must("status"); strings.Count(out, "alive") != 3 || strings.Contains(out, "not ready") {
		t.Fatalf("status:\n%s", out)
	}
	var rows []struct {
		Name       string `json:"name"`
		Ready      bool   `json:"ready"`
		IndexSlots uint64 `json:"index_slots"`
	}
	if err := json.Unmarshal([]byte(c.must("status", "-o", "json")), &rows); err != nil || len(rows) != 3 {
		t.Fatalf("status -o json: %d rows, %v", len(rows), err)
	}
	for _, r := range rows {
		if !r.Ready || r.IndexSlots == 0 {
			t.Fatalf("status -o json of %s: ready %v, index of %d slots", r.Name, r.Ready, r.IndexSlots)
		}
	}

	// SIGTERM everything: clean exits.
	for _, n := range c.nodes {
		if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.nodes {
		select {
		case err := <-n.done:
			if err != nil {
				t.Fatalf("%s after SIGTERM: %v", n.name, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("%s still running 15s after SIGTERM", n.name)
		}
		if l, _ := os.ReadFile(n.log); !strings.Contains(string(l), "msg=stopped") {
			t.Fatalf("%s's log has no \"stopped\" line", n.name)
		}
	}
	t.Logf("total %v", time.Since(t0).Round(time.Millisecond))
}
