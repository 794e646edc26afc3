// Tests of the key distributions: the zipfian law, the scrambling permutation, uniformity.
package loadgen

import (
	"math"
	"math/rand/v2"
	"testing"
)

// within fails unless got is within k standard deviations of a
// binomial(n, p) count's mean.
func within(t *testing.T, what string, got int, n int, p float64, k float64) {
	t.Helper()
	mean := float64(n) * p
	sd := math.Sqrt(float64(n) * p * (1 - p))
	if math.Abs(float64(got)-mean) > k*sd {
		t.Errorf("%s: %d of %d draws, want %.0f ± %.0f (%.0f sd)", what, got, n, mean, k*sd, k)
	}
}

func TestZipfianMatchesTheLaw(t *testing.T) {
	const draws = 1_000_000
	for _, c := range []struct {
		n     uint64
		theta float64
	}{{1000, 0.99}, {100_000, 0.99}, {10_000, 0.5}} {
		z, err := newZipfian(c.n, c.theta)
		if err != nil {
			t.Fatal(err)
		}
		r := rand.New(rand.NewPCG(1, 2))
		counts := make([]int, c.n)
		for range draws {
			counts[z.next(r)]++
		}
		// Ranks 1 and 2 are exact in Gray's method: within 5 sd.
		within(t, "rank 1", counts[0], draws, z.prob(0), 5)
		within(t, "rank 2", counts[1], draws, z.prob(1), 5)
		// The rest follows Gray's approximation of the inverse CDF: the
		// top 10 ranks hold the share that approximation gives them
		// (within 5 sd), which is within 6% of the law's (it overweights
		// ranks 3.. a little: 4-5% at theta 0.99).
		var got int
		var law float64
		for i := range uint64(10) {
			got += counts[i]
			law += z.prob(i)
		}
		within(t, "top 10 ranks", got, draws, genCDF(z, 10), 5)
		if f := float64(got) / draws; math.Abs(f-law) > 0.06*law {
			t.Errorf("n %d theta %v: the top 10 ranks drew %.4f, the law says %.4f", c.n, c.theta, f, law)
		}
		within(t, "top 1% of ranks", counts0(counts, c.n/100), draws, genCDF(z, c.n/100), 5)
		// Frequencies fall with rank (ranks 1..5, clear of noise).
		for i := 1; i < 5; i++ {
			if counts[i] >= counts[i-1] {
				t.Errorf("n %d: rank %d drawn %d times, rank %d %d", c.n, i+1, counts[i], i, counts[i-1])
			}
		}
	}
	if _, err := newZipfian(10, 1); err == nil {
		t.Error("theta 1 accepted")
	}
	if _, err := newZipfian(0, 0.5); err == nil {
		t.Error("0 items accepted")
	}
}

// genCDF is the probability that z.next draws a rank below k (k >= 2):
// u < (1+0.5^theta)/zetan draws rank 0 or 1, and above that the draw
// n*(eta*u-eta+1)^alpha is below k for u < ((k/n)^(1-theta)-1)/eta+1.
func genCDF(z *zipfian, k uint64) float64 {
	t2 := (1 + z.halfPowTh) / z.zetan
	uk := (math.Pow(float64(k)/float64(z.n), 1-z.theta)-1)/z.eta + 1
	return max(t2, uk)
}

// counts0 sums counts[0:k].
func counts0(counts []int, k uint64) int {
	var s int
	for _, c := range counts[:k] {
		s += c
	}
	return s
}

func TestZipfianOfOneAndTwoItems(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []uint64{1, 2} {
		z, _ := newZipfian(n, 0.99)
		for range 10_000 {
			if k := z.next(r); k >= n {
				t.Fatalf("n %d: drew %d", n, k)
			}
		}
	}
}

func TestPermutationIsABijection(t *testing.T) {
	for _, n := range []uint64{1, 2, 3, 10, 255, 256, 257, 1000, 65537} {
		p := newPermutation(n, n*7+1)
		seen := make([]bool, n)
		for x := range n {
			y := p.apply(x)
			if y >= n || seen[y] {
				t.Fatalf("n %d: perm(%d) = %d, out of range or repeated", n, x, y)
			}
			seen[y] = true
		}
	}
}

func TestScrambledZipfianSpreadsTheHotKeys(t *testing.T) {
	const n, draws = 10_000, 500_000
	o := Options{Keys: n, Distribution: Zipfian, Theta: 0.99, Seed: 5}
	kc, err := newKeyChooser(&o)
	if err != nil {
		t.Fatal(err)
	}
	s := kc.(scrambled)
	r := rand.New(rand.NewPCG(6, 7))
	counts := make([]int, n)
	for range draws {
		counts[kc.next(r)]++
	}
	// The hottest key is the permutation's image of rank 1, with rank 1's
	// probability.
	hot := s.perm.apply(0)
	within(t, "hottest key", counts[hot], draws, s.z.prob(0), 5)
	for k, c := range counts {
		if c > counts[hot] {
			t.Fatalf("key %d drawn %d times, more than the hottest (%d, %d)", k, c, hot, counts[hot])
		}
	}
	// The 10 hottest keys are not bunched together: they span more than
	// a tenth of the key space.
	lo, hi := uint64(n), uint64(0)
	for i := range uint64(10) {
		k := s.perm.apply(i)
		lo, hi = min(lo, k), max(hi, k)
	}
	if hi-lo < n/10 {
		t.Fatalf("the 10 hottest keys lie in [%d, %d]", lo, hi)
	}
	// Another seed, another permutation.
	o.Seed = 6
	kc2, _ := newKeyChooser(&o)
	if kc2.(scrambled).perm.apply(0) == hot && kc2.(scrambled).perm.apply(1) == s.perm.apply(1) {
		t.Fatal("seeds 5 and 6 give the same hot keys")
	}
}

func TestUniformKeys(t *testing.T) {
	const n, draws = 10, 200_000
	r := rand.New(rand.NewPCG(8, 9))
	counts := make([]int, n)
	u := uniformKeys{n}
	for range draws {
		counts[u.next(r)]++
	}
	for k, c := range counts {
		within(t, "uniform key", c, draws, 1.0/n, 5)
		_ = k
	}
}

func TestZetaOfLargeN(t *testing.T) {
	for _, theta := range []float64{0.5, 0.99} {
		var exact float64
		for i := uint64(1); i <= 3*zetaExact; i++ {
			exact += 1 / math.Pow(float64(i), theta)
			if i != zetaExact-1 && i != zetaExact+1 && i != 3*zetaExact {
				continue
			}
			if got := zeta(i, theta); math.Abs(got-exact) > 1e-9*exact {
				t.Errorf("zeta(%d, %v) = %.15g, summed %.15g", i, theta, got, exact)
			}
		}
	}
}
