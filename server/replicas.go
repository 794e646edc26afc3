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
// that holds it. The leader's planner then adds replicas (Plan). A count
// below what shards already hold is refused while dropping backups is not
// built.
func (s *Server) setReplicas(req *proto.SetReplicas) proto.Message {
	m := s.Map()
	if !m.Bootstrapped() {
		return &proto.Error{Code: proto.CodeUnavailable, Message: fmt.Sprintf("setting the replica count to %d: %s holds no cluster map yet", req.Replicas, s.cfg.Name)}
	}
	if most := m.MostHolders(); req.Replicas < most {
		// The leader drops no surplus backup yet (clustermap.PlanDrops is
		// not run), so the shards would keep their copies and the map
		// would never settle: refuse rather than pretend.
		return &proto.Error{Code: proto.CodeBadRequest, Message: fmt.Sprintf(
			"lowering the replica count to %d is not built yet: shards hold (or are being given) %d copies, and the map's leader does not drop surplus backups; the count stays %d (map epoch %d)",
			req.Replicas, most, m.Replicas(), m.Epoch())}
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

// noteReplicasIgnored says, once the server holds a map, that
// Config.Replicas is ignored when it differs from the map's: only the
// bootstrap of a new cluster applies it, as the map is the authority on
// the count (a restart with another flag must not change it behind the
// operator's back).
func (s *Server) noteReplicasIgnored() {
	defer s.wg.Done()
	for {
		changed := s.node.Changed()
		if m := s.Map(); m.Bootstrapped() {
			if m.Replicas() != s.cfg.Replicas {
				s.log.Info("replica count given (--replicas) ignored: the cluster map's stands; change it with rkv-client replicas N",
					"given", s.cfg.Replicas, "map_replicas", m.Replicas(), "epoch", m.Epoch())
			}
			return
		}
		select {
		case <-s.stop:
			return
		case <-changed:
		case <-time.After(time.Second):
		}
	}
}
