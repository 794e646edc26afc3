package membership

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/testlog"
	"github.com/rkv-io/rkv/proto"
)

// capture gives a node a logger that records everything, DEBUG included,
// in buf.
func capture(buf *testlog.Buffer) nodeOpt {
	return func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
}

// logLine returns the first line of buf at level with message msg and
// every one of attrs ("key=value"), or an error listing what buf has with
// that message.
func logLine(buf *testlog.Buffer, level slog.Level, msg string, attrs ...string) (string, error) {
	head := fmt.Sprintf("level=%s msg=%q ", level, msg)
	if !strings.ContainsAny(msg, " =\"") {
		head = fmt.Sprintf("level=%s msg=%s ", level, msg)
	}
	var near []string
	for _, l := range strings.Split(buf.String(), "\n") {
		if !strings.Contains(l, fmt.Sprintf("msg=%q", msg)) && !strings.Contains(l, "msg="+msg+" ") {
			continue
		}
		near = append(near, l)
		if !strings.Contains(l, head) {
			continue
		}
		ok := true
		for _, a := range attrs {
			ok = ok && strings.Contains(l, " "+a)
		}
		if ok {
			return l, nil
		}
	}
	return "", fmt.Errorf("no %s line %q with %v; lines with that message:\n%s", level, msg, attrs, strings.Join(near, "\n"))
}

// TestMembershipChangesLogged: a server logs at INFO each member that
// joins, leaves, dies, or restarts (with its old and new generations); a
// client logs the same at DEBUG only.
func TestMembershipChangesLogged(t *testing.T) {
	var sbuf, cbuf testlog.Buffer
	s1 := start(t, "s1", proto.RoleServer, serverMeta(1, 1), longMemory, capture(&sbuf))
	s2 := start(t, "s2", proto.RoleServer, serverMeta(2, 1), longMemory, withSeeds(s1))
	s3 := start(t, "s3", proto.RoleServer, serverMeta(3, 1), longMemory, withSeeds(s1))
	obs := start(t, "obs", proto.RoleClient, proto.NodeMeta{}, longMemory, withSeeds(s1), capture(&cbuf))
	c1 := start(t, "c1", proto.RoleClient, proto.NodeMeta{}, longMemory, withSeeds(s1))

	expect := func(what string, level slog.Level, buf *testlog.Buffer, msg string, attrs ...string) {
		t.Helper()
		var line string
		waitFor(t, 10*time.Second, what, func() (err error) {
			line, err = logLine(buf, level, msg, attrs...)
			return err
		})
		t.Logf("%s: %s", what, line)
	}
	both := func(what, msg string, attrs ...string) {
		t.Helper()
		expect("server: "+what, slog.LevelInfo, &sbuf, msg, append([]string{"node=s1"}, attrs...)...)
		expect("client: "+what, slog.LevelDebug, &cbuf, msg, append([]string{"node=obs"}, attrs...)...)
	}
	both("s2 joined", "member joined", "member=s2", "role=server", "addr="+s2.LocalNode().Addr.String(), "generation=102", "control=127.0.0.1:7402")
	both("c1 joined", "member joined", "member=c1", "role=client")

	if err := closeClient(t, c1); err != nil {
		t.Fatal(err)
	}
	// c1 leaves through the servers; another client learns it by gossip,
	// and, should that miss, by failure detection.
	expect("server: c1 left", slog.LevelInfo, &sbuf, "member left", "node=s1", "member=c1", "role=client")
	var line string
	waitFor(t, 10*time.Second, "client: c1 gone", func() error {
		l, err := logLine(&cbuf, slog.LevelDebug, "member left", "node=obs", "member=c1", "role=client")
		if err != nil {
			l, err = logLine(&cbuf, slog.LevelDebug, "member dead", "node=obs", "member=c1", "role=client")
		}
		line = l
		return err
	})
	t.Logf("client: c1 gone: %s", line)
	expect("c1 reaped", slog.LevelDebug, &sbuf, "member reaped", "member=c1", "state=left")

	if err := s3.Shutdown(); err != nil {
		t.Fatal(err)
	}
	both("s3 dead", "member dead", "member=s3", "role=server")

	port := s2.LocalNode().Addr.Port()
	if err := s2.Shutdown(); err != nil {
		t.Fatal(err)
	}
	meta := serverMeta(2, 1)
	meta.Generation, meta.ControlAddr = 1102, "127.0.0.1:6999"
	cfg := testConfig("s2", proto.RoleServer, meta, longMemory, withSeeds(s1))
	cfg.BindPort = int(port)
	again, err := Create(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = again.Shutdown() })
	both("s2 restarted", "member restarted", "member=s2", "role=server", "old_generation=102", "new_generation=1102",
		"old_control=127.0.0.1:7402", "new_control=127.0.0.1:6999")

	// A client logs nothing of this at INFO, a server nothing at DEBUG.
	for _, msg := range []string{"member joined", "member left", "member dead", "member restarted"} {
		if l, err := logLine(&cbuf, slog.LevelInfo, msg); err == nil {
			t.Errorf("client logged at INFO: %s", l)
		}
		if l, err := logLine(&sbuf, slog.LevelDebug, msg); err == nil {
			t.Errorf("server logged at DEBUG: %s", l)
		}
	}
	if l, err := logLine(&sbuf, slog.LevelInfo, "member joined", "member=s1"); err == nil {
		t.Errorf("a server logs its own join: %s", l)
	}
	_ = obs
}
