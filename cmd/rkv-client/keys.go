// Keys on the command line: their encoding, their checks, and the commands that take many (mget, exists, mput).

package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/rkv-io/rkv/client"
	"github.com/rkv-io/rkv/proto"
)

// keyEncodings are what --key-encoding accepts: how a key argument (or a
// line of keys on stdin) spells its bytes.
var keyEncodings = map[string]func(string) ([]byte, error){
	"raw":    func(s string) ([]byte, error) { return []byte(s), nil },
	"hex":    hex.DecodeString,
	"base64": base64.StdEncoding.DecodeString,
}

// parseKey decodes a key argument; an empty or undecodable key is a usage
// error.
func (g *globals) parseKey(arg string) ([]byte, error) {
	k, err := keyEncodings[g.keyEncoding](arg)
	switch {
	case err != nil:
		return nil, &exitError{exitUsage, fmt.Errorf("key %q is not %s: %w", arg, g.keyEncoding, err)}
	case len(k) == 0:
		return nil, &exitError{exitUsage, errors.New("empty key: a key is 1 byte or more")}
	}
	return k, nil
}

// parseKeys decodes key arguments; a single "-" reads them from stdin, one
// a line.
func (g *globals) parseKeys(args []string) ([][]byte, error) {
	if len(args) == 1 && args[0] == "-" {
		args = nil
		lines := bufio.NewScanner(g.stdin)
		lines.Buffer(make([]byte, 64<<10), 1<<20)
		for lines.Scan() {
			if lines.Text() != "" {
				args = append(args, lines.Text())
			}
		}
		if err := lines.Err(); err != nil {
			return nil, &exitError{exitOther, fmt.Errorf("reading keys from stdin: %w", err)}
		}
	}
	keys := make([][]byte, 0, len(args))
	for _, a := range args {
		k, err := g.parseKey(a)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// keyJSON fills a JSON object's key: as a string when it is UTF-8, in
// key_base64 otherwise.
type keyJSON struct {
	Key       string `json:"key,omitempty"`
	KeyBase64 []byte `json:"key_base64,omitempty"`
}

func toKeyJSON(k []byte) keyJSON {
	if utf8.Valid(k) {
		return keyJSON{Key: string(k)}
	}
	return keyJSON{KeyBase64: k}
}

// foundJSON is a key that may be absent, with its value when present.
type foundJSON struct {
	keyJSON
	Found       bool   `json:"found"`
	Size        int    `json:"size,omitempty"`
	Value       string `json:"value,omitempty"`
	ValueBase64 []byte `json:"value_base64,omitempty"`
}

func toFoundJSON(k, v []byte, found bool) foundJSON {
	j := foundJSON{keyJSON: toKeyJSON(k), Found: found, Size: len(v)}
	if utf8.Valid(v) {
		j.Value = string(v)
	} else {
		j.ValueBase64 = v
	}
	return j
}

// isTerminal reports whether f is a terminal.
func isTerminal(f any) bool {
	fd, ok := f.(interface{ Fd() uintptr })
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(fd.Fd()), unix.TCGETS)
	return err == nil
}

// readValue reads a value of at most limit bytes (0: no limit) from
// stdin, saying so first when stdin is a terminal (else the command seems
// to hang). It stops reading as soon as the value is too large.
func (g *globals) readValue(cmd *cobra.Command, limit int64) ([]byte, error) {
	if isTerminal(g.stdin) {
		fmt.Fprintln(cmd.ErrOrStderr(), "rkv-client: reading the value from standard input (end it with Ctrl-D)")
	}
	in := g.stdin
	if limit > 0 {
		in = io.LimitReader(in, limit+1)
	}
	b, err := io.ReadAll(in)
	switch {
	case err != nil:
		return nil, &exitError{exitOther, fmt.Errorf("reading the value from stdin: %w", err)}
	case limit > 0 && int64(len(b)) > limit:
		return nil, fmt.Errorf("%w: value too large: more than %d bytes on stdin, the key's server takes at most %d", client.ErrTooLarge, limit, limit)
	}
	return b, nil
}

func mgetCmd(g *globals) *cobra.Command {
	return manyKeysCmd(g, true, &cobra.Command{
		Use:   "mget KEY... | mget -",
		Short: "print the values of many keys, read together (MultiGet); - reads the keys from stdin, one a line",
		Long: `mget reads every key with one MultiGet: the keys of one server share its
RDMA READ posts. The table has a line per key, its value or (not found); -o
json a list of {key, found, value}. It exits 1 when a key is absent, 0 when
all are present.`,
	})
}

func existsCmd(g *globals) *cobra.Command {
	return manyKeysCmd(g, false, &cobra.Command{
		Use:   "exists KEY... | exists -",
		Short: "say whether keys exist (exit 0 if all do, 1 if one does not)",
	})
}

// manyKeysCmd completes cmd as a command that reads its keys (arguments,
// or stdin with -) with one MultiGet and prints what it found, with the
// values when values is set.
func manyKeysCmd(g *globals, values bool, cmd *cobra.Command) *cobra.Command {
	cmd.Args = cobra.MinimumNArgs(1)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		keys, err := g.parseKeys(args)
		if err != nil {
			return err
		}
		return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
			vals, err := c.MultiGet(ctx, keys)
			if err != nil {
				return err
			}
			return printFound(g, cmd, keys, vals, values)
		})
	}
	return cmd
}

// printFound prints whether each key was found (and its value, with
// values), and fails with exitNotFound when one was not.
func printFound(g *globals, cmd *cobra.Command, keys, vals [][]byte, values bool) error {
	out := cmd.OutOrStdout()
	missing := 0
	list := make([]foundJSON, 0, len(keys))
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for i, k := range keys {
		found := vals[i] != nil
		if !found {
			missing++
		}
		j := toFoundJSON(k, vals[i], found)
		if !values {
			j.Size, j.Value, j.ValueBase64 = 0, "", nil
		}
		list = append(list, j)
		switch {
		case g.output == "json":
		case !found && values:
			fmt.Fprintf(tw, "%s\t(not found)\n", printable(k))
		case values:
			fmt.Fprintf(tw, "%s\t%s\n", printable(k), printable(vals[i]))
		default:
			fmt.Fprintf(tw, "%s\t%v\n", printable(k), found)
		}
	}
	if g.output == "json" {
		if err := writeJSON(out, list); err != nil {
			return err
		}
	} else if err := tw.Flush(); err != nil {
		return err
	}
	if missing > 0 {
		return &exitError{exitNotFound, fmt.Errorf("%d of %d keys not found", missing, len(keys))}
	}
	return nil
}

// stdoutIsTerminal reports whether the command writes to a terminal:
// whatever file run was given as stdout, so that tests can hand it a pty.
func stdoutIsTerminal(cmd *cobra.Command) bool {
	return isTerminal(cmd.OutOrStdout())
}

func mputCmd(g *globals) *cobra.Command {
	var file string
	var concurrency, batch int
	cmd := &cobra.Command{
		Use:   "mput [--file F]",
		Short: "bulk load: put every \"KEY<TAB>VALUE\" line of standard input (or --file)",
		Long: `mput reads lines of a key, a tab and a value (the key spelled as
--key-encoding says; the value as it is, to the end of the line) and puts
them, --batch lines at a time in one MultiPut (one RDMA_WRITE and one
commit batch per server for the keys of shards without backups; the others
one by one), --concurrency batches at a time on one client. It stops at the
first failed batch, saying which lines it held (any of them may have been
put, as with a failed put), and prints how many keys it put and how fast. A
key given twice in one batch is put once, with its last value.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case concurrency < 1:
				return fmt.Errorf("--concurrency %d: must be 1 or more", concurrency)
			case batch < 1 || batch > proto.MaxBatchCommits:
				return fmt.Errorf("--batch %d: must be 1 to %d", batch, proto.MaxBatchCommits)
			}
			in := g.stdin
			if file != "" {
				f, err := os.Open(file)
				if err != nil {
					return &exitError{exitOther, fmt.Errorf("--file: %w", err)}
				}
				defer f.Close()
				in = f
			}
			return g.withClient(cmd, func(ctx context.Context, c *client.Client) error {
				return bulkPut(ctx, g, c, in, concurrency, batch, cmd.OutOrStdout())
			})
		},
	}
	cmd.Flags().StringVar(&file, "file", "", "read the lines from this file instead of standard input")
	cmd.Flags().IntVar(&concurrency, "concurrency", 16, "batches in flight at once")
	cmd.Flags().IntVar(&batch, "batch", 16, "lines put together in one MultiPut")
	return cmd
}

// bulkPut puts every KEY<TAB>VALUE line of in, batch lines per MultiPut,
// with concurrency goroutines sharing c.
func bulkPut(ctx context.Context, g *globals, c *client.Client, in io.Reader, concurrency, batch int, out io.Writer) error {
	type lines struct {
		first int // the line number of kvs[0]
		kvs   []client.KV
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan lines, concurrency)
	var done atomic.Int64
	var wg sync.WaitGroup
	for range concurrency {
		wg.Go(func() {
			for w := range work {
				if err := c.MultiPut(ctx, w.kvs); err != nil {
					cancel(fmt.Errorf("lines %d-%d: %w", w.first, w.first+len(w.kvs)-1, err))
					return
				}
				done.Add(int64(len(w.kvs)))
			}
		})
	}
	start := time.Now()
	scanner := bufio.NewScanner(in)
	scanner.Buffer(make([]byte, 64<<10), 2<<20)
	var err error
	next := lines{first: 1}
	send := func() {
		if len(next.kvs) == 0 {
			return
		}
		select {
		case work <- next:
		case <-ctx.Done():
			err = context.Cause(ctx)
		}
		next = lines{first: next.first + len(next.kvs)}
	}
	for n := 1; err == nil && scanner.Scan(); n++ {
		k, v, ok := strings.Cut(scanner.Text(), "\t")
		if !ok {
			send() // the lines before it, as one put at a time would have
			err = &exitError{exitUsage, fmt.Errorf("line %d: no tab between key and value", n)}
			break
		}
		key, kerr := g.parseKey(k)
		if ee := (*exitError)(nil); errors.As(kerr, &ee) {
			send()
			err = &exitError{ee.code, fmt.Errorf("line %d: %w", n, ee.err)}
			break
		}
		next.kvs = append(next.kvs, client.KV{Key: key, Value: []byte(v)})
		if len(next.kvs) == batch {
			send()
		}
	}
	if err == nil {
		send()
	}
	close(work)
	wg.Wait()
	if err == nil {
		err = scanner.Err()
	}
	if cerr := context.Cause(ctx); err == nil && cerr != nil {
		err = cerr
	}
	took := time.Since(start)
	fmt.Fprintf(out, "%d keys put in %v (%.0f/s)\n", done.Load(), took.Round(time.Millisecond), float64(done.Load())/took.Seconds())
	return err
}
