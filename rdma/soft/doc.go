// Package soft is a userspace RDMA "NIC" in pure Go: the "soft" provider
// of package rdma, reliable-connected queue pairs carried over TCP. Import
// it for its side effect:
//
//	import _ "github.com/rkv-io/rkv/rdma/soft"
//	dev, err := rdma.Open("soft", "", rdma.Options{ListenAddr: "10.0.0.5:7000"})
//
// # Devices
//
// Every Open creates an independent device with a TCP listener on
// Options.ListenAddr (default 127.0.0.1:0), its data endpoint, which QPInfo
// carries as Addr; give it an address the peers can reach (the listener's
// address is advertised as it is, so ":7000" advertises "[::]:7000"). A device keeps an MR table keyed by rkey and a table of
// its QPs. Devices lists one name, "soft0"; Open accepts any name.
//
// Memory registration pins the buffer (rdma/internal/mem, mlock) and so
// fails with an error naming RLIMIT_MEMLOCK where ibv_reg_mr would. Keys
// come from a keyed bijection of a counter: they look random and are not
// reused for 2^32 registrations, so a stale rkey cannot reach a newer MR.
// MR.Addr is the buffer's real virtual address, as with verbs.
//
// # Connections
//
// ModifyToRTS starts the QP's sender goroutine, which dials the peer
// device's data endpoint and sends a hello naming the peer QP, this QP and
// this QP's PSN; the peer device waits (up to 10 s) for that QP to reach
// RTR, checks that it was connected to exactly this QP and PSN, attaches
// the connection to the QP's responder and acknowledges. Each connected
// pair thus uses two TCP connections, each carrying one direction's
// requests and their responses. A QP accepts one such connection in its
// life. Requests posted before the connection is up wait for it; if it
// cannot be made they complete with RETRY_EXC_ERR. TCP_NODELAY is set.
// (Carrying every QP between two devices over one connection, so that the
// frames of many QPs leave in one write, is measured and designed in
// docs/ARCHITECTURE.md, "rdma/soft", but not built; rdma/soft's
// shared_test.go holds the tests it must keep passing.)
//
// # Wire format
//
// After the hello (24 bytes: "RKVS", version 1, 3 zero bytes, destination
// QPN, source QPN, PSN, RNR budget in ms) and its acknowledgement (8 bytes:
// "RKVA", a code, 3 zero bytes), each direction is a stream of frames, all
// integers big-endian. A request is a 48-byte header
//
//	payload length u32 | opcode u8 | 3 zero bytes | sequence u32 | rkey u32 |
//	remote address u64 | length u32 | immediate u32 | compare/add u64 | swap u64
//
// then, for WRITE, WRITE_WITH_IMM, SEND and SEND_WITH_IMM, the payload. A
// response is a 20-byte header
//
//	payload length u32 | kind u8 | status u8 | 2 zero bytes | sequence u32 | atomic value u64
//
// (kind ACK, NAK, READ data, atomic result), then, for READ data, the
// bytes. Every request is answered, in order. Sequence numbers start at
// the requester's PSN and must match exactly. Decoding (wire.go) is pure
// and strict: unknown opcodes, non-zero reserved bytes, fields an opcode
// does not use, lengths that disagree or exceed MaxMessageSize are all
// rejected, so no length field can cause an allocation (payloads go
// straight into registered memory) and a frame that decodes re-encodes to
// the same bytes. A malformed, truncated or out-of-sequence frame closes
// that connection and moves its QP to ERR, with the reason logged to
// rdma.Options.Logger; nothing else on the device is affected.
//
// # Responder
//
// One goroutine per incoming connection. It resolves the rkey in its own
// device's MR table and checks that the MR is in the QP's PD, has the
// access flag the opcode needs and contains the whole range (one byte past
// the end fails); then it copies between the socket and the MR, never
// calling application code. While it copies it holds the MR's read lock,
// so Deregister waits for the copy and never frees memory under it. A
// requester stalling in mid-payload is given AckTimeout*(RetryCount+1) per
// MiB chunk. Zero-length READ and WRITE need no valid rkey (IBA C9-88).
// Answers are batched like requests: the responder writes them out when
// its read buffer holds no further request, so the requests of one post
// are answered in one write.
//
// Atomics need 8-byte alignment (REM_INV_REQ_ERR otherwise) and operate
// with sync/atomic on the mapped memory, which holds a uint64 in the
// host's byte order, as rxe does; the original value lands in the
// requester's 8-byte SGE in host order too.
//
// SEND and WRITE_WITH_IMM consume the oldest RECV. With none posted, the
// responder waits up to half the requester's AckTimeout*(RetryCount+1) (so
// the answer beats the requester's own timeout) for one, then answers RNR:
// the request completes with RNR_RETRY_EXC_ERR, as when a real requester
// exhausts rnr_retry; the responder QP stays usable. A SEND longer than
// the RECV's buffers completes that RECV with LOC_LEN_ERR and the SEND with
// REM_INV_REQ_ERR, as InfiniBand specifies (rxe in Linux 6.1 reports
// LOC_QP_OP_ERR and REM_OP_ERR instead); a RECV whose SGEs fail the local
// checks completes with LOC_PROT_ERR and the SEND with REM_OP_ERR. Other NAKs
// (REM_ACCESS_ERR, REM_INV_REQ_ERR, REM_OP_ERR) move the responder's QP to
// ERR too, as in RC. After any NAK the responder stops reading that
// connection.
//
// # Requester
//
// PostSend copies the requests into the send ring and sends them inline
// from the caller's goroutine when no one else is sending (a lock-free
// owner flag; a busy owner is told to look again), so a request leaves
// without a goroutine hand-off. Requests of 64 KiB or more, or past 256 KiB
// sent in one call, go to the QP's sender goroutine so PostSend does not
// block on long writes. (A PostSend can still block while the socket's
// send buffer is full, that is while the peer does not read; a peer that
// stays silent past the budget below has the connection closed, which ends
// the write.) Small frames are batched and flushed when a batch is done;
// payloads over 4 KiB are written with writev straight from registered
// memory.
//
// Responses are read, READ data landed straight from the socket into the
// target SGEs, and requests completed strictly in posting order (successful
// ones only when signaled, by Signaled or SignalAll; failed ones always)
// by whoever holds the QP's reader token:
//
//   - When a QP is the only user of its send CQ, CQ.Wait takes the token
//     and reads the responses itself: the waiting goroutine sleeps in the
//     socket read and the response wakes it, as a plain TCP client, with no
//     hand-off between goroutines. Completions pushed into the CQ by others
//     (the QP's responder, a flush) and the Wait's context interrupt that
//     read, between frames only.
//   - Otherwise the QP's receiver goroutine reads: always, when the send CQ
//     serves several QPs; when Poll finds the CQ empty (a busy poller does
//     not read); and when responses have waited 500 µs for a Wait, which
//     the device's sweeper goroutine notices (it ticks every millisecond
//     while there is such traffic, and sleeps otherwise; no timer is
//     touched per request).
//
// The steady-state post, Wait and Poll paths allocate nothing (a Wait with
// a cancellable context allocates for context.AfterFunc when it reads
// inline).
//
// Local checks happen at post time and again just before the request is
// sent (an MR deregistered since fails it): an SGE outside its MR, in an
// MR of another PD or provider, or without LOCAL_WRITE where the NIC
// writes (READ target, atomic result, RECV buffer) completes the request
// with LOC_PROT_ERR once all requests before it have completed, and moves
// the QP to ERR. Shape errors and the QP state are checked by the same code
// as verbs' (rdma/internal/postcheck; a message may be up to
// MaxMessageSize) and, like a full queue, are PostErrors.
//
// Completion queues: any number of goroutines may Poll and Wait on one CQ.
// Parked Waits are woken one at a time through a one-slot channel and pass
// the wakeup on while completions remain; only one Wait at a time can read
// a lone QP's responses inline (it holds the QP's reader token), the
// others park.
//
// A request fails with RETRY_EXC_ERR when the peer's connection closes or
// resets while it is outstanding, or when the peer shows no sign of life
// (no completion and no byte) for AckTimeout*(RetryCount+1). A QP whose
// connection closed while idle stays in RTS and fails its next request so.
//
// # Errors
//
// The first failed request moves the QP to ERR and then completes with its
// status (in that order, so whoever polls the failure finds the QP in ERR;
// a RECV the responder fails likewise); the QP closes both its connections
// (the peer's outstanding requests then fail as against a dead QP) and
// completes every other outstanding and later request, on both queues,
// with WR_FLUSH_ERR, in order. Posting in ERR is accepted and flushed, as
// in verbs.
//
// # Close
//
// QP.Close marks the QP closed, closes its connections, and waits for its
// goroutines and for any PostSend or Wait working its connection inline
// (they hold a read lock that Close takes), so when it returns nothing
// touches the buffers of the requests it discarded. MR.Deregister waits for
// a copy in progress (the MR's lock), so memory is never freed under the
// NIC either. Device, PD and CQ lifetimes (ErrBusy, exactly-once Close) are
// rdma/internal/life's, shared with verbs.
//
// # Differences from hardware
//
//   - Frames are not cut at the path MTU and there are no retransmissions:
//     TCP is reliable, so retries only wait, and RetryCount only scales the
//     time a silent peer is given. An RNR is not retried on the wire: the
//     responder waits for a RECV instead.
//   - Fence waits until every earlier request has completed, not only
//     READs and atomics.
//   - A request whose local MR is deregistered while its payload is on the
//     way moves the QP to ERR and completes with WR_FLUSH_ERR, not
//     LOC_PROT_ERR: its frame cannot be finished.
//   - A CQ overrun makes the CQ unusable (Poll returns ErrCQOverrun) but
//     raises no asynchronous event and does not move QPs to ERR.
//   - QPs never leave ERR; there is no ModifyToReset in the API.
package soft
