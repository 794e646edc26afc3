//go:build chaos

// The cluster under test: rkv-server processes that the nemesis can kill, restart, stop and resume.

package chaos

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/freeport"
)

// buildServer compiles rkv-server into dir, once per test binary.
func buildServer(t *testing.T, dir string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "build", "-o", dir+"/", "github.com/rkv-io/rkv/cmd/rkv-server")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build rkv-server: %v\n%s", err, out)
	}
	return filepath.Join(dir, "rkv-server")
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

// nodeState is what the nemesis has done to a server.
type nodeState int

const (
	running nodeState = iota
	killed            // SIGKILLed, not restarted yet
	paused            // SIGSTOPped
)

// node is one rkv-server, restartable on the same data directory, name
// and addresses.
type node struct {
	idx                int
	name, dir, log, ip string
	gossip, ctl, data  int // ports

	mu     sync.Mutex
	state  nodeState
	starts int // "ready" log lines to wait for
	cmd    *exec.Cmd
	done   chan error
}

func (n *node) gossipAddr() string { return net.JoinHostPort(n.ip, fmt.Sprint(n.gossip)) }

// cluster is the servers and the network they run on.
type cluster struct {
	t      *testing.T
	server string   // the rkv-server binary
	args   []string // more flags for every server
	net    network
	nodes  []*node
}

func newCluster(t *testing.T, server string, nw network, n int) *cluster {
	root := t.TempDir()
	c := &cluster{t: t, server: server, net: nw}
	for i := range n {
		name := fmt.Sprintf("n%d", i+1)
		nd := &node{idx: i, name: name, dir: filepath.Join(root, name), log: filepath.Join(root, name+".log"), ip: nw.serverIP(i)}
		if nw.sharedPorts() {
			nd.gossip, nd.ctl, nd.data = freePort(t), freePort(t), freePort(t)
		} else {
			nd.gossip, nd.ctl, nd.data = 7946, 7950, 7951
		}
		c.nodes = append(c.nodes, nd)
	}
	return c
}

func (c *cluster) seeds() []string {
	var s []string
	for _, n := range c.nodes {
		s = append(s, n.gossipAddr())
	}
	return s
}

// start starts n (again) and waits for its "ready" log line. The caller
// holds n.mu.
func (c *cluster) startLocked(n *node) error {
	n.starts++
	// Join through the others, once they have started: the first
	// server of a new cluster joins nobody.
	var join []string
	for _, m := range c.nodes {
		if m != n && (n.starts > 1 || m.idx < n.idx) {
			join = append(join, m.gossipAddr())
		}
	}
	args := []string{"--name", n.name, "--data-dir", n.dir, "--provider", "soft", "--sync", "always",
		"--gossip-addr", n.gossipAddr(),
		"--control-addr", net.JoinHostPort(n.ip, fmt.Sprint(n.ctl)),
		"--data-addr", net.JoinHostPort(n.ip, fmt.Sprint(n.data)),
		"--arena-size", "32MiB", "--arena-count", "2", "--index-slots", "4096", "--lease-size", "64KiB",
		"--replicas", "1"} // a scenario's own --replicas, in c.args, comes later and wins
	args = append(args, c.args...)
	if len(join) > 0 {
		args = append(args, "--join", strings.Join(join, ","))
	} else {
		args = append(args, "--bootstrap")
	}
	logf, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := c.net.command(n.idx, c.server, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", n.name, err)
	}
	n.cmd, n.state = cmd, running
	n.done = make(chan error, 1)
	go func(done chan error) { done <- cmd.Wait() }(n.done)
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, _ := os.ReadFile(n.log)
		if strings.Count(string(b), "msg=ready") >= n.starts {
			return nil
		}
		select {
		case err := <-n.done:
			n.done <- err
			return fmt.Errorf("%s exited during start: %v (log %s)", n.name, err, n.log)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after 30s (log %s)", n.name, n.log)
		}
	}
}

func (c *cluster) start(n *node) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return c.startLocked(n)
}

// kill SIGKILLs n and waits for it to exit.
func (c *cluster) kill(n *node) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.state == killed {
		return nil
	}
	if err := n.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("SIGKILL %s (pid %d): %w", n.name, n.cmd.Process.Pid, err)
	}
	select {
	case <-n.done:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("%s (pid %d) still running 10s after SIGKILL", n.name, n.cmd.Process.Pid)
	}
	n.state = killed
	return nil
}

// restart starts a killed n again on its data directory and addresses.
func (c *cluster) restart(n *node) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.state != killed {
		return nil
	}
	return c.startLocked(n)
}

// pause SIGSTOPs n: its sockets stay open, nothing answers.
func (c *cluster) pause(n *node) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.state != running {
		return nil
	}
	if err := n.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP %s (pid %d): %w", n.name, n.cmd.Process.Pid, err)
	}
	n.state = paused
	return nil
}

// resume SIGCONTs a paused n.
func (c *cluster) resume(n *node) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.state != paused {
		return nil
	}
	if err := n.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("SIGCONT %s (pid %d): %w", n.name, n.cmd.Process.Pid, err)
	}
	n.state = running
	return nil
}

// down reports whether the nemesis killed n and has not restarted it.
func (c *cluster) down(n *node) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.state == killed
}

// node returns the server named name, or nil.
func (c *cluster) node(name string) *node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// leader names the live server that logged last that it leads the
// cluster map's Raft group ("leading the cluster map": every new leader
// does), "" if none did.
func (c *cluster) leader() string {
	var name string
	var latest time.Time
	for _, n := range c.nodes {
		if c.down(n) {
			continue
		}
		b, _ := os.ReadFile(n.log)
		for l := range strings.Lines(string(b)) {
			if !strings.Contains(l, `msg="leading the cluster map"`) || !strings.HasPrefix(l, "time=") {
				continue
			}
			ts, _, _ := strings.Cut(strings.TrimPrefix(l, "time="), " ")
			if t, err := time.Parse(time.RFC3339Nano, ts); err == nil && t.After(latest) {
				name, latest = n.name, t
			}
		}
	}
	return name
}

// exited reports a server that died without the nemesis killing it.
func (c *cluster) exited() []string {
	var out []string
	for _, n := range c.nodes {
		n.mu.Lock()
		if n.state != killed && n.done != nil {
			select {
			case err := <-n.done:
				n.done <- err
				out = append(out, fmt.Sprintf("%s exited on its own: %v", n.name, err))
			default:
			}
		}
		n.mu.Unlock()
	}
	return out
}

// stopAll kills every server (continuing paused ones first, so they die).
func (c *cluster) stopAll() {
	for _, n := range c.nodes {
		_ = c.resume(n)
		n.mu.Lock()
		if n.cmd != nil && n.state != killed {
			_ = n.cmd.Process.Signal(syscall.SIGKILL)
			select {
			case <-n.done:
			case <-time.After(10 * time.Second):
			}
			n.state = killed
		}
		n.mu.Unlock()
	}
}

// logTail is the end of every server's log, for a failure report.
func (c *cluster) logTail(lines int) string {
	var b strings.Builder
	for _, n := range c.nodes {
		l, _ := os.ReadFile(n.log)
		all := strings.Split(strings.TrimRight(string(l), "\n"), "\n")
		fmt.Fprintf(&b, "--- %s (%s), last %d lines\n%s\n", n.name, n.log, lines, strings.Join(all[max(0, len(all)-lines):], "\n"))
	}
	return b.String()
}
