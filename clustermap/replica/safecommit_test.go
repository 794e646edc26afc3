package replica

import (
	"slices"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/rkv-io/rkv/proto"
)

// A follower holding an entry its deposed leader never committed gets, from
// the new leader, a request with no entries that matches before that entry
// and commits past it: it must not apply it. The next request overwrites
// the entry with the new leader's, and the map has the new leader's
// changes only. hashicorp/raft alone applies the deposed entry here, and
// skips the new leader's entry at that index for good.
func TestFollowerAppliesNoEntryOfADeposedLeader(t *testing.T) {
	nodes := newTestNodes(t, 1, true)
	f := nodes[0]
	f.start(false)
	addr, leader := raft.NewInmemTransport("id-leader")
	leader.Connect(raft.ServerAddress(f.addr), f.inmem)
	defer leader.Close()

	entry := func(index, term uint64, server string) *raft.Log {
		b, err := proto.EncodeMapCommand(add(server))
		if err != nil {
			t.Fatal(err)
		}
		return &raft.Log{Index: index, Term: term, Type: raft.LogCommand, Data: b}
	}
	send := func(term, prevIndex, prevTerm, commit uint64, entries ...*raft.Log) {
		t.Helper()
		req := &raft.AppendEntriesRequest{
			RPCHeader: raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("id-leader"), Addr: []byte(addr)},
			Term:      term, PrevLogEntry: prevIndex, PrevLogTerm: prevTerm, Entries: entries, LeaderCommitIndex: commit,
		}
		var resp raft.AppendEntriesResponse
		if err := leader.AppendEntries("id-n1", raft.ServerAddress(f.addr), req, &resp); err != nil || !resp.Success {
			t.Fatalf("AppendEntries term %d after %d/%d, committing %d: success %v, %v", term, prevIndex, prevTerm, commit, resp.Success, err)
		}
	}
	servers := func() []string {
		var out []string
		for _, s := range f.Map().Servers() {
			out = append(out, s.Name)
		}
		return out
	}

	send(1, 0, 0, 2, entry(1, 1, "a"), entry(2, 1, "b")) // term 1 commits a and b
	send(1, 2, 1, 2, entry(3, 1, "deposed"))             // and appends an entry it never commits
	// Term 2's leader holds y and z at 3 and 4, and commits them without
	// this follower; its first request to it carries nothing after 2.
	send(2, 2, 1, 4)
	send(2, 2, 1, 4, entry(3, 2, "y"), entry(4, 2, "z"))
	waitFor(t, "the follower to apply z", func() bool { _, ok := f.Map().Server("z"); return ok })
	if got, want := servers(), []string{"a", "b", "y", "z"}; !slices.Equal(got, want) {
		t.Fatalf("the follower's map has servers %v, want %v", got, want)
	}
}

func TestClampCommit(t *testing.T) {
	ae := &raft.AppendEntriesRequest{PrevLogEntry: 7, Entries: []*raft.Log{{Index: 8}}, LeaderCommitIndex: 9}
	got := clampCommit(ae).(*raft.AppendEntriesRequest)
	if got.LeaderCommitIndex != 8 || ae.LeaderCommitIndex != 9 || got == ae {
		t.Fatalf("clamped to %d (a copy: %v), the request left at %d", got.LeaderCommitIndex, got != ae, ae.LeaderCommitIndex)
	}
	for _, c := range []any{
		&raft.AppendEntriesRequest{PrevLogEntry: 7, Entries: []*raft.Log{{Index: 8}, {Index: 9}}, LeaderCommitIndex: 9},
		&raft.AppendEntriesRequest{PrevLogEntry: 9, LeaderCommitIndex: 9},
		&raft.AppendEntriesRequest{Term: 3}, // a heartbeat
		&raft.RequestVoteRequest{},
	} {
		if clampCommit(c) != c {
			t.Errorf("%+v changed", c)
		}
	}
}
