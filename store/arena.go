// Arenas: files mapped MAP_SHARED and registered REMOTE_READ in units, in the background.

package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// ArenaInfo is what a reader needs to read one registered unit of an
// arena one-sidedly, the arena's bytes [Offset, Offset+Length): it is
// advertised once the unit's registration completes.
type ArenaInfo struct {
	ID         uint16
	Offset     int64  // where the unit starts in its arena
	Addr       uint64 // remote address of the unit's first byte
	Length     int64
	RKey       uint32 // read-only capability
	Generation uint64 // changes at every start of the store: rkeys do too
}

type arena struct {
	id    uint16
	path  string
	file  *os.File
	mem   *rdma.Memory
	units []arenaUnit // Options.RegistrationUnit each, the last maybe less
	// announced counts the units announced, registeredBytes their bytes;
	// registered is the time from the store's open to the announcement of
	// the last (ns), 0 before: for Stats.
	announced       atomic.Int32
	registeredBytes atomic.Int64
	registered      atomic.Int64
}

// arenaUnit is one registration of an arena: its bytes [off, off+n).
type arenaUnit struct {
	off, n int64
	// reg is its REMOTE_READ registration, nil until it is submitted (the
	// first arena's first unit goes before everything else).
	reg atomic.Pointer[rdma.Registration]
}

func arenaPath(dir string, id int) string {
	return filepath.Join(dir, fmt.Sprintf("arena-%04d.rkv", id))
}

// openArena opens or creates the arena file, reserves its blocks so a store
// through the mapping can never hit ENOSPC (which would be a SIGBUS), and
// maps it.
func openArena(dir string, id int, size, unit int64) (*arena, error) {
	path := arenaPath(dir, id)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("store: arena %d: %w", id, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("store: arena %d: %w", id, err)
	}
	if st.Size() != 0 && st.Size() != size {
		f.Close()
		return nil, fmt.Errorf("store: arena %s is %d bytes but ArenaSize is %d: the data directory was made with ArenaSize %d. "+
			"Start with that size again (rkv-server --arena-size %d), or move the directory away to start empty", path, st.Size(), size, st.Size(), st.Size())
	}
	// A new file that fails here holds nothing: removed, it gives back
	// what was reserved of it (a disk that filled up under it).
	discard := func() {
		f.Close()
		if st.Size() == 0 {
			_ = os.Remove(path)
		}
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		discard()
		return nil, fmt.Errorf("store: reserving %d bytes for arena %s: %w", size, path, err)
	}
	mem, err := rdma.MapFile(f, 0, int(size))
	if err != nil {
		discard()
		return nil, fmt.Errorf("store: arena %d: %w", id, err)
	}
	a := &arena{id: uint16(id), path: path, file: f, mem: mem, units: make([]arenaUnit, (size+unit-1)/unit)}
	for i := range a.units {
		a.units[i].off = int64(i) * unit
		a.units[i].n = min(unit, size-a.units[i].off)
	}
	return a, nil
}

// register submits the registrations of every unit, in order, at the
// program's priority: an arena added while serving, because free space
// runs short, is wanted soon.
func (a *arena) register(ctx context.Context, r *rdma.Registrar) {
	for i := range a.units {
		a.registerUnit(ctx, r, i, false)
	}
}

// registerUnit submits the registration of unit i; in the background
// (rdma.RegisterRequest.Background) unless the store cannot serve without
// it.
func (a *arena) registerUnit(ctx context.Context, r *rdma.Registrar, i int, background bool) {
	u := &a.units[i]
	req := rdma.RegisterRequest{Buf: a.mem.Bytes()[u.off : u.off+u.n], Access: rdma.AccessRemoteRead, Background: background}
	u.reg.Store(r.RegisterBatch(ctx, []rdma.RegisterRequest{req})[0])
}

// registration returns unit i's registration, nil before it is submitted.
func (a *arena) registration(i int) *rdma.Registration { return a.units[i].reg.Load() }

// unitReady reports whether unit i's registration has succeeded.
func (a *arena) unitReady(i int) bool {
	reg := a.registration(i)
	if reg == nil {
		return false
	}
	select {
	case <-reg.Done():
		_, err := reg.Wait(context.Background())
		return err == nil
	default:
		return false
	}
}

// readyAt reports whether the unit holding the arena's byte off is
// registered: only then may a region be carved there, since a reader
// could not read what is written into it.
func (a *arena) readyAt(off int64) bool { return a.unitReady(int(off / a.units[0].n)) }

// ready reports whether every unit is registered.
func (a *arena) ready() bool { return int(a.announced.Load()) == len(a.units) }

// info describes ready unit i.
func (a *arena) info(i int, generation uint64) ArenaInfo {
	mr, _ := a.registration(i).Wait(context.Background())
	return ArenaInfo{ID: a.id, Offset: a.units[i].off, Addr: mr.Addr(), Length: int64(mr.Len()), RKey: mr.RKey(), Generation: generation}
}

// record returns the bytes of the record at loc, checked to lie inside the
// arena.
func (a *arena) record(loc proto.Location) ([]byte, error) {
	b := a.mem.Bytes()
	if loc.Offset+uint64(loc.Length) > uint64(len(b)) || loc.Length < proto.RecordHeaderSize {
		return nil, fmt.Errorf("store: location %+v outside arena %d of %d bytes", loc, a.id, len(b))
	}
	return b[loc.Offset : loc.Offset+uint64(loc.Length)], nil
}

// markDead flips the state word of the record at off, so one-sided readers
// holding its location see it superseded.
func (a *arena) markDead(off uint64) { a.setState(off, proto.RecordDead) }

// setState sets the state word of the record at off with one aligned
// atomic store (records are 8-byte aligned), skipped when it holds st
// already so that a rebuild does not dirty pages for nothing.
func (a *arena) setState(off uint64, st uint32) {
	p := (*uint32)(unsafe.Pointer(&a.mem.Bytes()[off+proto.RecordStateOffset]))
	if atomic.LoadUint32(p) != st {
		atomic.StoreUint32(p, st)
	}
}

// restore writes rec, the verified copy of the record at off, back over
// it, all but its state word, through the mapping. A record an RDMA device
// wrote (a NIC's DMA, rxe's copy in the kernel) went around the page
// tables, into pages the kernel may hold clean since a checkpoint wrote
// them back, which the next checkpoint's fdatasync would then skip: a
// store through the mapping dirties every page it touches. It also undoes
// what the lease's holder wrote there after the commit's check.
func (a *arena) restore(off uint64, rec []byte) {
	b := a.mem.Bytes()[off : off+uint64(len(rec))]
	copy(b[:proto.RecordStateOffset], rec[:proto.RecordStateOffset])
	copy(b[proto.RecordStateOffset+4:], rec[proto.RecordStateOffset+4:])
}

// recordState reads the state word of the record at the start of b, which
// may be arena memory a client or a reader shares.
func recordState(b []byte) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&b[proto.RecordStateOffset])))
}

// putState sets the state word of a record in private memory (a copy).
func putState(b []byte, st uint32) { binary.LittleEndian.PutUint32(b[proto.RecordStateOffset:], st) }

// sync makes every store through the arena's mapping durable: one
// fdatasync covers all dirty pages of the file, so a batch of commits
// touching one arena costs one sync, not one per record.
func (a *arena) sync() error {
	if err := unix.Fdatasync(int(a.file.Fd())); err != nil {
		return fmt.Errorf("store: fdatasync of arena %s: %w", a.path, err)
	}
	return nil
}

func (a *arena) close() error {
	for i := range a.units {
		if reg := a.registration(i); reg != nil {
			_ = reg.Release()
		}
	}
	err := a.mem.Close()
	if cerr := a.file.Close(); err == nil {
		err = cerr
	}
	return err
}
