// A signal to rkv-client: the command unwinds through client.Close, which
// leaves the cluster. The test binary runs itself as rkv-client.
package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
)

// asCLI, set in a child's environment, makes the test binary run main.
const asCLI = "RKV_CLIENT_TEST_AS_CLI"

func TestMain(m *testing.M) {
	if os.Getenv(asCLI) == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

// TestSignalLeaves: SIGINT (Ctrl-C) or SIGTERM during a command makes
// rkv-client leave the cluster before it exits (exit 4, "interrupted"):
// the server records the client as having left, not as dead, at once.
func TestSignalLeaves(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and runs rkv-client processes")
	}
	srv := startServer(t, nil, nil)
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			events, cancel := srv.Membership().Subscribe()
			defer cancel()
			// members waits for servers that never come: a command
			// still running when the signal arrives.
			cmd := exec.Command(os.Args[0], "--timeout", "20s", "members", "--expect-servers", "5")
			cmd.Env = append(os.Environ(), asCLI+"=1", "RKV_JOIN="+srv.GossipAddr())
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			exited := false
			defer func() {
				if !exited {
					_ = cmd.Process.Kill()
					<-done
				}
			}()

			// Once the server sees the client, signal it.
			ctx, stop := context.WithTimeout(context.Background(), 15*time.Second)
			defer stop()
			var name string
			for name == "" {
				select {
				case ev := <-events:
					if ev.Kind == membership.EventJoin && ev.Member.Meta.Role == proto.RoleClient {
						name = ev.Member.Name
					}
				case <-ctx.Done():
					t.Fatalf("the server never saw the client join; stderr:\n%s", stderr.String())
				}
			}
			time.Sleep(200 * time.Millisecond) // into the wait of members --expect-servers
			sent := time.Now()
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}

			var gone membership.EventKind
			for gone == 0 {
				select {
				case ev := <-events:
					if ev.Member.Name == name && (ev.Kind == membership.EventLeave || ev.Kind == membership.EventFail) {
						gone = ev.Kind
					}
				case <-ctx.Done():
					t.Fatalf("%s still in the server's view 15s after %v", name, sig)
				}
			}
			took := time.Since(sent)
			if gone != membership.EventLeave {
				t.Errorf("after %v the server saw %s go as %v after %v, want it to leave", sig, name, gone, took)
			}
			if took > 2*time.Second {
				t.Errorf("the server saw %s go %v after %v, want it within 2s", name, took, sig)
			}
			var err error
			select {
			case err = <-done:
				exited = true
			case <-time.After(10 * time.Second):
				t.Fatalf("rkv-client still running 10s after %v", sig)
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != exitOther || !strings.Contains(stderr.String(), "interrupted") {
				t.Errorf("after %v: %v, stderr %q; want exit %d saying it was interrupted", sig, err, stderr.String(), exitOther)
			}
			t.Logf("%v: %s left the server's view %v after the signal; rkv-client: %s", sig, name, took.Round(time.Millisecond),
				strings.TrimSpace(stderr.String()))
		})
	}
}
