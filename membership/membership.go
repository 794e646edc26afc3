package membership

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/rkv-io/rkv/proto"
)

var (
	// ErrClosed is returned by the methods of a Membership after Shutdown.
	ErrClosed = errors.New("membership: shut down")
	// ErrLeft is returned by SetMeta and Join after Leave.
	ErrLeft = errors.New("membership: left the cluster")
	// ErrNotEncrypted is returned by the key methods of a node created
	// without a SecretKey.
	ErrNotEncrypted = errors.New("membership: gossip is not encrypted (no Config.SecretKey)")
)

// Membership is this node's membership of the cluster: its gossip, its
// view of the others, and its own metadata. Its methods are safe for
// concurrent use.
type Membership struct {
	s    *settings
	name string
	ml   *memberlist.Memberlist
	warn string

	setMu sync.Mutex // serializes SetMeta and Leave: metadata and incarnation go up together

	// mu guards what follows. It is a leaf lock: memberlist calls the
	// delegates while holding its own lock, so nothing here calls
	// memberlist while holding mu.
	mu         sync.Mutex
	closed     bool
	left       bool
	creating   bool                          // Create has not returned: a name conflict fails it
	nameErr    error                         // the name conflict Create fails with
	local      proto.NodeMeta                // as given, full arena list
	localRaw   []byte                        // as gossiped, at most memberlist.MetaMaxSize bytes
	localTable *proto.ArenaTable             // the arena list, when it does not fit in localRaw
	members    map[string]*Member            // every member memberlist told us about, self included
	raw        map[string][]byte             // each member's metadata as last decoded
	pending    map[string][]proto.ArenaTable // tables matching no metadata yet, newest first
	version    uint64
	subs       map[*subscriber]struct{}
	pushAll    bool                // push localTable to every alive member
	pushTo     map[string]struct{} // push localTable to these (members that joined)

	view         atomic.Pointer[View]
	pushDisabled atomic.Bool // tests: leave arena lists to push/pull
	staleSelf    atomic.Bool // a join showed a record of this node other than its current one
	reconnecting atomic.Bool // a reconnect round is running

	syncs sync.WaitGroup // exchanges syncServers and Refresh started; Add under mu, while not closed

	refreshed map[string]refresh // Refresh's last exchange with each member; under mu

	wake chan struct{} // cap 1: pushes queued
	stop chan struct{}
	done chan struct{}
}

// Create is CreateContext with a context that is never done.
func Create(cfg Config) (*Membership, error) { return CreateContext(context.Background(), cfg) }

// CreateContext starts gossip on the configured address, with this node
// as the only member, then joins Config.Seeds if any: it fails if none
// answers within Config.JoinTimeout (one attempt by default) or before ctx
// is done. It fails if the cluster has a live member of the same name at
// another address (memberlist refuses the newcomer; the members log it at
// ERROR). Without a gossip key it logs a warning (see Warning).
func CreateContext(ctx context.Context, cfg Config) (*Membership, error) {
	s, err := cfg.settings()
	if err != nil {
		return nil, err
	}
	raw, table, err := encodeLocal(s.Name, s.Meta)
	if err != nil {
		return nil, err
	}
	m := &Membership{
		s:          s,
		name:       s.Name,
		local:      cloneMeta(s.Meta),
		localRaw:   raw,
		localTable: table,
		members:    map[string]*Member{},
		raw:        map[string][]byte{},
		pending:    map[string][]proto.ArenaTable{},
		subs:       map[*subscriber]struct{}{},
		pushTo:     map[string]struct{}{},
		refreshed:  map[string]refresh{},
		creating:   true,
		wake:       make(chan struct{}, 1),
		stop:       make(chan struct{}),
		done:       make(chan struct{}),
	}
	m.view.Store(newView(0, nil))
	if s.keyring == nil {
		m.warn = "gossip is not encrypted: node metadata, including the rkeys that let any host on the network RDMA_READ server memory, travels in clear text; set " + s.SecretKeySetting
	}
	d := &delegate{m}
	s.ml.Delegate, s.ml.Events, s.ml.Merge, s.ml.Conflict = d, d, d, d
	// memberlist calls the delegates from here on, before it returns.
	ml, err := memberlist.Create(s.ml)
	if err != nil {
		return nil, fmt.Errorf("membership: starting gossip on %s:%d: %w", s.BindAddr, s.BindPort, err)
	}
	m.ml = ml
	go m.run()
	if m.warn != "" {
		s.Logger.Warn(m.warn)
	}
	if len(s.Seeds) > 0 {
		if err := m.joinRetrying(ctx, s.Seeds, s.JoinTimeout); err != nil {
			_ = m.Shutdown()
			return nil, err
		}
	}
	m.mu.Lock()
	m.creating = false
	nameErr := m.nameErr
	m.mu.Unlock()
	if nameErr != nil {
		// Without Leave: its leave message would be about the name,
		// and could make others take the live member for gone.
		_ = m.Shutdown()
		return nil, nameErr
	}
	return m, nil
}

// Join contacts the seeds ("host:port"), exchanging full state with each
// that answers, and returns how many answered; it fails only if none did.
// It blocks for up to Tuning.TCPTimeout per seed. A server, and a node
// whose join showed the cluster still holding a previous incarnation of
// it (a restart), then exchanges state with the alive servers until they
// hold its current incarnation (see settle), for up to Tuning.TCPTimeout
// more per round.
func (m *Membership) Join(seeds []string) (int, error) {
	if err := m.usable(); err != nil {
		return 0, err
	}
	m.staleSelf.Store(false)
	n, err := m.ml.Join(seeds)
	if err != nil {
		return n, fmt.Errorf("membership: joining through %v: %w", seeds, err)
	}
	m.mu.Lock()
	refused := m.nameErr != nil
	m.mu.Unlock()
	if !refused {
		m.settle()
	}
	return n, nil
}

// joinRetrying joins through seeds, retrying with backoff while none
// answers, for up to timeout (0: once) and while ctx is not done.
func (m *Membership) joinRetrying(ctx context.Context, seeds []string, timeout time.Duration) error {
	const first, most = 100 * time.Millisecond, 2 * time.Second
	deadline := time.Now().Add(timeout)
	wait := first
	for attempt := 1; ; attempt++ {
		_, err := m.Join(seeds)
		if err == nil {
			if attempt > 1 {
				m.s.Logger.Info("joined the cluster", "seeds", seeds, "attempts", attempt)
			}
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 || errors.Is(err, ErrLeft) || errors.Is(err, ErrClosed) {
			if attempt > 1 {
				return fmt.Errorf("%w (%d attempts in %v)", err, attempt, timeout)
			}
			return err
		}
		wait = min(wait, left)
		m.s.Logger.Info("no seed answered: retrying", "seeds", seeds, "attempt", attempt, "retry_in", wait, "err", err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("membership: joining through %v: %w (after %d attempts: %w)", seeds, ctx.Err(), attempt, err)
		case <-t.C:
		}
		wait = min(2*wait, most)
	}
}

func (m *Membership) usable() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.usableLocked()
}

// SetMeta replaces this node's metadata and announces it. A server calls
// it whenever its metadata changes, e.g. each time another arena finishes
// its registration. meta.Role must be the configured role and
// meta.Leaving false. SetMeta returns once the local view holds the new
// metadata and its announcement is queued for gossip; other nodes see it
// within a few gossip intervals (EventUpdate there). An arena list too
// large for the 512-byte metadata is sent to every member directly, and
// in push/pull state. SetMeta copies meta: the caller may reuse its
// slices.
func (m *Membership) SetMeta(meta proto.NodeMeta) error {
	if meta.Role != m.s.Role {
		return fmt.Errorf("membership: metadata of role %v on a %v", meta.Role, m.s.Role)
	}
	if meta.Leaving {
		return errors.New("membership: NodeMeta.Leaving is set by Leave")
	}
	m.setMu.Lock()
	defer m.setMu.Unlock()
	return m.setMeta(meta, func() {
		// UpdateNode queues the alive message at once, then waits
		// for it to be sent to enough nodes. That wait buys nothing
		// here (a newer alive message replaces a queued one) and
		// would hold every later SetMeta behind gossip rounds, so it
		// is cut to a nanosecond and its timeout error ignored.
		_ = m.ml.UpdateNode(time.Nanosecond)
	})
}

// setMeta installs meta as the local metadata and calls announce, which
// must make memberlist regossip it. The caller holds setMu.
func (m *Membership) setMeta(meta proto.NodeMeta, announce func()) error {
	raw, table, err := encodeLocal(m.name, meta)
	if err != nil {
		return err
	}
	meta = cloneMeta(meta)
	m.mu.Lock()
	if err := m.usableLocked(); err != nil {
		m.mu.Unlock()
		return err
	}
	m.local, m.localRaw = meta, raw
	changed := !tablesEqual(m.localTable, table)
	m.localTable = table
	m.mu.Unlock()

	announce() // calls delegate.NodeMeta, then NotifyUpdate for this node

	if table != nil && changed {
		m.mu.Lock()
		m.pushAll = true
		m.mu.Unlock()
		m.kick()
	}
	return nil
}

// cloneMeta copies what a NodeMeta points to.
func cloneMeta(meta proto.NodeMeta) proto.NodeMeta {
	meta.Arenas = slices.Clone(meta.Arenas)
	if meta.Index != nil {
		x := *meta.Index
		meta.Index = &x
	}
	return meta
}

func (m *Membership) usableLocked() error {
	switch {
	case m.closed:
		return ErrClosed
	case m.left:
		return ErrLeft
	}
	return nil
}

// Leave announces that this node leaves the cluster, taking up to
// timeout: first metadata with Leaving set, so that others record
// StateLeft rather than StateDead, then memberlist's leave message. Each
// goes out by gossip, which sends it to members picked at random (some of
// them perhaps gone too) a fixed number of times, and by a full-state
// exchange (push/pull, over TCP) with up to 8 alive servers, which spread
// it further. Other nodes then drop this one from placement, and a client
// from their views at once. Leave fails only when nothing confirms the
// departure: the leave message was not sent in time and no server
// answered. timeout must be positive. Call Shutdown afterwards. Leave
// after Leave does nothing.
func (m *Membership) Leave(timeout time.Duration) error {
	if timeout <= 0 {
		return fmt.Errorf("membership: Leave with a timeout of %v", timeout)
	}
	m.setMu.Lock()
	defer m.setMu.Unlock()
	m.mu.Lock()
	closed, left, meta := m.closed, m.left, m.local
	m.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if left {
		return nil
	}
	deadline := time.Now().Add(timeout)
	meta.Leaving = true
	// The Leaving metadata must be merged before the leave message
	// arrives, which would otherwise be taken for a death (and would
	// replace the metadata's gossip if still queued): it goes first, by
	// gossip, waiting up to a quarter of the time for it to be sent, and
	// to the servers until they show it, for up to three quarters of the
	// time in all.
	if err := m.setMeta(meta, func() { _ = m.ml.UpdateNode(timeout / 4) }); err != nil {
		return err
	}
	m.announce(deadline.Add(-timeout / 4))
	m.mu.Lock()
	m.left = true
	m.mu.Unlock()
	gossipErr := m.ml.Leave(max(time.Until(deadline)/2, time.Millisecond))
	tried, told := m.syncServers(deadline)
	if gossipErr != nil && told == 0 {
		return fmt.Errorf("membership: leaving: %w, and none of the %d servers tried answered within %v", gossipErr, tried, timeout)
	}
	return nil
}

// Shutdown stops gossip at once, without telling the cluster (others
// declare this node dead after their suspicion timeout; call Leave first
// to leave cleanly), and closes every Subscribe channel. It waits for an
// arena push or a state exchange in flight, up to Tuning.TCPTimeout, and
// for a Leave or SetMeta in progress. Shutdown after Shutdown does nothing.
func (m *Membership) Shutdown() error {
	m.setMu.Lock() // memberlist panics on a Leave after its Shutdown
	defer m.setMu.Unlock()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	for sub := range m.subs {
		close(sub.ch)
		delete(m.subs, sub)
	}
	m.mu.Unlock()
	close(m.stop)
	<-m.done
	m.syncs.Wait() // memberlist must not push/pull after its Shutdown
	if err := m.ml.Shutdown(); err != nil {
		return fmt.Errorf("membership: %w", err)
	}
	return nil
}

// isServer reports whether this node is a server.
func (m *Membership) isServer() bool { return m.s.Role == proto.RoleServer }

// Name is this node's name.
func (m *Membership) Name() string { return m.name }

// LocalNode returns this node as its own view shows it.
func (m *Membership) LocalNode() Member {
	if me, ok := m.View().Member(m.name); ok {
		return me
	}
	// Not reachable: memberlist reports this node during Create.
	m.mu.Lock()
	defer m.mu.Unlock()
	return Member{Name: m.name, State: StateAlive, Meta: m.local}
}

// View returns the current view. It never blocks for long and never
// returns nil.
func (m *Membership) View() *View { return m.view.Load() }

// Warning returns why this node's gossip is unsafe, or "" when it is
// encrypted.
func (m *Membership) Warning() string { return m.warn }

// Subscribe returns a channel of the view's changes from now on, and a
// function that cancels the subscription and closes the channel (calling
// it again does nothing). Shutdown closes it too.
//
// Delivery never blocks memberlist: the channel holds Config.EventBuffer
// events, and when it is full the oldest is dropped to make room for the
// newest. A subscriber detects the loss by a gap in Event.View.Version()
// and rereads View(); the newest event always arrives, so the last View
// received is current.
func (m *Membership) Subscribe() (<-chan Event, func()) {
	sub := &subscriber{ch: make(chan Event, m.s.EventBuffer)}
	m.mu.Lock()
	if m.closed {
		close(sub.ch)
	} else {
		m.subs[sub] = struct{}{}
	}
	m.mu.Unlock()
	return sub.ch, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if _, ok := m.subs[sub]; ok {
			delete(m.subs, sub)
			close(sub.ch)
		}
	}
}

type subscriber struct{ ch chan Event }

// send delivers ev, dropping the oldest event if the buffer is full. The
// caller holds Membership.mu, so sends are serialized and only the
// subscriber receives concurrently: after one receive there is room.
func (s *subscriber) send(ev Event) {
	select {
	case s.ch <- ev:
		return
	default:
	}
	select {
	case <-s.ch:
	default:
	}
	select {
	case s.ch <- ev:
	default:
	}
}

// InstallKey adds a gossip key (16, 24 or 32 bytes) to this node's
// keyring: from now on it also decrypts with it. See the package
// documentation for rotating keys across the cluster.
func (m *Membership) InstallKey(key []byte) error {
	return m.keyringOp("installing", func(k *memberlist.Keyring) error { return k.AddKey(slices.Clone(key)) })
}

// UseKey makes an installed key the primary: this node encrypts with it
// from now on. Every member must have installed it first.
func (m *Membership) UseKey(key []byte) error {
	return m.keyringOp("using", func(k *memberlist.Keyring) error { return k.UseKey(key) })
}

// RemoveKey removes a key that is not the primary from this node's
// keyring. Removing a key that is not installed does nothing.
func (m *Membership) RemoveKey(key []byte) error {
	return m.keyringOp("removing", func(k *memberlist.Keyring) error { return k.RemoveKey(key) })
}

// keyringOp runs op on the keyring of an encrypted cluster.
func (m *Membership) keyringOp(what string, op func(*memberlist.Keyring) error) error {
	if m.s.keyring == nil {
		return ErrNotEncrypted
	}
	if err := op(m.s.keyring); err != nil {
		return fmt.Errorf("membership: %s a gossip key: %w", what, err)
	}
	return nil
}

// kick wakes the background goroutine.
func (m *Membership) kick() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// run pushes this node's arena table to members that need it, reaps
// servers dead or left for longer than their retention, and reconnects
// to the servers held dead.
func (m *Membership) run() {
	defer close(m.done)
	tick := time.NewTicker(min(max(m.s.deadRetention/4, 10*time.Millisecond), time.Second))
	defer tick.Stop()
	reconnect := time.NewTicker(m.s.reconnectInterval)
	defer reconnect.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-tick.C:
			m.reap(time.Now())
		case <-reconnect.C:
			m.reconnect()
		case <-m.wake:
			m.push()
		}
	}
}

// reap drops the servers dead or left for Tuning.DeadRetention. (Other
// members go as soon as they are dead or left: observe.)
func (m *Membership) reap(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	for _, mb := range m.members {
		if mb.State != StateAlive && now.Sub(mb.Since) >= m.s.deadRetention {
			m.reapLocked(mb)
		}
	}
}

// retained reports whether mb stays in the view for Tuning.DeadRetention
// once dead or left: a server (whose keys must not move while it
// restarts). Other members are reaped at once.
func retained(mb *Member) bool { return mb.MetaErr == nil && mb.Meta.Role == proto.RoleServer }

// reapLocked drops mb from the view. The caller holds mu.
func (m *Membership) reapLocked(mb *Member) {
	delete(m.members, mb.Name)
	delete(m.raw, mb.Name)
	delete(m.pending, mb.Name)
	delete(m.refreshed, mb.Name)
	m.publishLocked(EventReap, *mb)
	m.logReapLocked(mb)
}

// publishLocked makes a new view and delivers its event. The caller holds
// mu.
func (m *Membership) publishLocked(kind EventKind, mb Member) {
	m.version++
	members := make([]Member, 0, len(m.members))
	for _, x := range m.members {
		members = append(members, *x)
	}
	v := newView(m.version, members)
	m.view.Store(v)
	ev := Event{Kind: kind, Member: mb, View: v}
	for sub := range m.subs {
		sub.send(ev)
	}
	m.s.Logger.Debug("view changed", "event", kind.String(), "member", mb.String(), "version", v.version)
}

// observe applies what memberlist reports about a node. It runs under
// memberlist's node lock.
func (m *Membership) observe(n *memberlist.Node, kind EventKind) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	mb := m.members[n.Name]
	known := mb != nil
	if mb == nil {
		mb = &Member{Name: n.Name}
		m.members[n.Name] = mb
	}
	before := *mb
	mb.Addr = nodeAddr(n)
	if old, ok := m.raw[n.Name]; !ok || !bytes.Equal(old, n.Meta) {
		m.raw[n.Name] = bytes.Clone(n.Meta)
		m.decodeLocked(mb, n.Meta)
	}
	now := time.Now()
	switch kind {
	case EventJoin, EventUpdate:
		if mb.State != StateAlive {
			mb.State, mb.Since = StateAlive, now
			kind = EventJoin
		}
	case EventFail:
		// memberlist reports both as NotifyLeave; a node leaving on
		// purpose said so in its metadata first.
		if mb.MetaErr == nil && mb.Meta.Leaving {
			kind = EventLeave
			mb.State = StateLeft
		} else {
			mb.State = StateDead
		}
		mb.Since = now
	}
	m.publishLocked(kind, *mb)
	if n.Name != m.name {
		m.logChangeLocked(kind, before, known, mb)
	}
	switch {
	case kind == EventJoin && n.Name != m.name && m.localTable != nil:
		m.pushTo[n.Name] = struct{}{}
		m.kick()
	case mb.State != StateAlive && !retained(mb) && n.Name != m.name:
		m.reapLocked(mb)
	}
}

// nodeAddr is a memberlist node's gossip address.
func nodeAddr(n *memberlist.Node) netip.AddrPort {
	ip, _ := netip.AddrFromSlice(n.Addr)
	return netip.AddrPortFrom(ip.Unmap(), n.Port)
}

// decodeLocked decodes a member's metadata into mb, attaching its arena
// list when the metadata carries only its summary. The caller holds mu.
func (m *Membership) decodeLocked(mb *Member, raw []byte) {
	meta, err := proto.DecodeNodeMeta(raw)
	if err != nil {
		m.s.Logger.Debug("undecodable metadata", "member", mb.Name, "err", err)
		mb.Meta, mb.MetaErr, mb.ArenasPending = proto.NodeMeta{}, err, false
		return
	}
	old := mb.Meta
	mb.Meta, mb.MetaErr, mb.ArenasPending = meta, nil, false
	if meta.Detached() {
		m.attachArenasLocked(mb, old)
	}
}

// delegate is what memberlist calls. memberlist.Delegate's methods may run
// concurrently, from memberlist's packet and stream goroutines;
// memberlist.EventDelegate's run one at a time, holding memberlist's node
// lock. None blocks: each takes Membership.mu briefly, and event delivery
// drops rather than waits.
type delegate struct{ m *Membership }

// NodeMeta returns the encoded local metadata, at most
// memberlist.MetaMaxSize bytes (SetMeta made sure). memberlist keeps the
// slice; it is never modified after it is published.
func (d *delegate) NodeMeta(limit int) []byte {
	d.m.mu.Lock()
	defer d.m.mu.Unlock()
	if len(d.m.localRaw) > limit {
		d.m.s.Logger.Error("metadata exceeds memberlist's limit", "bytes", len(d.m.localRaw), "limit", limit)
		return nil
	}
	return d.m.localRaw
}

// NotifyJoin, NotifyUpdate and NotifyLeave report a node's arrival,
// metadata change, and departure (dead or left: decided by its Leaving
// metadata). n is memberlist's: read, never kept.
func (d *delegate) NotifyJoin(n *memberlist.Node)   { d.m.observe(n, EventJoin) }
func (d *delegate) NotifyUpdate(n *memberlist.Node) { d.m.observe(n, EventUpdate) }
func (d *delegate) NotifyLeave(n *memberlist.Node)  { d.m.observe(n, EventFail) }
