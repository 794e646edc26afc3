// Package rdma is a verbs-shaped RDMA API with pluggable providers.
//
// The types follow libibverbs: a Device is opened by name, a protection
// domain (PD) owns memory regions (MR) and queue pairs (QP), work requests
// are posted to a reliable-connected QP and complete, in order, into a
// completion queue (CQ). Two providers implement it: rdma/soft, a pure-Go
// userspace RDMA engine over TCP (the default where no RDMA hardware exists),
// and rdma/verbs, cgo over libibverbs (InfiniBand, RoCE and Soft-RoCE), built
// with the "verbs" build tag. A provider registers itself when its package is
// imported, as database/sql drivers do.
//
// # Memory
//
// Registered memory is shared with a NIC that reads and writes it
// concurrently with the program, like DMA. It must not move and must not be
// Go heap memory, so only memory from [Alloc] or [MapFile] can be registered;
// anything else fails with [ErrNotMapped]. A [Memory] cannot be unmapped while
// a registration covers it.
//
// # Buffer ownership
//
// Posting a work request lends its buffers to the NIC. The bytes an SGE
// names must not be touched by the program (read for a RECV or READ target,
// written for a SEND or WRITE source) until the request is finished, and the
// MR must stay registered until then. A request is finished when its
// completion has been polled; an unsignaled request that succeeds never
// completes, and is finished once a completion of a later request on the
// same send queue has been polled, since send queues complete in order; and
// every request of a QP is finished once QP.Close has returned. The SendWR
// and RecvWR values themselves, and the slices passed to PostSend and
// PostRecv, are copied before Post returns and may be reused at once.
//
// # Concurrency
//
// Every method of every type here is safe for concurrent use unless its
// documentation says otherwise, and each says how long it may block. Post
// calls on one QP from several goroutines are serialised; the order between
// concurrent posters is unspecified. Any number of goroutines may Poll and
// Wait on one CQ; each completion reaches one of them.
package rdma
