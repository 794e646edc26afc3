package membership

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/rkv-io/rkv/proto"
)

// Config configures a node's membership. Zero fields take the defaults
// documented on each.
type Config struct {
	// Name is the node's name in the cluster, unique among its members.
	// Required for a server, and it must keep it across restarts: the
	// cluster map knows servers by name. A client defaults to
	// "client-<hostname>-<random>".
	Name string

	// Role is what the node does: proto.RoleServer or proto.RoleClient.
	// Required.
	Role proto.Role

	// Meta is the node's initial metadata (SetMeta replaces it). Its Role
	// defaults to Role and must agree with it; its Leaving must be false
	// (Leave sets it).
	Meta proto.NodeMeta

	// BindAddr and BindPort are where gossip listens, UDP and TCP on the
	// same port. The defaults, 127.0.0.1 and 0 (a port the kernel picks),
	// suit tests and single-host demos. A server in a real cluster binds
	// its cluster-network address and a fixed port (memberlist's usual is
	// 7946) so that seed lists stay valid across restarts.
	BindAddr string
	BindPort int

	// AdvertiseAddr and AdvertisePort are the address other nodes use to
	// reach this one, when it is not the bind address (binding 0.0.0.0,
	// NAT). Default: the bind address and port.
	AdvertiseAddr string
	AdvertisePort int

	// Seeds are "host:port" addresses of members that Create joins
	// through; Create fails if it can reach none of them. Empty: the node
	// starts a cluster of its own (the first server), or joins later with
	// Join.
	Seeds []string
	// JoinTimeout is how long Create keeps trying Seeds while none of
	// them answers (a cluster whose members start together, or a seed
	// restarting): it retries with a backoff from 100 ms to 2 s, logging
	// each failed attempt at INFO with its error. Default 0: one attempt.
	JoinTimeout time.Duration

	// SecretKey turns on gossip encryption (AES-GCM; 16, 24 or 32 bytes
	// for AES-128/192/256): every message is encrypted with it, and
	// messages that are not encrypted are refused. ExtraKeys are also
	// accepted for decryption, which is what lets a cluster rotate keys
	// (see the package documentation). Without a key, node metadata,
	// rkeys included, travels in clear text: Create logs a warning and
	// Warning says so.
	SecretKey []byte
	ExtraKeys [][]byte
	// SecretKeySetting names, in the warning logged without a SecretKey,
	// how the operator sets one: a command passes its flag (for example
	// "--gossip-key"). Default "Config.SecretKey".
	SecretKeySetting string

	// Logger receives the package's logs, and memberlist's at debug
	// level. Default: slog.Default().
	Logger *slog.Logger

	// Tuning sets gossip timing. The zero value is memberlist's
	// DefaultLocalConfig.
	Tuning Tuning

	// EventBuffer is the capacity of each Subscribe channel. Default 64.
	EventBuffer int
}

// Profile names one of memberlist's default configurations.
type Profile string

// Profiles.
const (
	// ProfileLocal is memberlist.DefaultLocalConfig: a loopback network
	// or one fast LAN segment (probe every 1 s, 200 ms probe timeout,
	// push/pull every 15 s). The default.
	ProfileLocal Profile = "local"
	// ProfileLAN is memberlist.DefaultLANConfig: a data-center network
	// (probe every 1 s, 500 ms probe timeout, push/pull every 30 s).
	ProfileLAN Profile = "lan"
	// ProfileWAN is memberlist.DefaultWANConfig.
	ProfileWAN Profile = "wan"
)

// Tuning sets gossip timing: a memberlist profile, and overrides of its
// fields (zero keeps the profile's value). Tests shorten the intervals to
// converge and detect failures in milliseconds.
type Tuning struct {
	Profile Profile // default ProfileLocal

	ProbeInterval       time.Duration // failure detection: one probe per interval
	ProbeTimeout        time.Duration // ack wait before indirect probes
	GossipInterval      time.Duration // gossip of queued messages
	PushPullInterval    time.Duration // full-state exchange (anti-entropy) with one random node
	TCPTimeout          time.Duration // stream connects and I/O, joins and pushes included
	SuspicionMult       int           // suspect for SuspicionMult*log10(N)*ProbeInterval before dead
	GossipToTheDeadTime time.Duration // how long memberlist keeps gossiping to a dead node

	// ReconnectInterval is how often a member tries to reach the servers
	// it holds dead (and its seeds, when it sees no server alive): one
	// cut off longer than GossipToTheDeadTime is otherwise never
	// contacted again once the cut heals. Default 5 s.
	ReconnectInterval time.Duration

	// DeadRetention is how long a dead or left server stays in the view
	// (in StateDead or StateLeft) before it is reaped (EventReap), so that
	// its state can be reported (its keys stay unavailable either way: the
	// cluster map, not the view, places them). Default 1 h. Other members
	// (clients) are reaped as soon as they are dead or left.
	DeadRetention time.Duration
}

// DefaultDeadRetention is Tuning.DeadRetention's default.
const DefaultDeadRetention = time.Hour

// The configuration with defaults filled in and checked.
type settings struct {
	Config
	ml                *memberlist.Config
	keyring           *memberlist.Keyring
	deadRetention     time.Duration // servers; other members are reaped at once
	reconnectInterval time.Duration
}

func (c Config) settings() (*settings, error) {
	switch c.Role {
	case proto.RoleServer, proto.RoleClient:
	default:
		return nil, fmt.Errorf("membership: Config.Role %v: want proto.RoleServer or proto.RoleClient", c.Role)
	}
	if c.Meta.Role == 0 {
		c.Meta.Role = c.Role
	}
	if c.Meta.Role != c.Role {
		return nil, fmt.Errorf("membership: Config.Meta.Role %v differs from Config.Role %v", c.Meta.Role, c.Role)
	}
	if c.Meta.Leaving {
		return nil, errors.New("membership: Config.Meta.Leaving is set by Leave, not by the caller")
	}
	if c.Name == "" {
		if c.Role == proto.RoleServer {
			return nil, errors.New("membership: a server needs a Config.Name that stays the same across restarts")
		}
		host, _ := os.Hostname()
		var r [4]byte
		_, _ = rand.Read(r[:])
		c.Name = "client-" + host + "-" + hex.EncodeToString(r[:])
	}
	if len(c.Name) > proto.MaxMetaNodeNameLen {
		return nil, fmt.Errorf("membership: node name of %d bytes, limit %d", len(c.Name), proto.MaxMetaNodeNameLen)
	}
	if c.BindAddr == "" {
		c.BindAddr = "127.0.0.1"
	}
	// memberlist binds every interface when it cannot parse the address:
	// insist on an IP literal.
	if _, err := netip.ParseAddr(c.BindAddr); err != nil {
		return nil, fmt.Errorf("membership: Config.BindAddr %q: want an IP address", c.BindAddr)
	}
	if c.AdvertiseAddr != "" {
		if _, err := netip.ParseAddr(c.AdvertiseAddr); err != nil {
			return nil, fmt.Errorf("membership: Config.AdvertiseAddr %q: want an IP address", c.AdvertiseAddr)
		}
	}
	if c.BindPort < 0 || c.BindPort > 65535 || c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		return nil, fmt.Errorf("membership: ports %d and %d: want 0 to 65535", c.BindPort, c.AdvertisePort)
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	c.Logger = c.Logger.With("node", c.Name)
	if c.SecretKeySetting == "" {
		c.SecretKeySetting = "Config.SecretKey"
	}
	if c.JoinTimeout < 0 {
		return nil, fmt.Errorf("membership: Config.JoinTimeout %v: want 0 (one attempt) or more", c.JoinTimeout)
	}
	if c.EventBuffer <= 0 {
		c.EventBuffer = 64
	}

	var mc *memberlist.Config
	switch c.Tuning.Profile {
	case "", ProfileLocal:
		mc = memberlist.DefaultLocalConfig()
	case ProfileLAN:
		mc = memberlist.DefaultLANConfig()
	case ProfileWAN:
		mc = memberlist.DefaultWANConfig()
	default:
		return nil, fmt.Errorf("membership: tuning profile %q: want %q, %q or %q", c.Tuning.Profile, ProfileLocal, ProfileLAN, ProfileWAN)
	}
	t := c.Tuning
	for _, o := range []struct {
		dst *time.Duration
		v   time.Duration
	}{
		{&mc.ProbeInterval, t.ProbeInterval},
		{&mc.ProbeTimeout, t.ProbeTimeout},
		{&mc.GossipInterval, t.GossipInterval},
		{&mc.PushPullInterval, t.PushPullInterval},
		{&mc.TCPTimeout, t.TCPTimeout},
		{&mc.GossipToTheDeadTime, t.GossipToTheDeadTime},
	} {
		if o.v < 0 {
			return nil, fmt.Errorf("membership: negative tuning %v", o.v)
		}
		if o.v > 0 {
			*o.dst = o.v
		}
	}
	if t.SuspicionMult > 0 {
		mc.SuspicionMult = t.SuspicionMult
	}
	s := &settings{deadRetention: t.DeadRetention, reconnectInterval: t.ReconnectInterval}
	if s.deadRetention <= 0 {
		s.deadRetention = DefaultDeadRetention
	}
	if s.reconnectInterval <= 0 {
		s.reconnectInterval = DefaultReconnectInterval
	}

	mc.Name = c.Name
	mc.BindAddr, mc.BindPort = c.BindAddr, c.BindPort
	mc.AdvertiseAddr, mc.AdvertisePort = c.AdvertiseAddr, c.AdvertisePort
	if c.AdvertisePort == 0 {
		mc.AdvertisePort = c.BindPort // memberlist sets both when it picks the port
	}
	mc.DelegateProtocolVersion = proto.MetaVersion
	mc.DelegateProtocolMin = proto.MetaVersion
	mc.DelegateProtocolMax = proto.MetaVersion
	mc.Logger = log.New(memberlistLog{c.Logger}, "", 0)

	if len(c.SecretKey) == 0 && len(c.ExtraKeys) > 0 {
		return nil, errors.New("membership: Config.ExtraKeys without a SecretKey")
	}
	if len(c.SecretKey) > 0 {
		// The keyring keeps the slices it is given: give it copies.
		extra := make([][]byte, 0, len(c.ExtraKeys))
		for _, k := range c.ExtraKeys {
			extra = append(extra, slices.Clone(k))
		}
		kr, err := memberlist.NewKeyring(extra, slices.Clone(c.SecretKey))
		if err != nil {
			return nil, fmt.Errorf("membership: gossip key: %w", err)
		}
		mc.Keyring = kr
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
		s.keyring = kr
	}
	s.Config, s.ml = c, mc
	return s, nil
}

// memberlistLog carries memberlist's log lines ("[LEVEL] memberlist: msg")
// into slog at debug level, memberlist's own level as an attribute.
type memberlistLog struct{ l *slog.Logger }

func (w memberlistLog) Write(p []byte) (int, error) {
	ctx := context.Background()
	if !w.l.Enabled(ctx, slog.LevelDebug) {
		return len(p), nil
	}
	s := strings.TrimSpace(string(p))
	level := ""
	if strings.HasPrefix(s, "[") {
		if i := strings.IndexByte(s, ']'); i > 0 {
			level, s = s[1:i], strings.TrimSpace(s[i+1:])
		}
	}
	s = strings.TrimPrefix(s, "memberlist: ")
	w.l.LogAttrs(ctx, slog.LevelDebug, s, slog.String("memberlist", level))
	return len(p), nil
}
