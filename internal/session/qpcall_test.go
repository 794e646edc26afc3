package session

import (
	"errors"
	"strings"
	"testing"

	"github.com/rkv-io/rkv/proto"
)

func frame(t testing.TB, id uint64, m proto.Message) []byte {
	t.Helper()
	b, err := proto.AppendFrame(nil, id, m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestQPReply(t *testing.T) {
	ok := frame(t, 7, &proto.CommitReply{Arena: 1, Offset: 64, Length: 100, Version: 3})
	refused := frame(t, 7, &proto.Error{Code: proto.CodeNotOwner, Message: "not mine"})
	for _, tc := range []struct {
		name  string
		frame []byte
		seq   uint64
		want  string // an error containing this; "" for none
	}{
		{"the reply", ok, 7, ""},
		{"the server's error", refused, 7, ""},
		{"another request's reply", ok, 8, "a reply to request 7, want 8"},
		{"three bytes", ok[:3], 7, "a reply of 3 bytes that is not one frame"},
		{"cut short", ok[:len(ok)-1], 7, "that is not one frame"},
		{"garbage after a right length", append([]byte{0, 0, 0, 2}, 0xc1, 0xc1), 7, "decoding"},
		{"a reply of another type", frame(t, 7, &proto.Ack{}), 7, "a Commit answered with Ack"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reply, err := QPReply(tc.frame, tc.seq, proto.MsgCommit, nil)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("error %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			case tc.want == "" && reply == nil:
				t.Fatal("no reply")
			}
		})
	}
	reply, _ := QPReply(refused, 7, proto.MsgCommit, nil)
	var pe *proto.Error
	if !errors.As(reply.(error), &pe) || pe.Code != proto.CodeNotOwner {
		t.Fatalf("the server's error came back as %#v", reply)
	}
}

// FuzzQPReply: no frame makes the decoding of a reply panic, and a reply
// it accepts is of the request's reply type or an Error.
func FuzzQPReply(f *testing.F) {
	f.Add(frame(f, 1, &proto.CommitReply{Arena: 1, Offset: 64, Length: 100, Version: 3}))
	f.Add(frame(f, 1, &proto.Error{Code: proto.CodeBadRequest, Message: "no"}))
	f.Add(frame(f, 1, &proto.Ack{}))
	f.Fuzz(func(t *testing.T, b []byte) {
		reply, err := QPReply(b, 1, proto.MsgCommit, &proto.CommitReply{})
		if err != nil {
			return
		}
		if tp := reply.Type(); tp != proto.MsgCommitReply && tp != proto.MsgError {
			t.Fatalf("accepted a %v as a Commit's reply", tp)
		}
	})
}
