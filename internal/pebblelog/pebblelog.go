// Package pebblelog routes a Pebble database's log to slog.
package pebblelog

import (
	"context"
	"fmt"
	"log/slog"
)

// Logger is a pebble.Logger that writes to Log: Pebble's informational
// lines at Debug, its errors at Error.
//
// Pebble calls Fatalf where its state can no longer be trusted (a failed
// WAL or manifest write, corruption), and its default logger exits the
// process there. This one logs the message and calls OnFatal, then
// returns: Pebble may carry on as if the failed write had succeeded, so
// OnFatal must make its owner stop trusting the database (refuse writes
// from then on), and must not block. A nil OnFatal only logs.
type Logger struct {
	Log     *slog.Logger
	OnFatal func(msg string)
}

// Infof logs at Debug, formatting only when Debug is enabled.
func (l Logger) Infof(format string, args ...any) {
	if l.Log.Enabled(context.Background(), slog.LevelDebug) {
		l.Log.Debug("pebble: " + fmt.Sprintf(format, args...))
	}
}

// Errorf logs at Error.
func (l Logger) Errorf(format string, args ...any) {
	l.Log.Error("pebble: " + fmt.Sprintf(format, args...))
}

// Fatalf logs at Error and calls OnFatal; it returns.
func (l Logger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	l.Log.Error("pebble reported a fatal error", "err", msg)
	if l.OnFatal != nil {
		l.OnFatal(msg)
	}
}
