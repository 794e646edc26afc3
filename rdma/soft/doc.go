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
// address is advertised as it is, so ":7000" advertises "[::]:7000"). A
// device keeps an MR table keyed by rkey, a table of its QPs and its links
// to peer devices. Devices lists one name, "soft0"; Open accepts any name.
//
// Memory registration pins the buffer (rdma/internal/mem, mlock) and so
// fails with an error naming RLIMIT_MEMLOCK where ibv_reg_mr would. A
// registration for remote writes also maps its pages writable at once, as
// ibv_reg_mr does: mlock leaves a shared file mapping's pages read-only,
// and the first write of a peer's to each would fault. Keys
// come from a keyed bijection of a counter: they look random and are not
// reused for 2^32 registrations, so a stale rkey cannot reach a newer MR.
// MR.Addr is the buffer's real virtual address, as with verbs.
//
// # Links
//
// The QPs between two devices share one TCP connection, a link, per
// direction of requests, or a few: this device's links to a peer device,
// as many as Options.Links (default 1), carry the requests of every QP here
// connected to a QP there, and their answers, each QP on one link: its
// lane's (QPConfig.Lane above 0: lane k on link k-1, modulo the links,
// which the device reports as an rdma.Multilink), or else the one its
// number picks (consecutive QPs take different links). More links let
// more Waits read their own responses (below); fewer put more frames in
// each write. ModifyToRTS starts the QP's sender goroutine, which joins
// its link to the peer's data endpoint, dialing it (and saying hello) if
// there is none, and attaches the QP: an attach frame names the peer QP,
// this QP and this QP's PSN; the peer device waits (up to 10 s, on a
// goroutine of its own, so the link serves on) for that QP to reach RTR,
// checks that it was connected to exactly this QP and PSN, and answers
// with an attach acknowledgement. A QP serves one requester in its life,
// and a link that gets no QP attached within 10 s of its hello is closed,
// so a peer that cannot attach one (it needs the QP numbers and the PSN
// that rdma.ConnectQP exchanged) cannot hold a link open.
// Requests posted before the acknowledgement wait for it; if the attach
// fails they complete with RETRY_EXC_ERR. An attach on a link that dies
// before it is acknowledged (the peer restarted and nobody had noticed) is
// tried once more on a new link. A link is closed when the last QP leaves
// it; a QP leaves when it closes or goes to ERR. TCP_NODELAY is set.
//
// Writes are batched across QPs (doorbell batching): a QP's transmitter
// encodes its requests into a batch of its own and hands the batch to the
// link's writer. Whoever finds the writer idle writes, and then whatever
// other QPs left meanwhile, until nothing is pending; a QP that finds a
// write in progress leaves its batch pending and returns, so the frames
// of all the QPs that are ready together leave in one write. Goroutines
// woken together by one read of responses are ready together only if the
// first waits for the others: a batch of READs posted on a link whose
// last read brought responses for several QPs ("bunched") yields once
// before its write. The responder hands over its answers the same way.
// Payloads over 4 KiB leave by writev straight from registered memory,
// holding the writer until their frame is out, as frames cannot
// interleave. A write blocked for the longest budget of the link's QPs
// (the peer read nothing all that time) breaks the link: the device's
// sweeper goroutine looks every second (a write deadline, renewed per
// write, cost 1% of a lone READ).
//
// # Wire format
//
// A link opens with a hello (8 bytes: "RKVS", version 3, 3 zero bytes).
// Then each direction is a stream of frames, all integers big-endian,
// each opening with a header of its direction's size. From the requester,
// a request is a 52-byte header
//
//	payload length u32 | opcode u8 | flags u8 | 2 zero bytes | destination QP u32 | sequence u32 |
//	rkey u32 | remote address u64 | length u32 | immediate u32 | compare/add u64 | swap u64
//
// then, for WRITE, WRITE_WITH_IMM, SEND and SEND_WITH_IMM, the payload.
// The one flag (bit 0, on those four only) says that the request's ACK
// may wait (below).
// From the responder, a response is a 24-byte header
//
//	payload length u32 | kind u8 | status u8 | 2 zero bytes | destination QP u32 |
//	sequence u32 | atomic value u64
//
// (kind ACK, NAK, READ data, atomic result), then, for READ data, the
// bytes. Control frames have their direction's header size: a zero
// payload length, the kind, a code byte (used by the attach
// acknowledgement only), two zero bytes, the destination and source QPs,
// the PSN (attach only), and zeros. The requester sends attach and detach
// (the requester QP left: nothing more comes for it); the responder sends
// the attach acknowledgement (a code: ok, no such QP, not ready, wrong
// peer, busy) and gone (the responder QP left RTS: the requester's
// outstanding requests fail with RETRY_EXC_ERR at once, as against a dead
// QP). QP numbers are 24 bits, never 0.
//
// Every request is answered, in order. Sequence numbers start at the
// requester's PSN and must match exactly. Decoding (wire.go) is pure and
// strict: unknown opcodes, non-zero reserved bytes, fields a frame does
// not use, lengths that disagree or exceed MaxMessageSize are all
// rejected, so no length field can cause an allocation (payloads go
// straight into registered memory) and a frame that decodes re-encodes to
// the same bytes. A malformed or truncated frame closes its link, with
// the reason logged to rdma.Options.Logger; the QPs whose requests it
// carried go to ERR, the QPs whose answers it carried see the link fail
// (below); nothing else on the device is affected. A well-formed frame
// that breaks one QP's protocol (an out-of-sequence request, a response
// to no request) costs that QP alone: the link stays in step. Frames for
// a QP that left the link, or that left RTS, are read and dropped.
//
// # Responder
//
// One goroutine per link, for every QP attached to it. It resolves the
// rkey in its own device's MR table and checks that the MR is in the QP's
// PD, has the access flag the opcode needs and contains the whole range
// (one byte past the end fails); then it copies between the socket and
// the MR, never calling application code. While it copies it holds the
// MR's read lock, so Deregister waits for the copy and never frees memory
// under it. A requester stalling in mid-payload is given its QP's
// AckTimeout*(RetryCount+1) per MiB chunk. Zero-length READ and WRITE need
// no valid rkey (IBA C9-88). Answers are batched like requests: the
// responder hands them to the writer when its read buffer holds no
// further request, so the requests that arrived together, of any QPs,
// are answered in one write.
//
// An ACK may wait when its request asked for that: an unsignaled WRITE or
// SEND, sent while fewer than half the QP's send ring's requests were on
// the wire (nobody waits for its completion; the ACK only frees its slot).
// The responder holds such ACKs back, up to 4 KiB of them: each answer it
// queues takes them along in front of it (so every QP's answers stay in
// order), and 1 ms after the first was held they leave by themselves (a
// timer writes them while the responder waits between frames; otherwise
// the responder does before it next blocks). A QP whose budget is under
// 16 ms never holds. So a request-reply protocol posting its requests and
// replies unsignaled (a PUT's commit SEND and the reply to it) costs
// neither side a write and a read for the ACKs: the replies carry them,
// or they leave in bulk. NAKs are never held.
//
// Atomics need 8-byte alignment (REM_INV_REQ_ERR otherwise) and operate
// with sync/atomic on the mapped memory, which holds a uint64 in the
// host's byte order, as rxe does; the original value lands in the
// requester's 8-byte SGE in host order too.
//
// A SEND's ACK is handed to the writer before its RECV completes (when
// no further request is buffered): the application's answer to the SEND,
// which goes back on the other link, would otherwise often overtake the
// ACK and interrupt the requester's Wait reading for it; 3-7% off a
// PUT's p50 across processes.
//
// A CQ given a RecvHandler (rdma.RecvHandling) takes its successful RECV
// completions from the responder instead of the ring: the responder
// gathers those of the requests it read together, of any QPs, and hands
// them over once it has served them, after the answers have gone to the
// writer, one call per handler; those a handler declines go to their CQs
// as though it were not set. While a handler runs, or a hold is taken
// (rdma.PostHolding), the device's posts are corked: their frames pend in
// their link's writer, which is taken if nobody writes, and leave when a
// handler returns or a hold is released (all that is held then: handlers
// of many links could otherwise overlap for ever), in one write per
// link, made without blocking (a socket that takes only part of it leaves
// the rest to a goroutine: the responder must never wait for a peer that
// may be waiting for it). So a server answering the commits of many
// clients' QPs, that came in one read, sends the replies in one write;
// each commit's RECV completion is no hand-off to another goroutine.
//
// SEND and WRITE_WITH_IMM consume the oldest RECV. With none posted the
// responder does not wait, which would hold up every QP on the link: it
// NAKs RNR at once and drops the QP's later requests until the NAKed one
// comes again. The requester sends it again (and what followed it) after
// a delay, from 100 µs doubling to 10 ms, as IB's rnr_retry does, for up
// to half its AckTimeout*(RetryCount+1); then the request completes with
// RNR_RETRY_EXC_ERR. RNR leaves the responder's QP in RTS. A SEND longer
// than the RECV's buffers completes that RECV with LOC_LEN_ERR and the
// SEND with REM_INV_REQ_ERR, as InfiniBand specifies (rxe in Linux 6.1
// reports LOC_QP_OP_ERR and REM_OP_ERR instead); a RECV whose SGEs fail
// the local checks completes with LOC_PROT_ERR and the SEND with
// REM_OP_ERR. Other NAKs (REM_ACCESS_ERR, REM_INV_REQ_ERR, REM_OP_ERR)
// move the responder's QP to ERR too, as in RC; its requester learns from
// the NAK, and the QP's later requests are read and dropped.
//
// # Requester
//
// PostSend copies the requests into the send ring and sends them inline
// from the caller's goroutine when no one else is sending for the QP (a
// lock-free owner flag; a busy owner is told to look again), so a request
// leaves without a goroutine hand-off. Requests of 64 KiB or more, past
// 256 KiB sent in one call, or over 4 KiB while the link's writer is busy,
// go to the QP's sender goroutine so PostSend does not block on long
// writes. (A PostSend can still block while the socket's send buffer is
// full, that is while the peer does not read.) A payload's MRs are held
// from the moment its request is taken for sending until its frame is
// written; one being deregistered then fails the request with
// LOC_PROT_ERR, as at post time, and its frame is not sent. A fenced
// request is held back until the READs and atomics before it have
// completed, their data landed, as InfiniBand specifies; the WRITEs and
// SENDs before it need no wait, as the responder executes a QP's requests
// in order (so a fence never waits for held ACKs).
//
// Responses are read, READ data landed straight from the socket into the
// target SGEs, and requests completed strictly in posting order (successful
// ones only when signaled, by Signaled or SignalAll; failed ones always)
// by whoever holds the link's reader token:
//
//   - When every QP on the link is the only user of its send CQ, a
//     CQ.Wait of a QP with requests outstanding (other than ones whose
//     ACKs may be held, which come late or with other answers) takes the
//     token and reads the responses itself: the waiting goroutine sleeps
//     in the socket read and the response wakes it, as a plain TCP
//     client, with no hand-off between goroutines. It hands the frames of
//     the link's other QPs to them, as the goroutine does, and when it
//     stops while another QP has requests on the wire it gives the token
//     to the goroutine.
//     Completions pushed into the CQ by others (the QP's responder, a
//     flush) and the Wait's context interrupt that read, between frames
//     only.
//   - Otherwise the link's goroutine reads, and hands each frame to its
//     QP: always, while the link carries a QP whose send CQ serves several
//     QPs; when Poll finds the CQ empty (a busy poller does not read);
//     while several QPs have requests outstanding and the Wait that read
//     inline stopped; and when responses have waited 500 µs for a Wait,
//     which the device's sweeper goroutine notices (it ticks every
//     millisecond while there is such traffic, and sleeps otherwise; no
//     timer is touched per request). A link that comes to carry no QP
//     with a shared CQ is read inline again.
//
// The steady-state post, Wait and Poll paths allocate nothing. A Wait that
// reads inline under a context that can end registers the interrupt of
// its read for that context's end (context.AfterFunc) once, and keeps it
// for the next inline Wait under a context with the same Done channel;
// a kept registration that fires later interrupts whatever read is then
// under way, which looks at its CQ and context and reads on.
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
// a link inline (it holds the token), the others park.
//
// A request fails with RETRY_EXC_ERR when its link closes or resets while
// it is outstanding, when the peer QP leaves RTS (gone), or when nothing
// at all arrives on the link for the QP's AckTimeout*(RetryCount+1) while
// it has requests outstanding: the responder answers in link order, so
// silence on the link is silence for every QP on it, and each QP fails on
// its own budget; silence in mid-frame fails the link. A QP whose link
// closed, or whose peer left, while it was idle stays in RTS and fails its
// next request so.
//
// # Errors
//
// The first failed request moves the QP to ERR and then completes with its
// status (in that order, so whoever polls the failure finds the QP in ERR;
// a RECV the responder fails likewise); the QP leaves its links (the
// peer's requester is told its QP is gone, the peer's responder that the
// requester left) and completes every other outstanding and later request,
// on both queues, with WR_FLUSH_ERR, in order; a request whose data is
// landing at that moment completes first. Posting in ERR is accepted and
// flushed, as in verbs.
//
// # Close
//
// QP.Close marks the QP closed, leaves its links, and waits for its
// goroutine and for anything touching its requests' buffers: a PostSend
// sending inline, and a link's reader or responder landing data in them
// (they hold a read lock that Close takes; readers of a link only try it,
// so that none waits for a Close that waits for a write that waits for
// the peer, and drop the QP's frames when the lock is taken). So when it
// returns nothing touches the buffers of the requests it discarded.
// MR.Deregister waits for a copy in progress (the MR's lock, which the
// NIC's copies likewise only try), so memory is never freed under the NIC
// either. A Close can wait for a large request of its QP to finish
// writing: its frame cannot be cut short on a shared link. Device, PD and
// CQ lifetimes (ErrBusy, exactly-once Close) are rdma/internal/life's,
// shared with verbs.
//
// # Differences from hardware
//
//   - Frames are not cut at the path MTU and there are no retransmissions
//     but RNR's: TCP is reliable, so retries only wait, and RetryCount only
//     scales the time a silent peer is given. A large frame holds its link
//     until it is out.
//   - A successful unsignaled WRITE or SEND whose ACK is still held when
//     its QP goes to ERR, or when the peer's QP leaves, completes with an
//     error (WR_FLUSH_ERR, RETRY_EXC_ERR) though it was executed, as a
//     NIC's would whose ACK was lost; its slot's completion was not
//     signaled, so only an error tells.
//   - A CQ overrun makes the CQ unusable (Poll returns ErrCQOverrun) but
//     raises no asynchronous event and does not move QPs to ERR.
//   - QPs never leave ERR; there is no ModifyToReset in the API.
package soft
