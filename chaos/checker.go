// The checker: linearizability of a history (porcupine, a register per key) and durability of acknowledged writes.

package chaos

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// AnomalyKind names what an Anomaly violates.
type AnomalyKind string

// Anomaly kinds.
const (
	// NotLinearizable: no order of the key's operations that respects
	// real time explains what its reads returned (a stale read, a lost
	// or resurrected write, a value that flips back...).
	NotLinearizable AnomalyKind = "not-linearizable"
	// CheckTimedOut: porcupine did not finish within CheckOptions.Timeout,
	// so the key's history is unverified. Counted as an anomaly: a run
	// that cannot be checked proves nothing.
	CheckTimedOut AnomalyKind = "check-timed-out"
	// LostWrite: after recovery a key's final read shows a state that an
	// acknowledged put or delete had already replaced when it was
	// invoked.
	LostWrite AnomalyKind = "lost-write"
	// PhantomRead: a get returned a value no put ever wrote, or one
	// whose put had not yet been invoked.
	PhantomRead AnomalyKind = "phantom-read"
	// Unreadable: the key could not be read after recovery at all.
	Unreadable AnomalyKind = "unreadable-after-recovery"
)

// Anomaly is one violation the checker found.
type Anomaly struct {
	Kind   AnomalyKind
	Key    string
	Detail string
}

func (a Anomaly) String() string { return fmt.Sprintf("%s on key %q: %s", a.Kind, a.Key, a.Detail) }

// CheckOptions configures Check. Zero fields take the defaults documented
// on each.
type CheckOptions struct {
	// Timeout bounds porcupine's search, over all keys together.
	// Default 60s.
	Timeout time.Duration
}

// Result is what Check found.
type Result struct {
	// Linearizability is porcupine's verdict over every key: Ok,
	// Illegal, or Unknown when it timed out.
	Linearizability porcupine.CheckResult
	// Anomalies lists every violation, per key; empty when the history
	// is correct.
	Anomalies []Anomaly
	// Checked is the number of operations porcupine checked, after the
	// reduction described on Check.
	Checked int

	info porcupine.LinearizationInfo
}

// WriteVisualization writes porcupine's interactive HTML view of the
// history (each key's partial linearizations, the point where it fails)
// to path, with faults shown on a "nemesis" row.
func (r *Result) WriteVisualization(path string, faults []Fault) error {
	info := r.info
	var ann []porcupine.Annotation
	for _, f := range faults {
		ann = append(ann, porcupine.Annotation{Tag: "nemesis", Start: int64(f.Start), End: int64(f.End),
			Description: f.Kind + " " + f.Node, Details: f.String(), BackgroundColor: "#f4c7c3"})
	}
	info.AddAnnotations(ann)
	if err := porcupine.VisualizePath(registerModel, info, path); err != nil {
		return fmt.Errorf("chaos: writing the linearizability visualization to %s: %w", path, err)
	}
	return nil
}

// Check verifies a history:
//
//   - Linearizability, with porcupine, of each key as a register with
//     put, get and delete, starting absent. Failed operations and failed
//     gets are left out (they had no effect). An Unknown put or delete
//     may take effect at any time after its call or never: its return is
//     placed after every other operation. An Unknown put whose value no
//     get ever returned is left out: "never applied" explains every
//     history it could be part of, since its value was never observed.
//   - Durability: for every acknowledged put or delete a, the key's final
//     read must come from a write (or a delete, for "not found") that was
//     not already complete when a was invoked.
//   - No phantom reads: every value read was written by a put invoked
//     before the read returned.
//
// Every violation is listed in Result.Anomalies.
func Check(ops []Op, opts CheckOptions) Result {
	if opts.Timeout <= 0 {
		opts.Timeout = 60 * time.Second
	}
	var res Result
	byKey := map[string][]Op{}
	for _, op := range ops {
		byKey[op.Key] = append(byKey[op.Key], op)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		res.Anomalies = append(res.Anomalies, phantomReads(k, byKey[k])...)
		res.Anomalies = append(res.Anomalies, lostWrites(k, byKey[k])...)
	}

	pops := porcupineOps(ops)
	res.Checked = len(pops)
	res.Linearizability, res.info = porcupine.CheckOperationsVerbose(registerModel, pops, opts.Timeout)
	switch res.Linearizability {
	case porcupine.Illegal:
		for _, k := range illegalKeys(pops) {
			res.Anomalies = append(res.Anomalies, Anomaly{Kind: NotLinearizable, Key: k,
				Detail: "no real-time order of its operations explains the values read (see the visualization)"})
		}
	case porcupine.Unknown:
		res.Anomalies = append(res.Anomalies, Anomaly{Kind: CheckTimedOut, Key: "*",
			Detail: fmt.Sprintf("porcupine did not finish %d operations within %v", len(pops), opts.Timeout)})
	}
	return res
}

// illegalKeys checks each key's partition on its own to name the keys
// that fail (porcupine's verdict covers all of them at once). A partition
// that times out here is not named.
func illegalKeys(pops []porcupine.Operation) []string {
	var bad []string
	for _, part := range registerModel.Partition(pops) {
		if porcupine.CheckOperationsTimeout(registerModel, part, 10*time.Second) == porcupine.Illegal {
			bad = append(bad, part[0].Input.(regInput).Key)
		}
	}
	sort.Strings(bad)
	return bad
}

// phantomReads finds gets of values that no put of the key wrote, or
// whose put was invoked only after the get returned.
func phantomReads(key string, ops []Op) []Anomaly {
	written := map[string]Op{}
	for _, op := range ops {
		if op.Kind == Put {
			written[op.Value] = op
		}
	}
	var out []Anomaly
	for _, op := range ops {
		if op.Kind != Get || op.Outcome != OK || !op.Found {
			continue
		}
		w, ok := written[op.Value]
		switch {
		case !ok:
			out = append(out, Anomaly{Kind: PhantomRead, Key: key, Detail: fmt.Sprintf("%v read a value never written", op)})
		case w.Call > op.Return:
			out = append(out, Anomaly{Kind: PhantomRead, Key: key, Detail: fmt.Sprintf("%v read the value of %v, invoked after the read returned", op, w)})
		}
	}
	return out
}

// lostWrites compares the key's final reads with its acknowledged writes.
func lostWrites(key string, ops []Op) []Anomaly {
	var out []Anomaly
	for _, f := range ops {
		if !f.Final || f.Kind != Get {
			continue
		}
		if f.Outcome != OK {
			out = append(out, Anomaly{Kind: Unreadable, Key: key, Detail: fmt.Sprintf("%v", f)})
			continue
		}
		// The writes that could have produced what f read.
		var sources []Op
		for _, w := range ops {
			if w.Outcome == Failed || w.Call > f.Return {
				continue
			}
			if (f.Found && w.Kind == Put && w.Value == f.Value) || (!f.Found && w.Kind == Delete) {
				sources = append(sources, w)
			}
		}
		if len(sources) == 0 && f.Found {
			continue // a phantom read, reported as such
		}
		for _, a := range ops {
			if a.Outcome != OK || (a.Kind != Put && a.Kind != Delete) || a.Call > f.Return {
				continue
			}
			// Some source must not have completed before a began.
			if !slices.ContainsFunc(sources, func(w Op) bool { return returnOf(w) >= a.Call }) {
				what := "a value"
				if !f.Found {
					what = "not found"
				}
				out = append(out, Anomaly{Kind: LostWrite, Key: key,
					Detail: fmt.Sprintf("the final read %v found %s that %v had replaced", f, what, a)})
				break
			}
		}
	}
	return out
}

// returnOf is an operation's return time for the checks: never, for an
// Unknown write.
func returnOf(op Op) time.Duration {
	if op.Outcome == Unknown {
		return math.MaxInt64
	}
	return op.Return
}

// porcupineOps turns a history into porcupine's operations, reduced as
// Check describes.
func porcupineOps(ops []Op) []porcupine.Operation {
	// firstRead is, for each value read (key + "\x00" + value), the
	// earliest return of a get that read it.
	firstRead := map[string]time.Duration{}
	clients := 0
	for _, op := range ops {
		if op.Kind == Get && op.Outcome == OK && op.Found {
			rv := op.Key + "\x00" + op.Value
			if r, ok := firstRead[rv]; !ok || op.Return < r {
				firstRead[rv] = op.Return
			}
		}
		clients = max(clients, op.Client+1)
	}
	sorted := slices.Clone(ops)
	slices.SortStableFunc(sorted, func(a, b Op) int { return cmp.Compare(a.Call, b.Call) })
	var out []porcupine.Operation
	unknown := 0
	for _, op := range sorted {
		if op.Outcome == Failed || (op.Kind == Get && op.Outcome != OK) {
			continue
		}
		seen, wasRead := firstRead[op.Key+"\x00"+op.Value]
		if op.Kind == Put && op.Outcome == Unknown && !wasRead {
			continue
		}
		po := porcupine.Operation{
			ClientId: op.Client,
			Input:    regInput{Kind: op.Kind, Key: op.Key, Value: op.Value},
			Output:   regOutput{Found: op.Found, Value: op.Value},
			Call:     int64(op.Call),
			Return:   int64(op.Return),
			Metadata: op,
		}
		if op.Kind != Get {
			po.Output = regOutput{}
		}
		if op.Outcome == Unknown {
			// Pending forever, or for a put until the first read of
			// its value returned: values are unique, so the put took
			// effect before that read did. Bounding it keeps the
			// search small: every operation pending forever is
			// concurrent with the whole rest of the key's history, and
			// a key with a few dozen of them (partitions make that
			// many) took porcupine over a minute. Its own row in the
			// visualization, as the client went on with other
			// operations.
			po.Return = math.MaxInt64
			if op.Kind == Put {
				po.Return = int64(seen)
			}
			po.ClientId = clients + unknown
			unknown++
		}
		out = append(out, po)
	}
	return out
}

// regInput is an operation on one key.
type regInput struct {
	Kind  Kind
	Key   string
	Value string // put only
}

// regOutput is what a get returned.
type regOutput struct {
	Found bool
	Value string
}

// regState is a register: absent, or a value.
type regState struct {
	Present bool
	Value   string
}

// registerModel is a register per key with put, get and delete.
var registerModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(regInput).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return regState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in := state.(regState), input.(regInput)
		switch in.Kind {
		case Put:
			return true, regState{Present: true, Value: in.Value}
		case Delete:
			return true, regState{}
		}
		out := output.(regOutput)
		return out.Found == s.Present && (!out.Found || out.Value == s.Value), s
	},
	Equal: func(a, b any) bool { return a.(regState) == b.(regState) },
	DescribeOperation: func(input, output any) string {
		in := input.(regInput)
		switch in.Kind {
		case Put:
			return fmt.Sprintf("put(%s, %s)", in.Key, in.Value)
		case Delete:
			return fmt.Sprintf("delete(%s)", in.Key)
		}
		if out := output.(regOutput); out.Found {
			return fmt.Sprintf("get(%s) -> %s", in.Key, out.Value)
		}
		return fmt.Sprintf("get(%s) -> not found", in.Key)
	},
	DescribeState: func(state any) string {
		if s := state.(regState); s.Present {
			return s.Value
		}
		return "(absent)"
	},
	DescribeOperationMetadata: func(info any) string {
		op, ok := info.(Op)
		if !ok {
			return ""
		}
		var b strings.Builder
		fmt.Fprintf(&b, "client %d, %v", op.Client, op.Outcome)
		if op.Final {
			b.WriteString(", final read")
		}
		if op.Err != "" {
			b.WriteString(": " + op.Err)
		}
		return b.String()
	},
}
