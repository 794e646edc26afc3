package soft

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"strings"
	"testing"

	"github.com/rkv-io/rkv/internal/testlog"
	"github.com/rkv-io/rkv/rdma"
)

// The provider's warnings go to the Logger it is opened with, in that
// logger's format, not to slog's default (which printed them as plain text
// among a server's --log-format json lines).
func TestWarningsGoToOptionsLogger(t *testing.T) {
	var out testlog.Buffer
	d, err := rdma.Open("soft", "", rdma.Options{Logger: slog.New(slog.NewJSONHandler(&out, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	c, err := net.Dial("tcp", d.(*device).Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write(bytes.Repeat([]byte{'x'}, helloSize)); err != nil {
		t.Fatal(err)
	}
	// The device logs the malformed hello, then closes the connection.
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var rec struct{ Level, Msg, Stage string }
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &rec) != nil {
		t.Fatalf("want one JSON line from the Options.Logger, got %q", out.String())
	}
	if rec.Level != "WARN" || rec.Msg != "rdma/soft: dropped a data connection" || rec.Stage != "malformed hello" {
		t.Fatalf("logged %+v, want the WARN of a malformed hello", rec)
	}
}
