package server

import (
	"testing"

	"github.com/rkv-io/rkv/proto"
)

// peerRequests is a sample of each request only servers may make: the
// hostile tests send them on a client session.
var peerRequests = map[proto.MsgType]proto.Message{
	proto.MsgMapChange:      &proto.MapChange{},
	proto.MsgShardScan:      &proto.ShardScan{},
	proto.MsgFenceShards:    &proto.FenceShards{},
	proto.MsgReleaseShards:  &proto.ReleaseShards{},
	proto.MsgReplicaCommit:  &proto.ReplicaCommit{},
	proto.MsgReplicaDelete:  &proto.ReplicaDelete{Key: []byte("k")},
	proto.MsgRenewReadLease: &proto.RenewReadLease{ServerID: "id"},
}

// TestHandlers: every request in proto's table but Hello (the handshake's)
// has a handler under its own type, no reply has one, and exactly the
// requests of peerRequests are peer-only.
func TestHandlers(t *testing.T) {
	for mt := proto.MsgType(1); int(mt) < proto.NumMsgTypes; mt++ {
		h := handlers[mt]
		switch {
		case mt == proto.MsgHello:
			if h.serve != nil {
				t.Errorf("Hello has a handler: the handshake takes it, and a second one must be refused")
			}
		case mt.Reply() != 0 && h.serve == nil:
			t.Errorf("%v is a request in proto's table with no handler", mt)
		case mt.Reply() == 0 && h.serve != nil:
			t.Errorf("%v is not a request, yet has a handler", mt)
		}
		if h.serve != nil && h.req != mt {
			t.Errorf("handlers[%v] takes %v", mt, h.req)
		}
		if _, want := peerRequests[mt]; h.peerOnly != want {
			t.Errorf("%v: peer-only %v, want %v", mt, h.peerOnly, want)
		}
	}
	for mt, m := range peerRequests {
		if m.Type() != mt {
			t.Errorf("peerRequests[%v] is a %v", mt, m.Type())
		}
	}
}
