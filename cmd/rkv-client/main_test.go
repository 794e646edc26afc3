package main

import (
	"bytes"
	"strings"
	"testing"
)

func runCLI(env map[string]string, args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := run(args, func(k string) string { return env[k] }, strings.NewReader(""), &out, &errb)
	return out.String(), errb.String(), code
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

func TestDevices(t *testing.T) {
	out, _, code := runCLI(nil, "devices")
	if code != 0 || !strings.Contains(out, "soft") {
		t.Fatalf("devices: %d %q", code, out)
	}
}
