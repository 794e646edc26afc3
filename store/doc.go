// Package store holds a server's data: value arenas registered for RDMA,
// self-verifying records, the hash index clients read one-sidedly, and the
// Pebble database that makes the index durable.
//
// Values reach the store without passing through the server's code: a
// client takes a write lease (a region of an arena registered REMOTE_WRITE
// for that lease only), writes records into it with RDMA_WRITE, and commits
// each with a small message. Commit checks the record, makes it durable,
// points the index at it and retires the version it replaces. Clients then
// find it with one READ of the index and one of the record.
//
// The key space is cut into proto.NumShards shards, and the store serves
// only the shards it owns (shards.go). The invariant the design rests on:
//
//	A record in a server's arena is in state live only while that server
//	owns the record's shard and the record is its key's current version
//	there.
//
// A one-sided reader that finds a live record with the right key and CRC
// may return it; one that finds nothing in the index must check the
// shard's word, published after the index table, before it may answer
// "not found". Shards move between stores by migration: the target copies
// a shard's records in (Ingest), the source freezes, the target copies
// what changed, the source releases, the target activates. Commits and
// deletes are idempotent per (shard, session, seq) (sessions.go).
package store
