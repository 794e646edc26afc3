package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"
)

func runCLIIn(env map[string]string, stdin string, args ...string) (string, string, int) {
	var out, errb bytes.Buffer
	code := run(context.Background(), args, environOf(env), strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), code
}

// Keys as users spell them: empty is a usage error everywhere, binary keys
// go in hex or base64, "put KEY -" reads stdin, and the commands over many
// keys (mget, exists) say which are absent, in the table, in JSON and in
// the exit code.
func TestKeysOnTheCommandLine(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	env := map[string]string{"RKV_JOIN": startServerWith(t, nil, nil)}
	for _, args := range [][]string{{"get", ""}, {"put", "", "v"}, {"del", ""}, {"owner", ""}, {"mget", "a", ""}, {"--key-encoding", "hex", "get", "zz"}, {"--key-encoding", "rot13", "get", "k"}} {
		if _, errs, code := runCLI(env, args...); code != exitUsage || errs == "" {
			t.Errorf("%q: exit %d (stderr %q), want %d", args, code, errs, exitUsage)
		}
	}
	if _, errs, code := runCLI(nil); code != exitUsage || !strings.Contains(errs, "no command") {
		t.Errorf("bare rkv-client: exit %d, %q", code, errs)
	}
	if out, _, _ := runCLI(nil, "--help"); strings.Count(out, "Exit codes") != 1 {
		t.Errorf("--help lists the exit codes %d times", strings.Count(out, "Exit codes"))
	}

	if out, errs, code := runCLIIn(env, "from stdin", "put", "a", "-"); code != exitOK {
		t.Fatalf("put a -: exit %d, %q %q", code, out, errs)
	}
	if out, _, code := runCLI(env, "get", "a"); code != exitOK || out != "from stdin" {
		t.Fatalf("get a after put a -: exit %d, %q", code, out)
	}
	// A binary key: 0xff 0x00, put in hex, read back in base64.
	if out, errs, code := runCLI(env, "--key-encoding", "hex", "put", "ff00", "binary"); code != exitOK {
		t.Fatalf("put of a hex key: exit %d, %q %q", code, out, errs)
	}
	if out, _, code := runCLI(env, "--key-encoding", "base64", "get", "/wA="); code != exitOK || out != "binary" {
		t.Fatalf("get of the same key in base64: exit %d, %q", code, out)
	}

	out, _, code := runCLI(env, "-o", "json", "get", "absent")
	var miss foundJSON
	if err := json.Unmarshal([]byte(out), &miss); code != exitNotFound || err != nil || miss.Found || miss.Key != "absent" {
		t.Fatalf("get -o json of an absent key: exit %d, %q (%v)", code, out, err)
	}

	out, _, code = runCLIIn(env, "a\nabsent\n", "mget", "-")
	if code != exitNotFound || !strings.Contains(out, "from stdin") || !strings.Contains(out, "absent  (not found)") {
		t.Fatalf("mget of keys from stdin: exit %d\n%s", code, out)
	}
	out, _, code = runCLI(env, "-o", "json", "--key-encoding", "hex", "mget", "61", "ff00")
	var got []foundJSON
	if err := json.Unmarshal([]byte(out), &got); code != exitOK || err != nil || len(got) != 2 ||
		got[0].Value != "from stdin" || !bytes.Equal(got[1].KeyBase64, []byte{0xff, 0}) || got[1].Value != "binary" {
		t.Fatalf("mget -o json: exit %d, %q (%v)", code, out, err)
	}
	var load strings.Builder
	for i := range 500 {
		fmt.Fprintf(&load, "bulk-%d\tvalue %d\n", i, i)
	}
	if out, errs, code := runCLIIn(env, load.String(), "mput"); code != exitOK || !strings.HasPrefix(out, "500 keys put") {
		t.Fatalf("mput of 500 lines: exit %d, %q %q", code, out, errs)
	}
	if out, _, code := runCLI(env, "get", "bulk-499"); code != exitOK || out != "value 499" {
		t.Fatalf("get bulk-499 after mput: exit %d, %q", code, out)
	}
	var odd strings.Builder
	for i := range 50 {
		fmt.Fprintf(&odd, "odd-%d\tv%d\n", i, i)
	}
	if out, errs, code := runCLIIn(env, odd.String(), "mput", "--batch", "7", "--concurrency", "3"); code != exitOK || !strings.HasPrefix(out, "50 keys put") {
		t.Fatalf("mput --batch 7 of 50 lines: exit %d, %q %q", code, out, errs)
	}
	if out, _, code := runCLI(env, "get", "odd-49"); code != exitOK || out != "v49" {
		t.Fatalf("get odd-49 after mput: exit %d, %q", code, out)
	}
	for _, bad := range []string{"0", "65"} {
		if _, errs, code := runCLIIn(env, "k\tv\n", "mput", "--batch", bad); code != exitUsage || !strings.Contains(errs, "--batch "+bad+": must be 1 to 64") {
			t.Errorf("mput --batch %s: exit %d, %q", bad, code, errs)
		}
	}
	for stdin, want := range map[string]string{"k\tv\nno tab here\n": "line 2: no tab", "k\tv\n\tv\n": "line 2: empty key"} {
		if _, errs, code := runCLIIn(env, stdin, "mput"); code != exitUsage || !strings.Contains(errs, want) {
			t.Errorf("mput of %q: exit %d, %q; want a usage error saying %q", stdin, code, errs, want)
		}
	}
	if out, _, code := runCLI(env, "scan", "--prefix", "bulk-49", "--keys-only"); code != exitOK ||
		out != "bulk-49\nbulk-490\nbulk-491\nbulk-492\nbulk-493\nbulk-494\nbulk-495\nbulk-496\nbulk-497\nbulk-498\nbulk-499\n" {
		t.Fatalf("scan --keys-only: exit %d, %q", code, out)
	}
	if _, _, code := runCLI(env, "scan", "--keys-only", "--values"); code != exitUsage {
		t.Fatalf("scan --keys-only --values: exit %d, want %d", code, exitUsage)
	}
	if out, _, code := runCLI(env, "exists", "a"); code != exitOK || !strings.Contains(out, "a  true") {
		t.Fatalf("exists a: exit %d, %q", code, out)
	}
	if out, _, code := runCLI(env, "exists", "a", "absent"); code != exitNotFound || !strings.Contains(out, "absent  false") {
		t.Fatalf("exists a absent: exit %d, %q", code, out)
	}
}

// countingReader counts what was read of it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// The limits a server advertises are checked before anything is written or
// read: a key too long fails the same way for put, get and del, and a value
// on stdin too large fails once it passes the limit, not after all of it.
func TestLimitsCheckedFirst(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	srv := startServer(t, nil, nil)
	env := map[string]string{"RKV_JOIN": srv.GossipAddr()}
	maxValue := srv.Store().Options().MaxValueLen
	long := strings.Repeat("k", srv.Store().Options().MaxKeyLen+1)
	for _, args := range [][]string{{"put", long, "v"}, {"get", long}, {"del", long}} {
		_, errs, code := runCLI(env, args...)
		if code != exitOther || !strings.Contains(errs, "key too long: 1025 bytes, s1 takes at most 1024") || len(errs) > 300 {
			t.Errorf("%s of a 1025-byte key: exit %d, %q", args[0], code, errs)
		}
	}
	in := &countingReader{r: strings.NewReader(strings.Repeat("v", 16<<20))}
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"put", "big", "-"}, environOf(env), in, &out, &errb)
	if code != exitOther || !strings.Contains(errb.String(), "value too large") || in.n > 2*maxValue {
		t.Fatalf("put of 16 MiB from stdin: exit %d, %q, %d bytes read (limit %d)", code, errb.String(), in.n, maxValue)
	}
	if _, errs, code := runCLIIn(env, strings.Repeat("v", maxValue), "put", "big", "-"); code != exitOK {
		t.Fatalf("put of a value at the limit (%d bytes): exit %d, %q", maxValue, code, errs)
	}
	if _, errs, code := runCLI(env, "put", "big2", strings.Repeat("v", maxValue+1)); code != exitOther || !strings.Contains(errs, "value too large") {
		t.Fatalf("put of a value over the limit: exit %d, %q", code, errs)
	}
}
