package pebblelog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

var _ pebble.Logger = Logger{}

func TestLevelsAndFatal(t *testing.T) {
	var out bytes.Buffer
	var fatal []string
	l := Logger{Log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo})), OnFatal: func(msg string) { fatal = append(fatal, msg) }}
	l.Infof("chatter %d", 1)
	l.Errorf("an error %d", 2)
	l.Fatalf("gone %d", 3) // returns: the default logger would exit here
	got := out.String()
	if strings.Contains(got, "chatter") {
		t.Errorf("informational line logged above Debug:\n%s", got)
	}
	for _, want := range []string{"level=ERROR msg=\"pebble: an error 2\"", "pebble reported a fatal error", "gone 3"} {
		if !strings.Contains(got, want) {
			t.Errorf("log lacks %q:\n%s", want, got)
		}
	}
	if len(fatal) != 1 || fatal[0] != "gone 3" {
		t.Errorf("OnFatal calls: %q", fatal)
	}
	Logger{Log: slog.New(slog.DiscardHandler)}.Fatalf("no hook") // must not panic
}
