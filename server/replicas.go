// Replication's configuration after the bootstrap: clients changing the replica count (SetReplicas), and Config.Replicas ignored on a restart or a join.

package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rkv-io/rkv/proto"
)

// setReplicas answers SetReplicas: the count is proposed through the map's
// leader as forget's changes are, and the answer is the epoch of the map
// that holds it. The leader's planner then adds replicas (Plan) or drops
// the surplus backups (PlanDrops).
func (s *Server) setReplicas(req *proto.SetReplicas) proto.Message {
	m := s.Map()
	if !m.Bootstrapped() {
		return &proto.Error{Code: proto.CodeUnavailable, Message: fmt.Sprintf("setting the replica count to %d: %s holds no cluster map yet", req.Replicas, s.cfg.Name)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	next, err := s.propose(ctx, &proto.MapCommand{Op: proto.MapSetReplicas, Replicas: req.Replicas})
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		// No leader reached, or its change not seen here in time: worth
		// a retry (the command is idempotent).
		return &proto.Error{Code: proto.CodeUnavailable, Message: fmt.Sprintf("setting the replica count to %d: %v", req.Replicas, err)}
	case err != nil:
		return &proto.Error{Code: proto.CodeBadRequest, Message: fmt.Sprintf("setting the replica count to %d: %v", req.Replicas, err)}
	}
	s.log.Info("replica count set", "replicas", next.Replicas(), "was", m.Replicas(), "epoch", next.Epoch())
	return &proto.MapChangeReply{Epoch: next.Epoch()}
}

// noteReplicasIgnored says, once the server holds the cluster's map, that
// Config.Replicas is ignored when it differs from the map's count: only
// the bootstrap of a new cluster applies it, as the map is the authority
// (a restart with another setting must not change it behind the
// operator's back). The map it compares with is the replica's once a
// leader is known and the map has stood still for replayQuiet: a restart
// replays the log, so the maps before (the one saved at the last stop,
// those of the first entries replayed) may predate the count.
func (s *Server) noteReplicasIgnored() {
	defer s.wg.Done()
	for {
		changed := s.node.Changed()
		m := s.node.Map()
		leader, _ := s.node.Leader()
		select {
		case <-s.stop:
			return
		case <-changed:
			continue
		case <-time.After(replayQuiet):
		}
		if !m.Bootstrapped() || leader == "" {
			continue
		}
		if m.Replicas() != s.cfg.Replicas {
			s.log.Info("replica count given (--replicas) ignored: the cluster map's stands; change it with rkv-client replicas N",
				"given", s.cfg.Replicas, "map_replicas", m.Replicas(), "epoch", m.Epoch())
		}
		return
	}
}

// replayQuiet is how long a restarted server's map must stand still, with
// a leader known, to be taken as replayed: the log's entries apply within
// milliseconds of each other once the leader is known.
const replayQuiet = time.Second
