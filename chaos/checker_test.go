package chaos

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/rkv-io/rkv/client"
)

// ms builds a time from milliseconds.
func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func put(c int, key, v string, call, ret int, o Outcome) Op {
	return Op{Client: c, Kind: Put, Key: key, Value: v, Outcome: o, Call: ms(call), Return: ms(ret)}
}

func del(c int, key string, call, ret int, o Outcome) Op {
	return Op{Client: c, Kind: Delete, Key: key, Outcome: o, Call: ms(call), Return: ms(ret)}
}

func get(c int, key, v string, call, ret int) Op {
	return Op{Client: c, Kind: Get, Key: key, Value: v, Found: v != "", Outcome: OK, Call: ms(call), Return: ms(ret)}
}

func final(op Op) Op { op.Final = true; return op }

// kinds returns the anomaly kinds found, in order.
func kinds(r Result) []AnomalyKind {
	var out []AnomalyKind
	for _, a := range r.Anomalies {
		out = append(out, a.Kind)
	}
	return out
}

func TestCheckAcceptsLinearizableHistories(t *testing.T) {
	for _, tc := range []struct {
		name string
		ops  []Op
	}{
		{"empty", nil},
		{"sequential", []Op{
			get(0, "a", "", 0, 1),
			put(0, "a", "0-1", 2, 3, OK),
			get(1, "a", "0-1", 4, 5),
			del(1, "a", 6, 7, OK),
			get(0, "a", "", 8, 9),
			put(1, "a", "1-2", 10, 11, OK),
			final(get(9, "a", "1-2", 20, 21)),
		}},
		{"concurrent writes, readers agree on one order", []Op{
			put(0, "a", "0-1", 0, 10, OK),
			put(1, "a", "1-1", 1, 11, OK),
			get(2, "a", "1-1", 12, 13),
			get(3, "a", "1-1", 14, 15),
			final(get(9, "a", "1-1", 20, 21)),
		}},
		{"a read concurrent with a write sees either value", []Op{
			put(0, "a", "0-1", 0, 1, OK),
			put(1, "a", "1-1", 2, 10, OK),
			get(2, "a", "0-1", 3, 4),
			get(3, "a", "1-1", 5, 6),
			final(get(9, "a", "1-1", 20, 21)),
		}},
		{"an unknown put applied long after it failed", []Op{
			put(0, "a", "0-1", 0, 1, OK),
			put(1, "a", "1-1", 2, 3, Unknown),
			get(2, "a", "0-1", 4, 5),
			get(2, "a", "1-1", 50, 51),
			final(get(9, "a", "1-1", 60, 61)),
		}},
		{"an unknown put never applied", []Op{
			put(0, "a", "0-1", 0, 1, OK),
			put(1, "a", "1-1", 2, 3, Unknown),
			final(get(9, "a", "0-1", 60, 61)),
		}},
		{"an unknown delete applied after the last acknowledged put began", []Op{
			put(0, "a", "0-1", 0, 1, OK),
			del(1, "a", 2, 3, Unknown),
			put(0, "a", "0-2", 4, 5, OK),
			get(2, "a", "0-2", 6, 7),
			final(get(9, "a", "", 60, 61)),
		}},
		{"failed operations and failed reads are ignored", []Op{
			put(0, "a", "0-1", 0, 1, OK),
			put(1, "a", "1-1", 2, 3, Failed),
			{Client: 2, Kind: Get, Key: "a", Outcome: Failed, Call: ms(4), Return: ms(5), Err: "timeout"},
			final(get(9, "a", "0-1", 60, 61)),
		}},
		{"keys are independent", []Op{
			put(0, "a", "0-1", 0, 1, OK),
			put(1, "b", "1-1", 0, 1, OK),
			get(2, "a", "0-1", 2, 3),
			get(2, "b", "1-1", 2, 3),
			final(get(9, "a", "0-1", 60, 61)),
			final(get(9, "b", "1-1", 60, 61)),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Check(tc.ops, CheckOptions{Timeout: 10 * time.Second})
			if r.Linearizability != porcupine.Ok || len(r.Anomalies) != 0 {
				t.Fatalf("verdict %s, anomalies %v; want Ok and none", r.Linearizability, r.Anomalies)
			}
		})
	}
}

func TestCheckCatchesAnomalies(t *testing.T) {
	for _, tc := range []struct {
		name string
		ops  []Op
		want []AnomalyKind
	}{
		{"stale read after an acknowledged overwrite", []Op{
			put(0, "a", "0-1", 0, 1, OK),
			put(0, "a", "0-2", 2, 3, OK),
			get(1, "a", "0-1", 4, 5),
			final(get(9, "a", "0-2", 60, 61)),
		}, []AnomalyKind{NotLinearizable}},
		{"stale read of a deleted key", []Op{
			put(0, "a", "0-1", 0, 1, OK),
			del(0, "a", 2, 3, OK),
			get(1, "a", "0-1", 4, 5),
			final(get(9, "a", "", 60, 61)),
		}, []AnomalyKind{NotLinearizable}},
		{"a value that flips back", []Op{
			put(0, "a", "0-1", 0, 1, OK),
			put(1, "a", "1-1", 0, 10, OK),
			get(2, "a", "1-1", 2, 3),
			get(2, "a", "0-1", 4, 5),
			final(get(9, "a", "1-1", 60, 61)),
		}, []AnomalyKind{NotLinearizable}},
		{"an acknowledged write lost after recovery", []Op{
			put(0, "a", "0-1", 0, 1, OK),
			put(0, "a", "0-2", 2, 3, OK),
			get(1, "a", "0-2", 4, 5),
			final(get(9, "a", "0-1", 60, 61)),
		}, []AnomalyKind{LostWrite, NotLinearizable}},
		{"an acknowledged write gone after recovery", []Op{
			put(0, "a", "0-1", 0, 1, OK),
			final(get(9, "a", "", 60, 61)),
		}, []AnomalyKind{LostWrite, NotLinearizable}},
		{"an acknowledged delete undone after recovery", []Op{
			put(0, "a", "0-1", 0, 1, OK),
			del(0, "a", 2, 3, OK),
			final(get(9, "a", "0-1", 60, 61)),
		}, []AnomalyKind{LostWrite, NotLinearizable}},
		{"a read of a value never written", []Op{
			put(0, "a", "0-1", 0, 1, OK),
			get(1, "a", "garbage", 2, 3),
			final(get(9, "a", "0-1", 60, 61)),
		}, []AnomalyKind{PhantomRead, NotLinearizable}},
		{"a read of a value before its put was invoked", []Op{
			get(1, "a", "0-1", 0, 1),
			put(0, "a", "0-1", 2, 3, OK),
			final(get(9, "a", "0-1", 60, 61)),
		}, []AnomalyKind{PhantomRead, NotLinearizable}},
		{"a key unreadable after recovery", []Op{
			put(0, "a", "0-1", 0, 1, OK),
			{Client: 9, Kind: Get, Key: "a", Outcome: Failed, Final: true, Call: ms(60), Return: ms(61), Err: "unavailable"},
		}, []AnomalyKind{Unreadable}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := Check(tc.ops, CheckOptions{Timeout: 10 * time.Second})
			got := kinds(r)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("anomalies %v (verdict %s); want kinds %v", r.Anomalies, r.Linearizability, tc.want)
			}
			for _, a := range r.Anomalies {
				if a.Key != "a" || a.Detail == "" {
					t.Errorf("anomaly %+v: want key \"a\" and a detail", a)
				}
			}
		})
	}
}

func TestCheckNamesOnlyTheBadKey(t *testing.T) {
	ops := []Op{
		put(0, "good", "0-1", 0, 1, OK),
		get(1, "good", "0-1", 2, 3),
		put(0, "bad", "0-2", 0, 1, OK),
		put(0, "bad", "0-3", 2, 3, OK),
		get(1, "bad", "0-2", 4, 5),
	}
	r := Check(ops, CheckOptions{})
	if r.Linearizability != porcupine.Illegal || len(r.Anomalies) != 1 || r.Anomalies[0].Key != "bad" {
		t.Fatalf("verdict %s, anomalies %v; want Illegal on key \"bad\" only", r.Linearizability, r.Anomalies)
	}
	path := filepath.Join(t.TempDir(), "history.html")
	if err := r.WriteVisualization(path, []Fault{{Kind: "kill", Node: "n1", Start: ms(1), End: ms(4)}}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `get(bad) -\u003e 0-2`) {
		t.Fatalf("the visualization (%d bytes) does not describe the stale read", len(b))
	}
	if !strings.Contains(string(b), "kill n1") {
		t.Fatalf("the visualization (%d bytes) does not show the fault", len(b))
	}
}

func TestCheckDropsUnobservedUnknownPuts(t *testing.T) {
	ops := []Op{
		put(0, "a", "0-1", 0, 1, OK),
		put(1, "a", "1-1", 2, 3, Unknown), // never read: left out
		put(2, "a", "2-1", 2, 3, Unknown), // read: kept, pending forever
		get(3, "a", "2-1", 4, 5),
		{Client: 3, Kind: Get, Key: "a", Outcome: Failed, Call: ms(6), Return: ms(7)},
	}
	r := Check(ops, CheckOptions{})
	if r.Checked != 3 || len(r.Anomalies) != 0 {
		t.Fatalf("checked %d operations, anomalies %v; want 3 and none", r.Checked, r.Anomalies)
	}
}

func TestClassify(t *testing.T) {
	unavailable := &client.UnavailableError{Node: "n1", Reason: "dead"}
	for _, tc := range []struct {
		kind  Kind
		err   error
		want  Outcome
		found bool
	}{
		{Get, nil, OK, true},
		{Get, fmt.Errorf("wrapped: %w", client.ErrNotFound), OK, false},
		{Get, unavailable, Failed, false},
		{Put, nil, OK, false},
		{Put, unavailable, Unknown, false},
		{Put, errors.New("i/o timeout"), Unknown, false},
		{Delete, nil, OK, false},
		{Delete, unavailable, Unknown, false},
		{Put, errors.Join(client.ErrNotSent, unavailable), Failed, false},
		{Delete, errors.Join(client.ErrNotSent, unavailable), Failed, false},
	} {
		got, found := Classify(tc.kind, tc.err)
		if got != tc.want || found != tc.found {
			t.Errorf("Classify(%v, %v) = %v, %v; want %v, %v", tc.kind, tc.err, got, found, tc.want, tc.found)
		}
	}
}
