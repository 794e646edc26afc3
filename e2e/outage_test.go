// A server down (killed, stopped, shut down) through the eyes of fresh rkv-client processes: unavailable, never "not found", nothing placed elsewhere.

package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestOutageIsUnavailableNeverNotFound is the outage of issue 11, case 1:
// before the cluster map, a fresh client placed a dead server's keys on a
// survivor after a few seconds, answered "key not found" for them,
// accepted puts of them there, and the server's return brought the old
// values back. Now, for the whole outage (SIGKILL then a restart, SIGSTOP
// then SIGCONT, SIGTERM then a restart), every fresh rkv-client process
// gets exit 3 (unavailable) for a get, a put and a scan that need the
// server, and after it every key reads back its value, once in a scan.
func TestOutageIsUnavailableNeverNotFound(t *testing.T) {
	c := startCluster(t, 3)
	const nkeys = 30
	vals := map[string]string{}
	for i := range nkeys {
		k, v := fmt.Sprintf("key-%02d", i), fmt.Sprintf("value %d", i)
		c.must("put", k, v)
		vals[k] = v
	}
	victim := c.nodes[1]
	var onVictim []string
	for k := range vals {
		var o struct {
			Owner string `json:"owner"`
		}
		if err := json.Unmarshal([]byte(c.must("owner", k, "-o", "json")), &o); err != nil {
			t.Fatal(err)
		}
		if o.Owner == victim.name {
			onVictim = append(onVictim, k)
		}
	}
	if len(onVictim) < 2 {
		t.Fatalf("%d of %d keys on %s: the test needs two", len(onVictim), nkeys, victim.name)
	}
	getKey, putKey := onVictim[0], onVictim[1]

	for _, fault := range []struct {
		name         string
		inject, heal func()
	}{
		{"SIGKILL, then a restart", func() {
			_ = victim.cmd.Process.Signal(syscall.SIGKILL)
			<-victim.done
		}, func() { c.start(victim, true) }},
		{"SIGSTOP, then SIGCONT", func() { _ = victim.cmd.Process.Signal(syscall.SIGSTOP) },
			func() { _ = victim.cmd.Process.Signal(syscall.SIGCONT) }},
		{"SIGTERM, then a restart", func() {
			_ = victim.cmd.Process.Signal(syscall.SIGTERM)
			if err := <-victim.done; err != nil {
				t.Fatalf("%s after SIGTERM: %v", victim.name, err)
			}
		}, func() { c.start(victim, true) }},
	} {
		t.Run(fault.name, func(t *testing.T) {
			fault.inject()
			start := time.Now()
			var gets, puts, scans int
			for time.Since(start) < 5*time.Second {
				if out, errs, code := c.run("", "get", getKey); code != exitUnavailable || !strings.Contains(errs, victim.name) {
					t.Fatalf("%v into the outage: get %s (on %s): exit %d, stdout %q, stderr %q; want exit 3 naming the server",
						time.Since(start).Round(time.Millisecond), getKey, victim.name, code, out, errs)
				}
				gets++
				if out, errs, code := c.run("", "put", putKey, "written during the outage"); code != exitUnavailable {
					t.Fatalf("%v into the outage: put %s (on %s): exit %d, stdout %q, stderr %q; want exit 3: it must not land elsewhere",
						time.Since(start).Round(time.Millisecond), putKey, victim.name, code, out, errs)
				}
				puts++
				if gets%3 == 0 {
					if out, errs, code := c.run("", "scan", "--prefix", "key-"); code != exitUnavailable {
						t.Fatalf("%v into the outage: scan: exit %d, stdout %q, stderr %q; want exit 3, not a listing without %s's keys",
							time.Since(start).Round(time.Millisecond), code, out, errs, victim.name)
					}
					scans++
				}
			}
			t.Logf("%v of outage: %d gets, %d puts and %d scans from fresh processes, each unavailable", time.Since(start).Round(time.Millisecond), gets, puts, scans)
			fault.heal()
			c.waitConverged()
			for k, v := range vals {
				deadline := time.Now().Add(15 * time.Second)
				for {
					out, errs, code := c.run("", "get", k)
					if code == 0 && out == v {
						break
					}
					if code != exitUnavailable || time.Now().After(deadline) {
						t.Fatalf("get %s after the outage: exit %d, %q (want %q), %s", k, code, out, v, errs)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			var scanned []struct {
				Key   string `json:"key"`
				Value string `json:"value"`
			}
			if err := json.Unmarshal([]byte(c.must("scan", "--prefix", "key-", "--values", "-o", "json")), &scanned); err != nil {
				t.Fatal(err)
			}
			if len(scanned) != nkeys {
				t.Fatalf("scan after the outage: %d keys, want %d (each once)", len(scanned), nkeys)
			}
			for _, kv := range scanned {
				if vals[kv.Key] != kv.Value {
					t.Fatalf("scan after the outage: %s = %q, want %q", kv.Key, kv.Value, vals[kv.Key])
				}
			}
		})
	}
}
