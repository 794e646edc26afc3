package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/proto"
)

// replicationJSON is `replicas --output json`: the map's replica count and
// how far its shards are from it.
type replicationJSON struct {
	MapEpoch uint64 `json:"map_epoch"`
	Replicas int    `json:"replicas"`
	// Target is the copies each shard should have now: Replicas, or the
	// number of active servers when fewer.
	Target          int `json:"target"`
	ActiveServers   int `json:"active_servers"`
	UnderReplicated int `json:"under_replicated"` // shards with fewer holders than Target
	AddingReplicas  int `json:"adding_replicas"`  // add-replica moves in progress
	OverReplicated  int `json:"over_replicated"`  // shards with more holders than Replicas
	InSync          int `json:"in_sync"`          // shards with at least Target holders, every one in sync
	CatchingUp      int `json:"catching_up"`      // shards with a copy to a new replica in progress
}

func toReplicationJSON(m *clustermap.Map) replicationJSON {
	r := m.Replication()
	j := replicationJSON{MapEpoch: m.Epoch(), Replicas: r.Replicas, Target: r.Target, UnderReplicated: r.UnderReplicated,
		AddingReplicas: r.Adding, OverReplicated: r.OverReplicated, InSync: r.InSync, CatchingUp: r.CatchingUp}
	for _, s := range m.Servers() {
		if s.State == proto.ServerActive {
			j.ActiveServers++
		}
	}
	return j
}

// writeReplication prints r for a human.
func writeReplication(w io.Writer, r replicationJSON) {
	fmt.Fprintf(w, "replicas: %d (map epoch %d)\n", r.Replicas, r.MapEpoch)
	copies := fmt.Sprintf("copies of each shard: %d (%s", r.Target, plural(r.ActiveServers, "active server"))
	if r.Target < r.Replicas {
		copies += fmt.Sprintf("; %d once there are %d", r.Replicas, r.Replicas)
	}
	fmt.Fprintln(w, copies+")")
	fmt.Fprintf(w, "shards in sync at %d: %d\n", r.Target, r.InSync)
	fmt.Fprintf(w, "under-replicated shards: %d\n", r.UnderReplicated)
	fmt.Fprintf(w, "shards catching up (a copy to a new replica in progress): %d\n", r.CatchingUp)
	fmt.Fprintf(w, "add-replica moves in progress: %d\n", r.AddingReplicas)
	if r.OverReplicated > 0 {
		fmt.Fprintf(w, "over-replicated shards: %d (the leader is dropping their surplus backups)\n", r.OverReplicated)
	}
}

// plural is n and what, with an s unless n is 1 ("copy" makes "copies",
// "key" keys).
func plural(n int, what string) string {
	switch {
	case n == 1:
		return "1 " + what
	case strings.HasSuffix(what, "y") && !strings.ContainsAny(what[max(len(what)-2, 0):len(what)-1], "aeiou"):
		return fmt.Sprintf("%d %sies", n, what[:len(what)-1])
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func replicasCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "replicas [N]",
		Short: "show the cluster's replica count and the shards short of it; with N, set it",
		Long: `replicas prints the cluster map's replica count (the copies of each shard the
cluster keeps, on distinct servers, and on distinct --zone labels first), the
copies each shard should have now (the count, or the number of active servers
when fewer), how many shards have that many copies in sync (their owners:
every write waits for each), how many have fewer (under-replicated), how
many have a copy to a new replica in progress (catching up: no write waits
for it until its move finishes), how many replicas are being added, and how
many shards hold more copies than the count (over-replicated, until the
leader drops the surplus). shards lists them shard by shard.

With N (1 to 16) it asks the cluster to keep N copies: the map's leader then
copies each shard short of them from its primary to another server while
reads and writes go on; replicas returns once the count is in the map, and
shows where the copies stand (run it again, or status, to follow them). A
lower count drops the surplus backups, from the servers holding the most
(their space is reclaimed); the primaries keep serving.

With more than one copy, the shards of a primary that dies fail over to a
backup (rkv-server --failover-timeout after gossip declared it dead), and the
leader copies them again to restore the count. Each write waits for every
backup (about twice the latency of one copy at two).`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			set := 0
			if len(args) == 1 {
				n, err := strconv.Atoi(args[0])
				if err != nil || n < 1 || n > proto.MaxShardOwners {
					return &exitError{exitUsage, fmt.Errorf("replicas %q: the replica count is a number from 1 to %d", args[0], proto.MaxShardOwners)}
				}
				set = n
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				out := cmd.OutOrStdout()
				if set != 0 {
					epoch, err := c.SetReplicas(ctx, set)
					if err != nil {
						return err
					}
					if g.output != "json" {
						fmt.Fprintf(out, "replica count set to %d at map epoch %d\n", set, epoch)
					}
				}
				r := toReplicationJSON(c.Map())
				if g.output == "json" {
					return writeJSON(out, r)
				}
				writeReplication(out, r)
				return nil
			})
		},
	}
}
