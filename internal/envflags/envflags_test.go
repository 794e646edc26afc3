package envflags

import (
	"fmt"
	"testing"

	"github.com/spf13/pflag"
)

func TestUnknowns(t *testing.T) {
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs.String("data-dir", "", "")
	fs.String("join", "", "")
	fs.String("sync", "", "")
	other := pflag.NewFlagSet("u", pflag.ContinueOnError)
	other.String("endpoints", "", "")
	env := Map([]string{"RKV_DAT_DIR=/x", "RKV_JION=h:1", "RKV_FROBNICATE=1", "RKV_SYNC=none", "PATH=/bin", "RKV_A=1",
		"RKV_ENDPOINT=h:2", "RKV_ENDPOINTS=h:3", "NOEQUALS"})
	got := Unknowns(env, fs, other)
	want := []Unknown{{"RKV_A", ""}, {"RKV_DAT_DIR", "data-dir"}, {"RKV_ENDPOINT", "endpoints"}, {"RKV_FROBNICATE", ""}, {"RKV_JION", "join"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Unknowns: %v, want %v", got, want)
	}
	if len(Unknowns(Map([]string{"RKV_SYNC=x", "HOME=/"}), fs)) != 0 {
		t.Fatal("known variables reported")
	}
}

func TestName(t *testing.T) {
	for flag, want := range map[string]string{"data-dir": "RKV_DATA_DIR", "join": "RKV_JOIN", "tls-client-ca": "RKV_TLS_CLIENT_CA"} {
		if got := Name(flag); got != want {
			t.Errorf("Name(%q) = %q, want %q", flag, got, want)
		}
	}
}

func TestEditDistance(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		d    int
	}{{"", "", 0}, {"a", "", 1}, {"RKV_JION", "RKV_JOIN", 1}, {"kitten", "sitting", 3}, {"abc", "abc", 0}, {"ab", "ba", 1}} {
		if got := editDistance(tc.a, tc.b); got != tc.d {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tc.a, tc.b, got, tc.d)
		}
	}
}
