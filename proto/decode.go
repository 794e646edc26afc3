// The one strict msgpack decoder every format of this package uses.

package proto

import (
	"bytes"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// decoder reads msgpack strictly, for every format of this package (control
// frames, gossip metadata, arena tables, the cluster map): each length is
// checked against its limit and against the bytes left before anything is
// allocated, integers must be integers (nil is not 0), and every error
// wraps the format's sentinel (ErrBadMessage, ErrBadMeta, ErrBadMap).
type decoder struct {
	r   *bytes.Reader
	d   *msgpack.Decoder
	bad error // the sentinel errors wrap
}

func newDecoder(b []byte, bad error) *decoder {
	r := bytes.NewReader(b)
	// A bytes.Reader is an io.ByteScanner: the decoder reads it directly,
	// without buffering ahead, so r.Len() is what is left.
	return &decoder{r: r, d: msgpack.NewDecoder(r), bad: bad}
}

func (d *decoder) fail(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{d.bad}, args...)...)
}

func (d *decoder) wrap(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", d.bad, what, err)
}

// end fails unless every byte was read.
func (d *decoder) end(what string) error {
	if n := d.r.Len(); n != 0 {
		return d.fail("%d bytes after the end of %s", n, what)
	}
	return nil
}

// arrayLen reads an array header of at most max elements; nil is -1.
func (d *decoder) arrayLen(what string, max int) (int, error) {
	n, err := d.d.DecodeArrayLen()
	if err != nil {
		return 0, d.wrap(what, err)
	}
	if n > max || n > d.r.Len() {
		return 0, d.fail("%s of %d elements (limit %d, %d bytes left)", what, n, max, d.r.Len())
	}
	return n, nil
}

// list reads an array header of at most max elements that must not be
// nil.
func (d *decoder) list(what string, max int) (int, error) {
	n, err := d.arrayLen(what, max)
	if err == nil && n < 0 {
		return 0, d.fail("%s: nil, want an array", what)
	}
	return n, err
}

// fixedArray reads an array header that must say n elements, or nil when
// nilOK.
func (d *decoder) fixedArray(what string, n int, nilOK bool) (isNil bool, err error) {
	k, err := d.arrayLen(what, n)
	if err != nil {
		return false, err
	}
	if k == -1 && nilOK {
		return true, nil
	}
	if k != n {
		return false, d.fail("%s of %d fields, want %d", what, k, n)
	}
	return false, nil
}

// fields reads the header of a positional array of exactly n fields.
func (d *decoder) fields(what string, n int) error {
	_, err := d.fixedArray(what, n, false)
	return err
}

// uint reads an unsigned integer of at most max in any msgpack integer
// form; nil, floats and negative values fail.
func (d *decoder) uint(what string, max uint64) (uint64, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return 0, d.wrap(what, err)
	}
	var v uint64
	switch {
	case c >= 0xe0 || (c >= 0xd0 && c <= 0xd3): // negative fixint, int8..int64
		i, err := d.d.DecodeInt64()
		if err != nil {
			return 0, d.wrap(what, err)
		}
		if i < 0 {
			return 0, d.fail("%s %d is negative", what, i)
		}
		v = uint64(i)
	case c <= 0x7f || (c >= 0xcc && c <= 0xcf): // positive fixint, uint8..uint64
		if v, err = d.d.DecodeUint64(); err != nil {
			return 0, d.wrap(what, err)
		}
	default:
		return 0, d.fail("%s: msgpack code %#x is not an integer", what, c)
	}
	if v > max {
		return 0, d.fail("%s %d, limit %d", what, v, max)
	}
	return v, nil
}

// u64 reads any unsigned 64-bit integer.
func (d *decoder) u64(what string) (uint64, error) { return d.uint(what, 1<<64-1) }

// uints reads a positional array of exactly len(dst) unsigned integers.
func (d *decoder) uints(what string, dst ...*uint64) error {
	if err := d.fields(what, len(dst)); err != nil {
		return err
	}
	for _, p := range dst {
		v, err := d.u64(what)
		if err != nil {
			return err
		}
		*p = v
	}
	return nil
}

func (d *decoder) bool(what string) (bool, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return false, d.wrap(what, err)
	}
	if c != 0xc2 && c != 0xc3 {
		return false, d.fail("%s: msgpack code %#x is not a bool", what, c)
	}
	v, err := d.d.DecodeBool()
	if err != nil {
		return false, d.wrap(what, err)
	}
	return v, nil
}

// bytes reads a bin or str of at most max bytes; nil stays nil.
func (d *decoder) bytes(what string, max int) ([]byte, error) {
	c, err := d.d.PeekCode()
	if err != nil {
		return nil, d.wrap(what, err)
	}
	switch {
	case c == 0xc0: // nil
		if _, err := d.d.DecodeBytesLen(); err != nil {
			return nil, d.wrap(what, err)
		}
		return nil, nil
	case c >= 0xc4 && c <= 0xc6: // bin8..32
	case (c >= 0xa0 && c <= 0xbf) || (c >= 0xd9 && c <= 0xdb): // str
	default:
		return nil, d.fail("%s: msgpack code %#x is not bytes", what, c)
	}
	n, err := d.d.DecodeBytesLen()
	if err != nil {
		return nil, d.wrap(what, err)
	}
	if n < 0 || n > max || n > d.r.Len() {
		return nil, d.fail("%s of %d bytes (limit %d, %d bytes left)", what, n, max, d.r.Len())
	}
	b := make([]byte, n)
	if err := d.d.ReadFull(b); err != nil {
		return nil, d.wrap(what, err)
	}
	return b, nil
}

func (d *decoder) str(what string, max int) (string, error) {
	b, err := d.bytes(what, max)
	return string(b), err
}

// shards reads a list of at most max distinct shards.
func (d *decoder) shards(what string, max int) ([]Shard, error) {
	n, err := d.arrayLen(what, max)
	if err != nil || n <= 0 {
		return nil, err
	}
	out := make([]Shard, n)
	for i := range out {
		v, err := d.uint(what, NumShards-1)
		if err != nil {
			return nil, err
		}
		out[i] = Shard(v)
	}
	return out, nil
}

// encodeShards writes a shard list (nil stays an empty array).
func encodeShards(e *msgpack.Encoder, shards []Shard) error {
	if err := e.EncodeArrayLen(len(shards)); err != nil {
		return err
	}
	for _, s := range shards {
		if err := e.EncodeUint(uint64(s)); err != nil {
			return err
		}
	}
	return nil
}
