// Key choice (uniform, zipfian, scrambled zipfian) and the self-checking values.
package loadgen

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"strconv"
)

// keyChooser picks key indexes in [0, n). It is immutable once built;
// each worker draws from it with its own *rand.Rand.
type keyChooser interface {
	next(r *rand.Rand) uint64
}

type uniformKeys struct{ n uint64 }

func (u uniformKeys) next(r *rand.Rand) uint64 { return r.Uint64N(u.n) }

// zipfian draws ranks 0..n-1 where rank i has probability proportional to
// 1/(i+1)^theta, by the method of Gray et al., "Quickly Generating
// Billion-Record Synthetic Databases" (SIGMOD 1994), as YCSB's
// ZipfianGenerator does: ranks 0 and 1 are exact, the rest follow a
// closed-form approximation of the inverse CDF. Building one costs O(n)
// (the zeta sum); each draw is O(1).
type zipfian struct {
	n          uint64
	theta      float64
	alpha      float64 // 1/(1-theta)
	zetan      float64 // zeta(n, theta)
	eta        float64
	halfPowTh  float64 // 0.5^theta: where rank 1 ends, in units of 1/zetan
	zeta2theta float64
}

// zetaExact is how many terms zeta sums one by one; beyond, it uses the
// Euler-Maclaurin formula, whose error there is far below float64's.
const zetaExact = 1 << 20

// zeta is the generalized harmonic number: the sum of 1/i^theta for i
// in 1..n. It costs O(min(n, zetaExact)).
func zeta(n uint64, theta float64) float64 {
	var s float64
	for i := uint64(1); i <= min(n, zetaExact-1); i++ {
		s += 1 / math.Pow(float64(i), theta)
	}
	if n < zetaExact {
		return s
	}
	// Sum of f(i) = i^-theta over [a, b]: the integral, plus the mean of
	// the ends, plus (f'(b) - f'(a))/12.
	a, b := float64(zetaExact), float64(n)
	f := func(x float64) float64 { return math.Pow(x, -theta) }
	df := func(x float64) float64 { return -theta * math.Pow(x, -theta-1) }
	return s + (math.Pow(b, 1-theta)-math.Pow(a, 1-theta))/(1-theta) + (f(a)+f(b))/2 + (df(b)-df(a))/12
}

func newZipfian(n uint64, theta float64) (*zipfian, error) {
	if n < 1 {
		return nil, fmt.Errorf("loadgen: zipfian over %d items: need at least 1", n)
	}
	if !(theta > 0 && theta < 1) {
		return nil, fmt.Errorf("loadgen: zipfian theta %v: must be in (0, 1)", theta)
	}
	z := &zipfian{n: n, theta: theta, alpha: 1 / (1 - theta), zetan: zeta(n, theta), zeta2theta: zeta(2, theta)}
	z.eta = (1 - math.Pow(2/float64(n), 1-theta)) / (1 - z.zeta2theta/z.zetan)
	z.halfPowTh = math.Pow(0.5, theta)
	return z, nil
}

// prob is the exact probability of rank i (0-based) under the zipfian law.
func (z *zipfian) prob(i uint64) float64 { return 1 / math.Pow(float64(i+1), z.theta) / z.zetan }

func (z *zipfian) next(r *rand.Rand) uint64 {
	u := r.Float64()
	uz := u * z.zetan
	if uz < 1 {
		return 0
	}
	if uz < 1+z.halfPowTh {
		return min(1, z.n-1)
	}
	return min(uint64(float64(z.n)*math.Pow(z.eta*u-z.eta+1, z.alpha)), z.n-1)
}

// scrambled maps a zipfian rank to a key through a pseudorandom
// permutation of [0, n), so the hot keys are spread over the key space
// (and over servers placed by key ranges or hashes) instead of being
// keys 0, 1, 2... YCSB's ScrambledZipfianGenerator hashes the rank (FNV)
// modulo n, which lets hot ranks collide on one key; a permutation keeps
// the zipfian law exact: key perm(i) has rank i's probability.
type scrambled struct {
	z    *zipfian
	perm permutation
}

func (s scrambled) next(r *rand.Rand) uint64 { return s.perm.apply(s.z.next(r)) }

// permutation is a keyed bijection of [0, n): rounds of xor with a key,
// multiplication by an odd constant and xorshift, each a bijection of
// [0, 2^b) for the smallest b with 2^b >= n, with cycle walking
// (re-applying until the result is below n: fewer than 2 rounds on
// average, as 2^b < 2n).
type permutation struct {
	n     uint64
	mask  uint64
	shift uint
	k     [2]uint64 // xor keys
	m     [2]uint64 // odd multipliers
}

func newPermutation(n uint64, seed uint64) permutation {
	b := uint(bits.Len64(max(n-1, 1)))
	p := permutation{n: n, mask: 1<<b - 1, shift: max(1, b/2)}
	for i := range 2 {
		seed = splitmix64(seed)
		p.k[i] = seed & p.mask
		seed = splitmix64(seed)
		p.m[i] = seed | 1
	}
	return p
}

func (p permutation) apply(x uint64) uint64 {
	for {
		for i := range p.k {
			x = ((x ^ p.k[i]) * p.m[i]) & p.mask
			x ^= x >> p.shift
		}
		if x < p.n {
			return x
		}
	}
}

// splitmix64 is a fast 64-bit mixer (Steele, Lea, Flood: SplitMix).
func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

func newKeyChooser(o *Options) (keyChooser, error) {
	n := uint64(o.Keys)
	switch o.Distribution {
	case Uniform:
		return uniformKeys{n}, nil
	case Zipfian:
		z, err := newZipfian(n, o.Theta)
		if err != nil {
			return nil, err
		}
		return scrambled{z, newPermutation(n, uint64(o.Seed))}, nil
	}
	return nil, fmt.Errorf("loadgen: distribution %q: want %q or %q", o.Distribution, Uniform, Zipfian)
}

// appendKey appends key i's name: prefix and the decimal index.
func appendKey(dst []byte, prefix string, i uint64) []byte {
	return strconv.AppendUint(append(dst, prefix...), i, 10)
}

// valueHeader is the bytes of a value that carry its key index and
// version: 8 bytes each, little-endian. The rest is a pseudorandom fill
// seeded by both. A value shorter than minVersioned is all fill, seeded
// by the key alone (its version is not recorded: a header with less
// than 8 bytes of fill to check it could be corrupted unnoticed).
const (
	valueHeader  = 16
	minVersioned = valueHeader + 8
)

// fillValue writes into v (its whole length) the value of key index key
// at version.
func fillValue(v []byte, key, version uint64) {
	if len(v) < minVersioned {
		fill(v, key, 0)
		return
	}
	binary.LittleEndian.PutUint64(v, key)
	binary.LittleEndian.PutUint64(v[8:], version)
	fill(v[valueHeader:], key, version)
}

// fillBlock is the unit of a value's fill: a 64-byte block drawn from
// (key, version), repeated, with each repetition's first word xored with
// its index so that shifted bytes do not pass for the right ones.
const fillBlock = 64

func fillSeed(key, version uint64) (blk [fillBlock]byte) {
	s := splitmix64(key ^ splitmix64(version))
	for i := 0; i < fillBlock; i += 8 {
		s = splitmix64(s)
		binary.LittleEndian.PutUint64(blk[i:], s)
	}
	return blk
}

// blockAt returns blk as stamped for the repetition at index i.
func blockAt(blk *[fillBlock]byte, i int) [fillBlock]byte {
	b := *blk
	binary.LittleEndian.PutUint64(b[:], binary.LittleEndian.Uint64(b[:])^uint64(i))
	return b
}

func fill(b []byte, key, version uint64) {
	blk := fillSeed(key, version)
	for i, off := 0, 0; off < len(b); i, off = i+1, off+fillBlock {
		bi := blockAt(&blk, i)
		copy(b[off:], bi[:])
	}
}

// checkValue reports whether v is a value written for key index key
// with size bytes: the right length, key and fill (for any version: a
// value from an earlier run is as good). A torn value, mixing two
// versions, fails the fill check.
func checkValue(v []byte, key uint64, size int) error {
	if len(v) != size {
		return fmt.Errorf("%w: %d bytes, want %d", ErrWrongValue, len(v), size)
	}
	var version uint64
	base := 0
	if size >= minVersioned {
		if k := binary.LittleEndian.Uint64(v); k != key {
			return fmt.Errorf("%w: holds key %d's value", ErrWrongValue, k)
		}
		version = binary.LittleEndian.Uint64(v[8:])
		base = valueHeader
	}
	b := v[base:]
	blk := fillSeed(key, version)
	for i, off := 0, 0; off < len(b); i, off = i+1, off+fillBlock {
		bi := blockAt(&blk, i)
		n := min(fillBlock, len(b)-off)
		if bytes.Equal(b[off:off+n], bi[:n]) {
			continue
		}
		for j := range n {
			if b[off+j] != bi[j] {
				return fmt.Errorf("%w: byte %d is not version %d's", ErrWrongValue, base+off+j, version)
			}
		}
	}
	return nil
}
