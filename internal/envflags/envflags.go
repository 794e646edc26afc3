// Package envflags is how rkv's commands read flags from the environment:
// RKV_<FLAG> in upper snake case, and a warning for each RKV_ variable
// that names no flag (a misspelling would otherwise be ignored without a
// word), with the flag it most likely meant.
package envflags

import (
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// Prefix starts every variable the commands read.
const Prefix = "RKV_"

// Name is a flag's environment variable: RKV_DATA_DIR for data-dir.
func Name(flag string) string {
	return Prefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// Map turns os.Environ's "KEY=value" list into a map; a later entry
// wins, as with getenv.
func Map(environ []string) map[string]string {
	m := make(map[string]string, len(environ))
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// Unknown is an RKV_ variable that names no flag, and the flag whose
// variable it most likely meant ("" when none is close).
type Unknown struct {
	Name, Closest string
}

// Unknowns returns the RKV_ variables of env that name no flag of the
// sets, in name order, each with the closest flag when one is within a
// typo or two.
func Unknowns(env map[string]string, sets ...*pflag.FlagSet) []Unknown {
	known := map[string]string{} // variable -> flag
	for _, fs := range sets {
		fs.VisitAll(func(f *pflag.Flag) { known[Name(f.Name)] = f.Name })
	}
	var out []Unknown
	for name := range env {
		if !strings.HasPrefix(name, Prefix) || known[name] != "" {
			continue
		}
		w := Unknown{Name: name}
		best := 0
		for v, flag := range known {
			d := editDistance(name, v)
			// Within two edits, and fewer than a third of the flag's
			// name: a typo, not another word.
			if d <= 2 && 3*d < len(v)-len(Prefix) && (w.Closest == "" || d < best || d == best && flag < w.Closest) {
				w.Closest, best = flag, d
			}
		}
		out = append(out, w)
	}
	slices.SortFunc(out, func(a, b Unknown) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// editDistance is the optimal string alignment distance between a and b,
// in bytes: insertions, deletions, substitutions and transpositions of
// adjacent bytes (RKV_JION for RKV_JOIN) count one each.
func editDistance(a, b string) int {
	d := make([][]int, len(a)+1)
	for i := range d {
		d[i] = make([]int, len(b)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}
