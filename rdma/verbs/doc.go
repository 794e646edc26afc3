//go:build verbs

// Package verbs is the rdma provider over libibverbs: InfiniBand, RoCE and
// Soft-RoCE (rxe) devices, through cgo. Importing it registers the provider
// "verbs" with package rdma.
//
// # Building
//
// The package is compiled only with the build tag verbs, so the default
// build and `go test ./...` stay pure Go:
//
//	apt-get install libibverbs-dev     # Debian: headers and libibverbs.so
//	go build -tags verbs ./...
//	go test -tags verbs -c -o /tmp/verbs.test ./rdma/verbs/
//
// cgo must be enabled (CGO_ENABLED=1, a C compiler).
//
// # Running
//
// At run time the program needs libibverbs1 and ibverbs-providers (the
// userspace driver of the device, e.g. librxe for Soft-RoCE), an RDMA device
// whose port is ACTIVE, and an RLIMIT_MEMLOCK large enough for all
// registered memory (ibv_reg_mr pins pages and charges them to the limit)
// or CAP_IPC_LOCK. Without a device, Open fails with an error wrapping
// rdma.ErrNoDevice that says how to create a Soft-RoCE device:
//
//	rdma link add rxe0 type rxe netdev eth0
//
// The tests of this package need one or two such devices; see
// deploy/rxevm (docs/RXE-VM.md) for a VM that has them on a host without
// RDMA.
//
// # Choices
//
//   - GID: Options.GID "" (the default) picks the first GID of type
//     RoCEv2 that is an IPv4-mapped address (index 1 on rxe, whose index 0
//     is the IPv6 link-local GID), falling back to 0; on InfiniBand it
//     picks 0. A number is used as the index; an IP address selects the
//     RoCEv2 GID of that address (one rxe device per netdev).
//   - Path MTU: the smaller of both ports' active MTUs.
//   - Timeouts: QPConfig.AckTimeout is rounded up to 4.096µs·2^n (n in
//     1..31, never 0 = infinite); QPConfig.RetryCount is capped at 7.
//   - RNR: min_rnr_timer 10.24 ms and rnr_retry 6 (7 would retry forever),
//     so a SEND or WRITE_WITH_IMM to an rkv QP that never posts a RECV
//     completes with RNR_RETRY_EXC_ERR after 7 x 10.24 ms plus timer
//     rounding (about 100 ms measured on rxe).
//   - READs and atomics in flight: up to 16 per QP in each direction
//     (max_rd_atomic, max_dest_rd_atomic), less if the device allows less.
//   - Waiting: CQ.Wait polls for the device's Options.Spin (0 by default),
//     yielding to other goroutines between polls, then sleeps on a
//     completion channel whose fd sleeps in Go's netpoller (arm with
//     ibv_req_notify_cq, poll again, sleep, read and acknowledge the
//     event). It does not busy-poll beyond the spin: on machines with few
//     CPUs a spinning poller starves a software device (rxe does its
//     protocol work in kernel threads and softirqs). A spin that outlasts
//     the answer saves the sleep's wake-ups: under the rxe VM a PUT's
//     shape took 346 µs spinning 1 ms against 840 µs sleeping at once (p99
//     1.1 and 2.2 ms; spinning on Poll alone, 356 µs and 16 ms). Callers
//     that want to spin without bound can loop on Poll.
//   - Posting: work requests and SGEs are written into C arrays allocated
//     with the QP (MaxSendWR×MaxSGE, MaxRecvWR×MaxSGE) and reused;
//     PostSend, PostRecv and Poll allocate nothing.
//
// # Differences from the soft provider
//
// The conformance suite rdma/rdmatest runs against both providers; where a
// device's behaviour differs, this package either makes it match or the
// difference is the device's and is listed here. The workarounds for rxe
// (Linux 6.1, rdma-core 44), with the evidence for each, are in rxe.go:
//
//   - Local protection: an SGE naming an MR of another provider, of another
//     PD, a deregistered MR or bytes outside its MR is redirected past the
//     end of a one-page guard MR that each PD registers, so the device
//     fails the request with LOC_PROT_ERR, in order, and the QP moves to
//     ERR, as with soft. Such a request is also fenced: rxe loses both
//     completions, about one time in ten, when its requester fails a
//     request while the response to an earlier READ is being processed.
//     (As on hardware, an atomic whose result buffer is unusable is still
//     executed at the peer before it fails locally.)
//   - Misaligned atomics (remote address not a multiple of 8) complete with
//     REM_INV_REQ_ERR as the IB specification and soft have it, although
//     rxe's userspace driver would refuse them at post time (EINVAL): the
//     provider posts such a request as a 1-byte READ with rkey 0 into the
//     guard, which fails without modifying anything, and reports that
//     failure with REM_INV_REQ_ERR.
//   - RECVs posted on a QP in ERR: rxe flushes its receive queue only when
//     its responder runs, which a userspace PostRecv does not trigger;
//     PostRecv on a QP known to be in ERR therefore re-applies ERR after
//     posting so the new RECVs are flushed at once, as on hardware.
//   - Receive-side errors are the device's: rxe reports a SEND longer than
//     the RECV's buffers, and a RECV whose buffer it cannot use, as
//     REM_OP_ERR at the requester and LOC_QP_OP_ERR on the RECV (copy_data
//     returns EINVAL, which the responder treats as a malformed WQE) where
//     soft reports REM_INV_REQ_ERR and LOC_LEN_ERR.
//
// And, the same in both providers but done differently:
//
//   - Shape errors and the QP state at post are checked by the same code
//     as soft's (rdma/internal/postcheck): an atomic whose SGL is not one
//     8-byte SGE, a negative offset, too many SGEs and the like are
//     rdma.ErrInvalidWR before anything reaches the device. A message may
//     be up to 2^32-1 bytes (ibv_sge.length).
//   - Requester completions of RDMA_WRITE_WITH_IMM and SEND_WITH_IMM carry
//     the opcodes RDMA_WRITE and SEND, as in verbs (ibv_wc has no opcode
//     for them).
//   - QP.State asks the device (ibv_query_qp), so it sees transitions to ERR
//     the device made on its own; a QP already known to be in ERR (an
//     error completion was polled) is reported as ERR without asking.
//   - CQ.Wait: one Wait at a time sleeps on the completion channel; other
//     Waits on the same CQ queue behind it and poll in turn, so any number
//     may wait and none spins beyond Options.Spin.
//   - QP.Close holds the post locks, so it waits for a post in progress,
//     and ibv_destroy_qp stops the device's work on the QP before it
//     returns. Device, PD and CQ lifetimes (ErrBusy, exactly-once Close)
//     are rdma/internal/life's, shared with soft; a PD whose
//     ibv_dealloc_pd fails stays open and Close may be retried.
//   - A post of more requests than the queue holds (after the device's
//     rounding up) posts those that fit and fails at the first other one
//     with rdma.ErrQueueFull.
//   - The device, not this package, enforces the MR access flags, bounds and
//     rkeys of remote requests.
package verbs
