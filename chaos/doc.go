// Package chaos checks rkv under faults. The package holds the history a
// run records and the checker (linearizability with porcupine, as a
// register per key; durability of acknowledged writes; no reads of values
// never written). The chaos test itself, which runs three rkv-server
// processes, concurrent clients and a nemesis that kills, stops,
// partitions and slows servers, is behind the build tag "chaos":
//
//	go test -tags chaos -run Chaos -v ./chaos/
//
// docs/CHAOS.md describes the run, its settings and how to read a failure.
package chaos
