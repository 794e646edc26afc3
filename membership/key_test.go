package membership

import (
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	for in, n := range map[string]int{
		strings.Repeat("0f", 16):                         16,
		strings.Repeat("ab", 24):                         24,
		"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n": 32,
		"AAAAAAAAAAAAAAAAAAAAAA":                         16, // unpadded base64
	} {
		if k, err := ParseKey(in); err != nil || len(k) != n {
			t.Errorf("ParseKey(%q) = %d bytes, %v; want %d", in, len(k), err, n)
		}
	}
	for in, want := range map[string]string{"c2hvcnQ=": "5 bytes", "AAAA": "3 bytes", "not a key!": "neither hex nor base64"} {
		if _, err := ParseKey(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseKey(%q) = %v, want an error saying %q", in, err, want)
		}
	}
}
