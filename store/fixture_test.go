package store

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
	_ "github.com/rkv-io/rkv/rdma/soft"
)

// server is a store on its own soft device, as a server process has.
type server struct {
	t    testing.TB
	dev  rdma.Device
	pd   rdma.PD
	reg  *rdma.Registrar
	cq   rdma.CQ
	opts Options
	s    *Store
}

// newBareServer opens a store as it is: a new one owns no shard.
func newBareServer(t testing.TB, opts Options) *server {
	t.Helper()
	return newBareServerWith(t, opts, nil, rdma.RegistrarOptions{})
}

// newBareServerWith is newBareServer with the store's PD wrapped by wrap
// (nil: as it is) and registrations by a Registrar of ropts.
func newBareServerWith(t testing.TB, opts Options, wrap func(rdma.PD) rdma.PD, ropts rdma.RegistrarOptions) *server {
	t.Helper()
	if opts.Dir == "" {
		opts.Dir = t.TempDir()
	}
	dev, err := rdma.Open("soft", "", rdma.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pd, err := dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		pd = wrap(pd)
	}
	cq, err := dev.CreateCQ(64)
	if err != nil {
		t.Fatal(err)
	}
	sv := &server{t: t, dev: dev, pd: pd, cq: cq, opts: opts, reg: rdma.NewRegistrar(pd, ropts)}
	sv.open()
	t.Cleanup(sv.shutdown)
	return sv
}

// newServer opens a store in opts.Dir that owns every shard (since epoch
// 1), as a server of a one-server cluster does.
func newServer(t testing.TB, opts Options) *server {
	t.Helper()
	sv := newBareServer(t, opts)
	if err := sv.s.ActivateShards(AllShards(), 1); err != nil {
		t.Fatal(err)
	}
	return sv
}

func (sv *server) open() {
	sv.t.Helper()
	s, err := Open(context.Background(), sv.pd, sv.reg, sv.opts)
	if err != nil {
		sv.t.Fatal(err)
	}
	sv.s = s
	// As a server does before it serves: writes need a registered arena
	// (the ingest crash test's child failed once, under load, on one
	// still registering).
	if err := s.WaitArena(context.Background()); err != nil {
		sv.t.Fatal(err)
	}
}

func (sv *server) restart() {
	sv.t.Helper()
	if err := sv.s.Close(); err != nil {
		sv.t.Fatal(err)
	}
	sv.open()
}

func (sv *server) shutdown() {
	if sv.s != nil {
		if err := sv.s.Close(); err != nil && !errors.Is(err, ErrClosed) {
			sv.t.Errorf("closing store: %v", err)
		}
	}
	for _, c := range []func() error{sv.reg.Close, sv.cq.Close, sv.pd.Close, sv.dev.Close} {
		if err := c(); err != nil && !errors.Is(err, rdma.ErrClosed) {
			sv.t.Errorf("shutdown: %v", err)
		}
	}
}

// client reaches a server over one connected QP, as rkv's client does:
// WRITE into leases, READ the index and records.
type client struct {
	t   testing.TB
	sv  *server
	dev rdma.Device
	pd  rdma.PD
	cq  rdma.CQ
	qp  rdma.QP
	sqp rdma.QP // the server's end
	mem *rdma.Memory
	mr  rdma.MR
	mu  sync.Mutex // one request at a time
	wc  []rdma.Completion
}

const clientBuf = 2 << 20

func newClient(t testing.TB, sv *server) *client {
	t.Helper()
	return newClientIn(t, sv, sv.pd)
}

// newClientIn is newClient with the server's end of the QP in spd, which
// must outlive the client.
func newClientIn(t testing.TB, sv *server, spd rdma.PD) *client {
	t.Helper()
	c := &client{t: t, sv: sv, wc: make([]rdma.Completion, 1)}
	var err error
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	c.dev, err = rdma.Open("soft", "", rdma.Options{})
	must(err)
	c.pd, err = c.dev.AllocPD()
	must(err)
	c.cq, err = c.dev.CreateCQ(64)
	must(err)
	c.qp, err = c.pd.CreateQP(rdma.QPConfig{SendCQ: c.cq, RecvCQ: c.cq})
	must(err)
	c.sqp, err = spd.CreateQP(rdma.QPConfig{SendCQ: sv.cq, RecvCQ: sv.cq})
	must(err)
	c.mem, err = rdma.Alloc(clientBuf)
	must(err)
	c.mr, err = c.pd.Register(c.mem.Bytes(), rdma.AccessLocalWrite)
	must(err)
	a, b := net.Pipe()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() { _, err := rdma.ConnectQP(ctx, b, c.sqp); errc <- err }()
	_, err = rdma.ConnectQP(ctx, a, c.qp)
	must(errors.Join(err, <-errc))
	a.Close()
	b.Close()
	t.Cleanup(func() {
		for _, f := range []func() error{c.qp.Close, c.sqp.Close, c.mr.Deregister, c.mem.Close, c.cq.Close, c.pd.Close, c.dev.Close} {
			if err := f(); err != nil {
				t.Errorf("client cleanup: %v", err)
			}
		}
	})
	return c
}

// do posts one signaled request using [off, off+n) of the client buffer
// and waits for it.
func (c *client) do(op rdma.Opcode, off, n int, raddr uint64, rkey uint32) rdma.Status {
	c.t.Helper()
	wr := []rdma.SendWR{{Op: op, Flags: rdma.Signaled, SGL: []rdma.SGE{{MR: c.mr, Offset: off, Length: n}}, RemoteAddr: raddr, RKey: rkey}}
	if err := c.qp.PostSend(wr); err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.cq.Wait(ctx, c.wc); err != nil {
		c.t.Fatal(err)
	}
	return c.wc[0].Status
}

// writer holds a lease and appends records to it.
type writer struct {
	c       *client
	lease   Lease
	off     int64
	version uint64
}

func (c *client) newWriter() *writer {
	c.t.Helper()
	l, err := c.sv.s.GrantLease(context.Background(), 0, 0)
	if err != nil {
		c.t.Fatal(err)
	}
	return &writer{c: c, lease: l, version: l.VersionBase}
}

// write puts a record into the lease with RDMA_WRITE and returns its
// offset and length, without committing it.
func (w *writer) write(key, value []byte) (off, n int64) {
	w.c.t.Helper()
	w.c.mu.Lock()
	defer w.c.mu.Unlock()
	size, err := proto.EncodeRecord(w.c.mem.Bytes(), w.version, 0, key, value)
	if err != nil {
		w.c.t.Fatal(err)
	}
	if w.off+int64(size) > w.lease.Size {
		w.c.t.Fatalf("lease full")
	}
	if st := w.c.do(rdma.OpWrite, 0, size, w.lease.Addr+uint64(w.off), w.lease.RKey); st != rdma.StatusSuccess {
		w.c.t.Fatalf("RDMA_WRITE into lease %d: %v", w.lease.ID, st)
	}
	off, n = w.off, int64(size)
	w.off += n
	w.version++
	return off, n
}

func (w *writer) put(key, value []byte) (Committed, error) {
	return w.putW(key, value, proto.Write{})
}

// putW writes and commits a record as write w of an idempotency session.
func (w *writer) putW(key, value []byte, wr proto.Write) (Committed, error) {
	off, n := w.write(key, value)
	return w.c.sv.s.Commit(context.Background(), w.lease.ID, off, n, wr)
}

// get resolves key one-sidedly: READ of its index neighborhood, READ of the
// record, verification. It returns retry=true for a torn or stale read.
func (c *client) get(key []byte) (value []byte, found, retry bool) {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	idx, err := c.sv.s.IndexRegion(context.Background())
	if err != nil {
		c.t.Fatal(err)
	}
	geo := idx.Geometry
	h := geo.Hash(key)
	nb := geo.NeighborhoodBytes()
	if st := c.do(rdma.OpRead, 0, nb, idx.Addr+uint64(geo.NeighborhoodOffset(geo.Home(h))), idx.RKey); st != rdma.StatusSuccess {
		c.t.Fatalf("READ of index neighborhood: %v", st)
	}
	locs, err := proto.FindInNeighborhood(c.mem.Bytes()[:nb], h, nil)
	if err != nil {
		return nil, false, true
	}
	for _, loc := range locs {
		a, ok := unitOf(c.sv.s, loc)
		if !ok {
			c.t.Fatalf("record at %+v, where no arena unit is registered", loc)
		}
		if st := c.do(rdma.OpRead, nb, int(loc.Length), a.Addr+loc.Offset-uint64(a.Offset), a.RKey); st != rdma.StatusSuccess {
			c.t.Fatalf("READ of record at %+v: %v", loc, st)
		}
		r, err := proto.VerifyRecord(c.mem.Bytes()[nb:nb+int(loc.Length)], key, 0)
		if errors.Is(err, proto.ErrStaleRecord) && len(locs) > 1 {
			continue // a fingerprint collision with another key
		}
		if err != nil {
			return nil, false, true
		}
		return append([]byte(nil), r.Value...), true, false
	}
	return nil, false, false
}

// unitOf finds the registered arena unit that holds the record at loc, as
// a reader finds its advertised region.
func unitOf(s *Store, loc proto.Location) (ArenaInfo, bool) {
	for _, a := range s.Arenas() {
		if a.ID == loc.Arena && loc.Offset >= uint64(a.Offset) && loc.Offset+uint64(loc.Length) <= uint64(a.Offset+a.Length) {
			return a, true
		}
	}
	return ArenaInfo{}, false
}

// mustGet retries get until it is not torn.
func (c *client) mustGet(key []byte) ([]byte, bool) {
	c.t.Helper()
	for range 100 {
		v, ok, retry := c.get(key)
		if !retry {
			return v, ok
		}
	}
	c.t.Fatalf("GET %q: 100 torn reads in a row", key)
	return nil, false
}

// shardWord READs shard sh's word from the server's index region, as a
// one-sided reader does after a miss.
func (c *client) shardWord(sh proto.Shard) uint64 {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	idx, err := c.sv.s.IndexRegion(context.Background())
	if err != nil {
		c.t.Fatal(err)
	}
	if st := c.do(rdma.OpRead, 0, proto.ShardWordSize, idx.Addr+uint64(idx.Geometry.ShardWordOffset(sh)), idx.RKey); st != rdma.StatusSuccess {
		c.t.Fatalf("READ of the word of %v: %v", sh, st)
	}
	return proto.DecodeShardWord(c.mem.Bytes()[:proto.ShardWordSize])
}

// recordState READs the state word of the record at loc.
func (c *client) recordState(loc proto.Location) uint32 {
	c.t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := unitOf(c.sv.s, loc)
	if !ok {
		c.t.Fatalf("record at %+v, where no arena unit is registered", loc)
	}
	if st := c.do(rdma.OpRead, 0, proto.RecordHeaderSize, a.Addr+loc.Offset-uint64(a.Offset), a.RKey); st != rdma.StatusSuccess {
		c.t.Fatalf("READ of the record at %+v: %v", loc, st)
	}
	h, err := proto.DecodeRecordHeader(c.mem.Bytes()[:proto.RecordHeaderSize])
	if err != nil {
		c.t.Fatalf("record at %+v: %v", loc, err)
	}
	return h.State
}

// readerResult is what a one-sided reader concludes about a key.
type readerResult int

const (
	readFound    readerResult = iota // a live record of the key
	readNotFound                     // a miss, and the server owns the shard since the reader's epoch
	readRefresh                      // a miss at a server that does not own the shard (as the reader's map says): refresh the map
)

// read is a one-sided GET as the design prescribes: a live record of the
// key is the answer; a miss means "not found" only if the shard's word
// equals since, the epoch the reader's map says the server owns it since.
func (c *client) read(key []byte, since uint64) ([]byte, readerResult) {
	c.t.Helper()
	v, ok := c.mustGet(key)
	switch {
	case ok:
		return v, readFound
	case proto.ShardWordSince(c.shardWord(proto.ShardOf(key))) == since:
		return nil, readNotFound
	}
	return nil, readRefresh
}

// keysIn returns n keys of shard sh, named after tag.
func keysIn(sh proto.Shard, tag string, n int) [][]byte {
	var out [][]byte
	for i := 0; len(out) < n; i++ {
		if k := fmt.Appendf(nil, "%s-%d-%d", tag, sh, i); proto.ShardOf(k) == sh {
			out = append(out, k)
		}
	}
	return out
}

// checkAccounting checks the store's space and key counts against each
// other: live bytes by arena and by shard agree, and the indexed keys are
// the owned shards' keys.
func checkAccounting(t testing.TB, s *Store) {
	t.Helper()
	var arenaLive, shardLive, ownedKeys int64
	for _, a := range s.Stats().Arenas {
		arenaLive += a.Live
		if a.Live < 0 || a.Dead < 0 || a.Live+a.Dead > a.Size {
			t.Fatalf("arena %d: %d live + %d dead of %d", a.ID, a.Live, a.Dead, a.Size)
		}
	}
	checkSegments(t, s)
	for _, sh := range s.Shards() {
		shardLive += sh.LiveBytes
		if sh.State == ShardOwned {
			ownedKeys += sh.Keys
		}
	}
	if arenaLive != shardLive {
		t.Fatalf("arenas count %d live bytes, shards %d", arenaLive, shardLive)
	}
	if st := s.Stats(); st.Keys != ownedKeys || int64(s.index.Len()) != ownedKeys {
		t.Fatalf("Stats.Keys %d, index %d keys, owned shards %d keys", st.Keys, s.index.Len(), ownedKeys)
	}
}

// checkSegments checks every segment's accounting: live, dead and the
// bytes of open regions add up to what is carved, and a segment is free
// exactly when nothing is carved in it.
func checkSegments(t testing.TB, s *Store) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, sg := range s.segments {
		switch {
		case sg.live < 0 || sg.dead < 0 || sg.pending < 0 || sg.live+sg.dead+sg.pending > sg.head || sg.head > s.opts.SegmentSize:
			t.Fatalf("segment %d (arena %d at %d, state %d): %d live + %d dead + %d pending, %d carved of %d",
				i, sg.arena.id, sg.start, sg.state, sg.live, sg.dead, sg.pending, sg.head, s.opts.SegmentSize)
		case sg.state == segmentFree && (sg.head != 0 || sg.regions != 0):
			t.Fatalf("free segment %d has %d bytes carved, %d regions", i, sg.head, sg.regions)
		case sg.state == segmentSealed && sg.regions == 0 && sg.live+sg.dead+sg.pending != sg.head:
			t.Fatalf("sealed segment %d without regions: %d live + %d dead + %d pending != %d carved", i, sg.live, sg.dead, sg.pending, sg.head)
		}
	}
}

// segmentTable describes every segment, for a failure message.
func segmentTable(s *Store) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for i, sg := range s.segments {
		fmt.Fprintf(&b, "segment %2d: state %d, head %7d, live %7d, dead %7d, pending %d, regions %d, cleaning %v, stuck %d\n",
			i, sg.state, sg.head, sg.live, sg.dead, sg.pending, sg.regions, sg.cleaning, sg.stuckLive)
	}
	return b.String()
}

// holdFirstApply stops s's writer in the next batch it applies: entered
// receives once it has stopped there, and unblock lets it go on (called
// at the test's cleanup too, so that a failing test does not leave the
// commit loop held).
func holdFirstApply(t testing.TB, s *Store) (entered <-chan struct{}, unblock func()) {
	in, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	unblock = func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	held := false // the writer's alone
	s.testHookApply = func() {
		if !held {
			held = true
			in <- struct{}{}
			<-release
		}
	}
	return in, unblock
}
