package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rkv-io/rkv/internal/envflags"
	"github.com/rkv-io/rkv/internal/freeport"
	"github.com/rkv-io/rkv/internal/testlog"
	"github.com/rkv-io/rkv/internal/testpki"
)

func port(t *testing.T) int {
	t.Helper()
	p, err := freeport.Loopback()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metricValue is the value of series (a name and its labels, as in the
// text format) in a /metrics body.
func metricValue(t *testing.T, body, series string) float64 {
	t.Helper()
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("/metrics: %q: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no %s", series)
	return 0
}

// The whole command in this process, with --log-format json: every line
// it logs is JSON (the soft provider's warnings included: they used to be
// plain text); it warns about a misspelled RKV_ variable, naming the flag
// meant; the clear-text gossip warning names --gossip-key; --metrics-addr
// serves /healthz, /readyz, rkv_build_info, rkv_control_errors_total and
// when the store opened and its arena registered, and no profiles without
// --pprof; SIGTERM stops it with status 0.
func TestRunServes(t *testing.T) {
	start := time.Now()
	metrics := fmt.Sprintf("127.0.0.1:%d", port(t))
	args := []string{"--name", "n1", "--data-dir", t.TempDir(), "--bootstrap", "--provider", "soft",
		"--gossip-addr", fmt.Sprintf("127.0.0.1:%d", port(t)), "--metrics-addr", metrics, "--log-format", "json",
		"--arena-size", "1MiB", "--arena-count", "1", "--index-slots", "1024", "--lease-size", "256KiB"}
	var stderr testlog.Buffer
	sigs := make(chan os.Signal, 1)
	exited := make(chan int, 1)
	go func() { exited <- run(args, env(map[string]string{"RKV_ARENA_CONT": "3"}), io.Discard, &stderr, sigs) }()
	base := "http://" + metrics
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := http.Get(base + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case code := <-exited:
			t.Fatalf("exited with %d before it was ready:\n%s", code, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not 200 within 30s:\n%s", stderr.String())
		}
	}
	if code, body := httpGet(t, base+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, body := httpGet(t, base+"/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("/readyz: %d %q", code, body)
	}
	_, body := httpGet(t, base+"/metrics")
	for _, want := range []string{`rkv_build_info{commit="`, `rkv_control_errors_total{code="full"} 0`, "rkv_arenas_registered 1", "rkv_arenas_registered_bytes 1.048576e+06",
		`rkv_catchup_shards{state="copying"} 0`, "rkv_catchup_copied_bytes 0", "rkv_copy_pulled_bytes_total 0", "rkv_qp_commits_total 0"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics has no %q", want)
		}
	}
	opened := time.Unix(0, int64(metricValue(t, body, "rkv_store_open_time_seconds")*1e9))
	if opened.Before(start.Add(-time.Millisecond)) || opened.After(time.Now()) {
		t.Errorf("rkv_store_open_time_seconds %v: not between the test's start %v and now", opened, start)
	}
	if reg := metricValue(t, body, `rkv_arena_registration_seconds{arena="0"}`); reg <= 0 || reg > time.Since(start).Seconds() {
		t.Errorf("arena 0 registered %vs after the store's open: not in (0, %v]", reg, time.Since(start).Seconds())
	}
	if code, _ := httpGet(t, base+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without --pprof: %d, want 404", code)
	}

	// A warning of the soft provider: a data connection with a bad hello.
	var ready struct{ Data string }
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.Contains(line, `"msg":"ready"`) {
			if err := json.Unmarshal([]byte(line), &ready); err != nil {
				t.Fatal(err)
			}
		}
	}
	c, err := net.Dial("tcp", ready.Data)
	if err != nil {
		t.Fatalf("the data endpoint of the ready line (%q): %v", ready.Data, err)
	}
	c.Write(bytes.Repeat([]byte{'x'}, 24))
	io.Copy(io.Discard, c) // closed once the refusal is logged
	c.Close()

	sigs <- syscall.SIGTERM
	select {
	case code := <-exited:
		if code != exitOK {
			t.Fatalf("exit %d after SIGTERM:\n%s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("still running 30s after SIGTERM:\n%s", stderr.String())
	}

	msgs := map[string][]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(stderr.String()), "\n") {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("a log line that is not JSON: %q", line)
		}
		msg := fmt.Sprint(r["msg"])
		msgs[msg] = append(msgs[msg], r)
	}
	if w := msgs["unknown environment variable: ignored"]; len(w) != 1 || w[0]["name"] != "RKV_ARENA_CONT" ||
		w[0]["did_you_mean"] != "RKV_ARENA_COUNT" || w[0]["level"] != "WARN" {
		t.Errorf("the misspelled RKV_ARENA_CONT: %v", w)
	}
	if r := msgs["new cluster: replicas set"]; len(r) != 1 || r[0]["replicas"] != float64(3) {
		t.Errorf("--bootstrap without --replicas: the map's replica count logged as %v, want the default, 3", r)
	}
	if len(msgs["rdma/soft: dropped a data connection"]) != 1 {
		t.Errorf("the soft provider's warning is not among the JSON lines:\n%s", stderr.String())
	}
	var gossip string
	for m := range msgs {
		if strings.HasPrefix(m, "gossip is not encrypted") {
			gossip = m
		}
	}
	if !strings.Contains(gossip, "--gossip-key") || strings.Contains(gossip, "Config.") {
		t.Errorf("the clear-text gossip warning %q: want it to name --gossip-key", gossip)
	}
}

func TestPprofOnlyWhenAsked(t *testing.T) {
	for _, on := range []bool{false, true} {
		rec := httptest.NewRecorder()
		newMetricsMux(http.NotFoundHandler(), func() error { return nil }, on).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/", nil))
		if want := map[bool]int{false: http.StatusNotFound, true: http.StatusOK}[on]; rec.Code != want {
			t.Errorf("--pprof=%v: /debug/pprof/ answers %d, want %d", on, rec.Code, want)
		}
		rec = httptest.NewRecorder()
		newMetricsMux(http.NotFoundHandler(), func() error { return nil }, on).ServeHTTP(rec, httptest.NewRequest("GET", "/debug/pprof/cmdline", nil))
		if rec.Code == http.StatusOK {
			t.Errorf("--pprof=%v: /debug/pprof/cmdline is served: it would show an --auth-token", on)
		}
	}
	if _, err := parseOptions([]string{"--name", "n", "--pprof"}, nil, io.Discard); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Fatalf("--pprof without --metrics-addr: %v", err)
	}
}

func TestUnknownEnv(t *testing.T) {
	o, err := parseOptions([]string{"--name", "n"}, env(map[string]string{
		"RKV_DAT_DIR": "/x", "RKV_JION": "h:1", "RKV_FROBNICATE": "1", "RKV_SYNC": "none", "PATH": "/bin", "RKV_A": "1",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := []envflags.Unknown{{Name: "RKV_A"}, {Name: "RKV_DAT_DIR", Closest: "data-dir"}, {Name: "RKV_FROBNICATE"}, {Name: "RKV_JION", Closest: "join"}}
	if fmt.Sprint(o.envWarnings) != fmt.Sprint(want) {
		t.Fatalf("warnings %v, want %v", o.envWarnings, want)
	}
	if o.DataDir != "rkv-data/n" || o.Sync != "none" {
		t.Fatalf("the known variables: %+v", o)
	}
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"--version"}, nil, &out, io.Discard, nil); code != exitOK ||
		!strings.HasPrefix(out.String(), "rkv-server ") || !strings.Contains(out.String(), " commit ") {
		t.Fatalf("--version: exit %d, %q", code, out.String())
	}
	// --version needs no --name, and RKV_VERSION is not a way to ask.
	if _, err := parseOptions(nil, env(map[string]string{"RKV_VERSION": "1"}), io.Discard); err == nil || !strings.Contains(err.Error(), "--name") {
		t.Fatalf("RKV_VERSION=1 without --name: %v", err)
	}
}

// --control-addr on every interface is advertised with --gossip-addr's
// host; with that on every interface too, the start is refused naming the
// flags.
func TestControlAddrOnEveryInterface(t *testing.T) {
	for _, ctl := range []string{"0.0.0.0:7950", "[::]:7950", ":7950"} {
		if _, err := parseOptions([]string{"--name", "n", "--control-addr", ctl, "--gossip-addr", "127.0.0.1:7946"}, nil, io.Discard); err != nil {
			t.Errorf("--control-addr %s with --gossip-addr 127.0.0.1:7946: %v", ctl, err)
		}
		_, err := parseOptions([]string{"--name", "n", "--control-addr", ctl, "--gossip-addr", "0.0.0.0:7946"}, nil, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--control-addr "+ctl+" listens on every interface") || !strings.Contains(err.Error(), "give --gossip-addr") {
			t.Errorf("--control-addr %s with --gossip-addr 0.0.0.0:7946: %v; want a refusal naming --gossip-addr", ctl, err)
		}
	}
}

// A --tls-cert that has expired or is not valid yet, or a --tls-key of
// another certificate, fails the start (exit 1) before anything opens,
// naming the file and the dates.
func TestTLSCertificateRefusedAtStart(t *testing.T) {
	now := time.Now()
	good := testpki.New(t, "127.0.0.1").WriteFiles(t, t.TempDir())
	expired := testpki.NewValid(t, now.Add(-48*time.Hour), now.Add(-24*time.Hour), "127.0.0.1").WriteFiles(t, t.TempDir())
	early := testpki.NewValid(t, now.Add(24*time.Hour), now.Add(48*time.Hour), "127.0.0.1").WriteFiles(t, t.TempDir())
	day := func(d time.Duration) string { return now.Add(d).UTC().Format(time.RFC3339)[:10] }
	for _, tc := range []struct {
		name      string
		cert, key string
		want      []string
	}{
		{"expired", expired.ServerCert, expired.ServerKey, []string{"--tls-cert " + expired.ServerCert, "has expired", "valid from " + day(-48*time.Hour), "to " + day(-24*time.Hour), "now is " + day(0)}},
		{"not valid yet", early.ServerCert, early.ServerKey, []string{"--tls-cert " + early.ServerCert, "is not valid yet", "valid from " + day(24*time.Hour)}},
		{"another key", good.ServerCert, good.ClientKey, []string{"--tls-cert " + good.ServerCert, "--tls-key " + good.ClientKey, "private key does not match public key"}},
	} {
		var stderr bytes.Buffer
		dir := filepath.Join(t.TempDir(), "data")
		code := run([]string{"--name", "n", "--data-dir", dir, "--bootstrap", "--tls-cert", tc.cert, "--tls-key", tc.key}, nil, io.Discard, &stderr, nil)
		if code != exitError {
			t.Errorf("%s: exit %d, want %d; stderr %q", tc.name, code, exitError, stderr.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("%s: stderr %q, want it to contain %q", tc.name, stderr.String(), w)
			}
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("%s: the data directory was made (%v): the start went on", tc.name, err)
		}
	}
}
