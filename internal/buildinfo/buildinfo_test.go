package buildinfo

import (
	"runtime"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	i := Info{Version: "v1.2.3", Commit: "abc123", Modified: true, Go: "go1.26.0"}
	if got, want := i.String(), "v1.2.3 commit abc123 (modified) go1.26.0"; got != want {
		t.Fatalf("String() = %q, want %q", got, want)
	}
	// A test binary carries no VCS stamp; Read still names the toolchain.
	r := Read()
	if r.Go != runtime.Version() || r.Commit == "" || r.Version == "" || !strings.Contains(r.String(), r.Go) {
		t.Fatalf("Read() = %+v", r)
	}
}
