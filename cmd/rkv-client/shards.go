package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/proto"
)

// catchUpJSON is a server's copies in progress, by its Stats: the moves
// copying shards into it now.
type catchUpJSON struct {
	Groups uint64 `json:"groups"` // groups of moves (one per source and start)
	Shards uint64 `json:"shards"` // shards they copy
	// Copied is how many of them had their full first pass; the later
	// passes take what changed meanwhile.
	Copied    uint64  `json:"shards_copied"`
	Keys      uint64  `json:"keys"`
	Bytes     uint64  `json:"bytes"`
	Seconds   float64 `json:"seconds"` // since the earliest group began
	MiBPerSec float64 `json:"mib_per_s"`
}

func toCatchUpJSON(p proto.CopyProgress) catchUpJSON {
	j := catchUpJSON{Groups: p.Groups, Shards: p.Shards, Copied: p.Copied, Keys: p.Keys, Bytes: p.Bytes, Seconds: p.Elapsed.Seconds()}
	if p.Elapsed > 0 {
		j.MiBPerSec = float64(p.Bytes) / (1 << 20) / p.Elapsed.Seconds()
	}
	return j
}

// catchUpLine is j for a human: "12 shards (4 copied), 41.2 MiB and 1200
// keys copied, 38.0 MiB/s over 1.1 s".
func catchUpLine(j catchUpJSON) string {
	line := fmt.Sprintf("%s (%d copied), %s and %s copied, %.1f MiB/s over %.1f s", plural(int(j.Shards), "shard"), j.Copied,
		humanBytes(j.Bytes), plural(int(j.Keys), "key"), j.MiBPerSec, j.Seconds)
	if j.Groups > 1 {
		line += fmt.Sprintf(" (%d move groups)", j.Groups)
	}
	return line
}

// shardJSON is one shard of `shards --output json`.
type shardJSON struct {
	Shard   proto.Shard `json:"shard"`
	Primary string      `json:"primary"`
	// InSync are the backups: every write to the shard waits for each.
	InSync []string `json:"in_sync"`
	// CatchingUp is the target of a move copying the shard to a new
	// replica: no write waits for it until the move finishes.
	CatchingUp string       `json:"catching_up,omitempty"`
	Move       *mapMoveJSON `json:"move,omitempty"`
	// State is "in sync" (at least the copies it should have),
	// "under-replicated" or "over-replicated" (more than the count, until
	// the leader drops the surplus).
	State string `json:"state"`
}

// shardsOutJSON is `shards --output json`.
type shardsOutJSON struct {
	MapEpoch uint64 `json:"map_epoch"`
	Replicas int    `json:"replicas"`
	Target   int    `json:"target"` // the copies each shard should have now
	// Healthy is whether every shard has Target copies in sync, no more
	// than Replicas, and no move in progress.
	Healthy bool        `json:"healthy"`
	Shards  []shardJSON `json:"shards"`
}

func toShardJSON(m *clustermap.Map, r clustermap.Replication, s proto.Shard) shardJSON {
	sr := m.ShardReplicas(s)
	j := shardJSON{Shard: s, Primary: sr.Primary, InSync: sr.InSync, CatchingUp: sr.CatchingUp, State: shardState(r, 1+len(sr.InSync))}
	if mv := sr.Move; mv != nil {
		j.Move = &mapMoveJSON{Shard: s, Kind: mv.Kind.String(), From: mv.From, To: mv.To, Phase: mv.Phase.String(), Started: mv.Started}
	}
	return j
}

// shardState is how a shard with holders owners stands against r.
func shardState(r clustermap.Replication, holders int) string {
	switch {
	case holders < r.Target:
		return "under-replicated"
	case holders > r.Replicas:
		return "over-replicated"
	}
	return "in sync"
}

// healthy reports whether j needs nothing done: its copies all there and
// in sync, and no move.
func (j shardJSON) healthy() bool { return j.State == "in sync" && j.Move == nil }

// shardsView is the shards of bootstrapped map m that shards lists: those
// in only, in its order; without, all of them with all, else those that
// are not healthy.
func shardsView(m *clustermap.Map, only []proto.Shard, all bool) shardsOutJSON {
	r := m.Replication()
	res := shardsOutJSON{MapEpoch: m.Epoch(), Replicas: r.Replicas, Target: r.Target, Healthy: true, Shards: []shardJSON{}}
	for s := range proto.NumShards {
		j := toShardJSON(m, r, proto.Shard(s))
		res.Healthy = res.Healthy && j.healthy()
		if len(only) == 0 && (all || !j.healthy()) {
			res.Shards = append(res.Shards, j)
		}
	}
	for _, s := range only {
		res.Shards = append(res.Shards, toShardJSON(m, r, s))
	}
	return res
}

func shardsCmd(g *globals) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "shards [SHARD...]",
		Short: "per shard: its primary, in-sync backups and replicas catching up (those not fully replicated or moving; --all)",
		Long: `shards lists, from the cluster map (the freshest this client can get), each
shard's primary, its in-sync backups (the other owners: the primary applies
and acknowledges a write only once each of them has applied it) and the
replica catching up, if any: the target of a move that copies the shard to
it (add-replica, or replace of the primary or of a backup), which gets the
shard's writes by the move's copy passes, the last with the shard frozen,
and which no write waits for until the move finishes and makes it an owner.
A promotion's target is an in-sync backup already. The MOVE column gives
the move's kind, source, phase (copying, or frozen for its last copy) and
the epoch that started it.

By default it lists only the shards that need something: fewer copies than
the replica count (or than the active servers, when fewer), more than the
count (until the leader drops the surplus), or a move in progress; when none
does, it says so. --all lists all 1024; SHARD arguments (0 to 1023) list
those. How far a copy has come is the target's business: see status.`,
		RunE: func(cmd *cobra.Command, args []string) error {
			var only []proto.Shard
			for _, a := range args {
				n, err := strconv.Atoi(a)
				if err != nil || n < 0 || n >= proto.NumShards {
					return &exitError{exitUsage, fmt.Errorf("shard %q: a shard is a number from 0 to %d", a, proto.NumShards-1)}
				}
				only = append(only, proto.Shard(n))
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				m := c.Map()
				out := cmd.OutOrStdout()
				if !m.Bootstrapped() {
					return &exitError{exitUnavailable, fmt.Errorf("the cluster map is not bootstrapped (epoch %d): no shard is assigned yet", m.Epoch())}
				}
				res := shardsView(m, only, all)
				if g.output == "json" {
					return writeJSON(out, res)
				}
				return writeShards(out, res, m.Replication(), len(only) > 0 || all)
			})
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "list every shard, not only those not fully replicated or moving")
	return cmd
}

// writeShards prints res for a human: a header line, then a row a shard.
// listed says the shards were chosen (--all, arguments) rather than those
// that need something.
func writeShards(w io.Writer, res shardsOutJSON, r clustermap.Replication, listed bool) error {
	switch {
	case res.Healthy:
		fmt.Fprintf(w, "map epoch %d: all %d shards have %s in sync, no move in progress\n", res.MapEpoch, proto.NumShards, plural(res.Target, "copy"))
	default:
		fmt.Fprintf(w, "map epoch %d: replicas: %d wanted (%s a shard now), %d shards in sync at %d, %d under-replicated, %d catching up",
			res.MapEpoch, res.Replicas, plural(res.Target, "copy"), r.InSync, r.Target, r.UnderReplicated, r.CatchingUp)
		if r.OverReplicated > 0 {
			fmt.Fprintf(w, ", %d over-replicated", r.OverReplicated)
		}
		fmt.Fprintln(w)
	}
	if len(res.Shards) == 0 {
		if !listed {
			fmt.Fprintln(w, "(--all lists every shard)")
		}
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SHARD\tSTATE\tPRIMARY\tIN SYNC\tCATCHING UP\tMOVE")
	for _, j := range res.Shards {
		move := "-"
		if mv := j.Move; mv != nil {
			move = fmt.Sprintf("%s %s->%s, %s since epoch %d", mv.Kind, mv.From, mv.To, mv.Phase, mv.Started)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", j.Shard, j.State, j.Primary, dash(strings.Join(j.InSync, ",")), dash(j.CatchingUp), move)
	}
	return tw.Flush()
}
