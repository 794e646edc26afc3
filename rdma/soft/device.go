// A soft device: its data endpoint, MR table, QP table and lifetime.

package soft

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/internal/life"
)

const defaultListenAddr = "127.0.0.1:0"

type device struct {
	name string
	addr string // data endpoint, host:port
	log  *slog.Logger
	ln   *net.TCPListener

	mrs   mrTable
	rkeys *keyGen
	lkeys *keyGen

	qpMu    sync.RWMutex
	qps     map[uint32]*qp
	nextQPN uint32

	links uint32               // Options.Links
	outMu sync.Mutex           // guards outs; taken before an outLink's mu
	outs  map[linkKey]*outLink // this device's links to peers

	life life.Lifetime // children: PDs and CQs

	mu     sync.Mutex                // guards closed and conns
	closed bool                      // set by Close: the accept loop stops taking connections
	conns  map[*net.TCPConn]struct{} // accepted connections: links from peer devices
	ins    map[*inLink]struct{}      // the links peers made, once past their hello

	// attachWithin (ns) bounds how long a link from a peer may go without
	// a QP attached: handshakeTimeout, shorter in tests.
	attachWithin atomic.Int64

	closing chan struct{} // closed by Close
	wg      sync.WaitGroup

	sweeping  atomic.Bool
	sweepKick chan struct{}
	lastLazy  atomic.Int64

	corks corks
}

func openDevice(name string, opts rdma.Options) (*device, error) {
	if opts.Links < 0 {
		return nil, fmt.Errorf("rdma/soft: device %s: Options.Links %d: must not be negative", name, opts.Links)
	}
	laddr := opts.ListenAddr
	if laddr == "" {
		laddr = defaultListenAddr
	}
	ln, err := net.Listen("tcp", laddr)
	if err != nil {
		return nil, fmt.Errorf("rdma/soft: device %s: listening on %s: %w", name, laddr, err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	d := &device{
		name:      name,
		addr:      ln.Addr().String(),
		log:       log,
		ln:        ln.(*net.TCPListener),
		mrs:       mrTable{m: map[uint32]*mr{}},
		rkeys:     newKeyGen(),
		lkeys:     newKeyGen(),
		qps:       map[uint32]*qp{},
		nextQPN:   rand.Uint32(),
		links:     uint32(max(opts.Links, 1)),
		outs:      map[linkKey]*outLink{},
		conns:     map[*net.TCPConn]struct{}{},
		ins:       map[*inLink]struct{}{},
		closing:   make(chan struct{}),
		sweepKick: make(chan struct{}, 1),
	}
	d.attachWithin.Store(int64(handshakeTimeout))
	d.life.InitDevice("rdma/soft: device " + name)
	d.wg.Add(2)
	go d.acceptLoop()
	go d.sweeper()
	return d, nil
}

func (d *device) Name() string     { return d.name }
func (d *device) Provider() string { return ProviderName }

// Links implements rdma.Multilink.
func (d *device) Links() int { return int(d.links) }

// Addr returns the device's data endpoint.
func (d *device) Addr() string { return d.addr }

func (d *device) AllocPD() (rdma.PD, error) {
	if err := d.life.Acquire(life.DevicePDs); err != nil {
		return nil, err
	}
	return newPD(d), nil
}

func (d *device) CreateCQ(size int) (rdma.CQ, error) {
	if size <= 0 || size > maxCQSize {
		return nil, fmt.Errorf("rdma/soft: CreateCQ(%d): size must be in 1..%d", size, maxCQSize)
	}
	if err := d.life.Acquire(life.DeviceCQs); err != nil {
		return nil, err
	}
	return newCQ(d, size), nil
}

// Close stops the data endpoint and every goroutine of the device.
func (d *device) Close() error {
	return d.life.Close(func() error {
		d.mu.Lock()
		d.closed = true
		for c := range d.conns {
			_ = c.Close()
		}
		d.mu.Unlock()
		close(d.closing)
		err := d.ln.Close()
		d.wg.Wait()
		return err
	})
}

func (d *device) acceptLoop() {
	defer d.wg.Done()
	for {
		c, err := d.ln.AcceptTCP()
		if err != nil {
			select {
			case <-d.closing:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off, as net/http does.
			d.log.Warn("rdma/soft: accept failed", "device", d.name, "err", err)
			select {
			case <-d.closing:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			_ = c.Close()
			return
		}
		d.conns[c] = struct{}{}
		d.wg.Add(1)
		d.mu.Unlock()
		go d.handshake(c)
	}
}

func (d *device) forget(c *net.TCPConn) {
	d.mu.Lock()
	delete(d.conns, c)
	d.mu.Unlock()
}

// spawn runs f on a goroutine that Close waits for.
func (d *device) spawn(f func()) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		f()
	}()
}

// isClosing reports whether Close was called: links ending then are no news.
func (d *device) isClosing() bool {
	select {
	case <-d.closing:
		return true
	default:
		return false
	}
}

// addQP gives q a QP number unique on the device (24 bits, as in verbs).
func (d *device) addQP(q *qp) {
	d.qpMu.Lock()
	defer d.qpMu.Unlock()
	for {
		d.nextQPN++
		n := d.nextQPN & 0xffffff
		if _, used := d.qps[n]; n > 1 && !used {
			q.num = n
			d.qps[n] = q
			return
		}
	}
}

func (d *device) removeQP(q *qp) {
	d.qpMu.Lock()
	delete(d.qps, q.num)
	d.qpMu.Unlock()
}

func (d *device) lookupQP(n uint32) *qp {
	d.qpMu.RLock()
	defer d.qpMu.RUnlock()
	return d.qps[n]
}
