// The resource interfaces every provider implements, and provider selection.

package rdma

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"
)

// Provider opens devices of one kind. Providers register themselves with
// RegisterProvider from an init function. Its methods are safe for
// concurrent use.
type Provider interface {
	// Name is the provider's name as given to Open ("soft", "verbs"). It
	// never blocks.
	Name() string
	// Devices lists the devices that Open could open now. It may do I/O
	// (verbs asks the kernel) but does not open anything.
	Devices() ([]string, error)
	// Open opens the named device; "" or "auto" means the first device.
	// It may block briefly: soft starts listening on Options.ListenAddr,
	// verbs opens the device and queries its port.
	Open(device string, opts Options) (Device, error)
}

// Options configures a device at Open. Each field is used by the providers
// that name it and ignored by the others.
type Options struct {
	// ListenAddr (soft) is the TCP address the device's responder listens
	// on, its data endpoint. Default "127.0.0.1:0".
	ListenAddr string
	// Port (verbs) is the physical port number. Default 1.
	Port int
	// GID (verbs) selects the port GID used for RoCE: "" (the default)
	// picks the first RoCEv2 IPv4-mapped GID, falling back to index 0; a
	// decimal string is a GID table index ("1"); an IP address selects the
	// RoCEv2 GID of that address.
	GID string
	// Links (soft) is how many TCP links the device opens to each peer
	// device; its QPs connected to QPs there are spread over them by QP
	// number, so QPs made one after another take different links, unless
	// their QPConfig.Lane keeps them together. A waiting goroutine reads
	// its own responses off a link only while no other goroutine reads
	// that link, so more links let more concurrent Waits read for
	// themselves, with no hand-off between goroutines; fewer put more
	// requests and answers in each write. Default 1: every
	// QP to a peer on one link. (rkv's client, its write QPs on one lane,
	// on three links side by side with one, a connection per goroutine:
	// GETs 1.91x as fast at two goroutines, 1.39x at four, about 1x at
	// one, sixteen and sixty-four; PUTs 1x. Its write QPs spread as well,
	// durable PUTs were 0.93x: their commits came in more, smaller reads.)
	Links int
	// Spin (verbs) is how long a CQ's Wait keeps polling, yielding to
	// other goroutines between polls, before it arms the CQ and sleeps on
	// its completion channel. On a NIC a request's completion comes a few
	// microseconds after its post, and sleeping costs an interrupt and a
	// wake-up of several microseconds more; spinning a little catches it
	// awake. Spinning costs CPU while nothing comes, so a process that
	// waits on many idle CQs (a server) keeps it short or 0. Default 0:
	// sleep as soon as the CQ is empty. Must not be negative.
	Spin time.Duration
	// Logger (soft) receives the provider's logs: data connections
	// refused or dropped, QPs moved to ERR and why. The command that opens
	// the device passes its own, so that these lines share its handler
	// and format. Default slog.Default().
	Logger *slog.Logger
}

// The resource interfaces below state, method by method, how long a call
// may block, what it may run concurrently with, and who owns the slices
// and buffers it is given. Unless a method says otherwise it is safe for
// concurrent use with every method of every resource, and a method of a
// closed resource fails with ErrClosed (the accessors — Name, Num, Addr,
// RKey and the like — keep answering).
//
// Resources form a tree: a Device owns PDs and CQs, a PD owns MRs and QPs,
// a QP uses one or two CQs. A resource's Close fails with ErrBusy while
// anything below it (or, for a CQ, a QP using it) is open, succeeds once,
// and returns ErrClosed after that; a child cannot be created from a
// closed resource (ErrClosed). Nothing is closed by a finalizer.

// Device is an open RDMA device.
type Device interface {
	// Name is the device's name ("soft0", "rxe0"). It never blocks.
	Name() string
	// Provider is the name of the provider that opened the device. It
	// never blocks.
	Provider() string
	// AllocPD allocates a protection domain. It blocks for a system call
	// at most (verbs: ibv_alloc_pd, and registering the PD's one-page
	// guard MR).
	AllocPD() (PD, error)
	// CreateCQ creates a completion queue with room for at least size
	// completions. It blocks for a system call at most.
	CreateCQ(size int) (CQ, error)
	// Close releases the device. It fails with ErrBusy while PDs or CQs
	// created from it are open. It blocks until the device's own
	// goroutines have stopped (soft: its listener and the handshakes in
	// progress; verbs: its async event watcher).
	Close() error
}

// PD is a protection domain: MRs and QPs of one PD work only with each
// other.
type PD interface {
	// Register pins buf and registers it with the given access. buf must
	// lie within one Memory from Alloc or MapFile (ErrNotMapped
	// otherwise); access must pass Access.Validate. Register blocks while
	// the pages are pinned, which takes time in proportion to len(buf)
	// (page faults in every page: about 0.15 s per GiB of warm memory,
	// more when the pages are first touched): use a Registrar to keep it
	// off latency-critical paths. It may run concurrently with every
	// other method, including other Registers of the same PD.
	//
	// buf is not lent but shared: from Register until Deregister returns,
	// the NIC reads and writes it for the posted requests that name the
	// MR, and remote peers holding the rkey read and write it as access
	// allows, at any moment and concurrently with the program. The MR
	// keeps buf (MR.Bytes); its Memory cannot be unmapped meanwhile
	// (Memory.Close fails with ErrBusy).
	Register(buf []byte, access Access) (MR, error)
	// CreateQP creates an RC queue pair in state RESET. cfg is copied; its
	// CQs must come from the PD's device and stay open while the QP
	// exists. It blocks for a system call at most.
	CreateQP(cfg QPConfig) (QP, error)
	// Close releases the PD. It fails with ErrBusy while MRs or QPs of
	// the PD exist. It blocks for a system call at most. If the device
	// refuses (verbs: a failed ibv_dealloc_pd) the PD stays open and Close
	// may be called again.
	Close() error
}

// MR is a registered memory region.
//
// The accessors never block and keep their values after Deregister.
type MR interface {
	// Addr is the address remote peers use to name the region's first byte.
	Addr() uint64
	// Len is the region's length in bytes.
	Len() int
	// LKey is the local key, for diagnostics: SGEs name their MR, not a key.
	LKey() uint32
	// RKey is the capability a remote peer needs to access the region.
	RKey() uint32
	// Access is the access the region was registered with.
	Access() Access
	// Bytes is the registered memory itself, shared with the NIC (see
	// PD.Register).
	Bytes() []byte
	// Deregister revokes the region: once it returns, remote accesses with
	// its rkey fail with REM_ACCESS_ERR, a request posted later that names
	// it fails with LOC_PROT_ERR, and the NIC no longer reads or writes
	// the region. It blocks until a transfer in progress into or out of
	// the region has finished (soft: a responder's or requester's copy;
	// verbs: ibv_dereg_mr), so the memory may then be reused or unmapped.
	// A request still outstanding that has not reached the region fails
	// (LOC_PROT_ERR, or WR_FLUSH_ERR behind an earlier failure); one that
	// already has may still succeed. It must be called exactly once; a
	// second call returns ErrClosed and does nothing. An MR produced by a
	// Registrar is released with Registration.Release instead.
	Deregister() error
}

// CQ is a completion queue.
//
// Any number of goroutines may Poll and Wait on one CQ at once, with each
// other and with Close: every completion is returned by exactly one call.
// One call returns its completions in the order the CQ received them;
// completions of one QP's send queue arrive in posting order, and those of
// its receive queue in the order its RECVs were consumed or flushed, but
// how concurrent calls share them out is unspecified. (verbs lets one Wait
// at a time sleep on its completion channel and queues the others behind
// it; soft parks them all. Either way none spins beyond Options.Spin.)
type CQ interface {
	// Poll moves up to len(wc) completions into wc[:n] and returns n. It
	// never blocks beyond a short lock (soft may hand a lone QP's
	// responses to its link's goroutine, so a busy poller makes
	// progress). wc is the caller's: Poll writes wc[:n] and keeps no
	// reference. It fails with ErrCQOverrun once more completions arrived
	// than the CQ could hold: the CQ is then unusable, as in verbs.
	Poll(wc []Completion) (int, error)
	// Wait blocks until at least one completion is available, ctx is done
	// (then it returns 0 and ctx.Err(), unless completions raced the
	// cancellation) or the CQ is closed (ErrClosed), then behaves as
	// Poll. With len(wc) == 0 it returns at once. It sleeps rather than
	// spins (soft: in a socket read or on a channel; verbs: on the
	// completion channel's fd in the netpoller, after polling for the
	// device's Options.Spin, 0 by default).
	Wait(ctx context.Context, wc []Completion) (int, error)
	// Close releases the CQ. It fails with ErrBusy while a QP uses it.
	// Waits in progress return ErrClosed (verbs' Close blocks until a Wait
	// sleeping on the completion channel has let go of it). Completions
	// not yet polled are discarded.
	Close() error
}

// RecvHandling is implemented by the CQs of a provider that can hand
// receive completions to a RecvHandler on its own goroutine (soft). A
// program checks for it and otherwise polls or waits: verbs' CQs do not
// implement it.
type RecvHandling interface {
	// SetRecvHandler hands the CQ's successful RECV completions to h from
	// now on, each with tag, instead of queueing them for Poll and Wait.
	// Failed receive completions (a flush, a length error) and every send
	// completion still go to Poll and Wait, so that a QP's failure is seen
	// where it always is. CQs given the same h (compared with ==, so a
	// pointer) have their completions handed to it together. Set it
	// before posting the RECVs whose completions h is to take; it cannot
	// be unset. Safe for concurrent use with everything else on the CQ.
	SetRecvHandler(h RecvHandler, tag any)
}

// RecvHandler takes receive completions in batches on the provider's own
// goroutine: how a server serves the SENDs of many QPs without a goroutine
// waiting on each, and serves together what arrived together (one group
// commit for many clients' commits).
type RecvHandler interface {
	// HandleRecvs is given successful RECV completions of the CQs h was
	// set on (RecvHandling), in the order they completed: all those the
	// provider completed together (soft: the SENDs of one read of a link,
	// from any of its QPs). It runs on the provider's goroutine that
	// completed them: never concurrently for the completions of one QP,
	// possibly so for different QPs. It must not block for long (a sync,
	// a network round trip): whatever else that goroutine serves (soft:
	// every QP of the link) waits until it returns. The sends it posts may
	// leave together once it returns (soft: one write per link). It
	// returns those it declines, in their order, a prefix of recvs's
	// memory (it may move them there): they are queued on their CQs for
	// Poll and Wait, as though it had not been set, so that a goroutine
	// waiting there serves what would take the handler long. recvs is the
	// provider's: valid only during the call.
	HandleRecvs(recvs []Recv) (declined []Recv)
}

// Recv is a receive completion handed to a RecvHandler, with the tag its
// CQ was given.
type Recv struct {
	Tag any
	Completion
}

// PostHolding is implemented by the devices of a provider that can hold
// sends and hand them to the wire together, whichever of the device's QPs
// they were posted on (soft: one write per link, as a RecvHandler's posts
// leave). A program checks for it: verbs does not implement it, as each
// post there rings its own doorbell, which is the NIC's business.
type PostHolding interface {
	// HoldPosts begins a hold: sends posted on the device's QPs from now
	// on, by any goroutine, may wait in the device until a ReleasePosts.
	// Holds may overlap (a RecvHandler's run is one); each HoldPosts needs
	// one ReleasePosts. Between the two, the caller must not wait for a
	// completion of what it posted, which may not have left, and must
	// not take long: every other goroutine's sends wait too. It never
	// blocks. Safe for concurrent use.
	HoldPosts()
	// ReleasePosts ends a hold and hands everything held to the wire,
	// without waiting for a peer that reads slowly (soft: what the socket
	// does not take at once, a goroutine writes). Safe for concurrent use.
	ReleasePosts()
}

// Multilink is implemented by the devices of a provider that carries the
// QPs to one peer device over several links (soft: Options.Links). A
// program checks for it to give concurrent work QPs of distinct lanes
// (QPConfig.Lane): lanes 1 to Links ride distinct links.
type Multilink interface {
	// Links is how many links the device opens to each peer device, at
	// least 1. It never blocks.
	Links() int
}

// QP is a reliable-connected queue pair.
//
// A new QP is in RESET. ModifyToInit, ModifyToRTR and ModifyToRTS move it,
// in that order, to RTS, where it can send; ConnectQP does all three with a
// peer over an out-of-band connection. An error completion, or
// ModifyToError, moves the QP to ERR; a QP never leaves ERR. By the time a
// caller polls an error completion, State reports ERR.
//
// Which states accept a post, as in verbs (ibv_post_send, ibv_post_recv):
//
//	state   PostSend                 PostRecv
//	RESET   ErrQPState               ErrQPState
//	INIT    ErrQPState               accepted, held until RTR
//	RTR     ErrQPState               accepted
//	RTS     accepted                 accepted
//	ERR     accepted, flushed        accepted, flushed
//	closed  ErrClosed                ErrClosed
//
// A request accepted in ERR completes with WR_FLUSH_ERR, signaled or not,
// as does every request outstanding when the QP enters ERR.
//
// # Ordering
//
// The requests of one send queue are executed by the responder in posting
// order (a READ sees the data of the WRITEs posted before it) and complete
// in posting order. A request's local source bytes may be read as soon as
// it is posted, before earlier READs and atomics have returned their data:
// set Fence on a request that must wait for those. SENDs and
// WRITE_WITH_IMMs consume the responder's RECVs in the order they were
// posted there.
//
// # Buffer ownership
//
// The SendWR and RecvWR values, their SGLs and the slices passed to
// PostSend and PostRecv are copied before the call returns and may be
// reused at once. The bytes an SGE names belong to the NIC from the post
// until the request is finished, and its MR must stay registered until
// then; the program must not write them (a WRITE or SEND source) or read
// them (a READ target, an atomic's result, a RECV buffer) meanwhile. A
// request is finished when:
//
//   - its completion has been polled (a signaled request, a RECV, and any
//     request that fails, since failures always complete);
//   - for an unsignaled request that succeeds, which never completes: a
//     completion of a later request on the same send queue has been polled
//     (send queues complete in order, so that one finished after it);
//   - or Close has returned.
type QP interface {
	// Num is the queue pair number. It never blocks.
	Num() uint32
	// State is the QP's current state. It blocks for a system call at
	// most (verbs asks the device, so it sees a move to ERR the device
	// made on its own). A closed QP reports ERR.
	State() QPState
	// Info returns what the peer needs to connect to this QP. It never
	// blocks.
	Info() QPInfo
	// ModifyToInit moves the QP from RESET to INIT (ErrQPState from any
	// other state). RECVs may be posted from INIT on. Each Modify method
	// moves the state atomically, so of two concurrent ones that start
	// from the same state one fails with ErrQPState; each blocks for a
	// system call at most.
	ModifyToInit() error
	// ModifyToRTR moves the QP from INIT to RTR, connected to remote.
	ModifyToRTR(remote QPInfo) error
	// ModifyToRTS moves the QP from RTR to RTS, where PostSend is
	// accepted. It does not wait for the connection: soft dials the peer
	// in the background, and requests posted meanwhile wait for it.
	ModifyToRTS() error
	// ModifyToError moves the QP to ERR from any state and returns: the
	// outstanding requests of both queues then complete with
	// WR_FLUSH_ERR, in order, as soon as the provider gets to them.
	ModifyToError() error
	// PostSend posts send-queue work requests, in order, and does not
	// wait for them to execute. A request of the wrong shape (ErrInvalidWR)
	// or beyond the queue's room (ErrQueueFull) stops the post with a
	// *PostError: the requests before PostError.Index were posted, the
	// others were not. A request the QP's PD cannot reach (see SGE) is
	// posted and fails with LOC_PROT_ERR in its turn. PostSend blocks for a
	// system call (verbs) or while it writes the requests to the
	// connection from the caller's goroutine (soft, up to 256 KiB per
	// call; longer ones go to a goroutine), which can take as long as the
	// peer leaves its socket buffer full; soft's PostSend of READs may also
	// yield the processor once first, so that other goroutines' READs leave
	// in the same write (see rdma/soft). Concurrent PostSends on one QP
	// are serialised: each call's requests are queued together, in
	// order, and the order between concurrent calls is unspecified.
	PostSend(wrs []SendWR) error
	// PostRecv posts receive buffers, in order, with the same errors and
	// serialisation as PostSend. It blocks for a system call at most and
	// never waits for the peer.
	PostRecv(wrs []RecvWR) error
	// Close destroys the QP. Outstanding requests are discarded without
	// completions, as with ibv_destroy_qp, and when Close returns nothing
	// reads or writes their buffers any more: the buffers and MRs are the
	// caller's again. It blocks until posts in progress and the
	// provider's work on the QP have stopped (soft closes the QP's
	// connections and waits for its goroutines and for Waits and PostSends
	// working the connection inline). Later calls fail with ErrClosed.
	Close() error
}

var providers = struct {
	sync.RWMutex
	m map[string]Provider
}{m: map[string]Provider{}}

// RegisterProvider makes a provider available to Open. It panics if a
// provider of the same name is registered twice.
func RegisterProvider(p Provider) {
	providers.Lock()
	defer providers.Unlock()
	if _, dup := providers.m[p.Name()]; dup {
		panic("rdma: provider " + p.Name() + " registered twice")
	}
	providers.m[p.Name()] = p
}

// Providers returns the names of the registered providers, sorted.
func Providers() []string {
	providers.RLock()
	defer providers.RUnlock()
	names := make([]string, 0, len(providers.m))
	for n := range providers.m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// ProviderDevices lists the devices the named provider could open now.
func ProviderDevices(provider string) ([]string, error) {
	providers.RLock()
	p, ok := providers.m[provider]
	providers.RUnlock()
	if !ok {
		return nil, fmt.Errorf("rdma: unknown provider %q (compiled in: %v)", provider, Providers())
	}
	return p.Devices()
}

// Open opens a device. provider is a registered provider's name, or "auto"
// (or ""): the verbs provider when it is compiled in and finds a device, the
// soft provider otherwise. device is a device name, or "auto" (or "") for
// the provider's first device.
func Open(provider, device string, opts Options) (Device, error) {
	if provider == "" || provider == "auto" {
		return openAuto(device, opts)
	}
	providers.RLock()
	p, ok := providers.m[provider]
	providers.RUnlock()
	if !ok {
		return nil, fmt.Errorf("rdma: unknown provider %q (compiled in: %v)", provider, Providers())
	}
	return p.Open(device, opts)
}

func openAuto(device string, opts Options) (Device, error) {
	var errs []error
	for _, name := range []string{"verbs", "soft"} {
		providers.RLock()
		p, ok := providers.m[name]
		providers.RUnlock()
		if !ok {
			continue
		}
		d, err := p.Open(device, opts)
		if err == nil {
			return d, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", name, err))
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("rdma: no provider compiled in: import rkv's rdma/soft or rdma/verbs")
	}
	return nil, errors.Join(errs...)
}
