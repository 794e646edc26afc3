package main

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/rkv-io/rkv/internal/envflags"
	"github.com/rkv-io/rkv/internal/tlsfiles"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/store"
)

// options is everything rkv-server takes on its command line, in its
// environment (RKV_<FLAG>) or in its config file.
type options struct {
	Config              string
	Name                string
	DataDir             string
	ArenaSize           int64
	MaxArenaCount       int
	ArenaCount          int
	IndexSlots          uint64
	MaxIndexSlots       uint64
	MaxSessions         int
	LeaseSize           int64
	SegmentSize         int64
	RegistrationUnit    int64
	Sync                string
	IndexLogSize        int64
	RegistrationWorkers int
	RegistrationNice    int
	VerbsSpin           time.Duration
	Provider            string
	Device              string
	DataAddr            string
	ControlAddr         string
	MaxConns            int
	MaxConnsPerHost     int
	FrameTimeout        time.Duration
	GossipAddr          string
	Join                []string
	JoinTimeout         time.Duration
	Bootstrap           bool
	Replicas            int
	Zone                string
	RaftVoters          int
	MoveTimeout         time.Duration
	MaxMoves            int
	FailoverTimeout     time.Duration
	ReadLease           time.Duration
	MaxClockDrift       time.Duration
	BackupTimeout       time.Duration
	ForwardOnQP         bool
	DeadServerTimeout   time.Duration
	GossipProfile       string
	GossipKey           string
	GossipKeyFile       string
	AuthToken           string
	AuthTokenFile       string
	PeerToken           string
	PeerTokenFile       string
	TLSCert             string
	TLSKey              string
	TLSClientCA         string
	TLSPeerCA           string
	MetricsAddr         string
	Pprof               bool
	LogLevel            string
	LogFormat           string
	Version             bool

	// Derived by validate.
	gossipKey []byte
	syncMode  store.SyncPolicy
	level     slog.Level
	gossipIP  string
	gossipPrt int
	tls       *tls.Config // nil without --tls-cert
	peerTLS   *tls.Config // for connections to other servers; nil without --tls-cert
	// envWarnings are the RKV_ variables of the environment that name no
	// flag (a misspelling would otherwise be ignored without a word),
	// logged once the logger is up.
	envWarnings []envflags.Unknown
	// replicasGiven: --replicas was set (flag, environment or file), not
	// left at its default. Only then is it passed on, so that a restart
	// without it logs nothing about a map at another count.
	replicasGiven bool
}

const usageHeader = `rkv-server runs one rkv server: it opens an RDMA device, the store (arenas
registered for one-sided access, hash index, Pebble), the control RPC
listener, and joins the cluster's gossip.

Usage:
  rkv-server --name NAME --bootstrap [flags]        the first server of a new cluster
  rkv-server --name NAME --join HOST:PORT [flags]   another server: joins (retrying for --join-timeout
                                                    while no seed answers), and takes its share of the shards
  (a restart is the same command: the data directory holds the cluster state)

Every flag can also be given as an environment variable RKV_<FLAG> in upper
snake case (--data-dir: RKV_DATA_DIR), or as a line "flag-name = value" in the
file named by --config (or RKV_CONFIG): one setting per line, '#' starts a
comment, values may be quoted, e.g.

  # /etc/rkv/node1.conf
  name = node1
  data-dir = /var/lib/rkv/node1
  gossip-addr = 10.0.0.1:7946
  join = 10.0.0.2:7946,10.0.0.3:7946
  arena-size = 1GiB

Precedence: command line, then environment, then config file, then default.
Sizes take a suffix: KiB MiB GiB TiB (or K M G T, also powers of two).
The gossip key (16, 24 or 32 bytes, base64 or hex) and the tokens are
best given by file or environment so they stay out of the process list.
--auth-token is what clients present; --peer-token, the same on every server,
is what servers present to each other (migration, map changes, Raft): with
it, a client's token or certificate no longer opens a session between
servers. Without it, those sessions take --auth-token like clients, and a
server with an --auth-token (or --tls-client-ca) warns about that at start.
Without a gossip key, node metadata (rkeys included) travels in clear text.
With --tls-cert and --tls-key the control port speaks TLS 1.3 only; adding
--tls-client-ca requires every client to present a certificate that CA
signed (mTLS). The certificate must hold the IP address the server
advertises for its control port as an IP SAN (the host of --control-addr, or
of --gossip-addr when --control-addr is 0.0.0.0 or [::]): clients verify it
against that address.

On SIGTERM or SIGINT the server shuts down gracefully (stops granting leases,
finishes commits, deregisters memory, leaves the cluster) and exits 0; a
second signal exits at once with status 1. Exit status 2 means bad flags or
configuration, 1 a failure to start or to shut down cleanly: among those, a
--tls-cert that has expired or is not valid yet, or a --tls-key that does not
match it (the message names the file and the dates). A server that
can register none of its arenas (RLIMIT_MEMLOCK below --arena-size, typically)
fails to start, with the reason and how to raise the limit; with some of them
it serves on those.

With --metrics-addr: /metrics (Prometheus), /healthz (200 while the process
answers) and /readyz (200 once the server serves: an arena registered and the
cluster map holding it; else 503 and the reason); /debug/pprof/ with --pprof.

Flags:
`

// newFlagSet defines the flags on o, with their defaults.
func newFlagSet(o *options) *pflag.FlagSet {
	fs := pflag.NewFlagSet("rkv-server", pflag.ContinueOnError)
	fs.SortFlags = false
	fs.StringVar(&o.Config, "config", "", "config `file` of \"flag-name = value\" lines (see above)")
	fs.StringVar(&o.Name, "name", "", "the server's cluster name; required, and must stay the same across restarts (placement hashes it)")
	fs.StringVar(&o.DataDir, "data-dir", "", "data directory (arenas, Pebble); default ./rkv-data/<name>")
	fs.Var(newSize(&o.ArenaSize, 64<<20), "arena-size", "size of each arena file, a multiple of --segment-size")
	fs.IntVar(&o.ArenaCount, "arena-count", 4, "number of arenas a new store starts with")
	fs.IntVar(&o.MaxArenaCount, "max-arena-count", 0, "arenas the store may grow to while serving, adding one when free space runs short with 70% of it live (0: --arena-count, no growth)")
	fs.Uint64Var(&o.IndexSlots, "index-slots", 1<<18, "home slots the one-sided hash index starts with, a power of two (16 bytes each); it doubles while serving at load 0.6")
	fs.Uint64Var(&o.MaxIndexSlots, "max-index-slots", 1<<26, "home slots the hash index may grow to, a power of two; new keys are refused at load 0.85 of it")
	fs.IntVar(&o.MaxSessions, "max-sessions", 1<<18, "idempotency entries kept (the last write of each shard and writer session, ~100 bytes each, for answering retries); past it the oldest go before their 10 minutes, and rkv_idempotency_sessions_evicted_early_total counts them")
	fs.Var(newSize(&o.LeaseSize, 1<<20), "lease-size", "largest write lease, and so the largest record: values up to it less 1056 bytes (writers ask for what they need, from 4KiB)")
	fs.Var(newSize(&o.SegmentSize, 0), "segment-size", "unit the arenas are carved and cleaned in, a multiple of 4KiB and at least --lease-size (0: 4 leases, or one when that does not divide --arena-size); keep it across restarts")
	fs.Var(newSize(&o.RegistrationUnit, 0), "registration-unit", "how much of an arena one memory registration covers, each advertised on its own so that the first serves while the rest are pinned; a multiple of --segment-size; beyond --arena-size, arenas register whole (0: 128MiB in whole segments)")
	fs.StringVar(&o.Sync, "sync", "always", "durability: always (fsync before ack), batch (every 10ms), none (written out before ack, never synced: survives a process crash, not a machine crash)")
	fs.Var(newSize(&o.IndexLogSize, 0), "index-log-size", "the file commits log their index entries (and under --sync always or batch their records) to until they are written into the index in the background, a multiple of 4KiB, at least 1MiB and 4 --lease-size under always or batch (0: 32MiB; under always or batch, whose records pass through it, a sixteenth of the arenas up to 256MiB, or 4 leases if more); if rkv_index_log_full_total grows, raise it")
	fs.IntVar(&o.RegistrationWorkers, "registration-workers", 0, "memory registrations run at once (0: min(4, GOMAXPROCS))")
	fs.IntVar(&o.RegistrationNice, "registration-nice", 10, "how far below the server's CPU priority the arenas' units after the first are pinned (the nice value of the threads pinning them rises by this much, to 19 at most), so that their pinning yields the CPUs to serving; 0 to 19, 0: at the server's")
	fs.StringVar(&o.Provider, "provider", "auto", "RDMA provider: auto (verbs if compiled in and a device exists, else soft), soft, verbs")
	fs.StringVar(&o.Device, "device", "", "RDMA device name (default: the provider's first device)")
	fs.StringVar(&o.DataAddr, "data-addr", "127.0.0.1:0", "soft provider's data endpoint host:port")
	fs.DurationVar(&o.VerbsSpin, "verbs-spin", 0, "verbs provider: how long a session's wait for its next commit, and a forward's for its answer, polls before it sleeps on the completion channel; spinning answers sooner and costs CPU on every idle session; 0 to 10ms, 0: sleep at once")
	fs.StringVar(&o.ControlAddr, "control-addr", "127.0.0.1:0", "control RPC listener host:port, advertised by gossip (on 0.0.0.0 or [::], with the host of --gossip-addr); what clients pass to --endpoints")
	fs.IntVar(&o.MaxConns, "max-conns", 8192, "control connections open at once; more are answered with an error and closed")
	fs.IntVar(&o.MaxConnsPerHost, "max-conns-per-host", 1024, "control connections open at once from one IP address (a client holds 4 per server)")
	fs.DurationVar(&o.FrameTimeout, "frame-timeout", 10*time.Second, "close a control connection that takes longer to send a request frame once begun (idling between requests is free)")
	fs.StringVar(&o.GossipAddr, "gossip-addr", "127.0.0.1:7946", "gossip host:port, UDP and TCP; what others pass to --join")
	fs.StringSliceVar(&o.Join, "join", nil, "gossip addresses of members to join, comma separated; any that answers will do")
	fs.DurationVar(&o.JoinTimeout, "join-timeout", 60*time.Second, "keep retrying --join while no member answers (with backoff, each attempt logged) for this long; 0: one attempt")
	fs.BoolVar(&o.Bootstrap, "bootstrap", false, "start a new cluster of this server alone, if the data directory holds no cluster state yet (ignored on a restart)")
	fs.IntVar(&o.Replicas, "replicas", 3, "copies of each shard, on distinct servers (distinct --zone first), 1 to 16, as many as there are servers when fewer: the map's count, set by the --bootstrap of a new cluster and ignored on a restart or a --join (change it with rkv-client replicas N)")
	fs.StringVar(&o.Zone, "zone", "", "this server's failure domain (a rack, an availability zone): a label of up to 64 printable characters without spaces; replicas of a shard go to distinct zones first (empty: none)")
	fs.IntVar(&o.RaftVoters, "raft-voters", 3, "servers voting in the cluster map's Raft group (an odd number is kept: 1 with one or two servers); the others follow without voting")
	fs.DurationVar(&o.MoveTimeout, "move-timeout", 30*time.Second, "abort a shard move whose source or target has been down this long")
	fs.IntVar(&o.MaxMoves, "max-moves", 32, fmt.Sprintf("shard moves in progress at once, 1 to %d, started by the map's leader in batches of at least half: more place the shards of new or empty servers sooner, and freeze more shards' writes at once for a move's last copy", proto.NumShards))
	fs.DurationVar(&o.FailoverTimeout, "failover-timeout", time.Second, "hand the shards of a primary declared dead by gossip this long ago to their backups (with more than one replica)")
	fs.DurationVar(&o.ReadLease, "read-lease", 4*time.Second, "the read lease the map's leader grants each server: clients trust reads of a server within it, and a paused or cut-off primary fails over only after it (the same on every server)")
	fs.DurationVar(&o.MaxClockDrift, "max-clock-drift", 500*time.Millisecond, "how far clocks may run apart over a read lease: the leader waits this much longer than a lease before a failover")
	fs.DurationVar(&o.BackupTimeout, "backup-timeout", time.Second, "drop from its shards a backup declared dead by gossip this long ago, so that their writes go on without it")
	fs.BoolVar(&o.ForwardOnQP, "forward-on-qp", false, "send a primary's forwards to its backups as RDMA SENDs on a QP rather than control requests over TCP (for RDMA hardware; no faster on the soft provider)")
	fs.DurationVar(&o.DeadServerTimeout, "dead-server-timeout", 0, "remove a server dead this long from the map, its shards given to the others empty (its keys are lost); 0: never (use rkv-client forget)")
	fs.StringVar(&o.GossipProfile, "gossip-profile", "local", "gossip timing: local (loopback, fast failure detection), lan or wan (memberlist's profiles)")
	fs.StringVar(&o.GossipKey, "gossip-key", "", "gossip encryption key, base64 or hex, 16/24/32 bytes")
	fs.StringVar(&o.GossipKeyFile, "gossip-key-file", "", "file holding the gossip key (base64 or hex)")
	fs.StringVar(&o.AuthToken, "auth-token", "", "token every client must present (and every server, without --peer-token)")
	fs.StringVar(&o.AuthTokenFile, "auth-token-file", "", "file holding the auth token")
	fs.StringVar(&o.PeerToken, "peer-token", "", "token of the servers alone, the same on each: required of sessions between servers, which then refuse the clients' token; sent when dialing the others")
	fs.StringVar(&o.PeerTokenFile, "peer-token-file", "", "file holding the peer token")
	fs.StringVar(&o.TLSCert, "tls-cert", "", "PEM certificate `file` (chain first to last) for TLS on the control port; needs --tls-key")
	fs.StringVar(&o.TLSKey, "tls-key", "", "PEM private key `file` of --tls-cert")
	fs.StringVar(&o.TLSClientCA, "tls-client-ca", "", "PEM CA certificate(s) `file`: require client certificates signed by them (mTLS); needs --tls-cert")
	fs.StringVar(&o.TLSPeerCA, "tls-peer-ca", "", "PEM CA certificate(s) `file` verifying the other servers' certificates (default: --tls-client-ca, else the system's roots); this server presents --tls-cert to them")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", "", "serve Prometheus /metrics, /healthz (process up) and /readyz (serving: 503 with the reason otherwise) on host:port (empty: off)")
	fs.BoolVar(&o.Pprof, "pprof", false, "also serve Go profiles under /debug/pprof/ on --metrics-addr (they expose the process's internals: keep the address private)")
	fs.StringVar(&o.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.LogFormat, "log-format", "text", "text or json")
	fs.BoolVar(&o.Version, "version", false, "print the version and commit, and exit")
	return fs
}

// envName is a flag's environment variable: RKV_DATA_DIR for data-dir.
func envName(flag string) string { return envflags.Name(flag) }

// errHelp is returned by parseOptions for --help.
var errHelp = pflag.ErrHelp

// errVersion is returned by parseOptions for --version.
var errVersion = errors.New("--version")

// parseOptions reads the command line, then the environment (environ is
// os.Environ's "KEY=value" list), then the config file, each filling only
// what the ones before left unset.
func parseOptions(args []string, environ []string, usageOut io.Writer) (*options, error) {
	o := &options{}
	fs := newFlagSet(o)
	env := envflags.Map(environ)
	fs.SetOutput(usageOut)
	fs.Usage = func() {
		fmt.Fprint(usageOut, usageHeader)
		fmt.Fprint(usageOut, fs.FlagUsages())
		fmt.Fprintln(usageOut, "\nEnvironment: RKV_<FLAG> for every flag above but --version, e.g. RKV_NAME, RKV_JOIN, RKV_GOSSIP_KEY;\nthe server warns at start about each RKV_ variable that names no flag.")
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if o.Version {
		return nil, errVersion
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (every setting is a --flag)", fs.Arg(0))
	}
	o.envWarnings = envflags.Unknowns(env, fs)
	set := map[string]bool{}
	fs.Visit(func(f *pflag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || set[f.Name] || f.Name == "version" {
			return
		}
		if v := env[envName(f.Name)]; v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("environment %s=%q: %w", envName(f.Name), v, e)
			}
			set[f.Name] = true
		}
	})
	if err != nil {
		return nil, err
	}
	if o.Config != "" {
		kv, err := readConfigFile(o.Config)
		if err != nil {
			return nil, err
		}
		for _, e := range kv {
			if e.key == "config" {
				return nil, fmt.Errorf("%s:%d: config files do not nest", o.Config, e.line)
			}
			if fs.Lookup(e.key) == nil {
				return nil, fmt.Errorf("%s:%d: unknown setting %q (settings are the flag names, e.g. data-dir)", o.Config, e.line, e.key)
			}
			if set[e.key] {
				continue
			}
			if err := fs.Set(e.key, e.value); err != nil {
				return nil, fmt.Errorf("%s:%d: %s = %q: %w", o.Config, e.line, e.key, e.value, err)
			}
		}
	}
	o.replicasGiven = fs.Changed("replicas") // fs.Set marks the environment's and the file's too
	if err := o.validate(); err != nil {
		return nil, err
	}
	return o, nil
}

type configEntry struct {
	key, value string
	line       int
}

// readConfigFile parses "key = value" lines; '#' starts a comment, blank
// lines are skipped, a value may be in double or single quotes.
func readConfigFile(path string) ([]configEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	defer f.Close()
	var out []configEntry
	sc := bufio.NewScanner(f)
	n := 0
	seen := map[string]int{}
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: want \"flag-name = value\", got %q", path, n, line)
		}
		k = strings.TrimPrefix(strings.TrimSpace(k), "--")
		v = strings.TrimSpace(v)
		if len(v) >= 2 && (v[0] == '"' || v[0] == '\'') && v[len(v)-1] == v[0] {
			if v[0] == '"' {
				if u, err := strconv.Unquote(v); err == nil {
					v = u
				} else {
					return nil, fmt.Errorf("%s:%d: %w", path, n, err)
				}
			} else {
				v = v[1 : len(v)-1]
			}
		} else if i := strings.Index(v, " #"); i >= 0 {
			v = strings.TrimSpace(v[:i])
		}
		if prev, dup := seen[k]; dup {
			return nil, fmt.Errorf("%s:%d: %s set twice (first on line %d)", path, n, k, prev)
		}
		seen[k] = n
		out = append(out, configEntry{key: k, value: v, line: n})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("config file %s: %w", path, err)
	}
	return out, nil
}

// maxVerbsSpin bounds --verbs-spin: a longer spin is a busy poll.
const maxVerbsSpin = 10 * time.Millisecond

func (o *options) validate() error {
	if o.Name == "" {
		return errors.New("--name is required (or RKV_NAME, or name = ... in --config)")
	}
	if o.DataDir == "" {
		o.DataDir = "rkv-data/" + o.Name
	}
	if o.ArenaCount < 1 {
		return fmt.Errorf("--arena-count %d: must be at least 1", o.ArenaCount)
	}
	if o.MaxArenaCount != 0 && o.MaxArenaCount < o.ArenaCount {
		return fmt.Errorf("--max-arena-count %d: must be at least --arena-count %d (or 0: no growth)", o.MaxArenaCount, o.ArenaCount)
	}
	if o.IndexSlots == 0 || o.IndexSlots&(o.IndexSlots-1) != 0 {
		return fmt.Errorf("--index-slots %d: must be a power of two", o.IndexSlots)
	}
	if o.MaxIndexSlots&(o.MaxIndexSlots-1) != 0 || o.MaxIndexSlots < o.IndexSlots {
		return fmt.Errorf("--max-index-slots %d: must be a power of two, at least --index-slots %d", o.MaxIndexSlots, o.IndexSlots)
	}
	if o.IndexLogSize != 0 && (o.IndexLogSize < 1<<20 || o.IndexLogSize%4096 != 0) {
		return fmt.Errorf("--index-log-size %d: must be a multiple of 4KiB, at least 1MiB", o.IndexLogSize)
	}
	if o.MaxSessions < 1 {
		return fmt.Errorf("--max-sessions %d: must be at least 1", o.MaxSessions)
	}
	if o.LeaseSize <= 0 || o.ArenaSize <= 0 || o.ArenaSize%o.LeaseSize != 0 {
		return fmt.Errorf("--arena-size %d must be a positive multiple of --lease-size %d", o.ArenaSize, o.LeaseSize)
	}
	if o.SegmentSize != 0 && (o.SegmentSize < o.LeaseSize || o.SegmentSize%4096 != 0 || o.ArenaSize%o.SegmentSize != 0) {
		return fmt.Errorf("--segment-size %d must be a multiple of 4KiB, at least --lease-size %d, and divide --arena-size %d", o.SegmentSize, o.LeaseSize, o.ArenaSize)
	}
	if o.RegistrationUnit < 0 || o.RegistrationUnit%4096 != 0 || o.SegmentSize != 0 && o.RegistrationUnit%o.SegmentSize != 0 {
		return fmt.Errorf("--registration-unit %d must be a multiple of --segment-size (4 leases by default)", o.RegistrationUnit)
	}
	var err error
	if o.syncMode, err = store.ParseSyncPolicy(o.Sync); err != nil {
		return fmt.Errorf("--sync %q: want always, batch or none", o.Sync)
	}
	if o.IndexLogSize != 0 && o.syncMode != store.SyncNone && o.IndexLogSize < 4*o.LeaseSize {
		return fmt.Errorf("--index-log-size %d under --sync %s: must hold 4 leases of --lease-size %d (at least %d), as the log carries the records", o.IndexLogSize, o.syncMode, o.LeaseSize, 4*o.LeaseSize)
	}
	if o.RegistrationWorkers < 0 {
		return fmt.Errorf("--registration-workers %d: must be 0 (default) or more", o.RegistrationWorkers)
	}
	if o.VerbsSpin < 0 || o.VerbsSpin > maxVerbsSpin {
		return fmt.Errorf("--verbs-spin %v: must be 0 to %v (longer is a busy poll)", o.VerbsSpin, maxVerbsSpin)
	}
	if o.RegistrationNice < 0 || o.RegistrationNice > 19 {
		return fmt.Errorf("--registration-nice %d: must be 0 to 19 (nice values go no further)", o.RegistrationNice)
	}
	switch o.Provider {
	case "auto", "soft", "verbs":
	default:
		return fmt.Errorf("--provider %q: want auto, soft or verbs", o.Provider)
	}
	host, port, err := splitHostPort(o.GossipAddr)
	if err != nil {
		return fmt.Errorf("--gossip-addr %q: %w", o.GossipAddr, err)
	}
	o.gossipIP, o.gossipPrt = host, port
	for _, a := range []struct{ flag, v string }{{"data-addr", o.DataAddr}, {"control-addr", o.ControlAddr}} {
		if _, _, err := splitHostPort(a.v); err != nil {
			return fmt.Errorf("--%s %q: %w", a.flag, a.v, err)
		}
	}
	// A control port on every interface is advertised with the gossip
	// address's host (server.Config.ControlAddr): a wildcard is no address
	// a client can dial.
	if ctlHost, _, _ := splitHostPort(o.ControlAddr); unspecified(ctlHost) && unspecified(o.gossipIP) {
		return fmt.Errorf("--control-addr %s listens on every interface, and the server advertises the host of --gossip-addr to clients for it, but --gossip-addr %s is on every interface too: give --gossip-addr (or --control-addr) the IP clients and servers reach this one at",
			o.ControlAddr, o.GossipAddr)
	}
	for _, j := range o.Join {
		if _, _, err := splitHostPort(j); err != nil {
			return fmt.Errorf("--join %q: %w", j, err)
		}
	}
	if o.Replicas < 1 || o.Replicas > proto.MaxShardOwners {
		return fmt.Errorf("--replicas %d: must be 1 to %d", o.Replicas, proto.MaxShardOwners)
	}
	if o.Bootstrap && len(o.Join) > 0 {
		return errors.New("--bootstrap starts a new cluster and --join joins an existing one: give one")
	}
	if err := proto.CheckZone(o.Zone); err != nil {
		return fmt.Errorf("--zone: %w", err)
	}
	if o.MaxConns < 1 || o.MaxConnsPerHost < 1 {
		return fmt.Errorf("--max-conns %d, --max-conns-per-host %d: must be at least 1", o.MaxConns, o.MaxConnsPerHost)
	}
	if o.FrameTimeout <= 0 {
		return fmt.Errorf("--frame-timeout %v: must be positive", o.FrameTimeout)
	}
	if o.RaftVoters < 1 {
		return fmt.Errorf("--raft-voters %d: must be at least 1", o.RaftVoters)
	}
	if o.JoinTimeout < 0 {
		return fmt.Errorf("--join-timeout %v: must be 0 (one attempt) or positive", o.JoinTimeout)
	}
	if o.MoveTimeout <= 0 {
		return fmt.Errorf("--move-timeout %v: must be positive", o.MoveTimeout)
	}
	if o.MaxMoves < 1 || o.MaxMoves > proto.NumShards {
		return fmt.Errorf("--max-moves %d: must be 1 to %d", o.MaxMoves, proto.NumShards)
	}
	if o.FailoverTimeout <= 0 {
		return fmt.Errorf("--failover-timeout %v: must be positive", o.FailoverTimeout)
	}
	if o.ReadLease < 100*time.Millisecond {
		return fmt.Errorf("--read-lease %v: must be at least 100ms (it is renewed every quarter of it)", o.ReadLease)
	}
	if o.MaxClockDrift <= 0 || o.MaxClockDrift >= o.ReadLease {
		return fmt.Errorf("--max-clock-drift %v: must be positive and less than --read-lease (%v)", o.MaxClockDrift, o.ReadLease)
	}
	if o.BackupTimeout <= 0 {
		return fmt.Errorf("--backup-timeout %v: must be positive", o.BackupTimeout)
	}
	if o.DeadServerTimeout < 0 {
		return fmt.Errorf("--dead-server-timeout %v: must be 0 (never) or positive", o.DeadServerTimeout)
	}
	switch o.GossipProfile {
	case "local", "lan", "wan":
	default:
		return fmt.Errorf("--gossip-profile %q: want local, lan or wan", o.GossipProfile)
	}
	if err := secretFlag("gossip-key", &o.GossipKey, o.GossipKeyFile); err != nil {
		return err
	}
	if o.GossipKey != "" {
		if o.gossipKey, err = membership.ParseKey(o.GossipKey); err != nil {
			return fmt.Errorf("gossip key: %w", err)
		}
	}
	if err := secretFlag("auth-token", &o.AuthToken, o.AuthTokenFile); err != nil {
		return err
	}
	if err := secretFlag("peer-token", &o.PeerToken, o.PeerTokenFile); err != nil {
		return err
	}
	if len(o.PeerToken) > proto.MaxControlToken {
		return fmt.Errorf("--peer-token: %d bytes, more than a Hello carries (%d)", len(o.PeerToken), proto.MaxControlToken)
	}
	if o.PeerToken != "" && o.PeerToken == o.AuthToken {
		return errors.New("--peer-token is the same as --auth-token, which every client holds: give the servers a token of their own")
	}
	if o.tls, o.peerTLS, err = o.tlsConfig(); err != nil {
		return err
	}
	if o.MetricsAddr != "" {
		if _, _, err := splitHostPort(o.MetricsAddr); err != nil {
			return fmt.Errorf("--metrics-addr %q: %w", o.MetricsAddr, err)
		}
	} else if o.Pprof {
		return errors.New("--pprof serves on --metrics-addr: give one")
	}
	if err := o.level.UnmarshalText([]byte(o.LogLevel)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", o.LogLevel)
	}
	switch o.LogFormat {
	case "text", "json":
	default:
		return fmt.Errorf("--log-format %q: want text or json", o.LogFormat)
	}
	return nil
}

// tlsConfig loads --tls-cert, --tls-key and --tls-client-ca into the
// control listener's TLS configuration, and --tls-peer-ca with the same
// certificate into that of the connections to other servers; nil, nil
// when none is given.
func (o *options) tlsConfig() (listener, peer *tls.Config, err error) {
	if o.TLSCert == "" && o.TLSKey == "" {
		if o.TLSClientCA != "" || o.TLSPeerCA != "" {
			return nil, nil, errors.New("--tls-client-ca and --tls-peer-ca need --tls-cert and --tls-key")
		}
		return nil, nil, nil
	}
	if o.TLSCert == "" || o.TLSKey == "" {
		return nil, nil, errors.New("--tls-cert and --tls-key: give both or neither")
	}
	certFlag := tlsfiles.Flag{Name: "--tls-cert", Path: o.TLSCert}
	cert, err := tlsfiles.KeyPair(certFlag, tlsfiles.Flag{Name: "--tls-key", Path: o.TLSKey})
	if err != nil {
		return nil, nil, err
	}
	if err := tlsfiles.CheckValidity(certFlag, cert, time.Now()); err != nil {
		return nil, nil, err
	}
	listener = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
	if o.TLSClientCA != "" {
		if listener.ClientCAs, err = tlsfiles.CertPool(tlsfiles.Flag{Name: "--tls-client-ca", Path: o.TLSClientCA}); err != nil {
			return nil, nil, err
		}
		listener.ClientAuth = tls.RequireAndVerifyClientCert
	}
	peer = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}
	peerCA := tlsfiles.Flag{Name: "--tls-peer-ca", Path: o.TLSPeerCA}
	if peerCA.Path == "" {
		peerCA = tlsfiles.Flag{Name: "--tls-client-ca", Path: o.TLSClientCA}
	}
	if peerCA.Path != "" {
		if peer.RootCAs, err = tlsfiles.CertPool(peerCA); err != nil {
			return nil, nil, err
		}
	}
	return listener, peer, nil
}

// unspecified reports whether host means every interface: 0.0.0.0, ::
// or empty (":7950").
func unspecified(host string) bool {
	if host == "" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsUnspecified()
}

func splitHostPort(s string) (string, int, error) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return "", 0, errors.New("want host:port")
	}
	host := strings.TrimSuffix(strings.TrimPrefix(s[:i], "["), "]")
	port, err := strconv.Atoi(s[i+1:])
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", s[i+1:])
	}
	return host, port, nil
}

// size is a pflag.Value of a byte count with an optional binary suffix.
type size struct{ p *int64 }

func newSize(p *int64, def int64) *size { *p = def; return &size{p} }

func (s *size) String() string { return formatSize(*s.p) }
func (s *size) Type() string   { return "size" }
func (s *size) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	*s.p = n
	return nil
}

func parseSize(v string) (int64, error) {
	t := strings.TrimSpace(v)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, u.suffix)), u.m
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n <= 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("bad size %q (e.g. 1048576, 64MiB, 1GiB)", v)
	}
	return n * mult, nil
}

func formatSize(n int64) string {
	for _, u := range []struct {
		s string
		m int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return strconv.FormatInt(n/u.m, 10) + u.s
		}
	}
	return strconv.FormatInt(n, 10)
}

// secretFlag resolves a secret given either as --NAME or as --NAME-file
// (its content, trimmed). Both at once is an error, and so is an empty
// file: it would silently mean no secret (no gossip encryption, a server
// open to anyone, the clients' token opening sessions between servers).
func secretFlag(name string, value *string, file string) error {
	if file == "" {
		return nil
	}
	if *value != "" {
		return fmt.Errorf("--%s and --%s-file: give one", name, name)
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("--%s-file: %w", name, err)
	}
	if *value = strings.TrimSpace(string(b)); *value == "" {
		return fmt.Errorf("--%s-file %s is empty", name, file)
	}
	return nil
}
