//go:build chaos

// netns mode: each server in its own network namespace, joined by veth pairs to a bridge.

package chaos

import "testing"

// chooseNetwork picks the network per CHAOS_NET and says why netns is not
// used when it is not.
func chooseNetwork(t *testing.T, cfg runConfig) (network, string) {
	note := "netns mode is not built yet: partitions and netem are NOT tested"
	if cfg.net == "netns" {
		t.Fatal(note)
	}
	t.Log("WARNING: " + note)
	return loopback{}, note
}
