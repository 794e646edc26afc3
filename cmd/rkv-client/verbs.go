//go:build verbs

package main

// Built with -tags verbs, the command can open InfiniBand/RoCE devices
// through libibverbs; --provider auto then prefers them.
import _ "github.com/rkv-io/rkv/rdma/verbs"
