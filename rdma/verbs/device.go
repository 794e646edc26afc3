//go:build verbs

package verbs

/*
#cgo LDFLAGS: -libverbs
#include "shim.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"github.com/rkv-io/rkv/rdma"
	"github.com/rkv-io/rkv/rdma/internal/life"
)

// ProviderName is the name this provider registers under.
const ProviderName = "verbs"

func init() { rdma.RegisterProvider(provider{}) }

type provider struct{}

func (provider) Name() string { return ProviderName }

// Devices lists the names of the RDMA devices libibverbs finds.
func (provider) Devices() ([]string, error) {
	names, err := deviceNames()
	if errors.Is(err, rdma.ErrNoDevice) {
		return nil, nil
	}
	return names, err
}

const noDeviceHint = "use --provider=soft or create one with `rdma link add rxe0 type rxe netdev IFACE`"

// deviceList returns libibverbs' device list (free it with
// ibv_free_device_list) or an error wrapping rdma.ErrNoDevice.
func deviceList() ([]*C.struct_ibv_device, **C.struct_ibv_device, error) {
	var n C.int
	list, err := C.ibv_get_device_list(&n)
	if list == nil {
		// No kernel RDMA support at all (ENOSYS) or no uverbs device.
		why := ""
		switch {
		case errors.Is(err, syscall.ENOSYS):
			why = " (this kernel has no RDMA support: ibv_get_device_list: ENOSYS)"
		case err != nil:
			why = fmt.Sprintf(" (ibv_get_device_list: %v)", err)
		}
		return nil, nil, fmt.Errorf("%w; %s%s", rdma.ErrNoDevice, noDeviceHint, why)
	}
	if n == 0 {
		C.ibv_free_device_list(list)
		return nil, nil, fmt.Errorf("%w; %s", rdma.ErrNoDevice, noDeviceHint)
	}
	return unsafe.Slice(list, int(n)), list, nil
}

func deviceNames() ([]string, error) {
	devs, list, err := deviceList()
	if err != nil {
		return nil, err
	}
	defer C.ibv_free_device_list(list)
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = C.GoString(C.ibv_get_device_name(d))
	}
	return names, nil
}

// Open opens the named device, or for "" and "auto" the first device whose
// port is ACTIVE.
func (provider) Open(name string, opts rdma.Options) (rdma.Device, error) {
	if opts.Port == 0 {
		opts.Port = 1
	}
	if opts.Port < 1 || opts.Port > 255 {
		return nil, fmt.Errorf("rdma/verbs: port %d out of range 1..255", opts.Port)
	}
	if opts.Spin < 0 {
		return nil, fmt.Errorf("rdma/verbs: Options.Spin %v: must not be negative", opts.Spin)
	}
	if _, _, err := parseGIDOption(opts.GID); err != nil {
		return nil, err // before touching any device
	}
	devs, list, err := deviceList()
	if err != nil {
		return nil, err
	}
	defer C.ibv_free_device_list(list)
	names := make([]string, len(devs))
	for i, d := range devs {
		names[i] = C.GoString(C.ibv_get_device_name(d))
	}
	if name == "" || name == "auto" {
		var errs []error
		for i, d := range devs {
			dev, err := openDevice(d, names[i], opts)
			if err == nil {
				return dev, nil
			}
			errs = append(errs, err)
		}
		return nil, fmt.Errorf("rdma/verbs: no usable device among %s: %w", strings.Join(names, ", "), errors.Join(errs...))
	}
	for i, d := range devs {
		if names[i] == name {
			return openDevice(d, name, opts)
		}
	}
	return nil, fmt.Errorf("rdma/verbs: no RDMA device %q (devices: %s): %w", name, strings.Join(names, ", "), rdma.ErrNoDevice)
}

// device is an open ibv_context bound to one port and one GID.
type device struct {
	name     string
	ctx      *C.struct_ibv_context
	port     int
	gidIndex int
	gid      [16]byte
	lid      uint16
	mtu      C.enum_ibv_mtu // the port's active MTU
	ethernet bool           // RoCE: the address vector needs a GRH
	lim      limits
	spin     time.Duration // Options.Spin: how long a CQ's Wait polls before it sleeps

	life life.Lifetime // children: PDs and CQs

	objMu   sync.Mutex // guards the lookup maps used by async events and Poll
	cqByPtr map[*C.struct_ibv_cq]*cq
	qpByPtr map[*C.struct_ibv_qp]*qp
	qpByNum map[uint32]*qp

	asyncFile *os.File
	asyncEv   *C.struct_ibv_async_event
	asyncDone chan struct{}
}

// limits are the device attributes CreateCQ and CreateQP check against.
type limits struct {
	maxQPWR, maxSGE, maxCQE    int
	maxRdAtom, maxInitRdAtom   int
	atomics                    bool
	vendorID, vendorPartID, hw uint32
}

func openDevice(d *C.struct_ibv_device, name string, opts rdma.Options) (_ *device, err error) {
	ctx, cerr := C.ibv_open_device(d)
	if ctx == nil {
		return nil, fmt.Errorf("rdma/verbs: ibv_open_device(%s): %v", name, errnoOr(cerr, "failed"))
	}
	defer func() {
		if err != nil {
			C.ibv_close_device(ctx)
		}
	}()
	dev := &device{name: name, ctx: ctx, port: opts.Port, spin: opts.Spin,
		cqByPtr: map[*C.struct_ibv_cq]*cq{}, qpByPtr: map[*C.struct_ibv_qp]*qp{}, qpByNum: map[uint32]*qp{}}
	dev.life.InitDevice("rdma/verbs: device " + name)

	var da C.struct_ibv_device_attr
	if rc := C.ibv_query_device(ctx, &da); rc != 0 {
		return nil, fmt.Errorf("rdma/verbs: ibv_query_device(%s): %v", name, syscall.Errno(rc))
	}
	if opts.Port > int(da.phys_port_cnt) {
		return nil, fmt.Errorf("rdma/verbs: %s has %d port(s), no port %d", name, da.phys_port_cnt, opts.Port)
	}
	dev.lim = limits{
		maxQPWR: int(da.max_qp_wr), maxSGE: int(da.max_sge), maxCQE: int(da.max_cqe),
		maxRdAtom: int(da.max_qp_rd_atom), maxInitRdAtom: int(da.max_qp_init_rd_atom),
		atomics:  da.atomic_cap != C.IBV_ATOMIC_NONE,
		vendorID: uint32(da.vendor_id), vendorPartID: uint32(da.vendor_part_id), hw: uint32(da.hw_ver),
	}

	var pa C.struct_ibv_port_attr
	if rc := C.rkv_query_port(ctx, C.uint8_t(opts.Port), &pa); rc != 0 {
		return nil, fmt.Errorf("rdma/verbs: ibv_query_port(%s, %d): %v", name, opts.Port, syscall.Errno(rc))
	}
	if pa.state != C.IBV_PORT_ACTIVE {
		return nil, fmt.Errorf("rdma/verbs: port %d of %s is %s, not ACTIVE (is its netdev up? `rdma link show %s/%d`)",
			opts.Port, name, portState(pa.state), name, opts.Port)
	}
	dev.lid = uint16(pa.lid)
	dev.mtu = pa.active_mtu
	dev.ethernet = pa.link_layer == C.IBV_LINK_LAYER_ETHERNET

	wantGID, wantIP, _ := parseGIDOption(opts.GID) // validated by Open
	if dev.gidIndex, err = pickGID(ctx, name, opts.Port, int(pa.gid_tbl_len), wantGID, wantIP, dev.ethernet); err != nil {
		return nil, err
	}
	var gid C.union_ibv_gid
	if rc := C.ibv_query_gid(ctx, C.uint8_t(opts.Port), C.int(dev.gidIndex), &gid); rc != 0 {
		return nil, fmt.Errorf("rdma/verbs: ibv_query_gid(%s, port %d, index %d) failed", name, opts.Port, dev.gidIndex)
	}
	dev.gid = *(*[16]byte)(unsafe.Pointer(&gid))
	if dev.ethernet && dev.gid == ([16]byte{}) {
		return nil, fmt.Errorf("rdma/verbs: GID %d of %s port %d is empty: give the netdev an IP address or choose another GID index", dev.gidIndex, name, opts.Port)
	}

	if err := dev.startAsync(); err != nil {
		return nil, err
	}
	return dev, nil
}

// pickGID returns want if it is >= 0, else (auto) the first RoCEv2 GID that
// is an IPv4-mapped address, falling back to index 0. On InfiniBand, auto is
// index 0.
// parseGIDOption reads rdma.Options.GID: "" is auto (-1), a number an
// index, anything else an IP address.
func parseGIDOption(s string) (index int, ip net.IP, err error) {
	if s == "" {
		return -1, nil, nil
	}
	if i, err := strconv.Atoi(s); err == nil {
		if i < 0 {
			return 0, nil, fmt.Errorf("rdma/verbs: GID index %d: must not be negative", i)
		}
		return i, nil, nil
	}
	if ip = net.ParseIP(s); ip == nil {
		return 0, nil, fmt.Errorf("rdma/verbs: GID %q: want \"\" (auto), a GID index or an IP address", s)
	}
	return -1, ip.To16(), nil
}

func pickGID(ctx *C.struct_ibv_context, name string, port, tblLen, want int, wantIP net.IP, ethernet bool) (int, error) {
	if want >= 0 {
		if want >= tblLen {
			return 0, fmt.Errorf("rdma/verbs: GID index %d out of range: %s port %d has %d GIDs", want, name, port, tblLen)
		}
		return want, nil
	}
	if !ethernet {
		if wantIP != nil {
			return 0, fmt.Errorf("rdma/verbs: GID by IP address %v needs a RoCE port; %s port %d is InfiniBand", wantIP, name, port)
		}
		return 0, nil
	}
	for i := 0; i < tblLen; i++ {
		var e C.struct_ibv_gid_entry
		rc := C.ibv_query_gid_ex(ctx, C.uint32_t(port), C.uint32_t(i), &e, 0)
		var raw [16]byte
		var v2 bool
		switch {
		case rc == 0:
			raw = *(*[16]byte)(unsafe.Pointer(&e.gid))
			v2 = e.gid_type == C.IBV_GID_TYPE_ROCE_V2
		case syscall.Errno(rc) == syscall.EOPNOTSUPP || syscall.Errno(rc) == syscall.ENOSYS:
			// Old kernel: fall back to ibv_query_gid and sysfs.
			var g C.union_ibv_gid
			if C.ibv_query_gid(ctx, C.uint8_t(port), C.int(i), &g) != 0 {
				continue
			}
			raw = *(*[16]byte)(unsafe.Pointer(&g))
			t, _ := os.ReadFile(fmt.Sprintf("/sys/class/infiniband/%s/ports/%d/gid_attrs/types/%d", name, port, i))
			v2 = strings.TrimSpace(string(t)) == "RoCE v2"
		default:
			continue // empty entry (ENODATA) or unreadable
		}
		switch {
		case wantIP != nil:
			if v2 && net.IP(raw[:]).Equal(wantIP) {
				return i, nil
			}
		case v2 && isIPv4Mapped(raw):
			return i, nil
		}
	}
	if wantIP != nil {
		return 0, fmt.Errorf("rdma/verbs: %s port %d has no RoCEv2 GID for address %v", name, port, wantIP)
	}
	return 0, nil
}

func isIPv4Mapped(g [16]byte) bool {
	for _, b := range g[:10] {
		if b != 0 {
			return false
		}
	}
	return g[10] == 0xff && g[11] == 0xff
}

func (d *device) Name() string     { return d.name }
func (d *device) Provider() string { return ProviderName }

// GIDIndex is the GID table index the device uses (diagnostics and tests).
func (d *device) GIDIndex() int { return d.gidIndex }

// GID is the port GID the device's QPs advertise.
func (d *device) GID() [16]byte { return d.gid }

// MTU is the port's active MTU in bytes.
func (d *device) MTU() int { return mtuBytes(d.mtu) }

func (d *device) String() string {
	return fmt.Sprintf("verbs:%s port %d gid[%d]", d.name, d.port, d.gidIndex)
}

// Close releases the device: ErrBusy while PDs or CQs are open, ErrClosed
// the second time.
func (d *device) Close() error {
	return d.life.Close(func() error {
		d.stopAsync()
		if rc := C.ibv_close_device(d.ctx); rc != 0 {
			return fmt.Errorf("rdma/verbs: ibv_close_device(%s) failed", d.name)
		}
		d.ctx = nil
		return nil
	})
}

// startAsync watches the device's async event fd from the netpoller: CQ
// overruns make that CQ's Poll fail with ErrCQOverrun, QP error events
// move the QP's tracked state to ERR.
func (d *device) startAsync() error {
	fd := int(d.ctx.async_fd)
	if rc := C.rkv_set_nonblock(C.int(fd)); rc != 0 {
		return fmt.Errorf("rdma/verbs: async fd of %s: %v", d.name, syscall.Errno(rc))
	}
	dup, err := syscall.Dup(fd)
	if err != nil {
		return fmt.Errorf("rdma/verbs: dup of the async fd of %s: %w", d.name, err)
	}
	syscall.CloseOnExec(dup)
	d.asyncFile = os.NewFile(uintptr(dup), "rdma-verbs-async-"+d.name)
	rc, err := d.asyncFile.SyscallConn()
	if err != nil {
		d.asyncFile.Close()
		return err
	}
	d.asyncEv = (*C.struct_ibv_async_event)(C.calloc(1, C.sizeof_struct_ibv_async_event))
	d.asyncDone = make(chan struct{})
	go d.asyncLoop(rc)
	return nil
}

func (d *device) asyncLoop(rc syscall.RawConn) {
	defer close(d.asyncDone)
	var fatal error
	read := func(uintptr) bool {
		for {
			r, err := C.ibv_get_async_event(d.ctx, d.asyncEv)
			if r != 0 {
				if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
					return false
				}
				fatal = err
				return true
			}
			d.handleAsync(d.asyncEv)
			C.ibv_ack_async_event(d.asyncEv)
		}
	}
	for fatal == nil {
		if err := rc.Read(read); err != nil {
			return // the file was closed by stopAsync
		}
	}
}

func (d *device) handleAsync(ev *C.struct_ibv_async_event) {
	switch ev.event_type {
	case C.IBV_EVENT_CQ_ERR:
		d.objMu.Lock()
		c := d.cqByPtr[C.rkv_async_cq(ev)]
		d.objMu.Unlock()
		if c != nil {
			c.overrun.Store(true)
		}
	case C.IBV_EVENT_QP_FATAL, C.IBV_EVENT_QP_REQ_ERR, C.IBV_EVENT_QP_ACCESS_ERR:
		d.objMu.Lock()
		q := d.qpByPtr[C.rkv_async_qp(ev)]
		d.objMu.Unlock()
		if q != nil {
			q.state.Store(uint32(rdma.QPStateError))
		}
	}
}

func (d *device) stopAsync() {
	if d.asyncFile == nil {
		return
	}
	d.asyncFile.Close()
	<-d.asyncDone
	C.free(unsafe.Pointer(d.asyncEv))
	d.asyncFile, d.asyncEv = nil, nil
}

// errorCompletion handles an error completion of one of the device's QPs:
// that QP is in ERR now (see qp.errorCompletion).
func (d *device) errorCompletion(c *rdma.Completion) {
	d.objMu.Lock()
	q := d.qpByNum[c.QPNum]
	d.objMu.Unlock()
	if q != nil {
		q.errorCompletion(c)
	}
}

func portState(s C.enum_ibv_port_state) string {
	switch s {
	case C.IBV_PORT_NOP:
		return "NOP"
	case C.IBV_PORT_DOWN:
		return "DOWN"
	case C.IBV_PORT_INIT:
		return "INIT"
	case C.IBV_PORT_ARMED:
		return "ARMED"
	case C.IBV_PORT_ACTIVE_DEFER:
		return "ACTIVE_DEFER"
	}
	return fmt.Sprintf("state %d", int(s))
}

func errnoOr(err error, def string) string {
	if err != nil {
		return err.Error()
	}
	return def
}

func mtuBytes(m C.enum_ibv_mtu) int {
	if m < C.IBV_MTU_256 || m > C.IBV_MTU_4096 {
		return 0
	}
	return 128 << uint(m)
}

// mtuEnum returns the largest IB MTU not above b bytes (at least 256).
func mtuEnum(b int) C.enum_ibv_mtu {
	m := C.enum_ibv_mtu(C.IBV_MTU_256)
	for m < C.IBV_MTU_4096 && 128<<uint(m+1) <= b {
		m++
	}
	return m
}
