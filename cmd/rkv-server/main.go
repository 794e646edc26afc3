// Command rkv-server runs one rkv server: an RDMA device (soft or verbs), the
// store whose arenas and hash index clients read one-sidedly, the control
// RPC listener, and the cluster's gossip. `rkv-server --help` documents the
// flags, their environment variables and the config file.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rkv-io/rkv/internal/buildinfo"
	"github.com/rkv-io/rkv/internal/tlsfiles"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/rdma"
	_ "github.com/rkv-io/rkv/rdma/soft"
	"github.com/rkv-io/rkv/server"
	"github.com/rkv-io/rkv/store"
)

// Exit statuses.
const (
	exitOK    = 0
	exitError = 1 // failed to start, or to shut down cleanly; second signal
	exitUsage = 2 // bad flags or configuration
)

func main() {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr, sigs))
}

// run is the whole command; main only supplies the process's arguments,
// environment, stdout (--version), stderr and signals.
func run(args []string, environ []string, stdout, stderr io.Writer, sigs <-chan os.Signal) int {
	o, err := parseOptions(args, environ, stderr)
	if errors.Is(err, errHelp) {
		return exitOK
	}
	if errors.Is(err, errVersion) {
		fmt.Fprintln(stdout, "rkv-server", buildinfo.Read())
		return exitOK
	}
	if _, ok := errors.AsType[*tlsfiles.InvalidError](err); ok {
		// The flags are right; what they name cannot serve.
		fmt.Fprintf(stderr, "rkv-server: cannot start: %v\n", err)
		return exitError
	}
	if err != nil {
		fmt.Fprintf(stderr, "rkv-server: %v\nrun 'rkv-server --help' for the flags\n", err)
		return exitUsage
	}
	var h slog.Handler
	hopts := &slog.HandlerOptions{Level: o.level}
	if o.LogFormat == "json" {
		h = slog.NewJSONHandler(stderr, hopts)
	} else {
		h = slog.NewTextHandler(stderr, hopts)
	}
	log := slog.New(h)
	for _, w := range o.envWarnings {
		if w.Closest != "" {
			log.Warn("unknown environment variable: ignored", "name", w.Name, "did_you_mean", envName(w.Closest), "flag", "--"+w.Closest)
		} else {
			log.Warn("unknown environment variable: ignored (RKV_<FLAG> names a flag of rkv-server --help)", "name", w.Name)
		}
	}

	if err := os.MkdirAll(o.DataDir, 0o750); err != nil {
		log.Error("creating the data directory", "dir", o.DataDir, "err", err)
		return exitError
	}
	dev, err := rdma.Open(o.Provider, o.Device, rdma.Options{ListenAddr: o.DataAddr, Spin: o.VerbsSpin, Logger: log})
	if err != nil {
		log.Error("opening the RDMA device", "provider", o.Provider, "device", o.Device, "err", err)
		return exitError
	}
	defer dev.Close()
	cfg := server.Config{
		Name:        o.Name,
		Device:      dev,
		ControlAddr: o.ControlAddr,
		Store: store.Options{
			Dir:              o.DataDir,
			ArenaSize:        o.ArenaSize,
			ArenaCount:       o.ArenaCount,
			MaxArenaCount:    o.MaxArenaCount,
			IndexSlots:       o.IndexSlots,
			MaxIndexSlots:    o.MaxIndexSlots,
			MaxSessions:      o.MaxSessions,
			LeaseSize:        o.LeaseSize,
			SegmentSize:      o.SegmentSize,
			Sync:             o.syncMode,
			IndexLogSize:     o.IndexLogSize,
			RegistrationUnit: o.RegistrationUnit,
		},
		Membership: membership.Config{
			BindAddr:         o.gossipIP,
			BindPort:         o.gossipPrt,
			Seeds:            o.Join,
			JoinTimeout:      o.JoinTimeout,
			SecretKey:        o.gossipKey,
			SecretKeySetting: "--gossip-key or --gossip-key-file",
			Tuning:           membership.Tuning{Profile: membership.Profile(o.GossipProfile)},
		},
		Bootstrap:         o.Bootstrap,
		MaxConns:          o.MaxConns,
		MaxConnsPerHost:   o.MaxConnsPerHost,
		FrameTimeout:      o.FrameTimeout,
		Voters:            o.RaftVoters,
		MoveTimeout:       o.MoveTimeout,
		MaxMoves:          o.MaxMoves,
		FailoverTimeout:   o.FailoverTimeout,
		ReadLease:         o.ReadLease,
		MaxClockDrift:     o.MaxClockDrift,
		BackupTimeout:     o.BackupTimeout,
		ForwardOnQP:       o.ForwardOnQP,
		DeadServerTimeout: o.DeadServerTimeout,
		Zone:              o.Zone,
		AuthToken:         o.AuthToken,
		PeerToken:         o.PeerToken,
		TLS:               o.tls,
		PeerTLS:           o.peerTLS,
		Logger:            log,
		Registrar:         rdma.RegistrarOptions{Workers: o.RegistrationWorkers, BackgroundNice: registrationNice(o.RegistrationNice)},
	}

	if o.replicasGiven || o.Bootstrap { // else the map's: a restart or a join without the flag logs nothing about it
		cfg.Replicas = o.Replicas
	}

	// A signal during the start cancels it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan struct{})
	interrupted := make(chan os.Signal, 1)
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		select {
		case s := <-sigs:
			interrupted <- s
			cancel()
		case <-started:
		}
	}()
	t0 := time.Now()
	srv, err := server.New(ctx, cfg)
	close(started)
	<-watching
	if err != nil {
		select {
		case s := <-interrupted:
			log.Info("interrupted while starting", "signal", s.String(), "err", err)
		default:
			log.Error("starting the server", "err", err)
		}
		return exitError
	}
	select {
	case s := <-interrupted: // the start finished, but a signal came in
		log.Info("shutting down", "signal", s.String())
		if err := srv.Close(); err != nil {
			log.Error("shutdown", "err", err)
			return exitError
		}
		return exitOK
	default:
	}
	meta := srv.Meta()
	log.Info("rdma device", "provider", meta.Provider, "device", srv.DeviceName(), "requested", o.Provider)
	mTLS := o.tls != nil && o.tls.ClientAuth == tls.RequireAndVerifyClientCert
	if o.tls != nil {
		log.Info("control port speaks TLS only", "cert", o.TLSCert, "client_certificates_required", mTLS)
	}
	logCredentials(log, o, mTLS)

	var metrics *http.Server
	metricsErr := make(chan error, 1)
	if o.MetricsAddr != "" {
		ln, err := net.Listen("tcp", o.MetricsAddr)
		if err != nil {
			log.Error("metrics listener", "addr", o.MetricsAddr, "err", err)
			_ = srv.Close()
			return exitError
		}
		metrics = &http.Server{Handler: newMetricsMux(metricsHandler(srv, h), srv.Ready, o.Pprof), ReadHeaderTimeout: 10 * time.Second,
			ErrorLog: slog.NewLogLogger(h, slog.LevelError)}
		go func() { metricsErr <- metrics.Serve(ln) }()
		log.Info("metrics", "addr", "http://"+ln.Addr().String()+"/metrics", "health", "/healthz", "readiness", "/readyz", "pprof", o.Pprof)
	}

	log.Info("ready", "name", srv.Name(), "control", srv.ControlAddr(), "gossip", srv.GossipAddr(),
		"data", meta.Endpoint.String(), "provider", meta.Provider, "generation", srv.Generation(),
		"data_dir", o.DataDir, "took", time.Since(t0).Round(time.Millisecond))
	arenasDone := make(chan struct{})
	go logArenas(srv, log, t0, arenasDone)

	var sig os.Signal
	clean := false // a stop that is not a failure
	select {
	case sig = <-sigs:
		clean = true
	case err := <-metricsErr:
		log.Error("metrics server failed", "err", err)
	case err := <-srv.Err():
		if clean = errors.Is(err, server.ErrRemoved); clean {
			log.Info("removed from the cluster map: stopping", "reason", err)
		} else {
			log.Error("cannot serve", "err", err)
		}
	}
	close(arenasDone)
	log.Info("shutting down: no new leases, finishing commits, deregistering memory, leaving gossip", "signal", fmt.Sprint(sig))
	done := make(chan error, 1)
	go func() {
		if metrics != nil {
			sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
			_ = metrics.Shutdown(sctx)
			scancel()
		}
		done <- srv.Close()
	}()
	select {
	case err := <-done:
		if err != nil {
			log.Error("shutdown", "err", err)
			return exitError
		}
		log.Info("stopped")
		if !clean {
			return exitError
		}
		return exitOK
	case s := <-sigs:
		log.Warn("second signal: exiting at once", "signal", s.String())
		return exitError
	}
}

// logCredentials says at start what the clients' credentials open: with
// none, everything (INFO); without a peer token, sessions between servers
// too (WARN, once).
func logCredentials(log *slog.Logger, o *options, mTLS bool) {
	switch {
	case o.AuthToken == "" && !mTLS:
		log.Info("no --auth-token or --tls-client-ca: any client that reaches the control address may read and write")
	case o.PeerToken == "":
		log.Warn("no --peer-token: a client's --auth-token or certificate also opens sessions between servers (shard scans, fences, releases, map changes, Raft); give every server the same --peer-token")
	}
}

// logArenas logs once every arena is registered (and so advertised).
func logArenas(srv *server.Server, log *slog.Logger, t0 time.Time, stop <-chan struct{}) {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		st := srv.Store().Stats()
		n := 0
		for _, a := range st.Arenas {
			if a.Registered {
				n++
			}
		}
		if n == len(st.Arenas) {
			rs := srv.RegistrarStats()
			log.Info("arenas registered", "count", n, "registered_bytes", rs.Bytes, "keys", st.Keys,
				"took", time.Since(t0).Round(time.Millisecond))
			return
		}
		select {
		case <-stop:
			return
		case <-tick.C:
		}
	}
}

// registrationNice is rdma.RegistrarOptions.BackgroundNice for
// --registration-nice n, whose 0 means none rather than the default.
func registrationNice(n int) int {
	if n == 0 {
		return -1
	}
	return n
}
