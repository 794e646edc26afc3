// Package membership will run hashicorp/memberlist gossip: each server
// advertises its control address, data endpoint, hash-index region and
// arenas (addr, rkey); clients and servers build the cluster view and place
// keys by rendezvous hashing from it.
//
// Status: not implemented yet (issue 5); only the package exists.
package membership
