// Package proto holds every wire type of rkv: the on-arena record format
// (record.go) and, with the cluster, the msgpack-encoded control RPCs and
// gossip metadata, each versioned.
package proto
