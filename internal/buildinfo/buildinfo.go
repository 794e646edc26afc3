// Package buildinfo reports what a binary was built from: the module
// version and the VCS revision the go command stamps into binaries built
// in a git checkout (runtime/debug.ReadBuildInfo).
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Info is a binary's build.
type Info struct {
	Version  string // the main module's version, "(devel)" for a build of a checkout
	Commit   string // vcs.revision, "unknown" when not stamped (go run, -buildvcs=false, a test binary)
	Modified bool   // vcs.modified: the checkout had uncommitted changes
	Go       string // the Go toolchain, runtime.Version()
}

// Read returns the running binary's build.
func Read() Info {
	info := Info{Version: "unknown", Commit: "unknown", Go: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	if v := bi.Main.Version; v != "" {
		info.Version = v
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Commit = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// String is what --version prints after the command's name:
// "(devel) commit 0123abcd... (modified) go1.26.0".
func (i Info) String() string {
	commit := i.Commit
	if i.Modified {
		commit += " (modified)"
	}
	return fmt.Sprintf("%s commit %s %s", i.Version, commit, i.Go)
}
