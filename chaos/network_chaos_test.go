//go:build chaos

// Where the servers run: loopback, or one network namespace each (faults on the network).

package chaos

import (
	"errors"
	"os/exec"
	"time"
)

// network is where the servers run and what faults it can inject.
type network interface {
	// name is "loopback" or "netns".
	name() string
	// serverIP is server i's address; clientIP is what clients bind.
	serverIP(i int) string
	clientIP() string
	// sharedPorts reports that every server shares one IP, so each
	// needs ports of its own.
	sharedPorts() bool
	// command runs a server program on server i's network.
	command(i int, path string, args ...string) *exec.Cmd
	// isolate cuts server i off from everyone (servers and clients);
	// heal undoes it.
	isolate(i int) error
	heal(i int) error
	// slow adds delay (with jitter) and loss to every packet server i
	// sends or receives; unslow undoes it.
	slow(i int, delay, jitter time.Duration, lossPercent float64) error
	unslow(i int) error
	// faultKinds is the network faults it can inject.
	faultKinds() []string
	// close removes what the network created.
	close() error
}

// errNoNetFaults is what loopback answers to network faults.
var errNoNetFaults = errors.New("network faults need netns mode")

// loopback runs every server on 127.0.0.1 in the test's namespace.
type loopback struct{}

func (loopback) name() string                                          { return "loopback" }
func (loopback) serverIP(int) string                                   { return "127.0.0.1" }
func (loopback) clientIP() string                                      { return "127.0.0.1" }
func (loopback) sharedPorts() bool                                     { return true }
func (loopback) isolate(int) error                                     { return errNoNetFaults }
func (loopback) heal(int) error                                        { return nil }
func (loopback) unslow(int) error                                      { return nil }
func (loopback) close() error                                          { return nil }
func (loopback) faultKinds() []string                                  { return nil }
func (loopback) slow(int, time.Duration, time.Duration, float64) error { return errNoNetFaults }
func (loopback) command(_ int, path string, args ...string) *exec.Cmd {
	return exec.Command(path, args...)
}
