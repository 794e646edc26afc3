// Logs of membership changes: INFO on a server, DEBUG on a client.

package membership

import (
	"context"
	"log/slog"

	"github.com/rkv-io/rkv/proto"
)

// changeLevel is the level of this node's logs of membership changes:
// INFO on a server, which operators read to follow the cluster, DEBUG on
// a client, whose user runs a command and wants its answer.
func (m *Membership) changeLevel() slog.Level {
	if m.isServer() {
		return slog.LevelInfo
	}
	return slog.LevelDebug
}

// memberAttrs are the attributes every log line about mb carries.
func memberAttrs(mb *Member) []slog.Attr {
	role := "?"
	if mb.MetaErr == nil {
		role = mb.Meta.Role.String()
	}
	return []slog.Attr{slog.String("member", mb.Name), slog.String("role", role), slog.String("addr", mb.Addr.String())}
}

// restarted reports whether before and after are two starts of one
// server: both servers, of different generations.
func restarted(before, after *Member) bool {
	return before.MetaErr == nil && after.MetaErr == nil &&
		before.Meta.Role == proto.RoleServer && after.Meta.Role == proto.RoleServer &&
		before.Meta.Generation != 0 && before.Meta.Generation != after.Meta.Generation
}

// logChangeLocked logs what observe made of memberlist's report about
// another member: kind is the event it published, before the member as it
// was (known false when it was not in the view), after as it is. A
// metadata update is logged only when it is a restart. The caller holds
// mu.
func (m *Membership) logChangeLocked(kind EventKind, before Member, known bool, after *Member) {
	ctx := context.Background()
	level := m.changeLevel()
	if !m.s.Logger.Enabled(ctx, level) {
		return
	}
	attrs := memberAttrs(after)
	var msg string
	switch {
	case (kind == EventJoin || kind == EventUpdate) && known && restarted(&before, after):
		msg = "member restarted"
		attrs = append(attrs,
			slog.Uint64("old_generation", before.Meta.Generation), slog.Uint64("new_generation", after.Meta.Generation),
			slog.String("old_control", before.Meta.ControlAddr), slog.String("new_control", after.Meta.ControlAddr))
		if before.State != StateAlive {
			attrs = append(attrs, slog.String("was", before.State.String()))
		}
	case kind == EventJoin:
		msg = "member joined"
		if after.MetaErr == nil && after.Meta.Role == proto.RoleServer {
			attrs = append(attrs, slog.Uint64("generation", after.Meta.Generation), slog.String("control", after.Meta.ControlAddr))
		}
		if known {
			attrs = append(attrs, slog.String("was", before.State.String()))
		}
		if after.MetaErr != nil {
			attrs = append(attrs, slog.String("meta_err", after.MetaErr.Error()))
		}
	case kind == EventLeave:
		msg = "member left"
	case kind == EventFail:
		msg = "member dead"
	default:
		return
	}
	m.s.Logger.LogAttrs(ctx, level, msg, attrs...)
}

// logReapLocked logs that mb was dropped from the view: at the level of
// membership changes for a server (its keys move now), DEBUG for others
// (reaped as soon as they went, which was logged). The caller holds mu.
func (m *Membership) logReapLocked(mb *Member) {
	level := slog.LevelDebug
	if retained(mb) {
		level = m.changeLevel()
	}
	attrs := append(memberAttrs(mb), slog.String("state", mb.State.String()), slog.Time("since", mb.Since))
	m.s.Logger.LogAttrs(context.Background(), level, "member reaped", attrs...)
}
