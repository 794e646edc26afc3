// Frame codec of the links: fixed-size headers encoded and decoded by pure functions.

package soft

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rkv-io/rkv/rdma"
)

// MaxMessageSize is the largest message one work request may move, the
// soft device's max_msg_sz. Longer requests are refused at post time with
// rdma.ErrInvalidWR, and frames announcing more are malformed.
const MaxMessageSize = 1 << 30

// Sizes of the hello and of the fixed headers of each direction. Every
// frame of a direction starts with a header of that direction's size, data
// and control frames alike, so a reader always knows how much to read.
const (
	helloSize          = 8
	requestHeaderSize  = 52
	responseHeaderSize = 24
)

// wireVersion is the version in the hello. Version 1 carried one QP per
// connection; version 2 carries every QP between two devices on one link;
// version 3 lets a request's ACK wait (flagAckMayWait).
const wireVersion = 3

// maxQPN bounds QP numbers on the wire: they are 24 bits, as in verbs.
const maxQPN = 1<<24 - 1

var helloMagic = [4]byte{'R', 'K', 'V', 'S'}

// Frames from the requesting device, each opening with a request header.
// The numbers are the wire format's own, not rdma.Opcode values, so the API
// may renumber without breaking the wire.
const (
	wireWrite uint8 = iota + 1
	wireWriteImm
	wireSend
	wireSendImm
	wireRead
	wireCompareSwap
	wireFetchAdd
	wireAttach // control: a requester QP introduces itself to a responder QP
	wireDetach // control: the requester QP leaves; nothing follows for it
	wireOpEnd
)

// Frames from the responding device, each opening with a response header.
const (
	respAck       uint8 = iota + 1 // WRITE, WRITE_WITH_IMM, SEND executed
	respNAK                        // request refused; status says why
	respReadData                   // READ executed; length bytes of data follow
	respAtomic                     // atomic executed; value is the original memory contents
	respAttachAck                  // control: the answer to an attach
	respGone                       // control: the responder QP left RTS; later requests go unanswered
	respKindEnd
)

// Attach acknowledgement codes.
const (
	ackOK        uint8 = iota // the responder QP now serves the requester
	ackNoQP                   // no QP with that number on the device
	ackNotReady               // the QP is not in RTR or RTS
	ackWrongPeer              // the QP is connected to another QP, or the PSN differs
	ackBusy                   // the QP already serves a requester
	ackCodeEnd
)

var ackReasons = [...]string{
	ackOK: "ok", ackNoQP: "no such QP", ackNotReady: "QP not in RTR or RTS",
	ackWrongPeer: "QP connected to another peer", ackBusy: "QP already serves a requester",
}

// Request flags, the byte after the opcode.
const (
	// flagAckMayWait: nobody waits for this WRITE's or SEND's ACK (its
	// work request is unsignaled), so the responder may hold the ACK back
	// and send it with its next answers on the link, or after ackDelay.
	flagAckMayWait uint8 = 1 << 0
)

// request is the header of a data request.
type request struct {
	op         uint8
	ackMayWait bool   // flagAckMayWait; WRITE, WRITE_WITH_IMM, SEND, SEND_WITH_IMM only
	dst        uint32 // the responder's QP
	seq        uint32
	rkey       uint32
	addr       uint64
	length     uint32 // bytes written, sent, read; 8 for atomics
	imm        uint32
	compareAdd uint64
	swap       uint64
}

// attach introduces the requester QP src to the responder QP dst.
type attach struct {
	dst, src uint32
	psn      uint32 // the requester's first sequence number
}

// qpEnds names the QPs of a detach (dst the responder, src the requester)
// or of an attach acknowledgement and a gone (dst the requester, src the
// responder): each frame names its destination first.
type qpEnds struct{ dst, src uint32 }

// attachAck answers an attach.
type attachAck struct {
	qpEnds
	code uint8
}

// response is the header of a data response.
type response struct {
	kind   uint8
	status rdma.Status // respNAK only
	dst    uint32      // the requester's QP
	seq    uint32
	length uint32 // respReadData: bytes of data that follow
	value  uint64 // respAtomic: the original value
}

var errFrameSize = errors.New("wrong header size")

func validQPN(n uint32) bool { return n != 0 && n <= maxQPN }

func encodeHello(b []byte) {
	_ = b[helloSize-1]
	copy(b[0:4], helloMagic[:])
	b[4], b[5], b[6], b[7] = wireVersion, 0, 0, 0
}

// decodeHello checks the hello that opens a link.
func decodeHello(b []byte) error {
	if len(b) != helloSize {
		return errFrameSize
	}
	if [4]byte(b[0:4]) != helloMagic {
		return fmt.Errorf("not an rkv soft link (magic %q)", b[0:4])
	}
	if b[4] != wireVersion {
		return fmt.Errorf("wire version %d, this side speaks %d", b[4], wireVersion)
	}
	if b[5]|b[6]|b[7] != 0 {
		return errors.New("hello: reserved bytes set")
	}
	return nil
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
	var flags uint8
	if r.ackMayWait {
		flags = flagAckMayWait
	}
	binary.BigEndian.PutUint32(b[0:], payload)
	b[4], b[5], b[6], b[7] = r.op, flags, 0, 0
	binary.BigEndian.PutUint32(b[8:], r.dst)
	binary.BigEndian.PutUint32(b[12:], r.seq)
	binary.BigEndian.PutUint32(b[16:], r.rkey)
	binary.BigEndian.PutUint64(b[20:], r.addr)
	binary.BigEndian.PutUint32(b[28:], r.length)
	binary.BigEndian.PutUint32(b[32:], r.imm)
	binary.BigEndian.PutUint64(b[36:], r.compareAdd)
	binary.BigEndian.PutUint64(b[44:], r.swap)
}

// decodeRequest parses and validates the header of a data request. Every
// field an opcode does not use must be zero, so a decoded header
// re-encodes to the same bytes.
func decodeRequest(b []byte) (request, error) {
	if len(b) != requestHeaderSize {
		return request{}, errFrameSize
	}
	payload := binary.BigEndian.Uint32(b[0:])
	r := request{
		op:         b[4],
		ackMayWait: b[5] == flagAckMayWait,
		dst:        binary.BigEndian.Uint32(b[8:]),
		seq:        binary.BigEndian.Uint32(b[12:]),
		rkey:       binary.BigEndian.Uint32(b[16:]),
		addr:       binary.BigEndian.Uint64(b[20:]),
		length:     binary.BigEndian.Uint32(b[28:]),
		imm:        binary.BigEndian.Uint32(b[32:]),
		compareAdd: binary.BigEndian.Uint64(b[36:]),
		swap:       binary.BigEndian.Uint64(b[44:]),
	}
	if r.op == 0 || r.op > wireFetchAdd {
		return request{}, fmt.Errorf("unknown request opcode %d", r.op)
	}
	switch {
	case b[5]&^flagAckMayWait != 0 || b[6]|b[7] != 0:
		return request{}, fmt.Errorf("request opcode %d: reserved bytes set", r.op)
	case r.ackMayWait && !hasPayload(r.op):
		return request{}, fmt.Errorf("request opcode %d lets its ACK wait, which only WRITEs and SENDs may", r.op)
	case !validQPN(r.dst):
		return request{}, fmt.Errorf("request opcode %d for QP %d", r.op, r.dst)
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

// Control frames are a header of their direction: a zero payload length,
// the kind, a byte that only an attach acknowledgement uses (its code), two
// zero bytes, the destination and source QPs, a PSN in an attach, and
// zeros to the header's end.

func encodeControl(b []byte, kind, code uint8, dst, src, psn uint32) {
	clear(b)
	b[4], b[5] = kind, code
	binary.BigEndian.PutUint32(b[8:], dst)
	binary.BigEndian.PutUint32(b[12:], src)
	binary.BigEndian.PutUint32(b[16:], psn)
}

// decodeControl checks the layout shared by control frames of size size
// and returns the code byte, the QPs and the PSN; hasCode and hasPSN say
// whether that kind uses the code byte and the PSN.
func decodeControl(b []byte, size int, hasCode, hasPSN bool) (code uint8, p qpEnds, psn uint32, err error) {
	if len(b) != size {
		return 0, qpEnds{}, 0, errFrameSize
	}
	kind := b[4]
	p = qpEnds{dst: binary.BigEndian.Uint32(b[8:]), src: binary.BigEndian.Uint32(b[12:])}
	psn = binary.BigEndian.Uint32(b[16:])
	var rest byte
	for _, c := range b[20:] {
		rest |= c
	}
	switch {
	case binary.BigEndian.Uint32(b[0:]) != 0:
		return 0, qpEnds{}, 0, fmt.Errorf("control frame %d carries a payload", kind)
	case b[6]|b[7] != 0 || !hasCode && b[5] != 0 || !hasPSN && psn != 0 || rest != 0:
		return 0, qpEnds{}, 0, fmt.Errorf("control frame %d: reserved bytes set", kind)
	case !validQPN(p.dst) || !validQPN(p.src):
		return 0, qpEnds{}, 0, fmt.Errorf("control frame %d between QPs %d and %d", kind, p.dst, p.src)
	}
	return b[5], p, psn, nil
}

func encodeAttach(b []byte, a attach) {
	encodeControl(b[:requestHeaderSize], wireAttach, 0, a.dst, a.src, a.psn)
}

func decodeAttach(b []byte) (attach, error) {
	if len(b) == requestHeaderSize && b[4] != wireAttach {
		return attach{}, fmt.Errorf("frame %d is not an attach", b[4])
	}
	_, p, psn, err := decodeControl(b, requestHeaderSize, false, true)
	if err != nil {
		return attach{}, err
	}
	return attach{dst: p.dst, src: p.src, psn: psn}, nil
}

func encodeDetach(b []byte, p qpEnds) {
	encodeControl(b[:requestHeaderSize], wireDetach, 0, p.dst, p.src, 0)
}

func decodeDetach(b []byte) (qpEnds, error) {
	if len(b) == requestHeaderSize && b[4] != wireDetach {
		return qpEnds{}, fmt.Errorf("frame %d is not a detach", b[4])
	}
	_, p, _, err := decodeControl(b, requestHeaderSize, false, false)
	return p, err
}

func encodeAttachAck(b []byte, a attachAck) {
	encodeControl(b[:responseHeaderSize], respAttachAck, a.code, a.dst, a.src, 0)
}

func decodeAttachAck(b []byte) (attachAck, error) {
	if len(b) == responseHeaderSize && b[4] != respAttachAck {
		return attachAck{}, fmt.Errorf("frame %d is not an attach acknowledgement", b[4])
	}
	code, p, _, err := decodeControl(b, responseHeaderSize, true, false)
	if err != nil {
		return attachAck{}, err
	}
	if code >= ackCodeEnd {
		return attachAck{}, fmt.Errorf("attach acknowledgement with code %d", code)
	}
	return attachAck{qpEnds: p, code: code}, nil
}

func encodeGone(b []byte, p qpEnds) {
	encodeControl(b[:responseHeaderSize], respGone, 0, p.dst, p.src, 0)
}

func decodeGone(b []byte) (qpEnds, error) {
	if len(b) == responseHeaderSize && b[4] != respGone {
		return qpEnds{}, fmt.Errorf("frame %d is not a gone", b[4])
	}
	_, p, _, err := decodeControl(b, responseHeaderSize, false, false)
	return p, err
}

func encodeResponse(b []byte, r *response) {
	_ = b[responseHeaderSize-1]
	binary.BigEndian.PutUint32(b[0:], r.length)
	b[4], b[5], b[6], b[7] = r.kind, uint8(r.status), 0, 0
	binary.BigEndian.PutUint32(b[8:], r.dst)
	binary.BigEndian.PutUint32(b[12:], r.seq)
	binary.BigEndian.PutUint64(b[16:], r.value)
}

// nakStatuses are the statuses a NAK may carry. RNR_RETRY_EXC_ERR on the
// wire is the RNR NAK: no RECV was posted, the requester may retry.
var nakStatuses = [...]bool{
	rdma.StatusRemAccessErr: true, rdma.StatusRemInvReqErr: true,
	rdma.StatusRemOpErr: true, rdma.StatusRNRRetryExcErr: true,
}

// decodeResponse parses and validates the header of a data response.
func decodeResponse(b []byte) (response, error) {
	if len(b) != responseHeaderSize {
		return response{}, errFrameSize
	}
	r := response{
		length: binary.BigEndian.Uint32(b[0:]),
		kind:   b[4],
		status: rdma.Status(b[5]),
		dst:    binary.BigEndian.Uint32(b[8:]),
		seq:    binary.BigEndian.Uint32(b[12:]),
		value:  binary.BigEndian.Uint64(b[16:]),
	}
	switch {
	case r.kind == 0 || r.kind > respAtomic:
		return response{}, fmt.Errorf("unknown response kind %d", r.kind)
	case b[6]|b[7] != 0:
		return response{}, fmt.Errorf("response kind %d: reserved bytes set", r.kind)
	case !validQPN(r.dst):
		return response{}, fmt.Errorf("response kind %d for QP %d", r.kind, r.dst)
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
