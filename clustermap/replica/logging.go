// Raft's log, routed into the node's slog.Logger.

package replica

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"sort"

	"github.com/hashicorp/go-hclog"
)

// newRaftLogger returns an hclog.Logger (what hashicorp/raft logs through)
// whose lines go to log: hclog writes JSON, and each line becomes one slog
// record with raft's level, message and fields. Raft's errors about a
// peer it cannot reach repeat with backoff while that peer is down; they
// are logged at Warn.
func newRaftLogger(log *slog.Logger) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{
		Name:       "raft",
		Level:      hclog.Debug,
		JSONFormat: true,
		Output:     &slogWriter{log: log},
	})
}

// slogWriter turns hclog's JSON lines into slog records.
type slogWriter struct{ log *slog.Logger }

func (w *slogWriter) Write(p []byte) (int, error) {
	for _, line := range bytes.Split(bytes.TrimSpace(p), []byte("\n")) {
		var fields map[string]any
		if err := json.Unmarshal(line, &fields); err != nil {
			w.log.Info(string(line))
			continue
		}
		level := slog.LevelInfo
		switch fields["@level"] {
		case "trace", "debug":
			level = slog.LevelDebug
		case "warn", "error":
			level = slog.LevelWarn
		}
		if !w.log.Enabled(context.Background(), level) {
			continue
		}
		msg, _ := fields["@message"].(string)
		keys := make([]string, 0, len(fields))
		for k := range fields {
			if k[0] != '@' {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		args := make([]any, 0, 2*len(keys)+2)
		if mod, ok := fields["@module"].(string); ok {
			args = append(args, "module", mod)
		}
		for _, k := range keys {
			args = append(args, k, fields[k])
		}
		w.log.Log(context.Background(), level, msg, args...)
	}
	return len(p), nil
}
