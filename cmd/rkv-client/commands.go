package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/clustermap"
	"github.com/rkv-io/rkv/membership"
	"github.com/rkv-io/rkv/proto"
)

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// kvJSON is a key and value in JSON: each as a string when it is UTF-8,
// in key_base64 and value_base64 otherwise.
type kvJSON struct {
	keyJSON
	Size        int    `json:"size"`
	Value       string `json:"value,omitempty"`
	ValueBase64 []byte `json:"value_base64,omitempty"`
}

func toKVJSON(k, v []byte, withValue bool) kvJSON {
	j := kvJSON{keyJSON: toKeyJSON(k), Size: len(v)}
	if withValue {
		if utf8.Valid(v) {
			j.Value = string(v)
		} else {
			j.ValueBase64 = v
		}
	}
	return j
}

func getCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "get KEY",
		Short: "print KEY's value (raw bytes, and a newline on a terminal; exit 1 if absent)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := g.parseKey(args[0])
			if err != nil {
				return err
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				v, err := c.Get(ctx, key)
				found := err == nil
				if err != nil && !errors.Is(err, client.ErrNotFound) {
					return err
				}
				if g.output == "json" {
					if err := writeJSON(cmd.OutOrStdout(), toFoundJSON(key, v, found)); err != nil {
						return err
					}
				} else if found {
					if _, err := cmd.OutOrStdout().Write(v); err != nil {
						return err
					}
					if stdoutIsTerminal(cmd) && !bytes.HasSuffix(v, []byte("\n")) {
						fmt.Fprintln(cmd.OutOrStdout()) // etcdctl's habit: the prompt on a line of its own
					}
				}
				if !found {
					return &exitError{exitNotFound, fmt.Errorf("key not found: %q", args[0])}
				}
				return nil
			})
		},
	}
}

func putCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "put KEY [VALUE | -]",
		Short: "store VALUE under KEY; without VALUE, or with -, the value is standard input",
		Long: `put stores VALUE under KEY; without VALUE, or with -, the value is standard
input. Keys are 1 to 1024 bytes; the largest value is what the key's server
advertises: its --lease-size less 1056 bytes (1,047,520 by default). Both are
checked before anything is written, and a value on stdin as soon as it passes
the limit.`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := g.parseKey(args[0])
			if err != nil {
				return err
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				var value []byte
				if len(args) == 2 && args[1] != "-" {
					value = []byte(args[1])
				} else {
					// The owner's limit first, so that a value too large
					// fails at once rather than after all of stdin.
					lim, err := c.Limits(key)
					if err != nil {
						return err
					}
					if value, err = g.readValue(cmd, int64(lim.MaxValueLen)); err != nil {
						return err
					}
				}
				if err := c.Put(ctx, key, value); err != nil {
					return err
				}
				if g.output == "json" {
					return writeJSON(cmd.OutOrStdout(), map[string]any{"key": args[0], "size": len(value), "ok": true})
				}
				fmt.Fprintln(cmd.OutOrStdout(), "OK")
				return nil
			})
		},
	}
}

func delCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "del KEY",
		Aliases: []string{"delete", "rm"},
		Short:   "delete KEY (deleting an absent key is not an error)",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := g.parseKey(args[0])
			if err != nil {
				return err
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				if err := c.Delete(ctx, key); err != nil {
					return err
				}
				if g.output == "json" {
					return writeJSON(cmd.OutOrStdout(), map[string]any{"key": args[0], "ok": true})
				}
				fmt.Fprintln(cmd.OutOrStdout(), "OK")
				return nil
			})
		},
	}
}

func scanCmd(g *globals) *cobra.Command {
	var prefix, start, end string
	var limit int
	var values, keysOnly bool
	cmd := &cobra.Command{
		Use:   "scan [--prefix P | --start S --end E] [--limit N] [--values | --keys-only]",
		Short: "list keys in order, from every server, with their value sizes (or values); a header and the count on a terminal only",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if prefix != "" && (cmd.Flags().Changed("start") || cmd.Flags().Changed("end")) {
				return errors.New("--prefix excludes --start and --end")
			}
			if limit < 0 {
				return fmt.Errorf("--limit %d: must be 0 (no limit) or more", limit)
			}
			if values && keysOnly {
				return errors.New("--values and --keys-only: give one")
			}
			var s, e []byte
			opts := []client.OpOption{client.WithLimit(limit)}
			if prefix != "" {
				s = []byte(prefix)
				opts = append(opts, client.WithPrefix())
			} else {
				s = []byte(start)
				if end != "" {
					e = []byte(end)
				}
			}
			if keysOnly {
				opts = append(opts, client.WithKeysOnly()) // no value is read
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				kvs, err := c.Scan(ctx, s, e, opts...)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if g.output == "json" {
					list := make([]kvJSON, 0, len(kvs))
					for _, kv := range kvs {
						list = append(list, toKVJSON(kv.Key, kv.Value, values))
					}
					return writeJSON(out, list)
				}
				if keysOnly { // for scripts: a key a line, nothing else
					for _, kv := range kvs {
						fmt.Fprintln(out, printable(kv.Key))
					}
					return nil
				}
				// The header and the count are for a human at a terminal,
				// as in redis-cli and etcdctl: into a pipe or a file go the
				// rows alone, KEY<TAB>SIZE (or VALUE), which cut -f and mput
				// read as they are.
				human := stdoutIsTerminal(cmd)
				w := out
				var tw *tabwriter.Writer
				if human {
					tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
					w = tw
					if values {
						fmt.Fprintln(tw, "KEY\tVALUE")
					} else {
						fmt.Fprintln(tw, "KEY\tSIZE")
					}
				}
				for _, kv := range kvs {
					if values {
						fmt.Fprintf(w, "%s\t%s\n", printable(kv.Key), printable(kv.Value))
					} else {
						fmt.Fprintf(w, "%s\t%d\n", printable(kv.Key), len(kv.Value))
					}
				}
				if !human {
					return nil
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				fmt.Fprintf(out, "(%d keys)\n", len(kvs))
				return nil
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&prefix, "prefix", "", "keys that start with P")
	f.StringVar(&start, "start", "", "first key (inclusive)")
	f.StringVar(&end, "end", "", "end key (exclusive; default: no bound)")
	f.IntVar(&limit, "limit", 0, "at most N keys (0: no limit)")
	f.BoolVar(&values, "values", false, "print values instead of their sizes")
	f.BoolVar(&keysOnly, "keys-only", false, "print the keys alone, one a line, without the header and the count even on a terminal")
	return cmd
}

// printable quotes a value that is not plain printable text.
func printable(v []byte) string {
	s := string(v)
	if utf8.ValidString(s) && !strings.ContainsAny(s, "\t\n\r\x00") {
		return s
	}
	return fmt.Sprintf("%q", s)
}

func ownerCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "owner KEY",
		Short: "show which server holds KEY in the cluster map, and its shard",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := g.parseKey(args[0])
			if err != nil {
				return err
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				name, err := c.Owner(key)
				if err != nil {
					return err
				}
				shard := proto.ShardOf(key)
				m := c.Map()
				_, since := m.Owner(shard)
				mb, inView := c.View().Member(name)
				state := "not in the gossip view"
				if inView {
					state = mb.State.String()
				}
				out := cmd.OutOrStdout()
				if g.output == "json" {
					if err := writeJSON(out, map[string]any{"key": args[0], "owner": name, "shard": shard, "since_epoch": since,
						"map_epoch": m.Epoch(), "state": state, "control_addr": mb.Meta.ControlAddr, "gossip_addr": mb.Addr.String()}); err != nil {
						return err
					}
				} else {
					fmt.Fprintf(out, "%s\t%s (shard %d since epoch %d, map epoch %d; %s, control %s, gossip %s)\n",
						args[0], name, shard, since, m.Epoch(), state, dash(mb.Meta.ControlAddr), mb.Addr)
				}
				if !inView || mb.State != membership.StateAlive {
					return &client.UnavailableError{Node: name, Reason: "the key's server is " + state}
				}
				return nil
			})
		},
	}
}

// memberJSON is one member of `members --output json`. Addresses and rkeys
// are hex strings, as in the table.
type memberJSON struct {
	Name          string      `json:"name"`
	State         string      `json:"state"`
	Role          string      `json:"role"`
	GossipAddr    string      `json:"gossip_addr"`
	ControlAddr   string      `json:"control_addr,omitempty"`
	Provider      string      `json:"provider,omitempty"`
	Endpoint      string      `json:"endpoint,omitempty"`
	Generation    uint64      `json:"generation,omitempty"`
	Leaving       bool        `json:"leaving,omitempty"`
	Version       string      `json:"version,omitempty"`
	Index         *indexJSON  `json:"index,omitempty"`
	Arenas        []arenaJSON `json:"arenas"`
	ArenasPending bool        `json:"arenas_pending,omitempty"`
	ServerID      string      `json:"server_id,omitempty"`
	MapEpoch      uint64      `json:"map_epoch,omitempty"`
	Zone          string      `json:"zone,omitempty"`
	shardsJSON
	Error string `json:"error,omitempty"`
}

// shardsJSON is a server's part in the cluster map this client holds (the
// freshest it got), in members' and status's rows: the shards it is
// primary of, backs up (an in-sync backup: every write waits for it) and
// catches up on (the target of a move copying the shard to it, not an
// owner yet: no write waits for it); and, the same on every row, the
// map's replica count, its shards with fewer holders than min(that count,
// active servers), with at least that many, and with a copy in progress.
type shardsJSON struct {
	ShardsPrimary      int `json:"shards_primary"`
	ShardsBackup       int `json:"shards_backup"`
	ShardsCatchingUp   int `json:"shards_catching_up"`
	MapReplicas        int `json:"map_replicas"`
	MapUnderReplicated int `json:"map_under_replicated"`
	MapInSync          int `json:"map_in_sync"`
	MapCatchingUp      int `json:"map_catching_up"`
}

// shardRoles is shardsJSON for each server of m.
func shardRoles(m *clustermap.Map) func(name string) shardsJSON {
	primaries, backups, catching, r := m.Counts(), m.Backups(), m.CatchingUp(), m.Replication()
	return func(name string) shardsJSON {
		return shardsJSON{ShardsPrimary: primaries[name], ShardsBackup: backups[name], ShardsCatchingUp: catching[name],
			MapReplicas: r.Replicas, MapUnderReplicated: r.UnderReplicated, MapInSync: r.InSync, MapCatchingUp: r.CatchingUp}
	}
}

// replicationLine is the map's replica count and how its shards stand, in
// one line under members' and status's tables.
func replicationLine(m *clustermap.Map) string {
	r := toReplicationJSON(m)
	line := fmt.Sprintf("map epoch %d: replicas: %d wanted (%s a shard with %s), %s in sync at %d, %d under-replicated, %d catching up",
		r.MapEpoch, r.Replicas, plural(r.Target, "copy"), plural(r.ActiveServers, "active server"),
		plural(r.InSync, "shard"), r.Target, r.UnderReplicated, r.CatchingUp)
	if r.OverReplicated > 0 {
		line += fmt.Sprintf(", %d over-replicated", r.OverReplicated)
	}
	return line
}

type indexJSON struct {
	Addr         string `json:"addr"`
	RKey         string `json:"rkey"`
	Slots        uint64 `json:"slots"`
	Neighborhood int    `json:"neighborhood"`
	Bytes        int    `json:"bytes"`
}

// arenaJSON is one advertised region: a registered unit of an arena, the
// arena's bytes from Offset on.
type arenaJSON struct {
	ID     uint16 `json:"id"`
	Offset uint64 `json:"offset"`
	Addr   string `json:"addr"`
	Length uint64 `json:"length"`
	RKey   string `json:"rkey"`
}

func toMemberJSON(m membership.Member, roles func(string) shardsJSON) memberJSON {
	j := memberJSON{Name: m.Name, State: m.State.String(), Role: m.Meta.Role.String(), GossipAddr: m.Addr.String(),
		ControlAddr: m.Meta.ControlAddr, Provider: m.Meta.Provider, Endpoint: m.Meta.Endpoint.String(),
		Generation: m.Meta.Generation, Leaving: m.Meta.Leaving, Version: m.Meta.RKVVersion,
		ArenasPending: m.ArenasPending, Arenas: []arenaJSON{}, ServerID: m.Meta.ServerID, MapEpoch: m.Meta.MapEpoch,
		Zone: m.Meta.Zone, shardsJSON: roles(m.Name)}
	if m.MetaErr != nil {
		j.Error = m.MetaErr.Error()
	}
	if x := m.Meta.Index; x != nil {
		j.Index = &indexJSON{Addr: fmt.Sprintf("%#x", x.Addr), RKey: fmt.Sprintf("%#x", x.RKey), Slots: x.Geometry.Slots,
			Neighborhood: x.Geometry.Neighborhood, Bytes: x.Geometry.TableBytes()}
	}
	for _, a := range m.Meta.Arenas {
		j.Arenas = append(j.Arenas, arenaJSON{ID: a.ID, Offset: a.Offset, Addr: fmt.Sprintf("%#x", a.Addr), Length: a.Length, RKey: fmt.Sprintf("%#x", a.RKey)})
	}
	return j
}

// ready reports whether m is an alive server that advertises its index and
// at least arenas arenas (a unit of each, at least).
func ready(m membership.Member, arenas int) bool {
	return m.IsServer() && m.Meta.Index != nil && !m.ArenasPending && arenaCount(m.Meta.Arenas) >= arenas
}

// arenaCount counts the arenas of an advertised region list, which has a
// region per registered unit of each, sorted by arena.
func arenaCount(regions []proto.ArenaRegion) int {
	n := 0
	for i, r := range regions {
		if i == 0 || r.ID != regions[i-1].ID {
			n++
		}
	}
	return n
}

func membersCmd(g *globals) *cobra.Command {
	var all bool
	var expect, expectArenas int
	cmd := &cobra.Command{
		Use:   "members",
		Short: "show the cluster view: servers, their state, index and arenas (addr, rkey)",
		Long: `members prints this client's view of the cluster, as the server asked
(--endpoints) or the client's own gossip (--join) sees it: each server's
state, zone, control address, RDMA provider and data endpoint, generation,
the shards it is primary of, backs up (in sync: every write waits for it)
and catches up on (a move copying them to it, that no write waits for yet)
in the cluster map, hash index (addr, rkey, geometry) and registered arenas
(id, addr, length, rkey); under the table, the map's replica count and how
many shards have that many copies in sync (or as many as there are active
servers, when fewer), fewer (under-replicated), and a copy in progress
(catching up). The shards command lists them shard by shard.
Clients are listed with --all, through --join only (a server's answer lists
servers alone).

With --expect-servers N it first waits (up to --timeout) until N servers are
alive, each advertising its index and at least --expect-arenas arenas, and
the cluster map holds N servers with its shards balanced and no move in
progress; it exits 3 if that never happens: scripts use it to wait for a
cluster to settle.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				view := c.View()
				if expect > 0 {
					for {
						n := 0
						for _, m := range view.Members() {
							if ready(m, expectArenas) {
								n++
							}
						}
						m := c.Map()
						if n >= expect && members(m) >= expect && m.Settled() {
							break
						}
						select {
						case <-ctx.Done():
							if errors.Is(ctx.Err(), context.Canceled) { // a signal
								return ctx.Err()
							}
							return &exitError{exitUnavailable, fmt.Errorf("%d of %d servers ready (alive, index and %d arenas advertised), the map: %v, after %v",
								n, expect, expectArenas, m, g.timeout)}
						case <-time.After(50 * time.Millisecond):
						}
						_ = c.WaitMap(ctx, m.Epoch()+1, 100*time.Millisecond)
						view = c.View()
					}
				}
				self := c.Name()
				var ms []membership.Member
				for _, m := range view.Members() {
					if m.Name == self || (!all && m.Meta.Role != proto.RoleServer && m.MetaErr == nil) {
						continue
					}
					ms = append(ms, m)
				}
				sort.Slice(ms, func(i, j int) bool { return ms[i].Name < ms[j].Name })
				out := cmd.OutOrStdout()
				cm := c.Map()
				roles := shardRoles(cm)
				if g.output == "json" {
					list := make([]memberJSON, 0, len(ms))
					for _, m := range ms {
						list = append(list, toMemberJSON(m, roles))
					}
					return writeJSON(out, list)
				}
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tSTATE\tROLE\tZONE\tCONTROL\tPROVIDER\tENDPOINT\tGEN\tMAP\tPRIMARY\tBACKUP\tCATCHING UP\tINDEX ADDR\tINDEX RKEY\tSLOTSxNBHD\tARENAS")
				var arenas [][]string
				for _, m := range ms {
					j := toMemberJSON(m, roles)
					idx := "-\t-\t-"
					if j.Index != nil {
						idx = fmt.Sprintf("%s\t%s\t%dx%d", j.Index.Addr, j.Index.RKey, j.Index.Slots, j.Index.Neighborhood)
					}
					n := arenaCount(m.Meta.Arenas)
					narenas := fmt.Sprint(n)
					if len(m.Meta.Arenas) > n {
						narenas += fmt.Sprintf(" (%d units)", len(m.Meta.Arenas))
					}
					if j.ArenasPending {
						narenas += " (list pending)"
					}
					state := j.State
					if j.Leaving {
						state += " (leaving)"
					}
					primary, backup, catching := "-", "-", "-"
					if cm.Member(j.Name) {
						primary, backup, catching = fmt.Sprint(j.ShardsPrimary), fmt.Sprint(j.ShardsBackup), fmt.Sprint(j.ShardsCatchingUp)
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n", j.Name, state, j.Role, dash(j.Zone), dash(j.ControlAddr), dash(j.Provider),
						dash(j.Endpoint), j.Generation, j.MapEpoch, primary, backup, catching, idx, narenas)
					for _, a := range j.Arenas {
						arenas = append(arenas, []string{j.Name, fmt.Sprint(a.ID), human(a.Offset), a.Addr, human(a.Length), a.RKey})
					}
				}
				if len(arenas) > 0 {
					fmt.Fprintln(tw)
					fmt.Fprintln(tw, "NODE\tARENA\tOFFSET\tADDR\tLENGTH\tRKEY")
					for _, a := range arenas {
						fmt.Fprintln(tw, strings.Join(a, "\t"))
					}
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				if cm.Bootstrapped() {
					fmt.Fprintln(out, replicationLine(cm))
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "list clients too")
	cmd.Flags().IntVar(&expect, "expect-servers", 0, "wait until this many servers are ready (see above)")
	cmd.Flags().IntVar(&expectArenas, "expect-arenas", 1, "with --expect-servers: arenas each server must advertise")
	return cmd
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func human(n uint64) string {
	for _, u := range []struct {
		s string
		m uint64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.m && n%u.m == 0 {
			return fmt.Sprintf("%d%s", n/u.m, u.s)
		}
	}
	return fmt.Sprint(n)
}

type statusJSON struct {
	Name         string `json:"name"`
	State        string `json:"state"`
	ControlAddr  string `json:"control_addr"`
	Generation   uint64 `json:"generation"`
	Arenas       int    `json:"arenas_registered"`
	Keys         uint64 `json:"keys"`
	Commits      uint64 `json:"commits"`
	Deletes      uint64 `json:"deletes"`
	LeasesActive uint64 `json:"leases_active"`
	Connections  uint64 `json:"connections"`
	Handled      uint64 `json:"control_requests"`
	MapEpoch     uint64 `json:"map_epoch"`
	Shards       uint64 `json:"shards_owned"` // by the server's store
	Zone         string `json:"zone,omitempty"`
	shardsJSON          // by the client's map
	// The moves into the server: shards copying now, shards moved in since
	// it started, what they copied and how fast.
	ShardsIncoming uint64  `json:"shards_incoming"`
	ShardsMovedIn  uint64  `json:"shards_moved_in"`
	CopiedKeys     uint64  `json:"copied_keys"`
	CopiedBytes    uint64  `json:"copied_bytes"`
	CopyMiBPerSec  float64 `json:"copy_mib_per_s,omitempty"`
	// CatchUp is the moves copying shards into the server now, by its
	// Stats: how far it has come catching up.
	CatchUp catchUpJSON `json:"catch_up"`
	// Space: live, dead (for the cleaner) and free bytes of the arenas'
	// capacity, and what the cleaner did.
	LiveBytes         uint64            `json:"live_bytes"`
	DeadBytes         uint64            `json:"dead_bytes"`
	FreeBytes         uint64            `json:"free_bytes"`
	CapacityBytes     uint64            `json:"capacity_bytes"`
	SegmentsCleaned   uint64            `json:"segments_cleaned"`
	CleanerMovedBytes uint64            `json:"cleaner_moved_bytes"`
	RequestsByType    map[string]uint64 `json:"requests_by_type,omitempty"`
	IndexSlots        uint64            `json:"index_slots"`
	Ready             bool              `json:"ready"`
	NotReady          string            `json:"not_ready,omitempty"`
	Error             string            `json:"error,omitempty"`
}

func statusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "per server: keys, shards, moves in progress, commits, leases (Stats RPC and gossip)",
		Long: `status asks every server of the view for its counters (the control RPC's
Stats) and adds what gossip says (state, arenas registered): keys, the arena
bytes live (current records), dead (superseded or deleted, for the cleaner to
reclaim) and free, the map epoch it holds, the shards it is primary of and
backs up (in sync) and catches up on (the target of a copy, not awaited
yet) in the cluster map (shards_owned in the JSON output is what its store
serves), shard moves into it (shards copying now, moved in since it
started, keys and bytes copied, MiB/s), commits,
deletes, leases, connections and control requests. A server that answers but
does not serve yet (no arena registered, or the map does not hold it) shows
"not ready" in STATE, the reason in the JSON output. A server that does not
answer is listed with its error, and the exit code is then 3. Under the
table: for each server copying shards in now, how far its copy has come by
its own count (shards, of them those past their full first pass, bytes and
keys copied, MiB/s since the copy began; catch_up in the JSON output); then
the map's replica count and how many shards have that many copies in sync
(or as many as there are active servers, when fewer), fewer
(under-replicated) and a copy in progress (catching up).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				var rows []statusJSON
				var failed error
				cm := c.Map()
				roles := shardRoles(cm)
				for _, m := range c.View().Members() {
					if m.Meta.Role != proto.RoleServer {
						continue
					}
					r := statusJSON{Name: m.Name, State: m.State.String(), ControlAddr: m.Meta.ControlAddr,
						Generation: m.Meta.Generation, Arenas: arenaCount(m.Meta.Arenas), Zone: m.Meta.Zone, shardsJSON: roles(m.Name)}
					if m.Meta.Detached() && len(m.Meta.Arenas) == 0 {
						r.Arenas = m.Meta.ArenaSet.Count // regions, as the list is pending: at least the arenas
					}
					st, err := c.Stats(ctx, m.Name)
					if err != nil {
						r.Error = err.Error()
						if failed == nil {
							failed = err
						}
					} else {
						r.Generation, r.Keys, r.Commits, r.Deletes = st.Generation, st.Keys, st.Commits, st.Deletes
						r.LeasesActive, r.Connections, r.Handled = st.LeasesActive, st.Connections, st.Handled
						r.MapEpoch, r.Shards, r.ShardsIncoming, r.ShardsMovedIn = st.MapEpoch, st.ShardsOwned, st.ShardsIncoming, st.ShardsMovedIn
						r.CopiedKeys, r.CopiedBytes, r.RequestsByType = st.CopiedKeys, st.CopiedBytes, st.Requests
						r.LiveBytes, r.DeadBytes, r.FreeBytes, r.CapacityBytes = st.LiveBytes, st.DeadBytes, st.FreeBytes, st.CapacityBytes
						r.SegmentsCleaned, r.CleanerMovedBytes = st.SegmentsCleaned, st.CleanerMovedBytes
						r.IndexSlots, r.Ready, r.NotReady = st.IndexSlots, st.NotReady == "", st.NotReady
						if !r.Ready {
							r.State += ", not ready"
						}
						if st.CopyTime > 0 {
							r.CopyMiBPerSec = float64(st.CopiedBytes) / (1 << 20) / st.CopyTime.Seconds()
						}
						r.CatchUp = toCatchUpJSON(st.Copying)
					}
					rows = append(rows, r)
				}
				slices.SortFunc(rows, func(a, b statusJSON) int { return strings.Compare(a.Name, b.Name) })
				out := cmd.OutOrStdout()
				if g.output == "json" {
					if err := writeJSON(out, rows); err != nil {
						return err
					}
				} else {
					tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "NAME\tSTATE\tZONE\tCONTROL\tGEN\tARENAS\tKEYS\tLIVE\tDEAD\tFREE\tMAP\tPRIMARY\tBACKUP\tCATCHING UP\tMOVING IN\tCOMMITS\tDELETES\tLEASES\tCONNS\tREQUESTS")
					for _, r := range rows {
						if r.Error != "" {
							fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\terror: %s\n", r.Name, r.State, dash(r.Zone), r.ControlAddr, r.Generation, r.Arenas, r.Error)
							continue
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%d\t%d\t%d\n", r.Name, r.State, dash(r.Zone), r.ControlAddr, r.Generation, r.Arenas,
							r.Keys, humanBytes(r.LiveBytes), humanBytes(r.DeadBytes), humanBytes(r.FreeBytes),
							r.MapEpoch, r.ShardsPrimary, r.ShardsBackup, r.ShardsCatchingUp, moving(r), r.Commits, r.Deletes, r.LeasesActive, r.Connections, r.Handled)
					}
					if err := tw.Flush(); err != nil {
						return err
					}
					for _, r := range rows {
						if r.CatchUp.Shards > 0 {
							fmt.Fprintf(out, "%s catching up: %s\n", r.Name, catchUpLine(r.CatchUp))
						}
					}
					if cm.Bootstrapped() {
						fmt.Fprintln(out, replicationLine(cm))
					}
				}
				if failed != nil {
					return &exitError{exitUnavailable, fmt.Errorf("not every server answered: %w", failed)}
				}
				return nil
			})
		},
	}
}

// moving summarizes a server's moves in: "-" when it never had any.
func moving(r statusJSON) string {
	if r.ShardsIncoming == 0 && r.ShardsMovedIn == 0 {
		return "-"
	}
	return fmt.Sprintf("%d now, %d done, %d keys, %s at %.1f MiB/s", r.ShardsIncoming, r.ShardsMovedIn, r.CopiedKeys, humanBytes(r.CopiedBytes), r.CopyMiBPerSec)
}

type mapServerJSON struct {
	Name    string `json:"name"`
	ID      string `json:"id"`
	State   string `json:"state"`
	Zone    string `json:"zone,omitempty"`
	Added   uint64 `json:"added_epoch"`
	Shards  int    `json:"shards"` // primary of
	Backups int    `json:"backups"`
	Alive   bool   `json:"alive"`
}

type mapMoveJSON struct {
	Shard   proto.Shard `json:"shard"`
	Kind    string      `json:"kind"` // replace, add-replica or promote
	From    string      `json:"from"`
	To      string      `json:"to"`
	Phase   string      `json:"phase"`
	Started uint64      `json:"started_epoch"`
}

func mapCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "map",
		Short: "show the cluster map: its epoch, the servers and their shards, the moves in progress",
		Long: `map prints the cluster map as a server holds it (the freshest this client
can get): the epoch, each server with its state in the map (active or
draining), its zone, the shards it is primary of and backs up and whether
gossip sees it alive, the replica count, and the shard moves in progress
(their kind: replace, add-replica or promote; copying, or frozen for their
last copy).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				m := c.Map()
				counts, backups := m.Counts(), m.Backups()
				view := c.View()
				var servers []mapServerJSON
				for _, s := range m.Servers() {
					mb, ok := view.Member(s.Name)
					servers = append(servers, mapServerJSON{Name: s.Name, ID: s.ID, State: s.State.String(), Zone: s.Zone, Added: s.Added,
						Shards: counts[s.Name], Backups: backups[s.Name], Alive: ok && mb.IsServer() && mb.Meta.ServerID == s.ID})
				}
				moves := []mapMoveJSON{}
				for _, mv := range m.Moves() {
					moves = append(moves, mapMoveJSON{Shard: mv.Shard, Kind: mv.Kind.String(), From: mv.From, To: mv.To, Phase: mv.Phase.String(), Started: mv.Started})
				}
				out := cmd.OutOrStdout()
				if g.output == "json" {
					return writeJSON(out, map[string]any{"epoch": m.Epoch(), "cluster_id": fmt.Sprintf("%016x", m.ClusterID()), "replicas": m.Replicas(),
						"servers": servers, "moves": moves})
				}
				fmt.Fprintf(out, "epoch %d, cluster %016x, %d shards, %d replicas\n", m.Epoch(), m.ClusterID(), proto.NumShards, m.Replicas())
				tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "SERVER\tID\tSTATE\tZONE\tALIVE\tSHARDS\tBACKUPS\tADDED")
				for _, s := range servers {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%v\t%d\t%d\t%d\n", s.Name, s.ID, s.State, dash(s.Zone), s.Alive, s.Shards, s.Backups, s.Added)
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				if len(moves) > 0 {
					fmt.Fprintf(out, "%d moves in progress:\n", len(moves))
					tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "SHARD\tKIND\tFROM\tTO\tPHASE\tSTARTED")
					for _, mv := range moves {
						fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\n", mv.Shard, mv.Kind, mv.From, mv.To, mv.Phase, mv.Started)
					}
					return tw.Flush()
				}
				return nil
			})
		},
	}
}

func forgetCmd(g *globals) *cobra.Command {
	var force, noWait bool
	cmd := &cobra.Command{
		Use:   "forget NODE",
		Short: "remove a server from the cluster: its shards move to the others first (--force: drop a dead one's)",
		Long: `forget removes server NODE from the cluster map. A live server is drained:
its shards move to the other servers (reads and writes go on), then it is
removed; forget shows the progress and returns when NODE is gone (or at once
with --no-wait). Stop the server afterwards.

A dead server's shards cannot be copied. forget refuses it unless --force, which
removes it at once and gives its shards to the others empty: with one copy of
each key, its keys are lost. Restarting a forgotten server with its old data
directory makes it drop that data.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			node := args[0]
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				epoch, err := c.Forget(ctx, node, force)
				if err != nil {
					return err
				}
				out := cmd.OutOrStdout()
				if force || noWait {
					fmt.Fprintf(out, "%s: removal committed at map epoch %d\n", node, epoch)
					return nil
				}
				// The drain outlives the operation timeout: wait without it.
				wait := context.WithoutCancel(ctx)
				last := ""
				for {
					m := c.Map()
					if !m.Member(node) {
						fmt.Fprintf(out, "%s: removed from the map (epoch %d)\n", node, m.Epoch())
						return nil
					}
					moving := 0
					for _, mv := range m.Moves() {
						if mv.From == node {
							moving++
						}
					}
					line := fmt.Sprintf("%s: draining, %d shards left, %d moving (map epoch %d)", node, m.Counts()[node], moving, m.Epoch())
					if line != last {
						fmt.Fprintln(out, line)
						last = line
					}
					select {
					case <-cmd.Context().Done():
						return &exitError{exitOther, fmt.Errorf("interrupted: the drain of %s goes on without this command", node)}
					case <-time.After(250 * time.Millisecond):
					}
					if err := c.WaitMap(wait, m.Epoch()+1, time.Second); err != nil && !errors.Is(err, context.DeadlineExceeded) {
						return err
					}
				}
			})
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "remove a dead server at once, giving its shards to the others empty (its keys are lost)")
	cmd.Flags().BoolVar(&noWait, "no-wait", false, "return once the drain has started")
	return cmd
}

// members is how many servers the map holds that were not removed.
func members(m *clustermap.Map) int {
	n := 0
	for _, s := range m.Servers() {
		if s.State != proto.ServerRemoved {
			n++
		}
	}
	return n
}

// humanBytes is n in the largest binary unit it reaches, one decimal.
func humanBytes(n uint64) string {
	for _, u := range []struct {
		s string
		m uint64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.m {
			return fmt.Sprintf("%.1f %s", float64(n)/float64(u.m), u.s)
		}
	}
	return fmt.Sprintf("%d B", n)
}
