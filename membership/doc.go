// Package membership runs rkv's cluster membership over hashicorp/memberlist
// (SWIM gossip): who is in the cluster, what each server advertises for
// one-sided reads, and which servers hold a key.
//
// # Nodes and metadata
//
// Every node, server or client, is a memberlist member. It gossips a
// proto.NodeMeta: its role, control address, RDMA provider and endpoint,
// and, for a server, its generation, hash-index region and arenas (address,
// length, rkey). A server calls SetMeta each time that changes, e.g. when
// another arena finishes its asynchronous registration.
//
// memberlist caps metadata at 512 bytes, which holds a server's index and
// up to 17 arenas (10 with every field at its widest; measured in
// proto.TestNodeMetaSize). Beyond that the metadata carries only the arena
// count and a digest (proto.ArenaSet), and the list itself (a
// proto.ArenaTable) travels two ways: the server pushes it to every member
// with a reliable (TCP) user message when it changes, and to each member
// that joins; and every node includes the tables it knows in memberlist's
// push/pull state (LocalState/MergeRemoteState), so a joining node gets
// them all from its seed and anti-entropy repairs any push that failed. A
// table is accepted only when it matches the generation and digest of the
// metadata memberlist delivered for its node. Until it arrives,
// Member.ArenasPending is set.
//
// # Clients are light members
//
// Clients learn the view from gossip by joining memberlist themselves,
// with role client; they hold no data. The alternative, clients
// asking a server for the view over the control RPC and watching it,
// would need a control protocol and a server to proxy every change, and
// would put a server on the path of every client's view. As members,
// clients see failures as fast as servers do, receive arena tables
// directly, and cost the servers little: SWIM's probe load per node does
// not grow with the cluster, and a client is one more entry in push/pull
// state. The costs are accepted knowingly: every client holds the gossip
// key (so a client could forge gossip, as a server could), takes part in
// failure detection (an overloaded client can make others suspect a server
// until it refutes), and must be reachable by UDP and TCP from every node,
// which RDMA's data path requires of it anyway. For short-lived clients
// (a CLI command, which would pay ~250 ms to join) the client package has
// the other design too, without a watch: client.Config.Endpoints asks a
// server for its view (proto.GetView) and asks again on failures and
// every second while in use, through View values made by NewView.
//
// # Joining, restarting, leaving
//
// memberlist spreads news by gossip: UDP messages sent to a few members
// picked at random, a fixed number of times, and by a periodic full-state
// exchange (push/pull, TCP) with one random member. Gossip can miss a
// member, and does more often when members that are gone but not yet
// detected are among those picked; then only the next push/pull repairs
// it. Two events are not left to that:
//
//   - A restart. A node started again under its name and address starts
//     memberlist at a low incarnation number, which members that still
//     hold its previous incarnation (alive, suspect or dead) ignore. When
//     its join shows it such a record (memberlist's MergeDelegate),
//     memberlist refutes it with a higher number, and Join then exchanges
//     full state with the alive servers (up to 8) until their answers
//     show the current record; a server does so after every join. So when
//     Create returns, the servers hold the new incarnation, generation and
//     control address, and so does every client that joins through them.
//   - A departure. Leave sends the Leaving metadata and then memberlist's
//     leave message by gossip, and each also by exchanges with the alive
//     servers (the first until the servers show it, so that none takes the
//     leave for a death), which spread them further. A node that stops
//     without Leave is declared dead by failure detection, after
//     memberlist's suspicion timeout.
//
// A member reconnects to the servers it holds dead: every
// Tuning.ReconnectInterval it exchanges state with up to 8 of them (and
// with its seeds when it sees no server alive), so that a partition
// longer than memberlist's GossipToTheDeadTime, after which neither side
// would contact the other again, heals once the network does.
//
// Names are unique: memberlist refuses a node that claims the name of a
// live member at another address. The members that see the claim, that
// member included, log it at ERROR (memberlist's ConflictDelegate), and
// the newcomer's Create fails with an error naming the name and the live
// member's address. A dead member's name is free again once memberlist
// forgets it (GossipToTheDeadTime); a restart at the same address reuses
// it at once.
//
// # The view
//
// View returns an immutable snapshot: the members (name, gossip address,
// state, decoded metadata) and a version that grows by one per change.
// Dead and left servers stay in it (StateDead, StateLeft) for
// Tuning.DeadRetention (default 1 h), then are reaped; other members
// (clients) are reaped as soon as they are dead or left. memberlist's
// suspect state is not observable through its API, so a suspect member
// stays StateAlive until it is declared dead. Whether a member left or
// died is told by its Leaving metadata: a member whose leave message
// arrives before that metadata is recorded dead.
//
// A server logs each change of another member at INFO: joined (with its
// generation and control address), left, dead, restarted (same name, new
// generation: old and new generation and control address), and a server
// reaped; a client logs them at DEBUG. Name conflicts are logged at ERROR.
//
// Subscribe delivers each change as an Event carrying the view it produced.
// memberlist calls its event delegate while holding its own lock, so
// delivery never blocks: each subscriber has a buffer of
// Config.EventBuffer events and, when it is full, the oldest event is
// dropped for the newest. Gaps in the versions tell a subscriber that it
// missed events; the newest event always arrives.
//
// # No placement
//
// The view says who is alive and where to reach them; it decides nothing
// about where keys live. That is the cluster map's (package clustermap),
// which a server being dead, paused or restarted does not change.
//
// # Encryption and key rotation
//
// With Config.SecretKey, memberlist encrypts every packet and stream with
// AES-GCM and refuses anything else, so a node without the key can neither
// join nor read metadata. Without one, rkeys travel in clear text, and any
// host that can send to the RDMA network can read server memory with them:
// Create logs a warning and Warning says so.
//
// To rotate keys without a partition, do each step on every node before
// the next: InstallKey(new) (nodes now decrypt with both keys), UseKey(new)
// (nodes encrypt with the new key, which everyone can read), then
// RemoveKey(old). Key changes are local; the operator (or a future control
// command) runs them on each node, and a node restarted meanwhile must be
// given the new key in its Config.
//
// # Tuning
//
// Config.Tuning starts from memberlist's DefaultLocalConfig (probe every
// second, failure declared a few seconds later) and takes overrides; a
// server on a data-center network should use ProfileLAN. The tests use
// intervals of tens of milliseconds.
package membership
