// Frame codec of the data connections: fixed-size headers encoded and decoded by pure functions.

package soft

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/rkv-io/rkv/rdma"
)

// MaxMessageSize is the largest message one work request may move, the
// soft device's max_msg_sz. Longer requests are refused at post time with
// rdma.ErrInvalidWR, and frames announcing more are malformed.
const MaxMessageSize = 1 << 30

// Sizes of the fixed frames and headers.
const (
	helloSize          = 24
	helloAckSize       = 8
	requestHeaderSize  = 48
	responseHeaderSize = 20
)

const (
	wireVersion = 1
	// maxRNRBudget caps the RNR wait a hello may ask the responder for.
	maxRNRBudget = time.Minute
)

var (
	helloMagic    = [4]byte{'R', 'K', 'V', 'S'}
	helloAckMagic = [4]byte{'R', 'K', 'V', 'A'}
)

// Request opcodes on the wire. They are the wire format's own numbers, not
// rdma.Opcode values, so the API may renumber without breaking the wire.
const (
	wireWrite uint8 = iota + 1
	wireWriteImm
	wireSend
	wireSendImm
	wireRead
	wireCompareSwap
	wireFetchAdd
	wireOpEnd
)

// Response kinds on the wire.
const (
	respAck      uint8 = iota + 1 // WRITE, WRITE_WITH_IMM, SEND executed
	respNAK                       // request refused; status says why
	respReadData                  // READ executed; length bytes of data follow
	respAtomic                    // atomic executed; value is the original memory contents
	respKindEnd
)

// Hello acknowledgement codes.
const (
	ackOK        uint8 = iota // the connection now feeds the QP's responder
	ackNoQP                   // no QP with that number on the device
	ackNotReady               // the QP is not in RTR or RTS
	ackWrongPeer              // the QP is connected to another QP, or the PSN differs
	ackBusy                   // the QP's responder already has a connection
	ackCodeEnd
)

var ackReasons = [...]string{
	ackOK: "ok", ackNoQP: "no such QP", ackNotReady: "QP not in RTR or RTS",
	ackWrongPeer: "QP connected to another peer", ackBusy: "QP responder already connected",
}

// hello opens a data connection: the requester of QP srcQPN introduces
// itself to the responder of QP dstQPN.
type hello struct {
	dstQPN, srcQPN uint32
	psn            uint32        // the requester's initial sequence number
	rnrBudget      time.Duration // how long the responder may wait for a RECV (whole ms)
}

// request is the header of a request frame.
type request struct {
	op         uint8
	seq        uint32
	rkey       uint32
	addr       uint64
	length     uint32 // bytes written, sent, read; 8 for atomics
	imm        uint32
	compareAdd uint64
	swap       uint64
}

// response is the header of a response frame.
type response struct {
	kind   uint8
	status rdma.Status // respNAK only
	seq    uint32
	length uint32 // respReadData: bytes of data that follow
	value  uint64 // respAtomic: the original value
}

var errFrameSize = errors.New("wrong header size")

func encodeHello(b []byte, h hello) {
	_ = b[helloSize-1]
	copy(b[0:4], helloMagic[:])
	b[4], b[5], b[6], b[7] = wireVersion, 0, 0, 0
	binary.BigEndian.PutUint32(b[8:], h.dstQPN)
	binary.BigEndian.PutUint32(b[12:], h.srcQPN)
	binary.BigEndian.PutUint32(b[16:], h.psn)
	binary.BigEndian.PutUint32(b[20:], uint32(h.rnrBudget/time.Millisecond))
}

func decodeHello(b []byte) (hello, error) {
	if len(b) != helloSize {
		return hello{}, errFrameSize
	}
	if [4]byte(b[0:4]) != helloMagic {
		return hello{}, fmt.Errorf("not an rkv soft data connection (magic %q)", b[0:4])
	}
	if b[4] != wireVersion {
		return hello{}, fmt.Errorf("wire version %d, this side speaks %d", b[4], wireVersion)
	}
	if b[5]|b[6]|b[7] != 0 {
		return hello{}, errors.New("hello: reserved bytes set")
	}
	h := hello{
		dstQPN:    binary.BigEndian.Uint32(b[8:]),
		srcQPN:    binary.BigEndian.Uint32(b[12:]),
		psn:       binary.BigEndian.Uint32(b[16:]),
		rnrBudget: time.Duration(binary.BigEndian.Uint32(b[20:])) * time.Millisecond,
	}
	if h.rnrBudget > maxRNRBudget {
		return hello{}, fmt.Errorf("hello: RNR budget %v above %v", h.rnrBudget, maxRNRBudget)
	}
	return h, nil
}

func encodeHelloAck(b []byte, code uint8) {
	_ = b[helloAckSize-1]
	copy(b[0:4], helloAckMagic[:])
	b[4], b[5], b[6], b[7] = code, 0, 0, 0
}

func decodeHelloAck(b []byte) (uint8, error) {
	if len(b) != helloAckSize {
		return 0, errFrameSize
	}
	if [4]byte(b[0:4]) != helloAckMagic {
		return 0, fmt.Errorf("peer answered the hello with %q", b[0:4])
	}
	if b[5]|b[6]|b[7] != 0 || b[4] >= ackCodeEnd {
		return 0, fmt.Errorf("malformed hello acknowledgement % x", b)
	}
	return b[4], nil
}

// hasPayload reports whether a request of this opcode carries data.
func hasPayload(op uint8) bool { return op >= wireWrite && op <= wireSendImm }

func isAtomic(op uint8) bool { return op == wireCompareSwap || op == wireFetchAdd }

// encodeRequest writes r's header; the payload length is r.length for
// opcodes that carry data and zero otherwise.
func encodeRequest(b []byte, r *request) {
	_ = b[requestHeaderSize-1]
	var payload uint32
	if hasPayload(r.op) {
		payload = r.length
	}
	binary.BigEndian.PutUint32(b[0:], payload)
	b[4], b[5], b[6], b[7] = r.op, 0, 0, 0
	binary.BigEndian.PutUint32(b[8:], r.seq)
	binary.BigEndian.PutUint32(b[12:], r.rkey)
	binary.BigEndian.PutUint64(b[16:], r.addr)
	binary.BigEndian.PutUint32(b[24:], r.length)
	binary.BigEndian.PutUint32(b[28:], r.imm)
	binary.BigEndian.PutUint64(b[32:], r.compareAdd)
	binary.BigEndian.PutUint64(b[40:], r.swap)
}

// decodeRequest parses and validates a request header. Every field an
// opcode does not use must be zero, so a decoded header re-encodes to the
// same bytes.
func decodeRequest(b []byte) (request, error) {
	if len(b) != requestHeaderSize {
		return request{}, errFrameSize
	}
	payload := binary.BigEndian.Uint32(b[0:])
	r := request{
		op:         b[4],
		seq:        binary.BigEndian.Uint32(b[8:]),
		rkey:       binary.BigEndian.Uint32(b[12:]),
		addr:       binary.BigEndian.Uint64(b[16:]),
		length:     binary.BigEndian.Uint32(b[24:]),
		imm:        binary.BigEndian.Uint32(b[28:]),
		compareAdd: binary.BigEndian.Uint64(b[32:]),
		swap:       binary.BigEndian.Uint64(b[40:]),
	}
	if r.op == 0 || r.op >= wireOpEnd {
		return request{}, fmt.Errorf("unknown request opcode %d", r.op)
	}
	if b[5]|b[6]|b[7] != 0 {
		return request{}, fmt.Errorf("request opcode %d: reserved bytes set", r.op)
	}
	switch {
	case hasPayload(r.op) && payload != r.length:
		return request{}, fmt.Errorf("request opcode %d: payload length %d differs from message length %d", r.op, payload, r.length)
	case !hasPayload(r.op) && payload != 0:
		return request{}, fmt.Errorf("request opcode %d carries a %d-byte payload", r.op, payload)
	case r.length > MaxMessageSize:
		return request{}, fmt.Errorf("request opcode %d: length %d above the %d-byte maximum", r.op, r.length, MaxMessageSize)
	case isAtomic(r.op) && r.length != 8:
		return request{}, fmt.Errorf("atomic request of length %d", r.length)
	case r.imm != 0 && r.op != wireWriteImm && r.op != wireSendImm:
		return request{}, fmt.Errorf("request opcode %d carries immediate data", r.op)
	case !isAtomic(r.op) && r.compareAdd != 0, r.op != wireCompareSwap && r.swap != 0:
		return request{}, fmt.Errorf("request opcode %d carries atomic operands", r.op)
	case (r.op == wireSend || r.op == wireSendImm) && (r.rkey != 0 || r.addr != 0):
		return request{}, fmt.Errorf("SEND request names remote memory")
	}
	return r, nil
}

func encodeResponse(b []byte, r *response) {
	_ = b[responseHeaderSize-1]
	binary.BigEndian.PutUint32(b[0:], r.length)
	b[4], b[5], b[6], b[7] = r.kind, uint8(r.status), 0, 0
	binary.BigEndian.PutUint32(b[8:], r.seq)
	binary.BigEndian.PutUint64(b[12:], r.value)
}

// nakStatuses are the statuses a NAK may carry.
var nakStatuses = [...]bool{
	rdma.StatusRemAccessErr: true, rdma.StatusRemInvReqErr: true,
	rdma.StatusRemOpErr: true, rdma.StatusRNRRetryExcErr: true,
}

// decodeResponse parses and validates a response header.
func decodeResponse(b []byte) (response, error) {
	if len(b) != responseHeaderSize {
		return response{}, errFrameSize
	}
	r := response{
		length: binary.BigEndian.Uint32(b[0:]),
		kind:   b[4],
		status: rdma.Status(b[5]),
		seq:    binary.BigEndian.Uint32(b[8:]),
		value:  binary.BigEndian.Uint64(b[12:]),
	}
	switch {
	case r.kind == 0 || r.kind >= respKindEnd:
		return response{}, fmt.Errorf("unknown response kind %d", r.kind)
	case b[6]|b[7] != 0:
		return response{}, fmt.Errorf("response kind %d: reserved bytes set", r.kind)
	case r.kind == respNAK && (int(r.status) >= len(nakStatuses) || !nakStatuses[r.status]):
		return response{}, fmt.Errorf("NAK with status %v", r.status)
	case r.kind != respNAK && r.status != 0:
		return response{}, fmt.Errorf("response kind %d carries status %v", r.kind, r.status)
	case r.kind != respReadData && r.length != 0:
		return response{}, fmt.Errorf("response kind %d carries a %d-byte payload", r.kind, r.length)
	case r.length > MaxMessageSize:
		return response{}, fmt.Errorf("READ response of %d bytes above the %d-byte maximum", r.length, MaxMessageSize)
	case r.kind != respAtomic && r.value != 0:
		return response{}, fmt.Errorf("response kind %d carries an atomic value", r.kind)
	}
	return r, nil
}
