package chaos

import (
	"testing"

	"go.uber.org/goleak"
)

// memberlist's Shutdown does not wait for a probe in flight: probeNode
// waits out its ack timeout and the indirect probes (a second or two at
// the LAN profile) and then returns. The chaos clients gossip until their
// last moment, so one such probe may still be running at exit (CI saw it
// once, every scenario otherwise passing).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}
