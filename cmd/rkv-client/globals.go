package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"runtime/trace"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/session"
	"github.com/rkv-io/rkv/internal/tlsfiles"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// errNoCluster wraps failures to join the cluster or to find a server in it.
var errNoCluster = errors.New("cluster unavailable")

// maxVerbsSpin bounds --verbs-spin (and rkv-server's): a longer spin is
// a busy poll.
const maxVerbsSpin = 10 * time.Millisecond

// maxSoftLinks bounds --soft-links.
const maxSoftLinks = 16

// globals are the flags every command takes.
type globals struct {
	env    map[string]string // the process environment
	getenv func(string) string
	stdin  io.Reader

	join          []string
	endpoints     []string
	gossipKey     string
	gossipKeyFile string
	authToken     string
	tlsCA         string
	tlsCert       string
	tlsKey        string
	output        string
	keyEncoding   string
	timeout       time.Duration
	provider      string
	device        string
	dataAddr      string
	softLinks     int
	verbsSpin     time.Duration
	bind          string
	logLevel      string
	conns         int
	cpuProfile    string
	traceFile     string

	profile *os.File    // open while --cpuprofile records
	trace   *os.File    // open while --trace records
	dev     rdma.Device // opened by the first connect, closed by run

	key   []byte
	level slog.Level
	tls   *tls.Config // nil without --tls-ca, --tls-cert and --tls-key
}

func (g *globals) register(fs *pflag.FlagSet) {
	fs.StringSliceVar(&g.endpoints, "endpoints", nil, "control addresses (host:port, a server's --control-addr) of cluster servers, comma separated: the client asks one for the servers and the map, without joining gossip (env RKV_ENDPOINTS)")
	fs.StringSliceVar(&g.join, "join", nil, "gossip addresses (host:port, a server's --gossip-addr) of cluster servers, comma separated: the client joins gossip as a light member (~250 ms more per command) (env RKV_JOIN)")
	fs.StringVar(&g.gossipKey, "gossip-key", "", "the cluster's gossip key, base64 or hex, with --join (env RKV_GOSSIP_KEY)")
	fs.StringVar(&g.gossipKeyFile, "gossip-key-file", "", "file holding the gossip key")
	fs.StringVar(&g.authToken, "auth-token", "", "token the servers require (env RKV_AUTH_TOKEN)")
	fs.StringVar(&g.tlsCA, "tls-ca", "", "PEM CA certificate(s) `file` verifying the servers' control certificates; enables TLS (env RKV_TLS_CA)")
	fs.StringVar(&g.tlsCert, "tls-cert", "", "PEM client certificate `file`, for servers requiring one (mTLS); needs --tls-key; enables TLS; one expired or not valid yet is a usage error")
	fs.StringVar(&g.tlsKey, "tls-key", "", "PEM private key `file` of --tls-cert")
	fs.StringVarP(&g.output, "output", "o", "table", "output format: table or json")
	fs.StringVar(&g.keyEncoding, "key-encoding", "raw", "how key arguments spell their bytes: raw, hex or base64 (for binary keys)")
	fs.DurationVar(&g.timeout, "timeout", 10*time.Second, "bound on joining the cluster, and on each operation")
	fs.StringVar(&g.provider, "provider", "auto", "RDMA provider: auto, soft or verbs")
	fs.StringVar(&g.device, "device", "", "RDMA device (default: the provider's first)")
	fs.StringVar(&g.dataAddr, "data-addr", "127.0.0.1:0", "soft provider's local data endpoint")
	fs.DurationVar(&g.verbsSpin, "verbs-spin", client.VerbsSpin, "verbs provider: how long a request's wait polls for its completion before it sleeps on the completion channel (an interrupt and a wake-up more); 0 to 10ms, 0: sleep at once")
	fs.IntVar(&g.softLinks, "soft-links", client.SoftLinks, "soft provider's TCP links to each server: the connections' read QPs spread over them, and requests in flight at once take connections on distinct links (GETs then read their own answers), while their write QPs share one (commits arrive together)")
	fs.StringVar(&g.bind, "bind", "127.0.0.1:0", "local gossip address with --join; servers must reach it by UDP and TCP")
	fs.IntVar(&g.conns, "conns", 0, "connections to each server: the requests in flight per server (default 4; bench: its concurrency)")
	fs.StringVar(&g.cpuProfile, "cpuprofile", "", "write a Go CPU profile of the command to this file (go tool pprof)")
	fs.StringVar(&g.traceFile, "trace", "", "write a Go execution trace of the command to this file (go tool trace): where each goroutine waited, and for what")
	fs.StringVar(&g.logLevel, "log-level", "error", "client library log level: debug, info, warn, error")
}

// finish applies the environment and checks the global flags.
func (g *globals) finish(cmd *cobra.Command) error {
	// --endpoints and --join say how to find the cluster: one given on
	// the command line overrides both variables, so that RKV_JOIN in the
	// environment does not make --endpoints ambiguous.
	fs := cmd.Root().PersistentFlags()
	skip := map[string]bool{}
	if fs.Changed("endpoints") || fs.Changed("join") {
		skip["endpoints"], skip["join"] = true, true
	}
	if err := applyEnv(fs, g.getenv, skip); err != nil {
		return err
	}
	warnUnknownEnv(cmd.ErrOrStderr(), g.env, fs)
	if len(g.endpoints) > 0 && len(g.join) > 0 {
		return errors.New("--endpoints (control addresses, no gossip) and --join (gossip addresses): give one (or one of RKV_ENDPOINTS and RKV_JOIN)")
	}
	switch g.output {
	case "table", "json":
	default:
		return fmt.Errorf("--output %q: want table or json", g.output)
	}
	if _, ok := keyEncodings[g.keyEncoding]; !ok {
		return fmt.Errorf("--key-encoding %q: want raw, hex or base64", g.keyEncoding)
	}
	if g.timeout <= 0 {
		return fmt.Errorf("--timeout %v: must be positive", g.timeout)
	}
	if g.conns < 0 {
		return fmt.Errorf("--conns %d: must not be negative", g.conns)
	}
	if g.verbsSpin < 0 || g.verbsSpin > maxVerbsSpin {
		return fmt.Errorf("--verbs-spin %v: want 0 to %v", g.verbsSpin, maxVerbsSpin)
	}
	if g.softLinks < 1 || g.softLinks > maxSoftLinks {
		return fmt.Errorf("--soft-links %d: want 1 to %d", g.softLinks, maxSoftLinks)
	}
	var err error
	if g.profile, err = record(g.cpuProfile, "--cpuprofile", pprof.StartCPUProfile); err != nil {
		return err
	}
	if g.trace, err = record(g.traceFile, "--trace", trace.Start); err != nil {
		return err
	}
	if err := g.level.UnmarshalText([]byte(g.logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", g.logLevel)
	}
	// What logs through slog's default logger (a library given no
	// Logger) shares the command's handler and level.
	slog.SetDefault(slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: g.level})))
	if g.gossipKey != "" && g.gossipKeyFile != "" {
		return errors.New("--gossip-key and --gossip-key-file: give one")
	}
	k := g.gossipKey
	if g.gossipKeyFile != "" {
		b, err := os.ReadFile(g.gossipKeyFile)
		if err != nil {
			return fmt.Errorf("--gossip-key-file: %w", err)
		}
		k = strings.TrimSpace(string(b))
	}
	if k != "" {
		if g.key, err = membership.ParseKey(k); err != nil {
			return fmt.Errorf("gossip key: %w", err)
		}
	}
	g.tls, err = g.tlsConfig()
	return err
}

// tlsConfig loads --tls-ca, --tls-cert and --tls-key into the TLS
// configuration of the control connections; nil when none is given.
// Without --tls-ca the system's roots verify the servers.
func (g *globals) tlsConfig() (*tls.Config, error) {
	if g.tlsCA == "" && g.tlsCert == "" && g.tlsKey == "" {
		return nil, nil
	}
	if (g.tlsCert == "") != (g.tlsKey == "") {
		return nil, errors.New("--tls-cert and --tls-key: give both or neither")
	}
	c := &tls.Config{MinVersion: tls.VersionTLS13}
	if g.tlsCA != "" {
		var err error
		if c.RootCAs, err = tlsfiles.CertPool(tlsfiles.Flag{Name: "--tls-ca", Path: g.tlsCA}); err != nil {
			return nil, err
		}
	}
	if g.tlsCert != "" {
		certFlag := tlsfiles.Flag{Name: "--tls-cert", Path: g.tlsCert}
		cert, err := tlsfiles.KeyPair(certFlag, tlsfiles.Flag{Name: "--tls-key", Path: g.tlsKey})
		if err != nil {
			return nil, err
		}
		// As rkv-server does at start: an expired or not yet valid
		// certificate would otherwise surface as the server's "bad
		// certificate" at the handshake, naming neither file nor dates.
		if err := tlsfiles.CheckValidity(certFlag, cert, time.Now()); err != nil {
			return nil, err
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// record creates path, when given, and starts a recording into it; flag
// names it in errors.
func record(path, flag string, start func(io.Writer) error) (*os.File, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if err := start(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	return f, nil
}

// stopRecording ends --cpuprofile's and --trace's recordings, if they run.
func (g *globals) stopRecording() error {
	var errs []error
	if g.profile != nil {
		pprof.StopCPUProfile()
		errs = append(errs, g.profile.Close())
		g.profile = nil
	}
	if g.trace != nil {
		trace.Stop()
		errs = append(errs, g.trace.Close())
		g.trace = nil
	}
	return errors.Join(errs...)
}

// connect makes a client: with --endpoints it asks a server for the view
// and the map, with --join it joins gossip.
func (g *globals) connect(cmd *cobra.Command) (*client.Client, error) {
	if len(g.join) == 0 && len(g.endpoints) == 0 {
		return nil, &exitError{exitUsage, errors.New("no cluster given: --endpoints host:port (a server's control address) or RKV_ENDPOINTS; or --join host:port (a gossip address) or RKV_JOIN")}
	}
	log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: g.level}))
	cfg := client.Config{
		AuthToken:      g.authToken,
		TLS:            g.tls,
		RetryTimeout:   min(g.timeout, 2*time.Second),
		ConnsPerServer: g.conns,
		Logger:         log,
	}
	via := "--endpoints " + strings.Join(g.endpoints, ",")
	if len(g.endpoints) > 0 {
		cfg.Endpoints = g.endpoints
	} else {
		host, port, err := splitHostPort(g.bind)
		if err != nil {
			return nil, &exitError{exitUsage, fmt.Errorf("--bind %q: %w", g.bind, err)}
		}
		cfg.Seeds, cfg.SecretKey = g.join, g.key
		cfg.Membership = membership.Config{BindAddr: host, BindPort: port, SecretKeySetting: "--gossip-key or RKV_GOSSIP_KEY"}
		via = "--join " + strings.Join(g.join, ",")
	}
	if g.dev == nil {
		dev, err := rdma.Open(g.provider, g.device, rdma.Options{ListenAddr: g.dataAddr, Links: g.softLinks, Spin: g.verbsSpin, Logger: log})
		if err != nil {
			return nil, &exitError{exitOther, fmt.Errorf("opening the RDMA device (--provider %s): %w", g.provider, err)}
		}
		g.dev = dev
	}
	cfg.Device = g.dev
	ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
	defer cancel()
	c, err := client.New(ctx, cfg)
	if err == nil {
		return c, nil
	}
	if cmd.Context().Err() == nil {
		if hint := g.wrongPort(cmd.Context(), err); hint != nil {
			return nil, &exitError{exitUsage, hint}
		}
	}
	switch {
	case errors.Is(err, client.ErrUnauthenticated):
		return nil, &exitError{exitOther, fmt.Errorf("connecting through %s: %w", via, err)}
	case errors.Is(err, context.DeadlineExceeded) && cmd.Context().Err() == nil:
		return nil, &exitError{exitUnavailable, fmt.Errorf("%w: timed out after %v (--timeout) connecting through %s: %w", errNoCluster, g.timeout, via, err)}
	default:
		return nil, &exitError{exitUnavailable, fmt.Errorf("%w: connecting through %s: %w", errNoCluster, via, err)}
	}
}

// wrongPort explains a failed start caused by an address given to the
// wrong flag, in one line: a gossip address in --endpoints (the client
// saw it close the connection at the Hello), or a control address in
// --join (it answers a Hello). nil when neither is the case.
func (g *globals) wrongPort(ctx context.Context, err error) error {
	if len(g.endpoints) > 0 {
		if errors.Is(err, client.ErrNotControlPort) {
			return fmt.Errorf("--endpoints %s: not a control port (the connection was closed at the Hello, as a gossip port does); --endpoints wants servers' control addresses (--control-addr, \"control\" in a server's ready line), --join takes gossip addresses",
				strings.Join(g.endpoints, ","))
		}
		return nil
	}
	for _, addr := range g.join {
		if name, ok := probeControlPort(ctx, addr, g.tls); ok {
			return fmt.Errorf("--join %s: a control port (of %s), not a gossip address: give it to --endpoints, or give --join a server's --gossip-addr", addr, name)
		}
	}
	return nil
}

// probeControlPort reports whether addr answers a Hello as an rkv control
// port does, and the server's name when it says it: with a HelloReply or
// with one of its Errors (a wrong token, TLS only).
func probeControlPort(ctx context.Context, addr string, tlsConfig *tls.Config) (string, bool) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	s, err := session.Dial(ctx, addr, "", session.Config{Name: "rkv-client-probe", Kind: proto.SessionClient, TLS: tlsConfig, DialTimeout: time.Second})
	if err == nil {
		_ = s.Close()
		return s.Hello.Server, true
	}
	if _, ok := errors.AsType[*proto.Error](err); ok {
		return "a server", true
	}
	return "", false
}

// closeDevice closes the RDMA device the clients used, once they are
// closed.
func (g *globals) closeDevice() {
	if g.dev != nil {
		_ = g.dev.Close()
		g.dev = nil
	}
}

// withClient runs fn with a connected client and an operation context,
// then closes the client.
func (g *globals) withClient(cmd *cobra.Command, fn func(ctx context.Context, c *client.Client) error) error {
	c, err := g.connect(cmd)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
	defer cancel()
	err = fn(ctx, c)
	if errors.Is(err, context.DeadlineExceeded) && cmd.Context().Err() == nil {
		err = fmt.Errorf("timed out after %v (--timeout): %w", g.timeout, err)
	}
	return classify(err)
}

func splitHostPort(s string) (string, int, error) {
	i := strings.LastIndex(s, ":")
	if i < 0 {
		return "", 0, errors.New("want host:port")
	}
	var port int
	if _, err := fmt.Sscanf(s[i+1:], "%d", &port); err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", s[i+1:])
	}
	return strings.Trim(s[:i], "[]"), port, nil
}
