// scan's output: the header and the count only for a human at a terminal.

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// openPTY opens a pseudo-terminal and returns its terminal side, which
// the command writes to as to a user's terminal, and a function that
// closes it and returns what was written (with the terminal's \r\n turned
// back into \n).
func openPTY(t *testing.T) (*os.File, func() string) {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { master.Close() })
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatalf("unlocking the pty: %v", err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatalf("the pty's number: %v", err)
	}
	tty, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("opening the pty's terminal side: %v", err)
	}
	// Read while the command writes: a pty buffers a few KiB only.
	got := make(chan string, 1)
	go func() {
		var b bytes.Buffer
		_, _ = io.Copy(&b, master) // ends with EIO once the terminal side is closed
		got <- strings.ReplaceAll(b.String(), "\r\n", "\n")
	}()
	return tty, func() string {
		tty.Close()
		return <-got
	}
}

// runCLIOn runs the command line with stdout on f.
func runCLIOn(f *os.File, env map[string]string, args ...string) (string, int) {
	var errb bytes.Buffer
	code := run(context.Background(), args, environOf(env), strings.NewReader(""), f, &errb)
	return errb.String(), code
}

// TestScanDecorations: scan's header and "(N keys)" are for a terminal;
// into a pipe or file (here a buffer) go the rows alone, tab separated,
// and --keys-only prints the keys alone even on a terminal.
func TestScanDecorations(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	env := map[string]string{"RKV_JOIN": startServerWith(t, nil, nil)}
	for k, v := range map[string]string{"user:1": "alice", "user:2": "bob", "user:3": "carol", "other": "x"} {
		if _, errs, code := runCLI(env, "put", k, v); code != exitOK {
			t.Fatalf("put %s: exit %d, %s", k, code, errs)
		}
	}

	t.Run("not a terminal", func(t *testing.T) {
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"scan", "--prefix", "user:", "--values"}, "user:1\talice\nuser:2\tbob\nuser:3\tcarol\n"},
			{[]string{"scan", "--prefix", "user:"}, "user:1\t5\nuser:2\t3\nuser:3\t5\n"},
			{[]string{"scan", "--prefix", "nosuch"}, ""},
		} {
			if out, errs, code := runCLI(env, c.args...); code != exitOK || out != c.want {
				t.Errorf("%q into a buffer: exit %d, %q (stderr %q); want %q, no header or count", c.args, code, out, errs, c.want)
			}
		}
	})

	t.Run("keys-only on a terminal", func(t *testing.T) {
		tty, output := openPTY(t)
		errs, code := runCLIOn(tty, env, "scan", "--prefix", "user:", "--keys-only")
		if out := output(); code != exitOK || out != "user:1\nuser:2\nuser:3\n" {
			t.Fatalf("scan --keys-only on a terminal: exit %d, %q (stderr %q); want the keys alone", code, out, errs)
		}
	})

	t.Run("a terminal", func(t *testing.T) {
		tty, output := openPTY(t)
		errs, code := runCLIOn(tty, env, "scan", "--prefix", "user:", "--values")
		want := "KEY     VALUE\nuser:1  alice\nuser:2  bob\nuser:3  carol\n(3 keys)\n"
		if out := output(); code != exitOK || out != want {
			t.Fatalf("scan on a terminal: exit %d, %q (stderr %q); want %q", code, out, errs, want)
		}
	})
}
