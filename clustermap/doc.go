// Package clustermap is the cluster map: which servers hold each of the
// proto.NumShards shards, at an epoch that only grows, kept by a Raft group
// that the servers run (hashicorp/raft).
//
// Placement reads only the map. A server crashing, pausing or restarting
// does not change it: its shards stay its own, unavailable while it is
// down, never placed elsewhere. The map changes only when a server is
// added, drained or removed, and when shards move between servers; a move
// changes the owner only once the new owner holds everything (see Apply
// and docs/ARCHITECTURE.md, "The cluster map").
//
// The package is what clients need too:
//
//   - Map: an immutable map and its queries (Owner, Shard, Moves, ...).
//   - Apply: the deterministic transition a map command makes, which
//     every replica of the Raft log computes alike; and Plan, the moves a
//     leader proposes to balance the shards over the servers.
//
// Package clustermap/replica is the servers' Raft replica of the map. The
// map's wire format and its commands are proto's (proto/clustermap.go).
package clustermap
