package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/internal/testpki"
	"github.com/rkv-io/rkv/server"
)

func runCLI(env map[string]string, args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := run(context.Background(), args, environOf(env), strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
}

// environOf is env as os.Environ's list.
func environOf(env map[string]string) []string {
	var out []string
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

func TestUsageExitCodes(t *testing.T) {
	for _, args := range [][]string{
		{"get"}, {"put"}, {"get", "a", "b"}, {"frobnicate"}, {"--output", "yaml", "get", "k"},
		{"scan", "--prefix", "a", "--start", "b"}, {"--timeout", "soon", "members"}, {"get", "k"}, // no --join
		{"--gossip-key", "nope", "get", "k"},
	} {
		if _, errs, code := runCLI(nil, args...); code != exitUsage || errs == "" {
			t.Errorf("%v: exit %d (stderr %q), want %d", args, code, errs, exitUsage)
		}
	}
}

func TestHelpListsExitCodes(t *testing.T) {
	out, _, code := runCLI(nil, "--help")
	if code != 0 || !strings.Contains(out, "Exit codes") || !strings.Contains(out, "unavailable") {
		t.Fatalf("--help: %d\n%s", code, out)
	}
}

func TestEnvAndUnreachableCluster(t *testing.T) {
	// RKV_JOIN is used (no usage error), and an unreachable seed is exit 3.
	_, errs, code := runCLI(map[string]string{"RKV_JOIN": "127.0.0.1:1", "RKV_TIMEOUT": "2s"}, "get", "k")
	if code != exitUnavailable || !strings.Contains(errs, "127.0.0.1:1") {
		t.Fatalf("unreachable seed: exit %d, %q", code, errs)
	}
}

// A timeout too short says it is one, and which flag sets it.
func TestTimeoutSaysTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	// A deadline already past when the client starts: a millisecond raced
	// a join and a GET that both finished within it.
	env := map[string]string{"RKV_JOIN": startServerWith(t, nil, nil), "RKV_TIMEOUT": "1ns"}
	if _, errs, code := runCLI(env, "get", "k"); code != exitUnavailable || !strings.Contains(errs, "timed out after 1ns (--timeout)") {
		t.Fatalf("RKV_TIMEOUT=1ns: exit %d, %q", code, errs)
	}
}

func TestDevices(t *testing.T) {
	out, _, code := runCLI(nil, "devices")
	if code != 0 || !strings.Contains(out, "soft") {
		t.Fatalf("devices: %d %q", code, out)
	}
}

// Flags out of their bounds are usage errors naming the flag and the
// bounds, before any connection (the seed is unreachable).
func TestFlagBounds(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--verbs-spin", "-1us"}, "--verbs-spin -1µs: want 0 to 10ms"},
		{[]string{"--verbs-spin", "11ms"}, "--verbs-spin 11ms: want 0 to 10ms"},
		{[]string{"--soft-links", "0"}, "--soft-links 0: want 1 to"},
	} {
		args := append(append([]string{"--join", "127.0.0.1:1"}, tc.args...), "get", "k")
		if _, errs, code := runCLI(nil, args...); code != exitUsage || !strings.Contains(errs, tc.want) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, errs, exitUsage, tc.want)
		}
	}
}

func TestTLSFlagErrors(t *testing.T) {
	dir := t.TempDir()
	files := testpki.New(t, "127.0.0.1").WriteFiles(t, dir)
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want []string
	}{
		{nil, []string{"--tls-cert", files.ClientCert}, []string{"--tls-cert and --tls-key: give both or neither"}},
		{map[string]string{"RKV_TLS_KEY": files.ClientKey}, []string{"--tls-ca", files.CA}, []string{"--tls-cert and --tls-key: give both or neither"}},
		{nil, []string{"--tls-ca", missing}, []string{"--tls-ca", missing, "no such file"}},
		{map[string]string{"RKV_TLS_CA": files.ClientKey}, nil, []string{"--tls-ca " + files.ClientKey + ": no PEM certificate"}},
		{nil, []string{"--tls-cert", missing, "--tls-key", files.ClientKey}, []string{"--tls-cert", missing, "no such file"}},
		{nil, []string{"--tls-cert", files.ClientCert, "--tls-key", missing}, []string{"--tls-key", missing, "no such file"}},
		{nil, []string{"--tls-cert", files.CA, "--tls-key", files.ClientKey}, []string{files.CA, files.ClientKey, "private key does not match public key"}},
		{nil, []string{"--tls-cert", files.ClientKey, "--tls-key", files.ClientKey}, []string{files.ClientKey, "PEM data in certificate input"}},
	} {
		args := append(append([]string{"--join", "127.0.0.1:1"}, tc.args...), "get", "k")
		_, errs, code := runCLI(tc.env, args...)
		if code != exitUsage {
			t.Errorf("%v %v: exit %d, want %d (stderr %q)", tc.env, tc.args, code, exitUsage, errs)
		}
		for _, w := range tc.want {
			if !strings.Contains(errs, w) {
				t.Errorf("%v %v: stderr %q, want it to contain %q", tc.env, tc.args, errs, w)
			}
		}
	}
}

// TestTLSCertificateCheckedAtStart: a --tls-cert that has expired or is
// not valid yet fails the command at once as a usage error (exit 2) naming
// the file and the dates, before any connection: the seed here is
// unreachable, which would otherwise be exit 3.
func TestTLSCertificateCheckedAtStart(t *testing.T) {
	now := time.Now()
	expired := testpki.NewValid(t, now.Add(-48*time.Hour), now.Add(-24*time.Hour), "127.0.0.1").WriteFiles(t, t.TempDir())
	early := testpki.NewValid(t, now.Add(24*time.Hour), now.Add(48*time.Hour), "127.0.0.1").WriteFiles(t, t.TempDir())
	day := func(d time.Duration) string { return now.Add(d).UTC().Format(time.RFC3339)[:10] }
	for _, tc := range []struct {
		name  string
		files testpki.Files
		want  []string
	}{
		{"expired", expired, []string{"--tls-cert " + expired.ClientCert, "has expired", "valid from " + day(-48*time.Hour), "to " + day(-24*time.Hour), "now is " + day(0)}},
		{"not valid yet", early, []string{"--tls-cert " + early.ClientCert, "is not valid yet", "valid from " + day(24*time.Hour), "to " + day(48*time.Hour)}},
	} {
		_, errs, code := runCLI(map[string]string{"RKV_JOIN": "127.0.0.1:1", "RKV_TIMEOUT": "2s"},
			"--tls-ca", tc.files.CA, "--tls-cert", tc.files.ClientCert, "--tls-key", tc.files.ClientKey, "get", "k")
		if code != exitUsage {
			t.Errorf("%s: exit %d, want %d (stderr %q)", tc.name, code, exitUsage, errs)
		}
		for _, w := range tc.want {
			if !strings.Contains(errs, w) {
				t.Errorf("%s: stderr %q, want it to contain %q", tc.name, errs, w)
			}
		}
	}
}

// startServerWith runs one rkv server in-process with tlsConfig on its
// control port (nil: plaintext) and returns its gossip address once it
// serves.
func startServerWith(t *testing.T, tlsConfig, peerTLS *tls.Config) string {
	t.Helper()
	return startServer(t, tlsConfig, peerTLS).GossipAddr()
}

// startServer runs one rkv server in-process, a cluster of its own, with
// tlsConfig on its control port and peerTLS for its connections to other
// servers (nil: plaintext), and returns it once it serves.
func startServer(t *testing.T, tlsConfig, peerTLS *tls.Config) *server.Server {
	t.Helper()
	c := testcluster.Start(t, 1, testcluster.Options{Server: func(c *server.Config) {
		c.TLS, c.PeerTLS = tlsConfig, peerTLS
		c.Membership.BindAddr = "127.0.0.1"
	}})
	return c.Server("s1")
}

// TestTLSAgainstAServer: against a server requiring client certificates,
// the TLS flags (or their environment variables) work, and a client
// without a certificate, without TLS or without the CA fails naming the
// problem.
func TestTLSAgainstAServer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	pki := testpki.New(t, "127.0.0.1")
	files := pki.WriteFiles(t, t.TempDir())
	join := startServerWith(t, pki.ServerConfig(), pki.ClientConfig())

	if out, errs, code := runCLI(map[string]string{"RKV_JOIN": join}, "--tls-ca", files.CA, "--tls-cert", files.ClientCert, "--tls-key", files.ClientKey,
		"put", "greeting", "hello"); code != exitOK {
		t.Fatalf("put with the TLS flags: exit %d\n%s\n%s", code, out, errs)
	}
	tlsEnv := map[string]string{"RKV_JOIN": join, "RKV_TLS_CA": files.CA, "RKV_TLS_CERT": files.ClientCert, "RKV_TLS_KEY": files.ClientKey}
	if out, errs, code := runCLI(tlsEnv, "get", "greeting"); code != exitOK || out != "hello" {
		t.Fatalf("get with RKV_TLS_*: exit %d, %q\n%s", code, out, errs)
	}

	// A refused certificate is final, like a wrong token (exit 4), and
	// so is the server's plaintext refusal.
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"no client certificate", []string{"--tls-ca", files.CA}, exitOther, "remote error: tls: certificate required"},
		{"no TLS", nil, exitOther, "this control port speaks TLS only"},
		{"the system's roots", []string{"--tls-cert", files.ClientCert, "--tls-key", files.ClientKey}, exitOther, "certificate signed by unknown authority"},
	} {
		args := append(append([]string{"--timeout", "3s"}, tc.args...), "get", "greeting")
		_, errs, code := runCLI(map[string]string{"RKV_JOIN": join}, args...)
		if code != tc.code || !strings.Contains(errs, tc.want) {
			t.Errorf("%s: exit %d, stderr %q; want exit %d and %q", tc.name, code, errs, tc.code, tc.want)
		}
	}
}

func TestVersion(t *testing.T) {
	// No --join needed: the version is answered before any command runs.
	out, errs, code := runCLI(nil, "--version")
	if code != exitOK || !strings.HasPrefix(out, "rkv-client ") || !strings.Contains(out, " commit ") || !strings.Contains(out, "go1") {
		t.Fatalf("--version: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}

// An RKV_ variable that names no global flag is ignored with a warning on
// stderr that names the flag it most likely meant; known ones are quiet.
func TestUnknownEnvWarns(t *testing.T) {
	_, errs, code := runCLI(map[string]string{"RKV_ENDPOINT": "127.0.0.1:1", "RKV_FROBNICATE": "1", "RKV_OUTPUT": "json", "HOME": "/"}, "devices")
	if code != exitOK {
		t.Fatalf("devices: exit %d\n%s", code, errs)
	}
	for _, want := range []string{
		"rkv-client: warning: RKV_ENDPOINT names no global flag: ignored (did you mean RKV_ENDPOINTS, for --endpoints?)\n",
		"rkv-client: warning: RKV_FROBNICATE names no global flag: ignored (RKV_<FLAG> sets a global flag of rkv-client --help)\n",
	} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr %q, want it to contain %q", errs, want)
		}
	}
	if strings.Contains(errs, "RKV_OUTPUT") || strings.Count(errs, "\n") != 2 {
		t.Errorf("stderr %q: want the two warnings alone", errs)
	}
	// The misspelt variable is ignored: the command has no cluster.
	if _, errs, code := runCLI(map[string]string{"RKV_ENDPOINT": "127.0.0.1:1"}, "get", "k"); code != exitUsage || !strings.Contains(errs, "no cluster given") {
		t.Errorf("get with RKV_ENDPOINT only: exit %d, %q; want a usage error, no cluster given", code, errs)
	}
}

// --cpuprofile and --trace record the command, together, into their files;
// a file that cannot be made is a usage error naming its flag.
func TestProfileAndTrace(t *testing.T) {
	dir := t.TempDir()
	prof, tr := filepath.Join(dir, "cpu.pprof"), filepath.Join(dir, "run.trace")
	if _, errs, code := runCLI(nil, "--cpuprofile", prof, "--trace", tr, "devices"); code != 0 {
		t.Fatalf("devices with --cpuprofile and --trace: exit %d, %q", code, errs)
	}
	for _, f := range []string{prof, tr} {
		if st, err := os.Stat(f); err != nil || st.Size() == 0 {
			t.Fatalf("%s: %v, want a file with the recording", f, err)
		}
	}
	// A Go execution trace opens with its version header.
	if b, err := os.ReadFile(tr); err != nil || !bytes.HasPrefix(b, []byte("go 1.")) {
		t.Fatalf("%s does not read as a Go execution trace (%v): %.16q", tr, err, b)
	}
	for _, flag := range []string{"--cpuprofile", "--trace"} {
		_, errs, code := runCLI(nil, flag, filepath.Join(dir, "no-such-dir", "f"), "devices")
		if code != exitUsage || !strings.Contains(errs, flag) {
			t.Errorf("%s into a missing directory: exit %d, %q; want %d naming the flag", flag, code, errs, exitUsage)
		}
	}
}
