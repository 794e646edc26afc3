// The operation history a chaos run records: what each client asked, when, and what it saw.

package chaos

import (
	"fmt"
	"sync"
	"time"
)

// Kind is an operation's type.
type Kind uint8

// Kinds.
const (
	Get Kind = iota + 1
	Put
	Delete
)

func (k Kind) String() string {
	switch k {
	case Get:
		return "get"
	case Put:
		return "put"
	case Delete:
		return "delete"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Outcome is what the client learned about an operation's effect.
type Outcome uint8

// Outcomes. See docs/CHAOS.md for which client errors map to which.
const (
	// OK: a put or delete was acknowledged; a get returned a value or
	// "not found".
	OK Outcome = iota + 1
	// Failed: the operation certainly had no effect. For a get, any
	// error: a read has no effect either way, so it tells nothing.
	Failed
	// Unknown: a put or delete failed in a way that leaves open whether
	// the server applied it (a timeout, a lost connection after the
	// commit may have been sent, a retry that ended in an error). The
	// checker lets it take effect at any time after its call, or never.
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case Failed:
		return "failed"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// Op is one operation of a history.
type Op struct {
	// Client is the worker that issued the operation, from 0.
	Client int
	Kind   Kind
	Key    string
	// Value is what a put wrote, or what a get read when Found.
	Value string
	// Found is whether a successful get found a value.
	Found   bool
	Outcome Outcome
	// Call and Return are the invocation and response times, measured
	// on the monotonic clock from the history's start.
	Call, Return time.Duration
	// Final marks the reads made after the faults were healed and the
	// cluster recovered: the durability check compares them with the
	// acknowledged writes.
	Final bool
	// Err is the client's error, if any.
	Err string
}

func (op Op) String() string {
	var s string
	switch op.Kind {
	case Put:
		s = fmt.Sprintf("put(%s, %s)", op.Key, op.Value)
	case Delete:
		s = fmt.Sprintf("delete(%s)", op.Key)
	default:
		s = fmt.Sprintf("get(%s)", op.Key)
		if op.Outcome == OK {
			if op.Found {
				s += " -> " + op.Value
			} else {
				s += " -> not found"
			}
		}
	}
	s = fmt.Sprintf("client %d %s %v [%v, %v]", op.Client, s, op.Outcome, op.Call.Round(time.Microsecond), op.Return.Round(time.Microsecond))
	if op.Final {
		s += " (final)"
	}
	if op.Err != "" {
		s += ": " + op.Err
	}
	return s
}

// History records operations from concurrent clients. The zero value is
// not usable; call NewHistory.
type History struct {
	start time.Time
	mu    sync.Mutex
	ops   []Op
}

// NewHistory starts an empty history whose clock starts now.
func NewHistory() *History { return &History{start: time.Now()} }

// Now is the time since the history's start, on the monotonic clock: take
// it just before invoking an operation (Call) and just after it returns
// (Return).
func (h *History) Now() time.Duration { return time.Since(h.start) }

// Add records a completed operation.
func (h *History) Add(op Op) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

// Ops returns a copy of the recorded operations, in the order they were
// added.
func (h *History) Ops() []Op {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Op(nil), h.ops...)
}

// Fault is one fault a nemesis injected, on the history's clock.
type Fault struct {
	Kind   string // "kill", "pause", "partition", "netem"...
	Node   string
	Detail string
	// Start is when the fault began, End when it was healed (the
	// restarted server ready, the process continued...).
	Start, End time.Duration
}

func (f Fault) String() string {
	s := fmt.Sprintf("%s %s [%v, %v]", f.Kind, f.Node, f.Start.Round(time.Millisecond), f.End.Round(time.Millisecond))
	if f.Detail != "" {
		s += " " + f.Detail
	}
	return s
}
