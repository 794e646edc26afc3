// The control RPC between clients and servers: leases, commits, deletes, scans, stats.

package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// The control RPC runs over the TCP connection whose start carried the
// out-of-band QP handshake (rdma.ConnectQP). It is the server's control
// path only: GETs never use it.
//
// A frame is a 4-byte big-endian body length (at most MaxFrame) and a
// msgpack body, one positional array:
//
//	[ ControlVersion, type, request id, [payload fields...] ]
//
// A reply carries the id of its request. Every request is answered by its
// reply type or by an Error. Decoding is strict: another version, an
// unknown type, a type's payload with the wrong number of fields, a length
// over its limit or over the bytes left, or bytes after the end all fail
// with an error wrapping ErrBadMessage, before anything is allocated for
// them. A peer that sends a bad frame is answered by an Error
// (CodeBadRequest, request id 0, naming the problem) and disconnected.
const (
	ControlVersion = 1

	// MaxFrame bounds a frame's body. A scan reply is cut to fit.
	MaxFrame = 1 << 20

	// MaxHelloFrame bounds the body of the first frame on a connection,
	// which a server reads before the peer has authenticated: a Hello
	// with the longest name and token fits. An unauthenticated peer so
	// cannot make a server allocate MaxFrame per connection.
	MaxHelloFrame = 2048

	// Limits of the variable-length fields.
	MaxControlName    = 512  // Hello.Client, HelloReply.Server
	MaxControlToken   = 1024 // Hello.Token
	MaxControlMessage = 4096 // Error.Message
	MaxScanEntries    = MaxFrame / 8
)

// ErrBadMessage means a control frame that is malformed, too large, of
// another version or of an unknown type.
var ErrBadMessage = errors.New("proto: bad control message")

// MsgType is a control message's type.
type MsgType uint8

// Message types.
const (
	MsgHello MsgType = iota + 1
	MsgHelloReply
	MsgGrantLease
	MsgLeaseReply
	MsgCommit
	MsgCommitReply
	MsgDelete
	MsgAck
	MsgScan
	MsgScanReply
	MsgEndLease
	MsgStats
	MsgStatsReply
	MsgError
	msgTypeEnd
)

var msgNames = [...]string{
	MsgHello: "Hello", MsgHelloReply: "HelloReply", MsgGrantLease: "GrantLease", MsgLeaseReply: "LeaseReply",
	MsgCommit: "Commit", MsgCommitReply: "CommitReply", MsgDelete: "Delete", MsgAck: "Ack", MsgScan: "Scan",
	MsgScanReply: "ScanReply", MsgEndLease: "EndLease", MsgStats: "Stats", MsgStatsReply: "StatsReply", MsgError: "Error",
}

func (t MsgType) String() string {
	if t > 0 && t < msgTypeEnd {
		return msgNames[t]
	}
	return fmt.Sprintf("MsgType(%d)", uint8(t))
}

// NumMsgTypes is one more than the largest MsgType: arrays indexed by
// MsgType have this length.
const NumMsgTypes = int(msgTypeEnd)

// Message is one control message: a pointer to one of the types below.
type Message interface {
	Type() MsgType
	encode(e *msgpack.Encoder) error
	decode(d *ctlDecoder) error
}

// Hello opens a session: the first request on every connection.
type Hello struct {
	Client string
	Token  []byte // the server's auth token; empty when it has none
}

// HelloReply names the server and its generation (which changes with every
// start, as the rkeys do).
type HelloReply struct {
	Server     string
	Generation uint64
}

// GrantLease asks for a write lease.
type GrantLease struct{}

// LeaseReply is a granted write lease (store.Lease). TTL is its remaining
// life when the server sent it: relative, so clocks need not agree.
type LeaseReply struct {
	ID           uint64
	Arena        uint16
	Addr         uint64
	Size         uint64
	RKey         uint32
	TTL          time.Duration
	VersionBase  uint64
	VersionCount uint64
}

// Commit commits the record written at Offset of lease LeaseID's region,
// Length bytes long.
type Commit struct {
	LeaseID, Offset, Length uint64
}

// CommitReply says where the committed record lies and its version.
type CommitReply struct {
	Arena   uint16
	Offset  uint64
	Length  uint32
	Version uint64
}

// Delete deletes a key (absent keys are no error).
type Delete struct{ Key []byte }

// Ack acknowledges a Delete or an EndLease.
type Ack struct{}

// Scan lists keys in [Start, End) in order; End nil means no upper bound,
// Limit 0 no limit (the reply is still cut to fit MaxFrame).
type Scan struct {
	Start, End []byte
	Limit      uint32
}

// ScanEntry is one key of a scan and where its record lies.
type ScanEntry struct {
	Key     []byte
	Arena   uint16
	Offset  uint64
	Length  uint32
	Version uint64
}

// ScanReply is a scan's keys. More is set when the reply was cut short of
// the limit to fit a frame: scan again from the last key's successor.
type ScanReply struct {
	Entries []ScanEntry
	More    bool
}

// EndLease ends a lease: its write rkey is revoked.
type EndLease struct{ ID uint64 }

// Stats asks for the server's counters.
type Stats struct{}

// StatsReply is a few of the server's counters.
type StatsReply struct {
	Generation   uint64
	Keys         uint64
	Commits      uint64
	Deletes      uint64
	LeasesActive uint64
	Connections  uint64
	Handled      uint64 // control requests handled, all types
}

// ErrorCode classifies an Error.
type ErrorCode uint16

// Error codes.
const (
	CodeNotFound ErrorCode = iota + 1
	CodeLeaseInvalid
	CodeRecordInvalid
	CodeFull
	CodeIndexFull
	CodeUnauthenticated
	CodeInternal
	CodeBadRequest // a request the server does not take (a reply type, a second Hello)
	codeEnd
)

var codeNames = [...]string{
	CodeNotFound: "not found", CodeLeaseInvalid: "lease invalid", CodeRecordInvalid: "record invalid",
	CodeFull: "full", CodeIndexFull: "index full", CodeUnauthenticated: "unauthenticated",
	CodeInternal: "internal", CodeBadRequest: "bad request",
}

func (c ErrorCode) String() string {
	if c > 0 && c < codeEnd {
		return codeNames[c]
	}
	return fmt.Sprintf("code(%d)", uint16(c))
}

// Error is a failed request's answer.
type Error struct {
	Code    ErrorCode
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("rkv server: %s: %s", e.Code, e.Message) }

func (*Hello) Type() MsgType       { return MsgHello }
func (*HelloReply) Type() MsgType  { return MsgHelloReply }
func (*GrantLease) Type() MsgType  { return MsgGrantLease }
func (*LeaseReply) Type() MsgType  { return MsgLeaseReply }
func (*Commit) Type() MsgType      { return MsgCommit }
func (*CommitReply) Type() MsgType { return MsgCommitReply }
func (*Delete) Type() MsgType      { return MsgDelete }
func (*Ack) Type() MsgType         { return MsgAck }
func (*Scan) Type() MsgType        { return MsgScan }
func (*ScanReply) Type() MsgType   { return MsgScanReply }
func (*EndLease) Type() MsgType    { return MsgEndLease }
func (*Stats) Type() MsgType       { return MsgStats }
func (*StatsReply) Type() MsgType  { return MsgStatsReply }
func (*Error) Type() MsgType       { return MsgError }

func newMessage(t MsgType) Message {
	switch t {
	case MsgHello:
		return &Hello{}
	case MsgHelloReply:
		return &HelloReply{}
	case MsgGrantLease:
		return &GrantLease{}
	case MsgLeaseReply:
		return &LeaseReply{}
	case MsgCommit:
		return &Commit{}
	case MsgCommitReply:
		return &CommitReply{}
	case MsgDelete:
		return &Delete{}
	case MsgAck:
		return &Ack{}
	case MsgScan:
		return &Scan{}
	case MsgScanReply:
		return &ScanReply{}
	case MsgEndLease:
		return &EndLease{}
	case MsgStats:
		return &Stats{}
	case MsgStatsReply:
		return &StatsReply{}
	case MsgError:
		return &Error{}
	}
	return nil
}

// ---- encoding ----

func encUints(e *msgpack.Encoder, vs ...uint64) error {
	if err := e.EncodeArrayLen(len(vs)); err != nil {
		return err
	}
	for _, v := range vs {
		if err := e.EncodeUint(v); err != nil {
			return err
		}
	}
	return nil
}

func badMsg(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadMessage}, args...)...)
}

func checkLen(what string, n, max int) error {
	if n > max {
		return badMsg("%s of %d bytes, limit %d", what, n, max)
	}
	return nil
}

func (m *Hello) encode(e *msgpack.Encoder) error {
	if err := errors.Join(checkLen("client name", len(m.Client), MaxControlName), checkLen("token", len(m.Token), MaxControlToken)); err != nil {
		return err
	}
	return errors.Join(e.EncodeArrayLen(2), e.EncodeString(m.Client), e.EncodeBytes(m.Token))
}

func (m *HelloReply) encode(e *msgpack.Encoder) error {
	if err := checkLen("server name", len(m.Server), MaxControlName); err != nil {
		return err
	}
	return errors.Join(e.EncodeArrayLen(2), e.EncodeString(m.Server), e.EncodeUint(m.Generation))
}

func (*GrantLease) encode(e *msgpack.Encoder) error { return e.EncodeArrayLen(0) }
func (*Ack) encode(e *msgpack.Encoder) error        { return e.EncodeArrayLen(0) }
func (*Stats) encode(e *msgpack.Encoder) error      { return e.EncodeArrayLen(0) }

func (m *LeaseReply) encode(e *msgpack.Encoder) error {
	if m.TTL < 0 {
		return badMsg("negative lease TTL %v", m.TTL)
	}
	return encUints(e, m.ID, uint64(m.Arena), m.Addr, m.Size, uint64(m.RKey), uint64(m.TTL), m.VersionBase, m.VersionCount)
}

func (m *Commit) encode(e *msgpack.Encoder) error {
	return encUints(e, m.LeaseID, m.Offset, m.Length)
}

func (m *CommitReply) encode(e *msgpack.Encoder) error {
	return encUints(e, uint64(m.Arena), m.Offset, uint64(m.Length), m.Version)
}

func (m *Delete) encode(e *msgpack.Encoder) error {
	if len(m.Key) == 0 || len(m.Key) > MaxKeyLen {
		return badMsg("key of %d bytes: must be 1 to %d", len(m.Key), MaxKeyLen)
	}
	return errors.Join(e.EncodeArrayLen(1), e.EncodeBytes(m.Key))
}

func (m *Scan) encode(e *msgpack.Encoder) error {
	if err := errors.Join(checkLen("scan start", len(m.Start), MaxKeyLen), checkLen("scan end", len(m.End), MaxKeyLen)); err != nil {
		return err
	}
	return errors.Join(e.EncodeArrayLen(3), e.EncodeBytes(m.Start), e.EncodeBytes(m.End), e.EncodeUint(uint64(m.Limit)))
}

func (m *ScanReply) encode(e *msgpack.Encoder) error {
	if len(m.Entries) > MaxScanEntries {
		return badMsg("%d scan entries, limit %d", len(m.Entries), MaxScanEntries)
	}
	errs := []error{e.EncodeArrayLen(2), e.EncodeArrayLen(len(m.Entries))}
	for _, en := range m.Entries {
		if len(en.Key) == 0 || len(en.Key) > MaxKeyLen {
			return badMsg("scan entry key of %d bytes: must be 1 to %d", len(en.Key), MaxKeyLen)
		}
		errs = append(errs, e.EncodeArrayLen(5), e.EncodeBytes(en.Key), e.EncodeUint(uint64(en.Arena)),
			e.EncodeUint(en.Offset), e.EncodeUint(uint64(en.Length)), e.EncodeUint(en.Version))
	}
	errs = append(errs, e.EncodeBool(m.More))
	return errors.Join(errs...)
}

func (m *EndLease) encode(e *msgpack.Encoder) error { return encUints(e, m.ID) }

func (m *StatsReply) encode(e *msgpack.Encoder) error {
	return encUints(e, m.Generation, m.Keys, m.Commits, m.Deletes, m.LeasesActive, m.Connections, m.Handled)
}

func (m *Error) encode(e *msgpack.Encoder) error {
	if m.Code == 0 || m.Code >= codeEnd {
		return badMsg("error code %d", m.Code)
	}
	msg := m.Message
	if len(msg) > MaxControlMessage {
		msg = msg[:MaxControlMessage]
	}
	return errors.Join(e.EncodeArrayLen(2), e.EncodeUint(uint64(m.Code)), e.EncodeString(msg))
}

// AppendFrame appends m's frame (length prefix and body) with request id
// to dst.
func AppendFrame(dst []byte, id uint64, m Message) ([]byte, error) {
	start := len(dst)
	buf := bytes.NewBuffer(append(dst, 0, 0, 0, 0))
	e := msgpack.NewEncoder(buf)
	t := m.Type()
	if err := errors.Join(e.EncodeArrayLen(4), e.EncodeUint(ControlVersion), e.EncodeUint(uint64(t)), e.EncodeUint(id)); err != nil {
		return dst, err
	}
	if err := m.encode(e); err != nil {
		return dst, fmt.Errorf("proto: encoding %v: %w", t, err)
	}
	out := buf.Bytes()
	n := len(out) - start - 4
	if n > MaxFrame {
		return dst, badMsg("%v frame of %d bytes, limit %d", t, n, MaxFrame)
	}
	binary.BigEndian.PutUint32(out[start:], uint32(n))
	return out, nil
}

// WriteFrame writes m's frame with request id to w in one Write.
func WriteFrame(w io.Writer, id uint64, m Message) error {
	b, err := AppendFrame(nil, id, m)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// ReadFrame reads one frame from r and decodes it. buf is reused for the
// body when large enough; the returned buffer is the one to pass next
// time. The decoded message retains nothing of buf. A length over
// MaxFrame fails before anything is allocated.
func ReadFrame(r io.Reader, buf []byte) (id uint64, m Message, _ []byte, err error) {
	return ReadFrameMax(r, buf, MaxFrame)
}

// ReadFrameMax is ReadFrame with a smaller bound on the body, such as
// MaxHelloFrame; limits above MaxFrame are taken as MaxFrame.
func ReadFrameMax(r io.Reader, buf []byte, limit int) (id uint64, m Message, _ []byte, err error) {
	limit = min(limit, MaxFrame)
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, buf, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if uint64(n) > uint64(limit) {
		return 0, nil, buf, badMsg("frame of %d bytes, limit %d", n, limit)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, buf, err
	}
	id, m, err = DecodeFrame(buf)
	return id, m, buf, err
}

// DecodeFrame decodes a frame's body (without its length prefix). It
// retains nothing of b. Errors wrap ErrBadMessage.
func DecodeFrame(b []byte) (id uint64, m Message, err error) {
	if len(b) > MaxFrame {
		return 0, nil, badMsg("frame of %d bytes, limit %d", len(b), MaxFrame)
	}
	d := newCtlDecoder(b)
	if err := d.fixedArray("frame", 4); err != nil {
		return 0, nil, err
	}
	v, err := d.uint("version", 255)
	if err != nil {
		return 0, nil, err
	}
	if v != ControlVersion {
		return 0, nil, badMsg("control version %d; this side speaks %d", v, ControlVersion)
	}
	t, err := d.uint("type", 255)
	if err != nil {
		return 0, nil, err
	}
	if m = newMessage(MsgType(t)); m == nil {
		return 0, nil, badMsg("unknown message type %d", t)
	}
	if id, err = d.uint("request id", 1<<64-1); err != nil {
		return 0, nil, err
	}
	if err := m.decode(d); err != nil {
		return 0, nil, fmt.Errorf("%v: %w", MsgType(t), err)
	}
	if n := d.r.Len(); n != 0 {
		return 0, nil, badMsg("%d bytes after the end of %v", n, MsgType(t))
	}
	return id, m, nil
}

// ---- decoding ----

// ctlDecoder reads msgpack strictly: every length is checked against its
// limit and the bytes left before anything is allocated.
type ctlDecoder struct {
	r *bytes.Reader
	d *msgpack.Decoder
}

func newCtlDecoder(b []byte) *ctlDecoder {
	r := bytes.NewReader(b)
	return &ctlDecoder{r: r, d: msgpack.NewDecoder(r)}
}

func (d *ctlDecoder) wrap(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrBadMessage, what, err)
}

func (d *ctlDecoder) arrayLen(what string, max int) (int, error) {
	n, err := d.d.DecodeArrayLen()
	if err != nil {
		return 0, d.wrap(what, err)
	}
	if n < 0 || n > max || n > d.r.Len() {
		return 0, badMsg("%s of %d elements (limit %d, %d bytes left)", what, n, max, d.r.Len())
	}
	return n, nil
}

func (d *ctlDecoder) fixedArray(what string, n int) error {
	k, err := d.arrayLen(what, n)
	if err != nil {
		return err
	}
	if k != n {
		return badMsg("%s of %d fields, want %d", what, k, n)
	}
	return nil
}

func (d *ctlDecoder) uint(what string, max uint64) (uint64, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return 0, d.wrap(what, err)
	}
	var v uint64
	if c >= 0xe0 || (c >= 0xd0 && c <= 0xd3) { // negative fixint, int8..int64
		i, err := d.d.DecodeInt64()
		if err != nil {
			return 0, d.wrap(what, err)
		}
		if i < 0 {
			return 0, badMsg("%s %d is negative", what, i)
		}
		v = uint64(i)
	} else if c <= 0x7f || (c >= 0xcc && c <= 0xcf) { // positive fixint, uint8..uint64
		if v, err = d.d.DecodeUint64(); err != nil {
			return 0, d.wrap(what, err)
		}
	} else {
		return 0, badMsg("%s: msgpack code %#x is not an integer", what, c)
	}
	if v > max {
		return 0, badMsg("%s %d, limit %d", what, v, max)
	}
	return v, nil
}

func (d *ctlDecoder) uints(what string, dst ...*uint64) error {
	if err := d.fixedArray(what, len(dst)); err != nil {
		return err
	}
	for _, p := range dst {
		v, err := d.uint(what, 1<<64-1)
		if err != nil {
			return err
		}
		*p = v
	}
	return nil
}

// bytes reads a bin or str of at most max bytes; nil stays nil.
func (d *ctlDecoder) bytes(what string, max int) ([]byte, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return nil, d.wrap(what, err)
	}
	var n int
	switch {
	case c == 0xc0: // nil
		_, err = d.d.DecodeBytesLen()
		return nil, d.wrapNil(what, err)
	case c >= 0xc4 && c <= 0xc6: // bin8..32
		n, err = d.d.DecodeBytesLen()
	case (c >= 0xa0 && c <= 0xbf) || (c >= 0xd9 && c <= 0xdb): // str
		n, err = d.d.DecodeBytesLen()
	default:
		return nil, badMsg("%s: msgpack code %#x is not bytes", what, c)
	}
	if err != nil {
		return nil, d.wrap(what, err)
	}
	if n < 0 || n > max || n > d.r.Len() {
		return nil, badMsg("%s of %d bytes (limit %d, %d bytes left)", what, n, max, d.r.Len())
	}
	b := make([]byte, n)
	if err := d.d.ReadFull(b); err != nil {
		return nil, d.wrap(what, err)
	}
	return b, nil
}

func (d *ctlDecoder) wrapNil(what string, err error) error {
	if err != nil {
		return d.wrap(what, err)
	}
	return nil
}

func (m *Hello) decode(d *ctlDecoder) error {
	if err := d.fixedArray("Hello", 2); err != nil {
		return err
	}
	c, err := d.bytes("client name", MaxControlName)
	if err != nil {
		return err
	}
	m.Client = string(c)
	m.Token, err = d.bytes("token", MaxControlToken)
	return err
}

func (m *HelloReply) decode(d *ctlDecoder) error {
	if err := d.fixedArray("HelloReply", 2); err != nil {
		return err
	}
	s, err := d.bytes("server name", MaxControlName)
	if err != nil {
		return err
	}
	m.Server = string(s)
	m.Generation, err = d.uint("generation", 1<<64-1)
	return err
}

func (*GrantLease) decode(d *ctlDecoder) error { return d.fixedArray("GrantLease", 0) }
func (*Ack) decode(d *ctlDecoder) error        { return d.fixedArray("Ack", 0) }
func (*Stats) decode(d *ctlDecoder) error      { return d.fixedArray("Stats", 0) }

func (m *LeaseReply) decode(d *ctlDecoder) error {
	var arena, rkey, ttl uint64
	if err := d.uints("LeaseReply", &m.ID, &arena, &m.Addr, &m.Size, &rkey, &ttl, &m.VersionBase, &m.VersionCount); err != nil {
		return err
	}
	if arena >= MaxArenas || rkey > 1<<32-1 || ttl > 1<<63-1 {
		return badMsg("lease arena %d, rkey %#x, TTL %d out of range", arena, rkey, ttl)
	}
	m.Arena, m.RKey, m.TTL = uint16(arena), uint32(rkey), time.Duration(ttl)
	return nil
}

func (m *Commit) decode(d *ctlDecoder) error {
	return d.uints("Commit", &m.LeaseID, &m.Offset, &m.Length)
}

func (m *CommitReply) decode(d *ctlDecoder) error {
	var arena, length uint64
	if err := d.uints("CommitReply", &arena, &m.Offset, &length, &m.Version); err != nil {
		return err
	}
	if arena >= MaxArenas || length > 1<<32-1 {
		return badMsg("commit reply arena %d, length %d out of range", arena, length)
	}
	m.Arena, m.Length = uint16(arena), uint32(length)
	return nil
}

func (m *Delete) decode(d *ctlDecoder) error {
	if err := d.fixedArray("Delete", 1); err != nil {
		return err
	}
	var err error
	if m.Key, err = d.bytes("key", MaxKeyLen); err != nil {
		return err
	}
	if len(m.Key) == 0 {
		return badMsg("empty key")
	}
	return nil
}

func (m *Scan) decode(d *ctlDecoder) error {
	if err := d.fixedArray("Scan", 3); err != nil {
		return err
	}
	var err error
	if m.Start, err = d.bytes("scan start", MaxKeyLen); err != nil {
		return err
	}
	if m.End, err = d.bytes("scan end", MaxKeyLen); err != nil {
		return err
	}
	limit, err := d.uint("scan limit", 1<<32-1)
	m.Limit = uint32(limit)
	return err
}

func (m *ScanReply) decode(d *ctlDecoder) error {
	if err := d.fixedArray("ScanReply", 2); err != nil {
		return err
	}
	// An entry takes at least 7 bytes: array header, 1-byte key, 5 fixints.
	n, err := d.arrayLen("scan entries", MaxScanEntries)
	if err != nil {
		return err
	}
	if n > 0 {
		m.Entries = make([]ScanEntry, 0, min(n, d.r.Len()/7+1))
	}
	for range n {
		var en ScanEntry
		if err := d.fixedArray("scan entry", 5); err != nil {
			return err
		}
		if en.Key, err = d.bytes("scan entry key", MaxKeyLen); err != nil {
			return err
		}
		if len(en.Key) == 0 {
			return badMsg("scan entry with an empty key")
		}
		arena, err := d.uint("scan entry arena", MaxArenas-1)
		if err != nil {
			return err
		}
		if en.Offset, err = d.uint("scan entry offset", 1<<64-1); err != nil {
			return err
		}
		length, err := d.uint("scan entry length", 1<<32-1)
		if err != nil {
			return err
		}
		if en.Version, err = d.uint("scan entry version", 1<<64-1); err != nil {
			return err
		}
		en.Arena, en.Length = uint16(arena), uint32(length)
		m.Entries = append(m.Entries, en)
	}
	if m.More, err = d.d.DecodeBool(); err != nil {
		return d.wrap("scan more", err)
	}
	return nil
}

func (m *EndLease) decode(d *ctlDecoder) error { return d.uints("EndLease", &m.ID) }

func (m *StatsReply) decode(d *ctlDecoder) error {
	return d.uints("StatsReply", &m.Generation, &m.Keys, &m.Commits, &m.Deletes, &m.LeasesActive, &m.Connections, &m.Handled)
}

func (m *Error) decode(d *ctlDecoder) error {
	if err := d.fixedArray("Error", 2); err != nil {
		return err
	}
	c, err := d.uint("error code", uint64(codeEnd-1))
	if err != nil {
		return err
	}
	if c == 0 {
		return badMsg("error code 0")
	}
	m.Code = ErrorCode(c)
	s, err := d.bytes("error message", MaxControlMessage)
	m.Message = string(s)
	return err
}
