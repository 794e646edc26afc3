// Value types of the API: access flags, opcodes, statuses, work requests, completions.

package rdma

import (
	"fmt"
	"strings"
	"time"
)

// Access is a set of MR access flags. The values are those of
// ibv_access_flags.
type Access uint32

// Access flags. Local read access is always granted.
const (
	AccessLocalWrite   Access = 1 << 0 // the local NIC may write the MR (RECV and READ targets)
	AccessRemoteWrite  Access = 1 << 1 // remote RDMA_WRITE into the MR
	AccessRemoteRead   Access = 1 << 2 // remote RDMA_READ from the MR
	AccessRemoteAtomic Access = 1 << 3 // remote CMP_AND_SWP and FETCH_AND_ADD on the MR
)

const accessAll = AccessLocalWrite | AccessRemoteWrite | AccessRemoteRead | AccessRemoteAtomic

// Validate reports whether a is a combination a verbs device accepts:
// known bits only, and remote write or atomic access only together with
// local write (ibv_reg_mr fails with EINVAL otherwise).
func (a Access) Validate() error {
	if a&^accessAll != 0 {
		return fmt.Errorf("rdma: unknown access flags %#x", uint32(a&^accessAll))
	}
	if a&(AccessRemoteWrite|AccessRemoteAtomic) != 0 && a&AccessLocalWrite == 0 {
		return fmt.Errorf("rdma: access %v: remote write and remote atomic need LOCAL_WRITE", a)
	}
	return nil
}

func (a Access) String() string {
	if a == 0 {
		return "LOCAL_READ"
	}
	var parts []string
	for _, f := range []struct {
		bit  Access
		name string
	}{{AccessLocalWrite, "LOCAL_WRITE"}, {AccessRemoteWrite, "REMOTE_WRITE"}, {AccessRemoteRead, "REMOTE_READ"}, {AccessRemoteAtomic, "REMOTE_ATOMIC"}} {
		if a&f.bit != 0 {
			parts = append(parts, f.name)
		}
	}
	if rest := a &^ accessAll; rest != 0 {
		parts = append(parts, fmt.Sprintf("%#x", uint32(rest)))
	}
	return strings.Join(parts, "|")
}

// Opcode names a work request's operation, or, in a Completion, the
// operation that completed. Completions use the ibv_wc_opcode set: a
// SEND_WITH_IMM completes as OpSend and an RDMA_WRITE_WITH_IMM as OpWrite
// on the requester; the responder's RECV completes as OpRecv or OpRecvImm.
type Opcode uint8

// Work request opcodes (SendWR.Op) and completion opcodes (Completion.Op).
const (
	OpWrite       Opcode = iota + 1 // RDMA_WRITE
	OpWriteImm                      // RDMA_WRITE_WITH_IMM: consumes a RECV at the responder
	OpSend                          // SEND: consumes a RECV at the responder
	OpSendImm                       // SEND_WITH_IMM
	OpRead                          // RDMA_READ
	OpCompareSwap                   // ATOMIC_CMP_AND_SWP on 8 aligned bytes
	OpFetchAdd                      // ATOMIC_FETCH_AND_ADD on 8 aligned bytes
	OpRecv                          // completion of a RECV consumed by SEND
	OpRecvImm                       // completion of a RECV consumed by RDMA_WRITE_WITH_IMM
)

var opcodeNames = [...]string{
	OpWrite: "RDMA_WRITE", OpWriteImm: "RDMA_WRITE_WITH_IMM", OpSend: "SEND", OpSendImm: "SEND_WITH_IMM",
	OpRead: "RDMA_READ", OpCompareSwap: "ATOMIC_CMP_AND_SWP", OpFetchAdd: "ATOMIC_FETCH_AND_ADD",
	OpRecv: "RECV", OpRecvImm: "RECV_RDMA_WITH_IMM",
}

func (o Opcode) String() string {
	if int(o) < len(opcodeNames) && opcodeNames[o] != "" {
		return opcodeNames[o]
	}
	return fmt.Sprintf("Opcode(%d)", uint8(o))
}

// IsAtomic reports whether o is one of the 8-byte atomic operations.
func (o Opcode) IsAtomic() bool { return o == OpCompareSwap || o == OpFetchAdd }

// Status is a completion status. The values are those of ibv_wc_status, so
// the verbs provider passes them through unchanged.
type Status uint8

// Completion statuses.
const (
	StatusSuccess        Status = 0  // SUCCESS
	StatusLocLenErr      Status = 1  // LOC_LEN_ERR: a local SGE list too short for the data
	StatusLocQPOpErr     Status = 2  // LOC_QP_OP_ERR
	StatusLocEECOpErr    Status = 3  // LOC_EEC_OP_ERR
	StatusLocProtErr     Status = 4  // LOC_PROT_ERR: a local SGE outside its MR, wrong PD or access
	StatusWRFlushErr     Status = 5  // WR_FLUSH_ERR: flushed because the QP is in ERR
	StatusMWBindErr      Status = 6  // MW_BIND_ERR
	StatusBadRespErr     Status = 7  // BAD_RESP_ERR: unexpected response from the responder
	StatusLocAccessErr   Status = 8  // LOC_ACCESS_ERR
	StatusRemInvReqErr   Status = 9  // REM_INV_REQ_ERR: the responder rejected a malformed or misaligned request
	StatusRemAccessErr   Status = 10 // REM_ACCESS_ERR: wrong rkey, out of bounds, or missing access flag
	StatusRemOpErr       Status = 11 // REM_OP_ERR: the responder could not complete the operation
	StatusRetryExcErr    Status = 12 // RETRY_EXC_ERR: the peer did not answer within the retry budget
	StatusRNRRetryExcErr Status = 13 // RNR_RETRY_EXC_ERR: no RECV was posted at the responder
	StatusLocRDDViolErr  Status = 14 // LOC_RDD_VIOL_ERR
	StatusRemInvRdReqErr Status = 15 // REM_INV_RD_REQ_ERR
	StatusRemAbortErr    Status = 16 // REM_ABORT_ERR
	StatusInvEECNErr     Status = 17 // INV_EECN_ERR
	StatusInvEECStateErr Status = 18 // INV_EEC_STATE_ERR
	StatusFatalErr       Status = 19 // FATAL_ERR
	StatusRespTimeoutErr Status = 20 // RESP_TIMEOUT_ERR
	StatusGeneralErr     Status = 21 // GENERAL_ERR
)

var statusNames = [...]string{
	"SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR", "WR_FLUSH_ERR",
	"MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR", "REM_INV_REQ_ERR", "REM_ACCESS_ERR", "REM_OP_ERR",
	"RETRY_EXC_ERR", "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR", "REM_ABORT_ERR",
	"INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR", "GENERAL_ERR",
}

func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

// Completion is one work completion, as polled from a CQ.
type Completion struct {
	ID      uint64 // the work request's ID
	Status  Status
	Op      Opcode // valid only when Status is StatusSuccess, as in verbs
	ByteLen uint32 // bytes received (RECV) or transferred (READ, atomics: 8)
	Imm     uint32 // immediate data, when HasImm
	HasImm  bool
	QPNum   uint32 // the local QP the request was posted on
}

// Err returns nil for a successful completion and a *CompletionError
// otherwise.
func (c *Completion) Err() error {
	if c.Status == StatusSuccess {
		return nil
	}
	return &CompletionError{ID: c.ID, Status: c.Status, QPNum: c.QPNum}
}

// SGE is one element of a scatter/gather list: Length bytes at Offset in
// MR. A negative Offset or Length makes the request malformed
// (ErrInvalidWR at post). An SGE the QP cannot reach — an MR of another
// PD or provider, a deregistered MR, bytes past the MR's end, or an MR
// without LOCAL_WRITE where the NIC writes (a READ target, an atomic's
// result, a RECV buffer) — is posted, and its request completes with
// LOC_PROT_ERR in its turn and moves the QP to ERR, as on a NIC. See QP
// for who owns the bytes an SGE names.
type SGE struct {
	MR     MR
	Offset int
	Length int
}

// SendFlags modify a send-queue work request.
type SendFlags uint8

const (
	// Signaled asks for a completion on success. Without it (and without
	// QPConfig.SignalAll) a successful request completes silently; a
	// failed one always produces a completion.
	Signaled SendFlags = 1 << 0
	// Fence makes the request wait until earlier READs and atomics on the
	// QP have completed, so that it may use their results as its source.
	Fence SendFlags = 1 << 1
)

// SendWR is a send-queue work request. PostSend copies it: the value and
// its SGL may be reused once PostSend returns.
type SendWR struct {
	ID    uint64
	Op    Opcode // OpWrite, OpWriteImm, OpSend, OpSendImm, OpRead, OpCompareSwap, OpFetchAdd
	Flags SendFlags
	// SGL is the local side: the source of a WRITE or SEND, the target of a
	// READ, the 8-byte result buffer of an atomic.
	SGL []SGE
	// RemoteAddr and RKey name the remote memory of a READ, WRITE or atomic.
	RemoteAddr uint64
	RKey       uint32
	Imm        uint32 // for OpWriteImm and OpSendImm
	// CompareAdd is the compare value of OpCompareSwap and the addend of
	// OpFetchAdd; Swap is the value OpCompareSwap stores on a match.
	CompareAdd uint64
	Swap       uint64
}

// RecvWR is a receive-queue work request: the buffers an incoming SEND is
// scattered into. A WRITE_WITH_IMM consumes one too, without touching its
// buffers. PostRecv copies it.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// QPState is a queue pair state of the RC state machine.
type QPState uint8

// QP states.
const (
	QPStateReset QPState = iota
	QPStateInit
	QPStateRTR // ready to receive
	QPStateRTS // ready to send
	QPStateError
)

func (s QPState) String() string {
	switch s {
	case QPStateReset:
		return "RESET"
	case QPStateInit:
		return "INIT"
	case QPStateRTR:
		return "RTR"
	case QPStateRTS:
		return "RTS"
	case QPStateError:
		return "ERR"
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// QPInfo is what a peer needs to connect to a QP: what perftest and most
// verbs programs exchange out of band. Each provider fills the fields it
// uses.
type QPInfo struct {
	Provider string   // provider name; both ends must match
	QPNum    uint32   // queue pair number
	PSN      uint32   // initial packet sequence number
	LID      uint16   // InfiniBand local identifier (0 on RoCE)
	GID      [16]byte // port GID (RoCE, or IB across subnets)
	MTU      int      // path MTU in bytes
	Addr     string   // soft: the device's data endpoint (host:port)
}

// QPConfig configures a new RC queue pair. Zero fields take the defaults
// documented on each.
type QPConfig struct {
	SendCQ CQ // required: completions of send-queue requests
	RecvCQ CQ // required: completions of RECVs; may be the same CQ as SendCQ

	MaxSendWR int // outstanding send-queue requests; default 128
	MaxRecvWR int // outstanding receive-queue requests; default 128
	MaxSGE    int // SGEs per request; default 4

	// SignalAll makes every successful send-queue request produce a
	// completion, as if each carried Signaled (verbs' sq_sig_all).
	SignalAll bool

	// AckTimeout is how long a request may wait for the responder before
	// it is retried; RetryCount is how many retries precede
	// RETRY_EXC_ERR. A dead peer is therefore reported within about
	// AckTimeout*(RetryCount+1). Defaults: 500ms and 3. (verbs rounds
	// AckTimeout up to 4.096µs*2^n.)
	AckTimeout time.Duration
	RetryCount int

	// Lane (soft) keeps QPs to one peer device together when the device
	// has several links to it (Options.Links): the QPs of one lane above
	// 0 ride one link, lane k the link k-1 (modulo the links), so that
	// their requests leave in the same writes and reach the peer in the
	// same reads; lane 0, the default, spreads QPs over the links by
	// number. verbs ignores it. Must not be negative.
	Lane int
}

// Defaults applied by WithDefaults.
const (
	DefaultMaxWR      = 128
	DefaultMaxSGE     = 4
	DefaultAckTimeout = 500 * time.Millisecond
	DefaultRetryCount = 3
)

// WithDefaults returns c with zero fields set to their defaults, or an
// error naming the first invalid field.
func (c QPConfig) WithDefaults() (QPConfig, error) {
	if c.SendCQ == nil || c.RecvCQ == nil {
		return c, fmt.Errorf("rdma: QPConfig needs SendCQ and RecvCQ")
	}
	if c.MaxSendWR == 0 {
		c.MaxSendWR = DefaultMaxWR
	}
	if c.MaxRecvWR == 0 {
		c.MaxRecvWR = DefaultMaxWR
	}
	if c.MaxSGE == 0 {
		c.MaxSGE = DefaultMaxSGE
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = DefaultAckTimeout
	}
	if c.RetryCount == 0 {
		c.RetryCount = DefaultRetryCount
	}
	if c.MaxSendWR < 0 || c.MaxRecvWR < 0 || c.MaxSGE < 0 || c.AckTimeout < 0 || c.RetryCount < 0 || c.Lane < 0 {
		return c, fmt.Errorf("rdma: QPConfig has a negative limit or lane: %+v", c)
	}
	return c, nil
}
