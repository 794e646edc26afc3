package store

import (
	"flag"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	flag.Parse()
	// Each rapid case restarts the store a few times; 30 cases keep the
	// package under a minute with -race. Raise with -rapid.checks.
	if f := flag.Lookup("rapid.checks"); f != nil && f.Value.String() == f.DefValue {
		_ = f.Value.Set("30")
	}
	if os.Getenv(crashChildEnv) != "" {
		crashChild() // never returns
	}
	if os.Getenv(cleanerChildEnv) != "" {
		cleanerChild() // never returns
	}
	if os.Getenv(ingestChildEnv) != "" {
		ingestChild() // never returns
	}
	if os.Getenv(growChildEnv) != "" {
		growChild() // never returns
	}
	goleak.VerifyTestMain(m)
}
