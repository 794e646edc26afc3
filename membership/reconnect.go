// Reconnecting: state exchanges with the servers this node holds dead, so that a healed partition heals the view too.

package membership

import (
	"math/rand/v2"
	"time"
)

// DefaultReconnectInterval is Tuning.ReconnectInterval's default.
const DefaultReconnectInterval = 5 * time.Second

// reconnect exchanges state with up to maxSyncTargets of the servers this
// node holds dead (not left), and with its seeds when it sees no other
// server alive, in the background. memberlist probes and gossips only to
// members it holds alive (and to the dead for GossipToTheDeadTime), so
// after a longer partition two sides that hold each other dead would
// never talk again; an exchange with a dead member that answers makes it
// refute its death, and it is alive again on both sides within a round or
// two. A dead server that is really down fails the exchange at once
// (connection refused) or after Tuning.TCPTimeout.
func (m *Membership) reconnect() {
	if !m.reconnecting.CompareAndSwap(false, true) {
		return // the last round is still running
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.reconnecting.Store(false)
		return
	}
	var dead []string
	aliveServers := 0
	for name, mb := range m.members {
		switch {
		case name == m.name || !mb.IsServer():
		case mb.State == StateAlive:
			aliveServers++
		case mb.State == StateDead:
			dead = append(dead, mb.Addr.String())
		}
	}
	rand.Shuffle(len(dead), func(i, j int) { dead[i], dead[j] = dead[j], dead[i] })
	targets := dead[:min(len(dead), maxSyncTargets)]
	if aliveServers == 0 {
		targets = append(targets, m.s.Seeds...)
	}
	if len(targets) == 0 {
		m.mu.Unlock()
		m.reconnecting.Store(false)
		return
	}
	m.syncs.Add(1)
	m.mu.Unlock()
	go func() {
		defer m.syncs.Done()
		defer m.reconnecting.Store(false)
		for _, addr := range targets {
			select {
			case <-m.stop:
				return
			default:
			}
			if n, err := m.ml.Join([]string{addr}); err != nil || n == 0 {
				m.s.Logger.Debug("reconnecting", "to", addr, "err", err)
			} else {
				m.s.Logger.Info("reconnected to a member held dead", "addr", addr)
			}
		}
	}()
}
