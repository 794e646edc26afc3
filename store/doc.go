// Package store will hold a server's data: value arenas (files mapped into
// memory and registered for RDMA), self-verifying records, the hash index
// that clients read one-sidedly, the Pebble database that persists the
// index, write leases, commit and recovery.
//
// Status: not implemented yet (issue 4); only the package exists.
package store
