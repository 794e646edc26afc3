package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rkv-io/rkv/store"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

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
	if o.DataDir != "rkv-data/from-file" || o.Provider != "auto" || o.GossipAddr != "127.0.0.1:7946" || o.LeaseSize != 1<<20 {
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
		{[]string{"--name", "n", "--index-slots", "1000"}, nil, "power of two"},
		{[]string{"--name", "n", "--gossip-addr", "nowhere"}, nil, "host:port"},
		{[]string{"--name", "n", "--gossip-key", "abcd"}, nil, "gossip key"},
		{[]string{"--name", "n", "--log-format", "xml"}, nil, "--log-format"},
		{[]string{"--name", "n", "extra"}, nil, "unexpected argument"},
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
	if code := run([]string{"--help"}, env(nil), &out, nil); code != exitOK || !strings.Contains(out.String(), "RKV_<FLAG>") {
		t.Fatalf("--help: %d\n%s", code, out.String())
	}
	out.Reset()
	if code := run([]string{"--sync", "x", "--name", "n"}, env(nil), &out, nil); code != exitUsage || !strings.Contains(out.String(), "--sync") {
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
