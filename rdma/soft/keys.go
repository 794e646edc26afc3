// Key generation: lkeys, rkeys and QP numbers that look random and do not repeat.

package soft

import (
	"math/rand/v2"
	"sync/atomic"
)

// keyGen hands out 32-bit keys by pushing a counter through a keyed
// bijection of uint32: keys look random (an rkey is a capability, so the
// next one should not be guessable from the last) and never repeat until
// the counter wraps after 2^32 keys, so a stale rkey never names a newer MR.
type keyGen struct {
	n         atomic.Uint32
	pre, post uint32
}

func newKeyGen() *keyGen {
	g := &keyGen{pre: rand.Uint32(), post: rand.Uint32()}
	g.n.Store(rand.Uint32())
	return g
}

// next returns a fresh non-zero key.
func (g *keyGen) next() uint32 {
	for {
		if k := permute(g.n.Add(1)^g.pre) ^ g.post; k != 0 {
			return k
		}
	}
}

// permute is a bijection of uint32 (odd multiplications and xor-shifts
// are each invertible): murmur3's finaliser.
func permute(x uint32) uint32 {
	x ^= x >> 16
	x *= 0x85ebca6b
	x ^= x >> 13
	x *= 0xc2b2ae35
	x ^= x >> 16
	return x
}
