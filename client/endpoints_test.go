package client_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/internal/testcluster"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
	"github.com/rkv-io/rkv/rdma"
)

// A client made with Endpoints never joins gossip: it costs its one server
// a Hello and a GetView to start, learns every server from it, follows a
// server's death and restart and a new server through GetView alone, and
// goes on when the server it was given stops.
func TestEndpointsClientWithoutGossip(t *testing.T) {
	c := startCluster(t, 3)
	entry := c.Server("s1")
	dev, err := rdma.Open("soft", "", rdma.Options{ListenAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	before := map[string]uint64{}
	for _, s := range c.Running() {
		before[s.Name()] = s.Stats().Total()
	}
	helloBefore, viewBefore := entry.Stats().Handled[proto.MsgHello], entry.Stats().Handled[proto.MsgGetView]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cl, err := client.New(ctx, client.Config{Endpoints: []string{entry.ControlAddr()}, Device: dev, Logger: testcluster.Logger(),
		ViewRefresh: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if st := entry.Stats(); st.Handled[proto.MsgHello]-helloBefore != 1 || st.Handled[proto.MsgGetView]-viewBefore != 1 {
		t.Fatalf("starting cost %s %d Hellos and %d GetViews, want 1 and 1", entry.Name(),
			st.Handled[proto.MsgHello]-helloBefore, st.Handled[proto.MsgGetView]-viewBefore)
	}
	for _, s := range c.Running() {
		if s != entry && s.Stats().Total() != before[s.Name()] {
			t.Fatalf("starting reached %s (%d requests), not only %s", s.Name(), s.Stats().Total()-before[s.Name()], entry.Name())
		}
	}
	if cl.Membership() != nil {
		t.Fatal("a client with Endpoints has a gossip membership")
	}
	if got := len(cl.View().Servers()); got != 3 {
		t.Fatalf("the client's view holds %d servers, want 3: %v", got, cl.View().Members())
	}
	if cl.Map().Epoch() != c.Map().Epoch() {
		t.Fatalf("the client holds map epoch %d, the cluster %d", cl.Map().Epoch(), c.Map().Epoch())
	}

	const n = 90
	owner := map[int]string{}
	for i := range n {
		if err := cl.Put(ctx, key(i), value(i)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
		if owner[i], err = cl.Owner(key(i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range c.Running() {
		for _, m := range s.Membership().View().Members() {
			if m.Meta.Role == proto.RoleClient {
				t.Fatalf("%s's gossip view holds client %s", s.Name(), m.Name)
			}
		}
	}
	check := func(what string, down string) {
		t.Helper()
		for i := range n {
			v, err := cl.Get(ctx, key(i))
			if owner[i] == down {
				if u, ok := errors.AsType[*client.UnavailableError](err); !ok || u.Node != down {
					t.Fatalf("%s: key %d of the stopped %s: %q, %v; want unavailable", what, i, down, v, err)
				}
				continue
			}
			if err != nil || string(v) != string(value(i)) {
				t.Fatalf("%s: key %d on %s: %q, %v", what, i, owner[i], v, err)
			}
		}
	}
	check("all up", "")

	// A server stops: the view the client asks for shows it, and its keys
	// are unavailable while the others read.
	victim := "s2"
	gen := c.Server(victim).Generation()
	c.Stop(victim)
	waitFor(t, 15*time.Second, func() error {
		if m, ok := cl.View().Member(victim); !ok || m.State == membership.StateAlive {
			return fmt.Errorf("%s still alive in the client's view", victim)
		}
		return nil
	})
	check(victim+" stopped", victim)

	// It restarts, with new rkeys: the client follows.
	if s := c.Restart(victim); s.Generation() != gen+1 {
		t.Fatalf("%s restarted at generation %d, was %d", victim, s.Generation(), gen)
	}
	waitFor(t, 15*time.Second, func() error {
		_, err := cl.Get(ctx, key(firstOn(t, owner, victim)))
		return err
	})
	check(victim+" restarted", "")

	// A new server takes its share of the shards: the client reads the
	// keys moved to it, through the map and view it asks for.
	c.Add("s4")
	c.WaitSettled(30 * time.Second)
	waitFor(t, 15*time.Second, func() error {
		if e, want := cl.Map().Epoch(), c.Map().Epoch(); e < want {
			_, _ = cl.Get(ctx, key(0)) // in use: the view and map refresh
			return fmt.Errorf("the client holds map epoch %d, the cluster %d", e, want)
		}
		return nil
	})
	moved := 0
	for i := range n {
		if owner[i], err = cl.Owner(key(i)); err != nil {
			t.Fatal(err)
		}
		if owner[i] == "s4" {
			moved++
		}
	}
	if moved == 0 {
		t.Fatalf("no key of %d moved to s4: %v", n, c.Map())
	}
	check("s4 added", "")

	// The server the client was given stops: it asks the others it learnt.
	c.Stop(entry.Name())
	waitFor(t, 15*time.Second, func() error {
		if m, ok := cl.View().Member(entry.Name()); !ok || m.State == membership.StateAlive {
			return fmt.Errorf("%s still alive in the client's view", entry.Name())
		}
		return nil
	})
	check(entry.Name()+" stopped", entry.Name())
}

func firstOn(t *testing.T, owner map[int]string, name string) int {
	t.Helper()
	for i := range len(owner) {
		if owner[i] == name {
			return i
		}
	}
	t.Fatalf("no key on %s: %v", name, owner)
	return 0
}

// Endpoints and Seeds are two ways to learn the servers: a client takes
// one, and an endpoint that does not answer fails New within its ctx.
func TestEndpointsConfig(t *testing.T) {
	dev, err := rdma.Open("soft", "", rdma.Options{ListenAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := client.New(ctx, client.Config{Seeds: []string{"127.0.0.1:1"}, Endpoints: []string{"127.0.0.1:1"}, Device: dev}); err == nil {
		t.Fatal("Seeds and Endpoints together: no error")
	}
	_, err = client.New(ctx, client.Config{Endpoints: []string{"127.0.0.1:1"}, Device: dev, Logger: testcluster.Logger()})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("an endpoint nobody listens on: %v, want a deadline error", err)
	}
}
