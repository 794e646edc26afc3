package membership

import (
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/rkv-io/rkv/proto"
)

// Placement returns the servers that hold key: the replicas highest-scoring
// servers of the view (the alive servers whose metadata decoded: clients,
// dead, left and undecodable members never hold keys), highest first. The
// first is the key's primary. A server that is leaving stays placed until
// it has left. Placement returns fewer servers when the view has fewer,
// and nil for replicas < 1.
//
// This is rendezvous (highest random weight) hashing:
//
//	score(server, key) = mix64(xxhash64(server name) XOR xxhash64(key))
//
// where mix64 is splitmix64's finalizer, ties broken by the smaller name.
// It depends on the names and the key only, so every process with the
// same set of servers places every key the same way, and when a server
// leaves, only the keys it held move (each to the server that ranked next
// for it); with R replicas, a key's list loses that one server and gains
// the next. It costs one hash of the key and one multiply-xorshift per
// server.
func Placement(v *View, key []byte, replicas int) []Member {
	if replicas < 1 || len(v.servers) == 0 {
		return nil
	}
	replicas = min(replicas, len(v.servers))
	kh := xxhash.Sum64(key)
	type ranked struct {
		score uint64
		s     server
	}
	// The top replicas, best first, by insertion: replicas is small.
	top := make([]ranked, 0, replicas)
	for _, s := range v.servers {
		r := ranked{score: mix64(s.hash ^ kh), s: s}
		if len(top) == replicas && !v.better(r.score, r.s, top[len(top)-1].score, top[len(top)-1].s) {
			continue
		}
		j := len(top)
		if j < replicas {
			top = append(top, r)
		} else {
			j--
		}
		for ; j > 0 && v.better(r.score, r.s, top[j-1].score, top[j-1].s); j-- {
			top[j] = top[j-1]
		}
		top[j] = r
	}
	out := make([]Member, len(top))
	for i, r := range top {
		out[i] = v.members[r.s.i]
	}
	return out
}

// better orders placement candidates: higher score, then smaller name.
func (v *View) better(sa uint64, a server, sb uint64, b server) bool {
	if sa != sb {
		return sa > sb
	}
	return strings.Compare(v.members[a.i].Name, v.members[b.i].Name) < 0
}

// Owner returns the key's primary among every server still in the view,
// alive, dead or left (until it is reaped), by Placement's score. With
// R=1 a departed owner's keys are on no other server, so a client reports
// them unavailable instead of asking a survivor that would answer "not
// found"; once the owner is reaped, Placement and Owner agree again.
func Owner(v *View, key []byte) (Member, bool) {
	kh := xxhash.Sum64(key)
	best, bestScore := -1, uint64(0)
	for i := range v.members {
		m := &v.members[i]
		if m.MetaErr != nil || m.Meta.Role != proto.RoleServer {
			continue
		}
		s := mix64(xxhash.Sum64String(m.Name) ^ kh)
		if best < 0 || s > bestScore || s == bestScore && strings.Compare(m.Name, v.members[best].Name) < 0 {
			best, bestScore = i, s
		}
	}
	if best < 0 {
		return Member{}, false
	}
	return v.members[best], true
}

// mix64 is splitmix64's finalizer: every input bit changes every output
// bit with probability about 1/2.
func mix64(h uint64) uint64 {
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	return h ^ h>>31
}
