package main

import (
	"bytes"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/testpki"
	"github.com/rkv-io/rkv/store"
)

// env is m as os.Environ lists it.
func env(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	return out
}

func TestOptionsPrecedence(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "node.conf")
	os.WriteFile(conf, []byte(`# a comment
name = from-file
arena-size = 32MiB   # inline comment
arena-count = 8
sync = "batch"
join = 10.0.0.1:7946,10.0.0.2:7946
log-level = debug
`), 0o600)
	o, err := parseOptions([]string{"--config", conf, "--arena-count", "2"},
		env(map[string]string{"RKV_ARENA_SIZE": "128MiB", "RKV_SYNC": "none"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.Name != "from-file" || o.ArenaCount != 2 || o.ArenaSize != 128<<20 || o.syncMode != store.SyncNone {
		t.Fatalf("precedence flag > env > file: %+v", o)
	}
	if len(o.Join) != 2 || o.Join[1] != "10.0.0.2:7946" || o.LogLevel != "debug" {
		t.Fatalf("file values: %+v", o)
	}
	if o.DataDir != "rkv-data/from-file" || o.Provider != "auto" || o.GossipAddr != "127.0.0.1:7946" || o.LeaseSize != 1<<20 || o.MaxMoves != 32 {
		t.Fatalf("defaults: %+v", o)
	}
	// RKV_CONFIG names the file too.
	o, err = parseOptions(nil, env(map[string]string{"RKV_CONFIG": conf, "RKV_NAME": "env-name"}), io.Discard)
	if err != nil || o.Name != "env-name" || o.ArenaCount != 8 {
		t.Fatalf("RKV_CONFIG: %+v, %v", o, err)
	}
}

func TestGossipKey(t *testing.T) {
	hexKey := strings.Repeat("ab", 16)
	o, err := parseOptions([]string{"--name", "n", "--gossip-key", hexKey}, env(nil), io.Discard)
	if err != nil || len(o.gossipKey) != 16 {
		t.Fatalf("hex key: %v %v", o, err)
	}
	f := filepath.Join(t.TempDir(), "key")
	os.WriteFile(f, []byte("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n"), 0o600) // 32 bytes base64
	o, err = parseOptions([]string{"--name", "n"}, env(map[string]string{"RKV_GOSSIP_KEY_FILE": f}), io.Discard)
	if err != nil || len(o.gossipKey) != 32 {
		t.Fatalf("key file: %v %v", o, err)
	}
	if _, err := parseOptions([]string{"--name", "n", "--gossip-key", "c2hvcnQ="}, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), "5 bytes") {
		t.Fatalf("short key: %v", err)
	}
}

func TestOptionsErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{nil, nil, "--name is required"},
		{[]string{"--name", "n", "--sync", "sometimes"}, nil, "--sync"},
		{[]string{"--name", "n", "--provider", "ib"}, nil, "--provider"},
		{[]string{"--name", "n", "--arena-size", "10MiB", "--lease-size", "3MiB"}, nil, "multiple of --lease-size"},
		{[]string{"--name", "n", "--arena-size", "lots"}, nil, "bad size"},
		{[]string{"--name", "n", "--registration-unit", "-4MiB"}, nil, "bad size"},
		{[]string{"--name", "n", "--arena-size", "64MiB", "--segment-size", "4MiB", "--registration-unit", "6MiB"}, nil, "multiple of --segment-size"},
		{[]string{"--name", "n", "--index-slots", "1000"}, nil, "power of two"},
		{[]string{"--name", "n", "--arena-size", "64MiB", "--lease-size", "16MiB", "--index-log-size", "32MiB"}, nil, "must hold 4 leases of --lease-size"},
		{[]string{"--name", "n", "--max-sessions", "0"}, nil, "--max-sessions 0: must be at least 1"},
		{[]string{"--name", "n", "--registration-nice", "20"}, nil, "--registration-nice 20: must be 0 to 19"},
		{[]string{"--name", "n", "--registration-nice", "-5"}, nil, "--registration-nice -5: must be 0 to 19"},
		{[]string{"--name", "n", "--verbs-spin", "-1us"}, nil, "--verbs-spin -1µs: must be 0 to 10ms"},
		{[]string{"--name", "n", "--verbs-spin", "1s"}, nil, "--verbs-spin 1s: must be 0 to 10ms"},
		{[]string{"--name", "n", "--gossip-addr", "nowhere"}, nil, "host:port"},
		{[]string{"--name", "n", "--gossip-key", "abcd"}, nil, "gossip key"},
		{[]string{"--name", "n", "--log-format", "xml"}, nil, "--log-format"},
		{[]string{"--name", "n", "extra"}, nil, "unexpected argument"},
		{[]string{"--name", "n", "--replicas", "0"}, nil, "--replicas 0: must be 1 to"},
		{[]string{"--name", "n", "--replicas", "17"}, nil, "--replicas 17: must be 1 to"},
		{[]string{"--name", "n", "--failover-timeout", "0s"}, nil, "--failover-timeout 0s: must be positive"},
		{[]string{"--name", "n", "--max-moves", "0"}, nil, "--max-moves 0: must be 1 to 1024"},
		{[]string{"--name", "n", "--max-moves", "1025"}, nil, "--max-moves 1025: must be 1 to 1024"},
		{[]string{"--name", "n", "--read-lease", "50ms"}, nil, "--read-lease 50ms: must be at least 100ms"},
		{[]string{"--name", "n", "--max-clock-drift", "5s"}, nil, "--max-clock-drift 5s: must be positive and less than --read-lease (4s)"},
		{[]string{"--name", "n", "--max-clock-drift", "0s"}, nil, "--max-clock-drift 0s: must be positive"},
		{[]string{"--name", "n", "--backup-timeout", "-1s"}, nil, "--backup-timeout -1s: must be positive"},
		{[]string{"--nmae", "n"}, nil, "unknown flag"},
		{[]string{"--name", "n"}, map[string]string{"RKV_ARENA_COUNT": "many"}, "RKV_ARENA_COUNT"},
	} {
		_, err := parseOptions(tc.args, env(tc.env), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v %v: error %v, want one containing %q", tc.args, tc.env, err, tc.want)
		}
	}
}

func TestConfigFileErrors(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]string{
		"name = n\nbogus = 1\n":    "unknown setting",
		"name = n\njust words\n":   "flag-name = value",
		"name = n\nname = m\n":     "set twice",
		"name = n\nconfig = x\n":   "do not nest",
		"name = n\nsync = maybe\n": "--sync",
	} {
		f := filepath.Join(dir, "c.conf")
		os.WriteFile(f, []byte(body), 0o600)
		if _, err := parseOptions([]string{"--config", f}, env(nil), io.Discard); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", body, err, want)
		}
	}
}

func TestRunExitCodes(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"--help"}, env(nil), io.Discard, &out, nil); code != exitOK || !strings.Contains(out.String(), "RKV_<FLAG>") {
		t.Fatalf("--help: %d\n%s", code, out.String())
	}
	out.Reset()
	if code := run([]string{"--sync", "x", "--name", "n"}, env(nil), io.Discard, &out, nil); code != exitUsage || !strings.Contains(out.String(), "--sync") {
		t.Fatalf("bad flag: %d %s", code, out.String())
	}
}

func TestSizes(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "64MiB": 64 << 20, "1G": 1 << 30, "256 KiB": 256 << 10} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if formatSize(64<<20) != "64MiB" || formatSize(1000) != "1000" {
		t.Error("formatSize")
	}
}

// handshake runs a TLS handshake between server and client configs over
// a pipe and returns the server's error.
func handshake(t *testing.T, server, client *tls.Config) error {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	_ = a.SetDeadline(time.Now().Add(10 * time.Second))
	_ = b.SetDeadline(time.Now().Add(10 * time.Second))
	done := make(chan error, 1)
	go func() {
		c := tls.Client(b, client)
		err := c.Handshake()
		if err == nil {
			_, err = c.Read(make([]byte, 1)) // TLS 1.3: the server's verdict on our certificate
		}
		done <- err
		b.Close()
	}()
	s := tls.Server(a, server)
	err := s.Handshake()
	a.Close()
	<-done
	return err
}

func TestTLSOptions(t *testing.T) {
	dir := t.TempDir()
	pki := testpki.New(t, "127.0.0.1")
	files := pki.WriteFiles(t, dir)
	if o, err := parseOptions([]string{"--name", "n"}, env(nil), io.Discard); err != nil || o.tls != nil {
		t.Fatalf("no TLS flags: TLS config %v, %v", o.tls, err)
	}
	o, err := parseOptions([]string{"--name", "n", "--tls-cert", files.ServerCert, "--tls-key", files.ServerKey}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c := o.tls; c == nil || len(c.Certificates) != 1 || c.MinVersion != tls.VersionTLS13 || c.ClientAuth != tls.NoClientCert || c.ClientCAs != nil {
		t.Fatalf("--tls-cert and --tls-key: %+v", o.tls)
	}

	// mTLS, from the environment and the config file.
	conf := filepath.Join(dir, "node.conf")
	if err := os.WriteFile(conf, []byte("name = n\ntls-client-ca = "+files.CA+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err = parseOptions([]string{"--config", conf},
		env(map[string]string{"RKV_TLS_CERT": files.ServerCert, "RKV_TLS_KEY": files.ServerKey}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c := o.tls; c == nil || c.MinVersion != tls.VersionTLS13 || c.ClientAuth != tls.RequireAndVerifyClientCert || c.ClientCAs == nil {
		t.Fatalf("with --tls-client-ca: %+v", o.tls)
	}
	client := pki.ClientConfig()
	client.ServerName = "127.0.0.1"
	if err := handshake(t, o.tls, client); err != nil {
		t.Fatalf("a client with a certificate from --tls-client-ca: %v", err)
	}
	client.Certificates = nil
	if err := handshake(t, o.tls, client); err == nil || !strings.Contains(err.Error(), "didn't provide a certificate") {
		t.Fatalf("a client without a certificate: %v", err)
	}
}

func TestTLSOptionErrors(t *testing.T) {
	dir := t.TempDir()
	files := testpki.New(t, "127.0.0.1").WriteFiles(t, dir)
	missing := filepath.Join(dir, "missing.pem")
	garbage := filepath.Join(dir, "garbage.pem")
	if err := os.WriteFile(garbage, []byte("not PEM\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want []string
	}{
		{[]string{"--tls-cert", files.ServerCert}, nil, []string{"--tls-cert and --tls-key: give both or neither"}},
		{nil, map[string]string{"RKV_TLS_KEY": files.ServerKey}, []string{"--tls-cert and --tls-key: give both or neither"}},
		{[]string{"--tls-client-ca", files.CA}, nil, []string{"--tls-client-ca and --tls-peer-ca need --tls-cert and --tls-key"}},
		{[]string{"--tls-cert", missing, "--tls-key", files.ServerKey}, nil, []string{"--tls-cert", missing, "no such file"}},
		{[]string{"--tls-cert", files.ServerCert, "--tls-key", missing}, nil, []string{"--tls-key", missing, "no such file"}},
		{[]string{"--tls-cert", garbage, "--tls-key", files.ServerKey}, nil, []string{garbage, "PEM data in certificate input"}},
		{[]string{"--tls-cert", files.ServerCert, "--tls-key", garbage}, nil, []string{garbage, "PEM data in key input"}},
		{[]string{"--tls-cert", files.ServerCert, "--tls-key", files.ClientKey}, nil, []string{files.ClientKey, "private key does not match public key"}},
		{[]string{"--tls-cert", files.ServerCert, "--tls-key", files.ServerKey, "--tls-client-ca", missing}, nil, []string{"--tls-client-ca", missing, "no such file"}},
		{[]string{"--tls-cert", files.ServerCert, "--tls-key", files.ServerKey, "--tls-client-ca", files.ServerKey}, nil, []string{"--tls-client-ca " + files.ServerKey + ": no PEM certificate"}},
	} {
		_, err := parseOptions(append([]string{"--name", "n"}, tc.args...), env(tc.env), io.Discard)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v %v: error %v, want one containing %q", tc.args, tc.env, err, w)
			}
		}
	}
	var out bytes.Buffer
	if code := run([]string{"--name", "n", "--tls-key", files.ServerKey}, env(nil), io.Discard, &out, nil); code != exitUsage || !strings.Contains(out.String(), "--tls-cert") {
		t.Fatalf("run with --tls-key alone: exit %d\n%s", code, out.String())
	}
}

// The peer token comes from --peer-token, RKV_PEER_TOKEN, a file
// (--peer-token-file, RKV_PEER_TOKEN_FILE) or the config file, like the
// auth token; one that could not separate the servers from the clients is
// refused.
func TestPeerTokenOptions(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "peer-token")
	os.WriteFile(file, []byte("from a file\n"), 0o600)
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	conf := filepath.Join(dir, "node.conf")
	os.WriteFile(conf, []byte("name = n\npeer-token = from the config\n"), 0o600)
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"--name", "n", "--peer-token", "flag"}, nil, "flag"},
		{[]string{"--name", "n"}, map[string]string{"RKV_PEER_TOKEN": "env"}, "env"},
		{[]string{"--name", "n", "--peer-token-file", file}, nil, "from a file"},
		{[]string{"--name", "n"}, map[string]string{"RKV_PEER_TOKEN_FILE": file}, "from a file"},
		{[]string{"--config", conf}, nil, "from the config"},
		{[]string{"--name", "n", "--auth-token", "a"}, nil, ""},
	} {
		o, err := parseOptions(tc.args, env(tc.env), io.Discard)
		if err != nil || o.PeerToken != tc.want {
			t.Errorf("%v %v: peer token %q, %v; want %q", tc.args, tc.env, o.PeerToken, err, tc.want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--peer-token", "a", "--peer-token-file", file}, "--peer-token and --peer-token-file: give one"},
		{[]string{"--peer-token-file", filepath.Join(dir, "missing")}, "--peer-token-file: open " + filepath.Join(dir, "missing")},
		{[]string{"--peer-token-file", empty}, "--peer-token-file " + empty + " is empty"},
		// Empty, the others' files would mean no secret at all.
		{[]string{"--auth-token-file", empty}, "--auth-token-file " + empty + " is empty"},
		{[]string{"--gossip-key-file", empty}, "--gossip-key-file " + empty + " is empty"},
		{[]string{"--auth-token", "a", "--auth-token-file", file}, "--auth-token and --auth-token-file: give one"},
		{[]string{"--peer-token", "same", "--auth-token", "same"}, "--peer-token is the same as --auth-token"},
		{[]string{"--peer-token", strings.Repeat("t", 1025)}, "--peer-token: 1025 bytes, more than a Hello carries (1024)"},
	} {
		var stderr bytes.Buffer
		if code := run(append([]string{"--name", "n"}, tc.args...), env(nil), io.Discard, &stderr, nil); code != exitUsage || !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, stderr.String(), exitUsage, tc.want)
		}
	}
}

// One WARN at start when a client credential would open sessions between
// servers (no peer token); none with a peer token, and the INFO alone
// when clients need no credential at all.
func TestCredentialLogs(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    options
		mTLS bool
		want []string // levels logged
	}{
		{"auth token, no peer token", options{AuthToken: "a"}, false, []string{"WARN"}},
		{"client certificates, no peer token", options{}, true, []string{"WARN"}},
		{"auth token and peer token", options{AuthToken: "a", PeerToken: "p"}, false, nil},
		{"no client credential", options{}, false, []string{"INFO"}},
	} {
		var b bytes.Buffer
		logCredentials(slog.New(slog.NewTextHandler(&b, nil)), &tc.o, tc.mTLS)
		var levels []string
		for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
			if _, rest, ok := strings.Cut(line, "level="); ok {
				levels = append(levels, strings.Fields(rest)[0])
			}
		}
		if !slices.Equal(levels, tc.want) || len(tc.want) == 1 && tc.want[0] == "WARN" && !strings.Contains(b.String(), "--peer-token") {
			t.Errorf("%s: logged %q, want levels %v (the WARN naming --peer-token)", tc.name, b.String(), tc.want)
		}
	}
}

// --replicas and --zone: their defaults, each source, and what is refused.
// --replicas reaches the server only when given, so that a restart without
// it says nothing about the map's count.
func TestReplicasAndZoneOptions(t *testing.T) {
	o, err := parseOptions([]string{"--name", "n"}, env(nil), io.Discard)
	if err != nil || o.Replicas != 3 || o.replicasGiven || o.Zone != "" {
		t.Fatalf("defaults: replicas %d (given %v), zone %q, %v", o.Replicas, o.replicasGiven, o.Zone, err)
	}
	o, err = parseOptions([]string{"--name", "n", "--replicas", "3", "--zone", "eu-west-1a"}, env(nil), io.Discard)
	if err != nil || o.Replicas != 3 || !o.replicasGiven || o.Zone != "eu-west-1a" {
		t.Fatalf("flags: replicas %d (given %v), zone %q, %v", o.Replicas, o.replicasGiven, o.Zone, err)
	}
	o, err = parseOptions([]string{"--name", "n"}, env(map[string]string{"RKV_REPLICAS": "1", "RKV_ZONE": "rack-2"}), io.Discard)
	if err != nil || o.Replicas != 1 || !o.replicasGiven || o.Zone != "rack-2" {
		t.Fatalf("environment: replicas %d (given %v), zone %q, %v", o.Replicas, o.replicasGiven, o.Zone, err)
	}
	conf := filepath.Join(t.TempDir(), "n.conf")
	os.WriteFile(conf, []byte("name = n\nreplicas = 16\nzone = \"rack-3\"\n"), 0o600)
	o, err = parseOptions([]string{"--config", conf}, env(nil), io.Discard)
	if err != nil || o.Replicas != 16 || !o.replicasGiven || o.Zone != "rack-3" {
		t.Fatalf("config file: replicas %d (given %v), zone %q, %v", o.Replicas, o.replicasGiven, o.Zone, err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--replicas", "0"}, "--replicas 0: must be 1 to 16"},
		{[]string{"--replicas", "17"}, "--replicas 17: must be 1 to 16"},
		{[]string{"--replicas", "-2"}, "--replicas -2: must be 1 to 16"},
		{[]string{"--replicas", "three"}, `invalid argument "three" for "--replicas"`},
		{[]string{"--zone", "rack 1"}, `--zone: zone "rack 1": ' ' is not allowed`},
		{[]string{"--zone", "a\tb"}, `--zone: zone "a\tb": '\t' is not allowed`},
		{[]string{"--zone", "\xff"}, `--zone: zone "\xff": not UTF-8`},
		{[]string{"--zone", strings.Repeat("z", 65)}, "65 bytes, at most 64"},
	} {
		_, err := parseOptions(append([]string{"--name", "n"}, tc.args...), env(nil), io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
	// The help says what the default is for, and what it will be.
	var out bytes.Buffer
	if code := run([]string{"--help"}, env(nil), io.Discard, &out, nil); code != exitOK ||
		!strings.Contains(out.String(), "--replicas int") || !strings.Contains(out.String(), "as many as there are servers when fewer") || !strings.Contains(out.String(), "(default 3)") ||
		!strings.Contains(out.String(), "--zone string") {
		t.Fatalf("--help: %d\n%s", code, out.String())
	}
}

// --registration-nice defaults to 10, and its 0 pins every unit at the
// server's priority: the Registrar's "none" (negative), not its default.
func TestRegistrationNice(t *testing.T) {
	o, err := parseOptions([]string{"--name", "n"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ flag, want int }{{o.RegistrationNice, 10}, {0, -1}, {19, 19}} {
		if got := registrationNice(tc.flag); got != tc.want {
			t.Errorf("--registration-nice %d gives BackgroundNice %d, want %d", tc.flag, got, tc.want)
		}
	}
}
