package store

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// crashChildEnv names the child's data directory, crashSyncEnv its sync
// policy.
const (
	crashChildEnv = "RKV_STORE_CRASH_CHILD"
	crashSyncEnv  = "RKV_STORE_CRASH_SYNC"
)

// crashOptions are the options of the crash test's store, in dir.
func crashOptions(dir string, sync SyncPolicy) Options {
	opts := smallOptions()
	opts.Dir = dir
	opts.ArenaSize = 16 << 20
	opts.Sync = sync
	return opts
}

// crashChild runs in a child process: it commits unique values under load
// and prints "ack KEY VALUE" after each acknowledgement, until killed.
func crashChild() {
	t := &childT{}
	sync, err := ParseSyncPolicy(os.Getenv(crashSyncEnv))
	if err != nil {
		t.Fatal(err)
	}
	opts := crashOptions(os.Getenv(crashChildEnv), sync)
	sv := newServer(t, opts)
	waitArenas(t, sv.s, opts.ArenaCount)
	c := newClient(t, sv)
	w := c.newWriter()
	out := bufio.NewWriter(os.Stdout)
	fmt.Fprintln(out, "ready")
	out.Flush()
	for i := 0; ; i++ {
		k := fmt.Appendf(nil, "%s-%d", os.Getenv("RKV_CRASH_ROUND"), i)
		v := fmt.Appendf(nil, "value-%d-%d", i, rand.Uint64())
		if w.off+256 > w.lease.Size {
			w = c.newWriter()
		}
		if _, err := w.put(k, v); err != nil {
			fmt.Fprintln(os.Stderr, "commit:", err)
			os.Exit(3)
		}
		fmt.Fprintf(out, "ack %s %s\n", k, v)
		out.Flush()
	}
}

// childT lets the test fixtures run outside a test: any failure exits.
type childT struct{ testing.TB }

func (*childT) Helper()                      {}
func (*childT) Cleanup(func())               {}
func (*childT) TempDir() string              { return os.TempDir() }
func (*childT) Fatal(args ...any)            { fmt.Fprintln(os.Stderr, args...); os.Exit(2) }
func (*childT) Fatalf(f string, args ...any) { fmt.Fprintf(os.Stderr, f+"\n", args...); os.Exit(2) }
func (*childT) Errorf(f string, args ...any) { fmt.Fprintf(os.Stderr, f+"\n", args...) }

// A child process committing under load is killed with SIGKILL at random
// points; after every restart each acknowledged key reads back its value.
// Under SyncNone too: nothing is synced, but a commit reaches the kernel
// before it is acknowledged (before flushOnlyWAL, every run lost some of the
// last acknowledged keys).
func TestAcknowledgedWritesSurviveKill9(t *testing.T) {
	for _, sync := range []SyncPolicy{SyncAlways, SyncNone} {
		t.Run(sync.String(), func(t *testing.T) { testSurviveKill9(t, sync) })
	}
}

func testSurviveKill9(t *testing.T, sync SyncPolicy) {
	dir := t.TempDir()
	acked := map[string]string{}
	rounds := 4
	if testing.Short() {
		rounds = 2
	}
	for round := range rounds {
		n := 0
		runKilledChild(t, round, []string{crashChildEnv + "=" + dir, crashSyncEnv + "=" + sync.String()}, func(f []string) {
			if len(f) == 3 && f[0] == "ack" {
				acked[f[1]] = f[2]
				n++
			}
		})
		t.Logf("round %d: killed after %d acknowledged commits", round, n)
		if n == 0 {
			t.Fatalf("round %d: no commit acknowledged before the kill", round)
		}
	}

	opts := crashOptions(dir, sync)
	sv := newServer(t, opts)
	waitArenas(t, sv.s, opts.ArenaCount)
	if sync == SyncNone && sv.s.logReplayed == 0 {
		t.Errorf("the start after the last kill replayed nothing of the index log: the commits did not go through it")
	}
	c := newClient(t, sv)
	for k, v := range acked {
		got, ok := c.mustGet([]byte(k))
		if !ok || string(got) != v {
			t.Fatalf("acknowledged %s=%s reads %q (found %v) after kill -9", k, v, got, ok)
		}
	}
	// Nothing that was not committed is visible: every key present is one
	// the child wrote, with the value it wrote.
	entries, err := sv.s.Scan(nil, nil, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		v, err := sv.s.Get(e.Key)
		if err != nil || !bytes.HasPrefix(v, []byte("value-")) {
			t.Fatalf("key %s after crashes: %q, %v", e.Key, v, err)
		}
	}
	t.Logf("%d acknowledged keys all read back; %d keys in the store", len(acked), len(entries))
}

// runKilledChild runs this test binary as a child with env added, waits for
// its "ready" line, SIGKILLs it 100-500 ms after its first "ack" line (so
// that a slow machine still kills it with work acknowledged and more in
// flight) and hands each line it printed before it died to line, split
// into fields. It fails the test if the child did not start or ended by
// itself.
func runKilledChild(t *testing.T, round int, env []string, line func(fields []string)) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), env...), fmt.Sprintf("RKV_CRASH_ROUND=%d", round))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() || lines.Text() != "ready" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("round %d: child did not start: %s", round, stderr.String())
	}
	kill := func() { _ = cmd.Process.Signal(syscall.SIGKILL) }
	defer time.AfterFunc(30*time.Second, kill).Stop() // a child that never acknowledges
	armed := false
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		if !armed && len(f) > 0 && f[0] == "ack" {
			armed = true
			time.AfterFunc(time.Duration(100+rand.IntN(400))*time.Millisecond, kill)
		}
		line(f)
	}
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
		t.Fatalf("round %d: child ended by itself (%v): %s", round, err, stderr.String())
	}
}
