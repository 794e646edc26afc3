//go:build !race

// Package race reports whether the race detector is built in: it changes
// what allocates (sync.Pool drops items at random), so the tests that
// count allocations run without it (make test-allocs).
package race

// Enabled is true in a build with the race detector.
const Enabled = false
