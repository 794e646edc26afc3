//go:build chaos

// netns mode: each server in its own network namespace, joined by veth pairs to a bridge.

package chaos

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// chooseNetwork picks the network CHAOS_NET asks for. With "auto" it uses
// netns when it can and otherwise says loudly why not: the returned note
// goes into the summary.
func chooseNetwork(t *testing.T, cfg runConfig) (network, string) {
	if cfg.net == "loopback" {
		note := "CHAOS_NET=loopback: partitions and netem are NOT tested"
		t.Log("WARNING: " + note)
		return loopback{}, note
	}
	nw, err := newNetns()
	if err != nil {
		if cfg.net == "netns" {
			t.Fatalf("CHAOS_NET=netns: %v", err)
		}
		note := fmt.Sprintf("netns mode unavailable (%v): partitions and netem are NOT tested, loopback only", err)
		t.Log("WARNING: " + note)
		return loopback{}, note
	}
	note := ""
	if nw.netemErr != nil {
		note = fmt.Sprintf("tc netem unavailable (%v): delay and loss are NOT tested", nw.netemErr)
		t.Log("WARNING: " + note)
	}
	t.Logf("netns mode: bridge %s %s.254, servers in namespaces %s", nw.bridge, nw.subnet, strings.Join(nw.ns, " "))
	return nw, note
}

// netns puts server i in namespace ns[i] at subnet.(i+1), its veth peer
// host[i] on a bridge that holds subnet.254, the clients' address.
type netns struct {
	bridge   string
	subnet   string // the first three octets
	ns, host []string
	peer     []string // each veth's end in the namespace
	netemErr error    // why netem is unavailable, if it is
}

const netnsServers = 3

// run runs a command and returns its error with its output.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func newNetns() (_ *netns, err error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("not running as root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, errors.New("no ip command (apt-get install iproute2)")
	}
	pid := os.Getpid() % 100000
	prefix := fmt.Sprintf("rkc%d", pid) // interface names stay under 16 bytes
	nw := &netns{bridge: prefix + "br", subnet: fmt.Sprintf("10.213.%d", pid%250)}
	defer func() {
		if err != nil {
			_ = nw.close()
		}
	}()
	steps := [][]string{
		{"ip", "link", "add", nw.bridge, "type", "bridge"},
		{"ip", "addr", "add", nw.subnet + ".254/24", "dev", nw.bridge},
		{"ip", "link", "set", nw.bridge, "up"},
	}
	for _, s := range steps {
		if err := run(s[0], s[1:]...); err != nil {
			return nil, err
		}
	}
	for i := range netnsServers {
		ns, host, peer := fmt.Sprintf("%sn%d", prefix, i+1), fmt.Sprintf("%sh%d", prefix, i+1), fmt.Sprintf("%sp%d", prefix, i+1)
		if err := run("ip", "netns", "add", ns); err != nil {
			return nil, err
		}
		nw.ns = append(nw.ns, ns)
		if err := run("ip", "link", "add", host, "type", "veth", "peer", "name", peer, "netns", ns); err != nil {
			return nil, err
		}
		nw.host, nw.peer = append(nw.host, host), append(nw.peer, peer)
		for _, s := range [][]string{
			{"ip", "link", "set", host, "master", nw.bridge, "up"},
			{"ip", "-n", ns, "addr", "add", fmt.Sprintf("%s.%d/24", nw.subnet, i+1), "dev", peer},
			{"ip", "-n", ns, "link", "set", peer, "up"},
			{"ip", "-n", ns, "link", "set", "lo", "up"},
		} {
			if err := run(s[0], s[1:]...); err != nil {
				return nil, err
			}
		}
	}
	// With STP off a bridge port forwards at once; ping, when there is
	// one, proves it before any server depends on it.
	if _, err := exec.LookPath("ping"); err == nil {
		deadline := time.Now().Add(10 * time.Second)
		for i := range netnsServers {
			for {
				err := run("ip", "netns", "exec", nw.ns[i], "ping", "-c", "1", "-W", "1", nw.subnet+".254")
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					return nil, fmt.Errorf("namespace %s cannot reach the bridge: %w", nw.ns[i], err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	if _, err := exec.LookPath("tc"); err != nil {
		nw.netemErr = errors.New("no tc command (apt-get install iproute2)")
	} else if err := nw.slow(0, time.Millisecond, 0, 0); err != nil {
		nw.netemErr = err
	} else if err := nw.unslow(0); err != nil {
		nw.netemErr = err
	}
	return nw, nil
}

func (nw *netns) name() string          { return "netns" }
func (nw *netns) serverIP(i int) string { return fmt.Sprintf("%s.%d", nw.subnet, i+1) }
func (nw *netns) clientIP() string      { return nw.subnet + ".254" }
func (nw *netns) sharedPorts() bool     { return false }

func (nw *netns) faultKinds() []string {
	if nw.netemErr != nil {
		return []string{faultPartition}
	}
	return []string{faultPartition, faultNetem}
}

func (nw *netns) command(i int, path string, args ...string) *exec.Cmd {
	// ip netns exec execs the program itself (no fork): signals to the
	// process reach the server.
	return exec.Command("ip", append([]string{"netns", "exec", nw.ns[i], path}, args...)...)
}

// isolate takes the server's bridge port down: packets to and from it are
// dropped silently, so its TCP connections hang rather than reset.
func (nw *netns) isolate(i int) error { return run("ip", "link", "set", nw.host[i], "down") }

func (nw *netns) heal(i int) error { return run("ip", "link", "set", nw.host[i], "up") }

// slow installs netem on both ends of the server's veth pair.
func (nw *netns) slow(i int, delay, jitter time.Duration, lossPercent float64) error {
	if nw.netemErr != nil {
		return nw.netemErr
	}
	args := []string{"qdisc", "replace", "dev", "", "root", "netem",
		"delay", fmt.Sprintf("%dus", delay.Microseconds()), fmt.Sprintf("%dus", jitter.Microseconds()),
		"loss", fmt.Sprintf("%.1f%%", lossPercent)}
	args[3] = nw.host[i]
	if err := run("tc", args...); err != nil {
		return err
	}
	args[3] = nw.peer[i]
	return run("ip", append([]string{"netns", "exec", nw.ns[i], "tc"}, args...)...)
}

func (nw *netns) unslow(i int) error {
	if nw.netemErr != nil {
		return nil
	}
	var errs []error
	for _, cmd := range [][]string{
		{"tc", "qdisc", "del", "dev", nw.host[i], "root"},
		{"ip", "netns", "exec", nw.ns[i], "tc", "qdisc", "del", "dev", nw.peer[i], "root"},
	} {
		// Deleting the default qdisc fails harmlessly when none was added.
		if err := run(cmd[0], cmd[1:]...); err != nil && !strings.Contains(err.Error(), "Cannot delete qdisc with handle of zero") &&
			!strings.Contains(err.Error(), "No such file or directory") {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// close deletes the namespaces (their veth pairs go with them) and the
// bridge.
func (nw *netns) close() error {
	var errs []error
	for _, ns := range nw.ns {
		errs = append(errs, run("ip", "netns", "del", ns))
	}
	if err := run("ip", "link", "del", nw.bridge); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
		errs = append(errs, err)
	}
	nw.ns = nil
	return errors.Join(errs...)
}
