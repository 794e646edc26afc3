package e2e

import (
	"encoding/json"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A primary killed with SIGKILL is seen by the map's leader through its
// process watch (the session it held to the process ends, and its address
// refuses connections), before gossip's suspicion would end: the leader's
// log says so (process_gone=true), and the keys, written again right
// after the kill, are all written and read back.
func TestKilledPrimaryFailsOverOnTheLeadersWatch(t *testing.T) {
	c := newCluster(t, 3, smallStore)
	c.nodes[0].args = []string{"--replicas", "3"}
	for i, n := range c.nodes {
		c.start(n, i > 0)
	}
	// members waits for the map to settle too: 2,048 replicas copied.
	c.must("--timeout", "120s", "members", "--expect-servers", "3", "--expect-arenas", "2")
	var r struct {
		Target          int `json:"target"`
		UnderReplicated int `json:"under_replicated"`
	}
	if err := json.Unmarshal([]byte(c.must("-o", "json", "replicas")), &r); err != nil || r.Target != 3 || r.UnderReplicated != 0 {
		t.Fatalf("replicas settled: %+v, %v", r, err)
	}
	bench := []string{"--timeout", "30s", "bench", "--keys", "200", "--ops", "200", "--distribution", "uniform", "--verify", "--prefix", "failover/", "--quiet"}
	c.must(bench...)

	victim := c.nodes[2]
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	<-victim.done
	out := c.must(bench...) // every key written again (a third of them through a failover), then read
	t.Logf("from the kill to every key written again and read back: %v\n%s", time.Since(killed).Round(time.Millisecond), out)

	var line string
	for _, n := range c.nodes[:2] {
		b, _ := os.ReadFile(n.log)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, `msg="primary down: its shards failed over to their backups"`) && strings.Contains(l, "server="+victim.name) {
				line = l
			}
		}
	}
	if !strings.Contains(line, "process_gone=true") {
		t.Fatalf("the leader's failover of %s: %q, want one with process_gone=true", victim.name, line)
	}
	t.Log(line)
}
