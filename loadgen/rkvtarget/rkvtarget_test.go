package rkvtarget

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/loadgen"
)

var (
	_ loadgen.Target        = Target{}
	_ loadgen.WorkerTargets = Target{}
	_ loadgen.Counters      = Target{}
	_ loadgen.MultiGetter   = Client{}
)

func TestTarget(t *testing.T) {
	c := testcluster.Start(t, 1, testcluster.Options{})
	tg := Target{Clients: []*client.Client{c.Client(t, nil), c.Client(t, nil)}}
	ctx := context.Background()
	if w0, w1, w2 := tg.ForWorker(0).(Client), tg.ForWorker(1).(Client), tg.ForWorker(2).(Client); w0.C != tg.Clients[0] || w1.C != tg.Clients[1] || w2.C != tg.Clients[0] {
		t.Fatal("ForWorker does not spread the workers over the clients in turn")
	}
	if err := tg.Put(ctx, []byte("k"), []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := tg.ForWorker(1).Get(ctx, []byte("k")); err != nil || string(v) != "v" {
		t.Fatalf("get through the second client: %q, %v", v, err)
	}
	if _, err := tg.Get(ctx, []byte("absent")); !errors.Is(err, loadgen.ErrNotFound) {
		t.Fatalf("get of an absent key: %v, want loadgen.ErrNotFound", err)
	}
	vals, err := tg.ForWorker(0).(Client).MultiGet(ctx, [][]byte{[]byte("k"), []byte("absent")})
	if err != nil || string(vals[0]) != "v" || vals[1] != nil {
		t.Fatalf("multiget: %q, %v", vals, err)
	}
	n := tg.Counters()
	if want := tg.Clients[0].Reads() + tg.Clients[1].Reads(); n[CounterReads] != want || want == 0 {
		t.Fatalf("%s = %d, want the clients' sum %d (> 0)", CounterReads, n[CounterReads], want)
	}
	for k := range n {
		if k != CounterReads && (!strings.HasPrefix(k, RetriesPrefix) || k != strings.ToLower(k)) {
			t.Errorf("counter %q: want %s or %s<op in lower case>", k, CounterReads, RetriesPrefix)
		}
	}
}
