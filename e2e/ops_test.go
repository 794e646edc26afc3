package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// memlockWrap returns the command that runs a program with RLIMIT_MEMLOCK
// at limit bytes, and without CAP_IPC_LOCK when this test runs as root
// (root's capability ignores the limit): setpriv and prlimit, from
// util-linux.
func memlockWrap(t *testing.T, limit int) []string {
	t.Helper()
	prlimit := []string{"prlimit", fmt.Sprintf("--memlock=%d:%d", limit, limit)}
	if _, err := exec.LookPath("prlimit"); err != nil {
		t.Skipf("cannot run here: needs prlimit (util-linux) to lower RLIMIT_MEMLOCK: %v", err)
	}
	if os.Geteuid() != 0 {
		return prlimit
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skipf("cannot run here: running as root, and needs setpriv (util-linux) to drop CAP_IPC_LOCK: %v", err)
	}
	return append([]string{"setpriv", "--inh-caps=-ipc_lock", "--bounding-set=-ipc_lock", "--"}, prlimit...)
}

// waitExit waits for n to exit and returns its exit code.
func waitExit(t *testing.T, n *node, d time.Duration) int {
	t.Helper()
	select {
	case <-n.done:
		return n.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		b, _ := os.ReadFile(n.log)
		t.Fatalf("%s still running after %v:\n%s", n.name, d, b)
		return 0
	}
}

// A server whose RLIMIT_MEMLOCK covers none of its arenas exits 1 at start
// with the reason and the fix, instead of saying "ready" with nothing to
// serve; one that can pin some of them serves on those.
func TestServerWithoutPinnableMemory(t *testing.T) {
	// Arenas of 4 MiB under a limit of 3 MiB: none fits.
	c := newCluster(t, 1, []string{"--arena-size", "4MiB", "--arena-count", "2", "--index-slots", "4096", "--lease-size", "256KiB"})
	n := c.nodes[0]
	n.wrap = memlockWrap(t, 3<<20)
	c.launch(n, false)
	if code := waitExit(t, n, 30*time.Second); code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	b, _ := os.ReadFile(n.log)
	log := string(b)
	for _, want := range []string{"none of the 2 arenas", "could be registered", "RLIMIT_MEMLOCK", "ulimit -l"} {
		if !strings.Contains(log, want) {
			t.Errorf("the log says nothing of %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "msg=ready") {
		t.Fatalf("a server with no arena said ready:\n%s", log)
	}
	n.starts-- // that start logged no ready line

	// 6 MiB: the index and one arena, not the second. The same data
	// directory: the failed start left it usable.
	n.wrap = memlockWrap(t, 6<<20)
	c.launch(n, false)
	c.waitReady(n)
	b, _ = os.ReadFile(n.log)
	if got := strings.Count(string(b), `msg="arena registration failed"`); got < 3 {
		t.Fatalf("%d arena failures logged over both starts, want 3 (both, then the second):\n%s", got, b)
	}
	c.must("--timeout", "20s", "members", "--expect-servers", "1", "--expect-arenas", "1")
	if out := c.must("put", "k", "v"); strings.TrimSpace(out) != "OK" {
		t.Fatalf("put on the one arena: %q", out)
	}
	if out := c.must("get", "k"); out != "v" {
		t.Fatalf("get: %q", out)
	}
}

// A server started before its seed keeps trying, logging each attempt, and
// joins once the seed is up; of its two seeds, one never answers.
func TestJoinBeforeTheSeed(t *testing.T) {
	c := newCluster(t, 2, smallStore)
	seed, joiner := c.nodes[0], c.nodes[1]
	joiner.args = []string{"--join", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--join-timeout", "60s"}
	c.launch(joiner, true) // --join n1 and a port nobody listens on
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(joiner.log)
		if strings.Count(string(b), `msg="no seed answered: retrying"`) >= 2 {
			if !strings.Contains(string(b), "level=INFO") || !strings.Contains(string(b), "connection refused") {
				t.Fatalf("the retries are not logged at INFO with their error:\n%s", b)
			}
			break
		}
		select {
		case err := <-joiner.done:
			t.Fatalf("the joiner exited before its seed was up: %v\n%s", err, b)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no retries logged within 20s:\n%s", b)
		}
	}
	c.start(seed, false)
	c.waitReady(joiner)
	c.waitConverged()
	if b, _ := os.ReadFile(joiner.log); !strings.Contains(string(b), `msg="joined the cluster"`) {
		t.Fatalf("the joiner does not say it joined after retrying:\n%s", b)
	}
	if out := c.must("status"); strings.Count(out, "alive") != 2 {
		t.Fatalf("status:\n%s", out)
	}
}

// --version names the commit the binaries were built from.
func TestVersionNamesTheCommit(t *testing.T) {
	c := newCluster(t, 0, nil)
	info, err := exec.Command("go", "version", "-m", c.server).Output()
	if err != nil {
		t.Fatalf("go version -m %s: %v", c.server, err)
	}
	_, rev, ok := strings.Cut(string(info), "vcs.revision=")
	if !ok {
		// The go command stamps a build only in a checkout it
		// recognizes: not in a git worktree (.git is a file there) or
		// an unpacked archive.
		t.Skipf("cannot run here: the go command stamped no vcs.revision into the build (a git worktree, or no checkout):\n%s", info)
	}
	rev, _, _ = strings.Cut(rev, "\n")
	for _, bin := range []string{c.server, c.cli} {
		out, err := exec.Command(bin, "--version").Output()
		if err != nil {
			t.Fatalf("%s --version: %v", bin, err)
		}
		if !strings.Contains(string(out), "commit "+rev) {
			t.Fatalf("%s --version: %q, want commit %s", bin, out, rev)
		}
	}
}
