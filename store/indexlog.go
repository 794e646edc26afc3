// The index log: commits reach Pebble in the background; a log in a shared mapping keeps them, and under the durable policies their records, until then.

package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"golang.org/x/sys/unix"

	"github.com/rkv-io/rkv/proto"
)

// Under SyncNone a commit promises only that a process crash loses
// nothing. Writing each commit's index and session entries into Pebble's
// memtable, and handing the batch to Pebble's WAL writer, was the largest
// cost of a PUT there (docs/ARCHITECTURE.md). So the writer instead
// appends one entry per commit to this log, a file mapped MAP_SHARED (a
// store into it is in the page cache, which outlives the process, without
// a system call), and notes the key and session as pending. A flush
// (flushIndex), every Options.IndexFlushInterval or when the log fills,
// writes what is pending into Pebble in one batch: a key written many
// times between two flushes costs one entry, a session one entry however
// many writes it made. The batch also records how far the log is flushed
// (metaIndexLogKey), so the next Open replays what follows, in order,
// into Pebble before anything reads it.
//
// Everything else that reads or writes keys' entries in Pebble (scans, a
// shard's listing and drop, Ingest, the cleaner's relocations, freeing
// segments) flushes first: Pebble is then current, and no replay crosses
// a write made outside the log. A commit's entry is appended before the
// commit is published (nothing reads it before it could be replayed);
// one whose publication then fails is voided by a later entry.
//
// A machine crash may lose what the page cache held: the log's entries
// carry a checksum, the store's generation and a sequence number, and the
// replay stops at the first that does not follow, and skips a put whose
// record did not survive. SyncNone allows a machine crash to lose recent
// writes.
//
// Under SyncAlways and SyncBatch the log is also the journal of the
// records: each entry carries the verified copy of its record, and a
// batch's entries are made durable with one fdatasync of the log (at
// once under SyncAlways, every SyncWindow under SyncBatch). Syncing the
// arenas instead costs one fdatasync per arena per batch, over pages
// scattered across every client's lease; putting the records into
// Pebble's WAL, as the store did before, cost their passage through its
// memtable and compactions (docs/ARCHITECTURE.md). A flush is then a
// checkpoint: it syncs the arenas, so the records of the entries it
// writes into Pebble are durable where readers find them, before the log
// may wrap over them; and it trims the journal of the records the
// cleaner and Ingest copy (journal.go), which the same sync covers. It
// runs every CheckpointInterval, each time CheckpointBytes were logged,
// and whenever something must read Pebble. Open copies the records of
// the entries it replays into their arenas, and syncs them, before it
// starts the log afresh.

const (
	indexLogName = "index.log"
	// logHeaderSize is an entry's fixed part; a pad takes its first
	// logPadMin bytes only, and less room than that at the end of the log
	// wraps without one.
	logHeaderSize = 80
	logPadMin     = 32
)

// Entry kinds.
const (
	logPut    = 1
	logDelete = 2
	logPad    = 3 // the rest of the log is unused: the next entry is at 0
	logVoid   = 4 // the entry of seq target did not take effect
)

// Entry flags.
const (
	logHasSession = 1
	logHasRecord  = 2 // the record's bytes follow the key: loc.Length of them
)

// logEntry is one log entry, decoded.
type logEntry struct {
	seq     uint64
	kind    byte
	shard   proto.Shard
	key     []byte // aliases the log when decoded
	loc     proto.Location
	version uint64 // a put's; a void's target seq
	session uint64 // 0: none
	wseq    uint64
	time    int64
	rec     []byte // the record (durable policies); aliases the log when decoded
}

// logPos is a place in the log: the entry seq starts total bytes (pads
// included) into the log's life in generation gen; its offset in the
// file is total modulo the log's size.
type logPos struct {
	gen, seq, total uint64
}

// Formats of the position. A log that holds records has format 2, which
// an older rkv refuses to open: it would stop its replay at the first
// record as if the log ended there. A clean Close leaves format 1.
const (
	logFormatEntries = 1
	logFormatRecords = 2
)

func (p logPos) encode(format byte) []byte {
	b := binary.LittleEndian.AppendUint64([]byte{format}, p.gen)
	b = binary.LittleEndian.AppendUint64(b, p.seq)
	return binary.LittleEndian.AppendUint64(b, p.total)
}

func decodeLogPos(b []byte) (logPos, error) {
	if len(b) != 25 || b[0] != logFormatEntries && b[0] != logFormatRecords {
		return logPos{}, fmt.Errorf("store: index log position of %d bytes: corrupt or from a newer version", len(b))
	}
	return logPos{binary.LittleEndian.Uint64(b[1:]), binary.LittleEndian.Uint64(b[9:]), binary.LittleEndian.Uint64(b[17:])}, nil
}

// indexLog is the mapped file. Its writer is the store's writer (or Open);
// flushed is guarded by Store.mu.
//
// Under the durable policies entries are written with pwrite, a batch at
// a time (buffered), not stored through the mapping: an fdatasync after
// stores through a mapping took 0.84 ms here against 0.20 ms after a
// pwrite of the same 17 KiB. A new file is written whole before the
// first append (fill), not only reserved: an fdatasync over blocks
// allocated but never written would also write the file system's
// metadata, to record them written.
type indexLog struct {
	file     *os.File
	mem      []byte // the mapping: read by the replay, written unless buffered
	buffered bool
	buf      []byte // buffered: the entries encoded since the last writeOut,
	bufAt    uint64 // from this offset
	next     logPos // where the writer appends
	flushed  logPos // the entries before it are in Pebble
	calls    writerCalls

	// A new log is filled with zeros in the background (fill), which
	// the writer's appends wait for: filling is open while it runs.
	filling  chan struct{}
	fillErr  error
	stopFill chan struct{}
}

// openIndexLog opens the log in dir, or makes a new one of size bytes
// and fills it in the background (fill).
func openIndexLog(dir string, size int64) (*indexLog, error) {
	path := filepath.Join(dir, indexLogName)
	f, err := os.OpenFile(path, os.O_RDWR, 0o600)
	fresh := errors.Is(err, fs.ErrNotExist)
	if fresh {
		f, err = os.OpenFile(path+newSuffix, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
		if err == nil {
			// Reserved now, so that a full disk fails the open, not the fill.
			if err = unix.Fallocate(int(f.Fd()), 0, 0, size); errors.Is(err, unix.EOPNOTSUPP) {
				err = f.Truncate(size)
			}
			if err != nil {
				f.Close()
				os.Remove(f.Name())
				return nil, fmt.Errorf("store: index log %s: reserving %d bytes: %w", f.Name(), size, err)
			}
		}
	}
	if err != nil {
		return nil, fmt.Errorf("store: index log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("store: index log: %w", err)
	}
	// A log of another size (IndexLogSize changed) is replayed at its own
	// size first: see replayIndexLog.
	size = st.Size()
	if size < logHeaderSize*16 || size%8 != 0 {
		f.Close()
		return nil, fmt.Errorf("store: index log %s is %d bytes: corrupt (want a multiple of 8, at least %d); move it away only if the store was stopped cleanly", path, size, logHeaderSize*16)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("store: mapping the index log %s: %w", path, err)
	}
	l := &indexLog{file: f, mem: mem}
	if fresh {
		l.filling, l.stopFill = make(chan struct{}), make(chan struct{})
		go l.fill(path)
	}
	return l, nil
}

// newSuffix names a new log until it is filled.
const newSuffix = ".new"

// testHookLogFill, when set, runs in the filler before it renames a new
// log into place (tests, which run one store at a time when they set it).
var testHookLogFill func()

// fill writes zeros over the new log, durably, and renames it into place:
// a log whose blocks the file system holds as written takes syncs that
// write no metadata (fallocate's unwritten extents cost the first lap's
// syncs 25% more here), and filling 256 MiB took 0.23s, which a new
// store's reads need not wait for. A crash before the rename leaves a
// file the next start makes again.
func (l *indexLog) fill(path string) {
	defer close(l.filling)
	zeros := make([]byte, 1<<20)
	fd := int(l.file.Fd())
	for off := int64(0); off < int64(len(l.mem)); off += int64(len(zeros)) {
		select {
		case <-l.stopFill:
			l.fillErr = ErrClosed
			return
		default:
		}
		n := min(int64(len(zeros)), int64(len(l.mem))-off)
		if _, err := l.file.WriteAt(zeros[:n], off); err != nil {
			l.fillErr = fmt.Errorf("store: filling the new index log %s: %w", l.file.Name(), err)
			return
		}
		writeOutBehind(fd, off, n)
	}
	if testHookLogFill != nil {
		testHookLogFill()
	}
	select {
	case <-l.stopFill: // a Close: the next start makes the log again
		l.fillErr = ErrClosed
		return
	default:
	}
	err := l.file.Sync()
	if err == nil {
		err = os.Rename(l.file.Name(), path)
	}
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		l.fillErr = fmt.Errorf("store: making the new index log %s: %w", path, err)
	}
}

// fillDirty is the most of a new log's fill left in the page cache unwritten.
const fillDirty = 2 << 20

// writeOutBehind starts the write-out of the n bytes the fill wrote at off
// and waits for those written fillDirty before. Left to the kernel's
// writeback, a fill of 256 MiB had every other file's sync meanwhile
// (Raft's, Pebble's, as a new server takes up its first map) wait behind
// much of it: a fresh server of 8 GiB of arenas led and gossiped its
// first map 200-266 ms after it was ready in 6 starts of 12 (10-38 ms in
// the others), and 46-99 ms after in 10 starts with this (the fill took
// as long). Best effort: the fill's final sync makes it durable.
func writeOutBehind(fd int, off, n int64) {
	_ = unix.SyncFileRange(fd, off, n, unix.SYNC_FILE_RANGE_WRITE)
	if off >= fillDirty {
		_ = unix.SyncFileRange(fd, off-fillDirty, n, unix.SYNC_FILE_RANGE_WAIT_BEFORE|unix.SYNC_FILE_RANGE_WRITE|unix.SYNC_FILE_RANGE_WAIT_AFTER)
	}
}

// waitFilled waits for a new log's fill. The writer calls it before it
// appends.
func (l *indexLog) waitFilled() error {
	if l.filling == nil {
		return nil
	}
	<-l.filling
	return l.fillErr
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// writeOut hands the entries buffered to the kernel.
func (l *indexLog) writeOut() error {
	if len(l.buf) == 0 {
		return nil
	}
	if err := l.calls.pwrite(l.file, l.buf, int64(l.bufAt)); err != nil {
		return fmt.Errorf("store: writing the index log %s: %w", l.file.Name(), err)
	}
	l.buf = l.buf[:0]
	return nil
}

// sync makes the log's entries durable. The writer calls it.
func (l *indexLog) sync() error {
	if err := l.writeOut(); err != nil {
		return err
	}
	if err := l.calls.fdatasync(l.file); err != nil {
		return fmt.Errorf("store: fdatasync of the index log %s: %w", l.file.Name(), err)
	}
	return nil
}

// syncWritten makes the entries written out durable. It is safe to call
// from any goroutine: its call is an ordinary one (writerCalls).
func (l *indexLog) syncWritten() error {
	if err := unix.Fdatasync(int(l.file.Fd())); err != nil {
		return fmt.Errorf("store: fdatasync of the index log %s: %w", l.file.Name(), err)
	}
	return nil
}

func (l *indexLog) close() error {
	if l.filling != nil {
		close(l.stopFill)
		<-l.filling
	}
	return errors.Join(unix.Munmap(l.mem), l.file.Close())
}

func (l *indexLog) size() uint64 { return uint64(len(l.mem)) }

// logEntrySize is the bytes an entry with n bytes of key and record takes.
func logEntrySize(n int) int { return (logHeaderSize + n + 7) &^ 7 }

// free is the room left before the entries not yet flushed.
func (l *indexLog) free(flushed uint64) uint64 { return l.size() - (l.next.total - flushed) }

// append writes e at the log's end, with the next seq, which it returns.
// The caller made room for it (and a wrap's waste). A buffered log holds
// it until writeOut, unless it wraps.
func (l *indexLog) append(e *logEntry) (uint64, error) {
	n := logEntrySize(len(e.key) + len(e.rec))
	if off := l.next.total % l.size(); off+uint64(n) > l.size() {
		if rest := l.size() - off; rest >= logPadMin {
			l.put(off, &logEntry{seq: l.next.seq, kind: logPad}, int(rest))
			l.next.seq++
		}
		l.next.total += l.size() - off
		if err := l.writeOut(); err != nil {
			return 0, err
		}
	}
	e.seq = l.next.seq
	l.put(l.next.total%l.size(), e, n)
	l.next.seq++
	l.next.total += uint64(n)
	return e.seq, nil
}

// slot is where the n bytes at off are encoded: the mapping, or the
// buffer, which then ends at off+n.
func (l *indexLog) slot(off uint64, n int) []byte {
	if !l.buffered {
		return l.mem[off : off+uint64(n)]
	}
	if len(l.buf) == 0 {
		l.bufAt = off
	}
	at := len(l.buf)
	l.buf = slices.Grow(l.buf, n)[:at+n] // put writes every byte
	return l.buf[at:]
}

// put encodes e, of n bytes (a pad's header only), at off.
func (l *indexLog) put(off uint64, e *logEntry, n int) {
	encoded := n
	if e.kind == logPad {
		encoded = logPadMin
	}
	b := l.slot(off, encoded)
	le := binary.LittleEndian
	le.PutUint32(b[4:], uint32(n))
	le.PutUint64(b[8:], l.next.gen)
	le.PutUint64(b[16:], e.seq)
	b[24] = e.kind
	if e.kind != logPad {
		flags := byte(0)
		if e.session != 0 {
			flags = logHasSession
		}
		if e.rec != nil {
			flags |= logHasRecord
		}
		b[25] = flags
		le.PutUint16(b[26:], uint16(e.shard))
		le.PutUint16(b[28:], uint16(len(e.key)))
		le.PutUint16(b[30:], e.loc.Arena)
		le.PutUint64(b[32:], e.loc.Offset)
		le.PutUint32(b[40:], e.loc.Length)
		le.PutUint32(b[44:], 0)
		le.PutUint64(b[48:], e.version)
		le.PutUint64(b[56:], e.session)
		le.PutUint64(b[64:], e.wseq)
		le.PutUint64(b[72:], uint64(e.time))
		end := logHeaderSize + copy(b[logHeaderSize:], e.key)
		end += copy(b[end:], e.rec)
		clear(b[end:])
	} else {
		clear(b[25:])
	}
	le.PutUint32(b[0:], crc32.Checksum(b[4:], castagnoli))
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// read decodes the entry at pos, which must be generation gen's seq, or
// reports false: the log ends there.
func (l *indexLog) read(pos logPos) (e logEntry, n int, ok bool) {
	off := pos.total % l.size()
	if l.size()-off < logPadMin {
		return logEntry{kind: logPad}, int(l.size() - off), true // a wrap without a pad
	}
	b := l.mem[off:]
	le := binary.LittleEndian
	n = int(le.Uint32(b[4:]))
	switch {
	case n < logPadMin || n%8 != 0 || uint64(n) > l.size()-off:
		return e, 0, false
	case le.Uint64(b[8:]) != pos.gen || le.Uint64(b[16:]) != pos.seq:
		return e, 0, false
	}
	e.seq, e.kind = pos.seq, b[24]
	body := b[4:n]
	if e.kind == logPad {
		body = b[4:logPadMin]
	} else if n < logHeaderSize {
		return e, 0, false
	}
	if le.Uint32(b[0:]) != crc32.Checksum(body, castagnoli) {
		return e, 0, false
	}
	if e.kind == logPad {
		return e, n, true
	}
	keyLen := int(le.Uint16(b[28:]))
	e.loc = proto.Location{Arena: le.Uint16(b[30:]), Offset: le.Uint64(b[32:]), Length: le.Uint32(b[40:])}
	recLen := 0
	if b[25]&logHasRecord != 0 {
		recLen = int(e.loc.Length)
	}
	if logEntrySize(keyLen+recLen) != n {
		return e, 0, false
	}
	e.shard = proto.Shard(le.Uint16(b[26:]))
	e.key = b[logHeaderSize : logHeaderSize+keyLen]
	if recLen > 0 {
		e.rec = b[logHeaderSize+keyLen : logHeaderSize+keyLen+recLen]
	}
	e.version = le.Uint64(b[48:])
	if b[25]&logHasSession != 0 {
		e.session = le.Uint64(b[56:])
	}
	e.wseq = le.Uint64(b[64:])
	e.time = int64(le.Uint64(b[72:]))
	switch {
	case e.kind != logPut && e.kind != logDelete && e.kind != logVoid:
		return e, 0, false
	case e.kind != logVoid && (e.shard >= proto.NumShards || keyLen == 0 || proto.ShardOf(e.key) != e.shard):
		return e, 0, false
	case e.rec != nil && (e.kind != logPut || !holdsPut(e.rec, e)):
		return e, 0, false
	}
	return e, n, true
}

var metaIndexLogKey = []byte("m/index-log")

// pendingIndex is what the log holds that Pebble does not yet: the last
// entry of each key written (by Pebble data key), and the sessions that
// applied writes (their records are the session table's).
type pendingIndex struct {
	data     map[string]*pendingEntry // pointers: a key written again is updated in place, allocating nothing
	sessions map[sessKey]struct{}
}

type pendingEntry struct {
	e       entry
	deleted bool
}

func newPendingIndex() pendingIndex {
	return pendingIndex{data: map[string]*pendingEntry{}, sessions: map[sessKey]struct{}{}}
}

func (p pendingIndex) empty() bool { return len(p.data) == 0 && len(p.sessions) == 0 }

// logFormat is the format of the position a running store writes.
func (s *Store) logFormat() byte {
	if s.journaled() {
		return logFormatRecords
	}
	return logFormatEntries
}

// openIndex replays the index log into Pebble, if there is one, and
// starts the log afresh. Open calls it before reading any entry: after
// the journal's replay (whose records precede the log's: see flushIndex)
// and before loadShards and rebuild.
func (s *Store) openIndex() (int, error) {
	l, err := openIndexLog(s.opts.Dir, s.opts.IndexLogSize)
	if err != nil {
		return 0, err
	}
	b := s.db.NewBatch()
	defer b.Close()
	n, records, err := s.replayIndexLog(l, b)
	if err == nil && records > 0 {
		// The log starts again over them.
		err = s.syncArenas()
	}
	// The log starts again at its beginning, in this generation: the
	// replayed entries and the new position in one batch, before the
	// file is touched.
	next := logPos{gen: s.generation}
	if err == nil {
		err = b.Set(metaIndexLogKey, next.encode(s.logFormat()), nil)
	}
	if err == nil {
		if err = b.Commit(pebble.Sync); err != nil {
			err = fmt.Errorf("store: writing the replayed index log: %w", err)
		}
	}
	if err != nil {
		l.close()
		return n, err
	}
	if l.size() != uint64(s.opts.IndexLogSize) {
		// Replayed at the size IndexLogSize had before.
		path := l.file.Name()
		if err := errors.Join(l.close(), os.Remove(path)); err != nil {
			return n, fmt.Errorf("store: removing the replayed index log: %w", err)
		}
		if l, err = openIndexLog(s.opts.Dir, s.opts.IndexLogSize); err != nil {
			return n, err
		}
	}
	l.next, l.flushed = next, next
	l.buffered = s.journaled()
	s.ilog, s.logEnd = l, next
	s.flushAt = l.size() / 2
	if s.journaled() {
		s.flushAt = min(s.flushAt, uint64(s.opts.CheckpointBytes))
	}
	s.pending, s.flushing = newPendingIndex(), newPendingIndex()
	return n, nil
}

// replayIndexLog adds to b, in order, the effects of the entries past the
// recorded position, copying into the arenas the records the entries
// carry, and returns how many entries it replayed and records it copied.
func (s *Store) replayIndexLog(l *indexLog, b *pebble.Batch) (n, records int, err error) {
	v, closer, err := s.db.Get(metaIndexLogKey)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, 0, nil // never logged
	}
	if err != nil {
		return 0, 0, fmt.Errorf("store: reading the index log's position: %w", err)
	}
	pos, err := decodeLogPos(v)
	closer.Close()
	if err != nil {
		return 0, 0, err
	}
	entries, voided := l.entriesFrom(pos)
	lost := 0
	for _, e := range entries {
		if voided[e.seq] {
			continue
		}
		r := sessionRecord{seq: e.wseq, time: e.time}
		if e.kind == logPut {
			if e.rec != nil {
				if err := s.checkLocation(e.key, e.loc); err != nil {
					return n, records, fmt.Errorf("store: replaying index log entry %d: %w", e.seq, err)
				}
				// Dead until the rebuild says otherwise, as the journal's.
				a := s.arena(e.loc.Arena)
				copy(a.mem.Bytes()[e.loc.Offset:], e.rec)
				a.setState(e.loc.Offset, proto.RecordDead)
				records++
			} else if !s.holdsRecord(e) {
				lost++ // a machine crash's: SyncNone may lose recent writes
				continue
			}
			r.version, r.loc = e.version, e.loc
			if err := b.Set(shardDataKey(e.shard, e.key), entry{loc: e.loc, version: e.version}.encode(), nil); err != nil {
				return n, records, err
			}
		} else if err := b.Delete(shardDataKey(e.shard, e.key), nil); err != nil {
			return n, records, err
		}
		if e.session != 0 {
			if err := b.Set(sessionKey(e.shard, e.session), r.encode(), nil); err != nil {
				return n, records, err
			}
		}
		n++
	}
	if lost > 0 {
		s.log.Warn("the index log names records the arenas do not hold: their writes are lost, as a machine crash under sync none may lose recent writes",
			"records", lost)
	}
	return n, records, nil
}

// entriesFrom decodes the log's puts and deletes from pos on, in order, up
// to the first place that does not hold pos's successor, and the seqs of
// the entries voided.
func (l *indexLog) entriesFrom(pos logPos) (entries []logEntry, voided map[uint64]bool) {
	voided = map[uint64]bool{}
	for read := uint64(0); read < l.size(); {
		e, n, ok := l.read(pos)
		if !ok {
			break
		}
		if e.kind != logPad || n >= logPadMin {
			pos.seq++
		}
		pos.total += uint64(n)
		read += uint64(n)
		switch e.kind {
		case logVoid:
			voided[e.version] = true
		case logPut, logDelete:
			entries = append(entries, e)
		}
	}
	return entries, voided
}

// holdsRecord reports whether the arenas hold put e's record, intact.
func (s *Store) holdsRecord(e logEntry) bool {
	if s.checkLocation(e.key, e.loc) != nil {
		return false
	}
	rec, err := s.arena(e.loc.Arena).record(e.loc)
	return err == nil && holdsPut(rec, e)
}

// holdsPut reports whether rec is put e's record.
func holdsPut(rec []byte, e logEntry) bool {
	r, err := proto.ParseRecord(rec)
	return err == nil && len(rec) == int(e.loc.Length) && r.Version == e.version && string(r.Key) == string(e.key)
}

// logSize is the bytes c's entry takes in the log.
func (c *pendingCommit) logSize() int {
	if c.delete {
		return logEntrySize(len(c.key))
	}
	return logEntrySize(len(c.key) + len(c.rec)) // rec is nil under SyncNone
}

// logCommits appends the entries of the batch's commits about to be
// published, with their records under the durable policies. It first
// makes room for them all, and for a void of each: an entry appended
// stays. The writer calls it.
func (s *Store) logCommits(batch []*pendingCommit, now int64) error {
	need, most := 0, 0
	for _, c := range batch {
		if c.result == nil {
			n := c.logSize()
			need, most = need+n+logEntrySize(0), max(most, n)
		}
	}
	if need == 0 {
		return nil
	}
	if err := s.ilog.waitFilled(); err != nil {
		s.breakOn(err)
		return err
	}
	if err := s.logRoom(uint64(need + most)); err != nil {
		return err
	}
	for _, c := range batch {
		if c.result != nil {
			continue
		}
		e := logEntry{kind: logPut, shard: c.shard, key: c.key, loc: c.entry.loc, version: c.entry.version,
			session: c.write.Session, wseq: c.write.Seq, time: now}
		if c.delete {
			e.kind, e.loc, e.version = logDelete, proto.Location{}, 0
		} else {
			e.rec = c.rec
		}
		seq, err := s.ilog.append(&e)
		if err != nil {
			s.breakOn(err)
			return err
		}
		c.logSeq = seq
	}
	return nil
}

// logWritten hands what the batch appended to the kernel and, under
// SyncAlways, makes it durable. On failure the store takes no more
// writes: what the log holds is then unknown (the kernel may drop the
// pages it failed to write).
func (s *Store) logWritten() error {
	err := s.ilog.writeOut()
	if err == nil && s.opts.Sync == SyncAlways {
		err = s.ilog.sync()
	}
	if err != nil {
		s.breakOn(err)
	}
	return err
}

// logRoom makes room for n bytes of entries, flushing if need be.
func (s *Store) logRoom(n uint64) error {
	s.mu.Lock()
	free := s.ilog.free(s.ilog.flushed.total)
	s.mu.Unlock()
	if n <= free {
		return nil
	}
	s.stats.indexLogFull.Add(1)
	if err := s.flushIndex(); err != nil {
		return err
	}
	s.mu.Lock()
	free = s.ilog.free(s.ilog.flushed.total)
	s.mu.Unlock()
	if n > free {
		return fmt.Errorf("store: a batch of commits needs %d bytes of the index log, which has %d free of %d: raise IndexLogSize", n, free, s.ilog.size())
	}
	return nil
}

// logVoided voids the entry of c, whose publication failed; logCommits
// made room for it.
func (s *Store) logVoided(c *pendingCommit) {
	if _, err := s.ilog.append(&logEntry{kind: logVoid, version: c.logSeq}); err != nil {
		s.breakOn(err)
	}
}

// notePublishedLocked records c, published, as pending for the next
// flush. Called with mu held.
func (s *Store) notePublishedLocked(c *pendingCommit) {
	s.keyBuf = appendDataKey(s.keyBuf[:0], c.shard, c.key)
	if p := s.pending.data[string(s.keyBuf)]; p != nil {
		*p = pendingEntry{e: c.entry, deleted: c.delete}
	} else {
		s.pending.data[string(s.keyBuf)] = &pendingEntry{e: c.entry, deleted: c.delete}
	}
	if c.write.Session != 0 {
		s.pending.sessions[sessKey{c.shard, c.write.Session}] = struct{}{}
	}
}

// pendingEntryLocked returns key's entry in shard sh if the log holds it
// and Pebble not yet. Called with mu held.
func (s *Store) pendingEntryLocked(sh proto.Shard, key []byte) (pendingEntry, bool) {
	s.keyBuf = appendDataKey(s.keyBuf[:0], sh, key)
	p := s.pending.data[string(s.keyBuf)]
	if p == nil {
		p = s.flushing.data[string(s.keyBuf)]
	}
	if p == nil {
		return pendingEntry{}, false
	}
	return *p, true
}

// flushIndex writes what the log holds into Pebble, and with it how far
// the log is flushed: afterwards Pebble holds every commit published
// before the call. Under the durable policies it is a checkpoint: the
// arenas are synced first, and the journal trimmed in the same batch. It
// is safe to call from any goroutine.
func (s *Store) flushIndex() error { return s.flush(true) }

// flushPending makes Pebble hold every commit published before the call,
// for a reader of it, or for the cleaner, whose entries the pending ones
// must not overwrite later. Under the durable policies it leaves the
// log's position and the arenas be, since a checkpoint costs an
// fdatasync of each arena: the log keeps the entries, and a replay after
// a crash writes them again, in order, over what this wrote and what the
// cleaner wrote since. That is safe because the cleaner moves a record
// without changing its version, and the location an entry names holds
// its record until its segment is reused, which takes a checkpoint
// (reclaim) that moves the position past the entry. A writer of other
// versions (Ingest), or one that drops or hands over a shard's entries,
// calls flushIndex instead: a replay must not cross its writes.
func (s *Store) flushPending() error { return s.flush(!s.journaled()) }

// flush is flushIndex, or with checkpoint false, flushPending's write of
// what is pending alone.
func (s *Store) flush(checkpoint bool) error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	s.mu.Lock()
	pos := s.logEnd
	journal := s.journalNext.Load() // every journal entry below is committed
	if s.pending.empty() && len(s.sess.doomed) == 0 &&
		(!checkpoint || pos.total == s.ilog.flushed.total && journal == s.journalTrimmed) {
		s.mu.Unlock()
		return nil
	}
	if checkpoint {
		s.journalBytes.Store(0)
	}
	s.pending, s.flushing = s.flushing, s.pending
	doomed := s.sess.takeDoomed()
	b := s.db.NewBatch()
	defer b.Close()
	for _, k := range doomed {
		_ = b.Delete(sessionKey(k.shard, k.session), nil) // before the sets: a session re-created since stays
	}
	for k := range s.flushing.sessions {
		if ss := s.sess.m[k]; ss != nil && ss.applied {
			op := b.SetDeferred(sessionKeySize, sessionRecordSize)
			appendSessionKey(op.Key[:0], k.shard, k.session)
			ss.sessionRecord.append(op.Value[:0])
			_ = op.Finish()
		}
	}
	s.mu.Unlock()
	for k, p := range s.flushing.data {
		if p.deleted {
			_ = b.Delete([]byte(k), nil)
			continue
		}
		op := b.SetDeferred(len(k), entrySize)
		copy(op.Key, k)
		p.e.append(op.Value[:0])
		_ = op.Finish()
	}
	start := time.Now()
	var err error
	if checkpoint {
		_ = b.Set(metaIndexLogKey, pos.encode(s.logFormat()), nil)
	}
	if checkpoint && s.journaled() {
		// The records of the entries leaving the log, and of the journal,
		// were in the arenas before this sync: once it is done, neither
		// copy is needed.
		_ = b.DeleteRange(journalPrefix, journalKey(journal), nil)
		err = s.syncArenas()
	}
	if err == nil {
		// A checkpoint is synced under every policy (under SyncNone a
		// write-out: see walfs.go): the log may wrap over what it holds.
		// What flushForRead writes, the log still holds.
		opts := pebble.NoSync
		if checkpoint {
			opts = pebble.Sync
		}
		err = b.Commit(opts)
	}
	if err == nil {
		err = s.brokenErr()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		// Keep them pending: the next flush writes them, newer ones first.
		for k, p := range s.flushing.data {
			if _, ok := s.pending.data[k]; !ok {
				s.pending.data[k] = p
			}
		}
		for k := range s.flushing.sessions {
			s.pending.sessions[k] = struct{}{}
		}
		s.sess.undoom(doomed)
		err = fmt.Errorf("store: flushing the index log: %w", err)
	} else if checkpoint {
		s.ilog.flushed, s.journalTrimmed = pos, journal
		if s.journaled() {
			s.stats.checkpoints.Add(1)
		}
	}
	if err == nil {
		s.stats.indexFlushes.Add(1)
		s.stats.indexFlushed.Add(uint64(len(s.flushing.data)))
		s.stats.indexFlushTime.Add(int64(time.Since(start)))
	}
	clear(s.flushing.data)
	clear(s.flushing.sessions)
	return err
}

// indexFlushLoop flushes the log every IndexFlushInterval (under the
// durable policies, every CheckpointInterval), and sooner when the log
// is half full, CheckpointBytes were logged, or the journal asks.
func (s *Store) indexFlushLoop() {
	defer s.wg.Done()
	every := s.opts.IndexFlushInterval
	if s.journaled() {
		every = s.opts.CheckpointInterval
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-s.indexHalf:
		case <-s.journalFull:
		case <-s.stop:
			return
		}
		if err := s.flushIndex(); err != nil {
			s.log.Error("flushing the index log into Pebble", "err", err)
		}
	}
}

// logPublished records the batch's published commits as pending and
// publishes the log's end for flushes. The writer calls it, mu held.
func (s *Store) logPublishedLocked(batch []*pendingCommit) {
	for _, c := range batch {
		if c.result == nil {
			s.notePublishedLocked(c)
		}
	}
	s.logEnd = s.ilog.next
	if s.logEnd.total-s.ilog.flushed.total > s.flushAt {
		select {
		case s.indexHalf <- struct{}{}:
		default:
		}
	}
}
