// Command rkv-client is rkv's command-line client: get, put, del, scan,
// owner, members, status, map, forget, replicas, bench against a cluster,
// and devices (the RDMA providers and devices this machine has). `rkv-client --help` documents
// the flags and exit codes.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/buildinfo"
	"github.com/rkv-io/rkv/internal/envflags"
	"github.com/rkv-io/rkv/rdma"
	_ "github.com/rkv-io/rkv/rdma/soft" // the pure-Go provider; verbs.go adds libibverbs under -tags verbs
)

// Exit codes.
const (
	exitOK          = 0
	exitNotFound    = 1
	exitUsage       = 2
	exitUnavailable = 3
	exitOther       = 4
)

const exitCodesHelp = `Exit codes:
  0  success
  1  key not found (get)
  2  usage: bad command, flag or argument
  3  unavailable: no server reachable, the key's server is down or
     unreachable, or the wait of members --expect-servers timed out
  4  any other error (refused by the server, too large, server full,
     unauthenticated, ...), or interrupted by SIGINT or SIGTERM (after
     leaving the cluster; a second signal exits at once)`

// exitError carries the exit code of a failed command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// classify maps a client error to its exit code.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var ee *exitError
	if errors.As(err, &ee) {
		return err
	}
	switch {
	case errors.Is(err, client.ErrNotFound):
		return &exitError{exitNotFound, err}
	case errors.Is(err, client.ErrUnavailable), errors.Is(err, errNoCluster):
		return &exitError{exitUnavailable, err}
	}
	return &exitError{exitOther, err}
}

func main() {
	// SIGINT (Ctrl-C) and SIGTERM cancel the command's context, so that
	// it unwinds through client.Close, which leaves the cluster: without
	// that, the servers would take the client for alive until failure
	// detection caught up. A second signal kills at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	os.Exit(run(ctx, os.Args[1:], os.Environ(), os.Stdin, os.Stdout, os.Stderr))
}

// run runs the command line args, with environ (os.Environ's "KEY=value"
// list) for the RKV_ variables, in ctx: when ctx ends (a signal), the
// command is cancelled and returns, closing its client.
func run(ctx context.Context, args []string, environ []string, stdin io.Reader, stdout, stderr io.Writer) int {
	env := envflags.Map(environ)
	g := &globals{env: env, getenv: func(k string) string { return env[k] }, stdin: stdin}
	root := newRoot(g)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if perr := g.stopRecording(); perr != nil && err == nil {
		err = &exitError{exitOther, perr}
	}
	g.closeDevice()
	if err == nil {
		return exitOK
	}
	if ctx.Err() != nil { // whatever the command made of it
		fmt.Fprintf(stderr, "rkv-client: interrupted (%v): %v\n", context.Cause(ctx), err)
		return exitOther
	}
	var ee *exitError
	if errors.As(err, &ee) {
		fmt.Fprintln(stderr, "rkv-client:", ee.err)
		return ee.code
	}
	// Anything else comes from cobra or the flags: a usage error.
	fmt.Fprintf(stderr, "rkv-client: %v\nrun 'rkv-client --help' for usage\n", err)
	return exitUsage
}

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "rkv-client",
		Short: "rkv's command-line client",
		Long: `rkv-client talks to an rkv cluster. It asks a server's control port
(--endpoints, any server's control address: its --control-addr, "control" in
its ready log line) for the servers, their memory regions and the cluster map,
in one round trip, then reads values one-sidedly with RDMA_READ and writes them
with RDMA_WRITE plus a commit. With --join (gossip addresses) instead, it joins
the cluster's gossip as a light member to learn the same, which costs about
250 ms more per command.

Global flags can also be set in the environment: RKV_ENDPOINTS, RKV_JOIN,
RKV_GOSSIP_KEY, RKV_GOSSIP_KEY_FILE, RKV_AUTH_TOKEN, RKV_OUTPUT, RKV_TIMEOUT,
RKV_PROVIDER... (RKV_<FLAG> in upper snake case; the flag wins, and
--endpoints or --join on the command line overrides both RKV_ENDPOINTS and
RKV_JOIN). An RKV_ variable that names no global flag is ignored with a
warning that names the one it most likely meant.

Keys are arguments as they are spelled, or hex or base64 with --key-encoding
(binary keys); JSON output gives a key that is not UTF-8 as key_base64.`,
		Example: `  export RKV_ENDPOINTS=127.0.0.1:7411     # a server's control address
  rkv-client put greeting hello
  echo -n world | rkv-client put planet
  rkv-client get greeting
  rkv-client scan --prefix gr --values
  rkv-client members --output json
  rkv-client --join 127.0.0.1:7946 members --all   # through gossip: clients too
  rkv-client bench --ops 2000 --value-size 256`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { // no command: what there is, as a usage error
			_ = cmd.Help()
			return &exitError{exitUsage, errors.New("no command given")}
		},
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			return g.finish(cmd)
		},
	}
	// --version prints the build: cobra answers it before any command
	// runs (no --endpoints needed).
	root.Version = buildinfo.Read().String()
	root.SetVersionTemplate("rkv-client {{.Version}}\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return err })
	root.SetUsageTemplate(root.UsageTemplate() + "\n" + exitCodesHelp + "\n")
	g.register(root.PersistentFlags())
	root.AddCommand(getCmd(g), putCmd(g), delCmd(g), mgetCmd(g), mputCmd(g), existsCmd(g), scanCmd(g), ownerCmd(g), membersCmd(g), statusCmd(g), mapCmd(g), forgetCmd(g), replicasCmd(g), shardsCmd(g),
		benchCmd(g), devicesCmd())
	return root
}

// devicesCmd is the command rkv-client had first: the providers compiled in
// and the devices each can open.
func devicesCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "devices",
		Short: "list the RDMA providers compiled in and their devices",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			for _, name := range rdma.Providers() {
				devs, err := rdma.ProviderDevices(name)
				if err != nil {
					fmt.Fprintf(out, "%-6s error: %v\n", name, err)
					continue
				}
				if len(devs) == 0 {
					fmt.Fprintf(out, "%-6s no devices\n", name)
				}
				for _, d := range devs {
					fmt.Fprintf(out, "%-6s %s\n", name, d)
				}
			}
			return nil
		},
	}
}

// envName is a flag's environment variable: RKV_AUTH_TOKEN for auth-token.
func envName(flag string) string { return envflags.Name(flag) }

// warnUnknownEnv writes a line to w for each RKV_ variable of env that
// names none of the global flags (the ones the environment may set), with
// the one it most likely meant: a misspelt RKV_ENDPOINT would otherwise be
// ignored without a word.
func warnUnknownEnv(w io.Writer, env map[string]string, fs *pflag.FlagSet) {
	for _, u := range envflags.Unknowns(env, fs) {
		if u.Closest != "" {
			fmt.Fprintf(w, "rkv-client: warning: %s names no global flag: ignored (did you mean %s, for --%s?)\n", u.Name, envName(u.Closest), u.Closest)
		} else {
			fmt.Fprintf(w, "rkv-client: warning: %s names no global flag: ignored (RKV_<FLAG> sets a global flag of rkv-client --help)\n", u.Name)
		}
	}
}

// applyEnv sets every flag of fs not given on the command line from its
// environment variable, if set.
func applyEnv(fs *pflag.FlagSet, getenv func(string) string, skip map[string]bool) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || skip[f.Name] {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("environment %s=%q: %w", envName(f.Name), v, e)
			}
		}
	})
	return err
}
