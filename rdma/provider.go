// The resource interfaces every provider implements, and provider selection.

package rdma

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
)

// Provider opens devices of one kind. Providers register themselves with
// RegisterProvider from an init function.
type Provider interface {
	// Name is the provider's name as given to Open ("soft", "verbs").
	Name() string
	// Devices lists the devices that Open could open now. It may do I/O.
	Devices() ([]string, error)
	// Open opens the named device; "" or "auto" means the first device.
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
}

// Device is an open RDMA device.
type Device interface {
	Name() string
	Provider() string
	// AllocPD allocates a protection domain.
	AllocPD() (PD, error)
	// CreateCQ creates a completion queue with room for at least size
	// completions.
	CreateCQ(size int) (CQ, error)
	// Close releases the device. It fails with ErrBusy while PDs or CQs
	// created from it are open.
	Close() error
}

// PD is a protection domain: MRs and QPs of one PD work only with each
// other.
type PD interface {
	// Register pins buf and registers it with the given access. buf must
	// lie within one Memory from Alloc or MapFile (ErrNotMapped otherwise)
	// and is then shared with the NIC until the MR is deregistered.
	// Register may take a long time for large buffers (pinning faults in
	// every page): use a Registrar to keep it off latency-critical paths.
	Register(buf []byte, access Access) (MR, error)
	// CreateQP creates an RC queue pair in state RESET.
	CreateQP(cfg QPConfig) (QP, error)
	// Close releases the PD. It fails with ErrBusy while MRs or QPs of
	// the PD exist.
	Close() error
}

// MR is a registered memory region.
type MR interface {
	// Addr is the address remote peers use to name the region's first byte.
	Addr() uint64
	Len() int
	LKey() uint32
	// RKey is the capability a remote peer needs to access the region.
	RKey() uint32
	Access() Access
	// Bytes is the registered memory itself.
	Bytes() []byte
	// Deregister revokes the region: later remote accesses with its rkey
	// fail with REM_ACCESS_ERR. It must be called exactly once; a second
	// call returns ErrClosed and does nothing. Requests still posted that
	// use the MR complete with an error.
	Deregister() error
}

// CQ is a completion queue.
type CQ interface {
	// Poll moves up to len(wc) completions into wc without blocking and
	// returns how many it moved.
	Poll(wc []Completion) (int, error)
	// Wait blocks until at least one completion is available or ctx is
	// done, then behaves as Poll.
	Wait(ctx context.Context, wc []Completion) (int, error)
	// Close releases the CQ. It fails with ErrBusy while a QP uses it.
	Close() error
}

// QP is a reliable-connected queue pair.
//
// A new QP is in RESET. ModifyToInit, ModifyToRTR and ModifyToRTS move it,
// in that order, to a state where it can post work; ConnectQP does all three
// with a peer over an out-of-band connection. An error completion moves the
// QP to ERR, where every outstanding and later request completes with
// WR_FLUSH_ERR.
type QP interface {
	// Num is the queue pair number.
	Num() uint32
	State() QPState
	// Info returns what the peer needs to connect to this QP.
	Info() QPInfo
	// ModifyToInit moves the QP from RESET to INIT. RECVs may be posted
	// from INIT on.
	ModifyToInit() error
	// ModifyToRTR moves the QP from INIT to RTR, connected to remote.
	ModifyToRTR(remote QPInfo) error
	// ModifyToRTS moves the QP from RTR to RTS. Send-queue requests may
	// be posted in RTS only.
	ModifyToRTS() error
	// ModifyToError moves the QP to ERR, flushing outstanding work.
	ModifyToError() error
	// PostSend posts send-queue work requests, in order. It does not
	// wait for them to execute. On failure it returns a *PostError.
	PostSend(wrs []SendWR) error
	// PostRecv posts receive buffers, in order. On failure it returns a
	// *PostError.
	PostRecv(wrs []RecvWR) error
	// Close destroys the QP. Outstanding requests are discarded without
	// completions, as with ibv_destroy_qp.
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
