package membership

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/rkv-io/rkv/proto"
)

func testView(servers int, others ...Member) *View {
	var ms []Member
	for i := range servers {
		ms = append(ms, Member{Name: fmt.Sprintf("server-%02d", i), State: StateAlive, Meta: proto.NodeMeta{Role: proto.RoleServer}})
	}
	return newView(1, append(ms, others...))
}

func without(v *View, name string) *View {
	ms := slices.DeleteFunc(v.Members(), func(m Member) bool { return m.Name == name })
	return newView(v.Version()+1, ms)
}

func key(i int) []byte { return fmt.Appendf(nil, "user:%08d", i) }

func owner(v *View, k []byte) string {
	p := Placement(v, k, 1)
	if len(p) != 1 {
		return ""
	}
	return p[0].Name
}

// The score is part of the protocol: every process, in any language, must
// place keys the same way. These owners pin it.
func TestPlacementIsPinned(t *testing.T) {
	v := testView(5)
	got := []string{owner(v, []byte("a")), owner(v, []byte("hello")), owner(v, key(1)), owner(v, key(2)), owner(v, key(3))}
	want := []string{"server-04", "server-03", "server-02", "server-01", "server-02"}
	if !slices.Equal(got, want) {
		t.Fatalf("owners %q, pinned %q", got, want)
	}
	if s := mix64(0x0123456789abcdef); s != 0xb2c058e4ebb5112c { // checked by hand
		t.Fatalf("mix64 = %#x", s)
	}
}

// Keys spread evenly: chi-square over 100k keys and 10 servers.
func TestPlacementSpread(t *testing.T) {
	for _, n := range []int{3, 10, 31} {
		v := testView(n)
		const keys = 100_000
		count := map[string]int{}
		for i := range keys {
			count[owner(v, key(i))]++
		}
		if len(count) != n {
			t.Fatalf("%d servers, keys on %d", n, len(count))
		}
		exp := float64(keys) / float64(n)
		chi2, lo, hi := 0.0, keys, 0
		for _, c := range count {
			d := float64(c) - exp
			chi2 += d * d / exp
			lo, hi = min(lo, c), max(hi, c)
		}
		// The 0.999 quantile of chi-square with n-1 degrees of freedom
		// is below 1.9(n-1)+12 for these n (27.9 for 9, 59.7 for 30).
		limit := 1.9*float64(n-1) + 12
		t.Logf("%2d servers: chi-square %.1f (limit %.1f), max/min %.3f", n, chi2, limit, float64(hi)/float64(lo))
		if chi2 > limit {
			t.Errorf("%d servers: chi-square %.1f > %.1f: %v", n, chi2, limit, count)
		}
		if float64(hi)/float64(lo) > 1.1 {
			t.Errorf("%d servers: max/min %d/%d", n, hi, lo)
		}
	}
}

// When a server leaves, exactly its keys move (about 1/N); when one
// joins, only the keys it wins move, to it.
func TestPlacementMinimalMovement(t *testing.T) {
	const n, keys = 10, 50_000
	v := testView(n)
	gone := without(v, "server-03")
	grown := testView(n + 1)
	moved, joined := 0, 0
	for i := range keys {
		k := key(i)
		before, after := owner(v, k), owner(gone, k)
		if before != "server-03" && after != before {
			t.Fatalf("key %d moved from %s to %s though server-03 left", i, before, after)
		}
		if before == "server-03" {
			moved++
		}
		if g := owner(grown, k); g != before {
			if g != "server-10" {
				t.Fatalf("key %d moved from %s to %s when server-10 joined", i, before, g)
			}
			joined++
		}
	}
	frac, fracJoin := float64(moved)/keys, float64(joined)/keys
	t.Logf("leave moved %.4f of the keys (1/N = %.4f); join moved %.4f (1/(N+1) = %.4f)", frac, 1.0/n, fracJoin, 1.0/(n+1))
	if math.Abs(frac-1.0/n) > 0.1/n || math.Abs(fracJoin-1.0/(n+1)) > 0.1/(n+1) {
		t.Errorf("moved %.4f and %.4f of the keys", frac, fracJoin)
	}
}

func TestPlacementReplicas(t *testing.T) {
	const r = 3
	v := testView(8)
	gone := without(v, "server-05")
	first := map[int]int{}
	for i := range 20_000 {
		k := key(i)
		p := Placement(v, k, r)
		names := make([]string, len(p))
		for j, m := range p {
			names[j] = m.Name
		}
		if len(names) != r || len(slices.Compact(slices.Sorted(slices.Values(names)))) != r {
			t.Fatalf("key %d: replicas %v", i, names)
		}
		if names[0] != owner(v, k) {
			t.Fatalf("key %d: replicas %v, primary %s", i, names, owner(v, k))
		}
		// Losing a server removes it from the list and appends the next
		// one; the others keep their order.
		var after []string
		for _, m := range Placement(gone, k, r) {
			after = append(after, m.Name)
		}
		kept := slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s == "server-05" })
		if !slices.Equal(after[:len(kept)], kept) || len(after) != r {
			t.Fatalf("key %d: %v became %v", i, names, after)
		}
		// Each server is equally likely to be any replica rank.
		for j, name := range names {
			if name == "server-00" {
				first[j]++
			}
		}
	}
	for j := range r {
		if c := first[j]; c < 2000 || c > 3000 { // 20000/8 = 2500
			t.Errorf("server-00 was replica %d for %d keys", j, c)
		}
	}
	if p := Placement(v, key(1), 20); len(p) != 8 {
		t.Errorf("20 replicas of 8 servers: %d", len(p))
	}
	if p := Placement(v, key(1), 0); p != nil {
		t.Errorf("0 replicas: %v", p)
	}
	if p := Placement(testView(0), key(1), 1); p != nil {
		t.Errorf("no servers: %v", p)
	}
}

// Only alive servers whose metadata decoded hold keys.
func TestPlacementSkipsNonServers(t *testing.T) {
	v := testView(2,
		Member{Name: "client", State: StateAlive, Meta: proto.NodeMeta{Role: proto.RoleClient}},
		Member{Name: "dead", State: StateDead, Meta: proto.NodeMeta{Role: proto.RoleServer}},
		Member{Name: "left", State: StateLeft, Meta: proto.NodeMeta{Role: proto.RoleServer}},
		Member{Name: "future", State: StateAlive, MetaErr: errors.New("version 2")},
	)
	if s := v.Servers(); len(s) != 2 || s[0].Name != "server-00" || s[1].Name != "server-01" {
		t.Fatalf("servers %v", s)
	}
	for i := range 1000 {
		for _, m := range Placement(v, key(i), 6) {
			if m.Name != "server-00" && m.Name != "server-01" {
				t.Fatalf("placed on %v", m)
			}
		}
	}
	if _, ok := v.Member("dead"); !ok || v.Len() != 6 {
		t.Errorf("view lost members: %v", v.Members())
	}
	if _, ok := v.Member("nobody"); ok {
		t.Error("found nobody")
	}
}

func BenchmarkPlacement(b *testing.B) {
	for _, n := range []int{3, 32, 256} {
		for _, r := range []int{1, 3} {
			b.Run(fmt.Sprintf("servers=%d/R=%d", n, r), func(b *testing.B) {
				v := testView(n)
				k := key(42)
				for b.Loop() {
					Placement(v, k, r)
				}
			})
		}
	}
}

// Owner agrees with Placement while every server is alive, and keeps a
// departed server's keys on it (unavailable) until it is reaped.
func TestOwnerKeepsKeysOnDepartedServers(t *testing.T) {
	v := testView(5)
	for i := range 2000 {
		m, ok := Owner(v, key(i))
		if !ok || m.Name != owner(v, key(i)) {
			t.Fatalf("key %d: Owner %q (ok %v), Placement %q", i, m.Name, ok, owner(v, key(i)))
		}
	}
	ms := v.Members()
	ms[2].State = StateDead
	dead := newView(v.Version()+1, ms)
	moved := 0
	for i := range 2000 {
		before := owner(v, key(i))
		m, _ := Owner(dead, key(i))
		if m.Name != before {
			t.Fatalf("key %d moved from %s to %s when %s died", i, before, m.Name, ms[2].Name)
		}
		if before == ms[2].Name {
			if m.State != StateDead {
				t.Fatalf("key %d: owner %s reported %v", i, m.Name, m.State)
			}
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("no key belonged to the dead server: the test checked nothing")
	}
	if _, ok := Owner(newView(1, nil), key(1)); ok {
		t.Fatal("Owner found a server in an empty view")
	}
}
