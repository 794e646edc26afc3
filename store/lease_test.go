package store

import (
	"context"
	"testing"

	"github.com/rkv-io/rkv/rdma"
)

// TestGrantLeaseInOwnPD: a lease registered in a PD of its writer's own
// is written and committed through a QP of that PD, refuses the rkey from
// a QP of the store's PD (where every reader's QP is), and is deregistered
// when it ends, so that the PD can be closed.
func TestGrantLeaseInOwnPD(t *testing.T) {
	sv := newServer(t, smallOptions())
	pd, err := sv.dev.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // after the clients' cleanups, which close their QPs
		if err := pd.Close(); err != nil {
			t.Errorf("closing the writer's PD after its lease ended: %v", err)
		}
	})
	reader, own := newClient(t, sv), newClientIn(t, sv, pd)
	l, err := sv.s.GrantLeaseIn(context.Background(), pd, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st := reader.do(rdma.OpWrite, 0, 8, l.Addr, l.RKey); st != rdma.StatusRemAccessErr {
		t.Fatalf("WRITE with the lease's rkey from a QP of the store's PD: %v, want REM_ACCESS_ERR", st)
	} // (which leaves reader's QP in ERR)
	w := &writer{c: own, lease: l, version: l.VersionBase}
	if _, err := w.put([]byte("own"), []byte("pd")); err != nil {
		t.Fatal(err)
	}
	if v, ok := newClient(t, sv).mustGet([]byte("own")); !ok || string(v) != "pd" {
		t.Fatalf("GET after a commit through the writer's PD: %q, %v", v, ok)
	}
	if err := sv.s.EndLease(l.ID); err != nil {
		t.Fatal(err)
	}
	if st := own.do(rdma.OpWrite, 0, 8, l.Addr, l.RKey); st != rdma.StatusRemAccessErr {
		t.Fatalf("WRITE with an ended lease's rkey from its own PD: %v, want REM_ACCESS_ERR", st)
	}
}
