// redis-server started for one comparison, and a go-redis loadgen target.

package target

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/rkv-io/rkv/internal/freeport"
	"github.com/rkv-io/rkv/loadgen"
)

// RedisOptions configure a redis-server process.
type RedisOptions struct {
	// Binary is the redis-server executable. Default "redis-server"
	// (looked up in PATH).
	Binary string
	// Dir is the server's directory: its config, log and append-only
	// file. Required; created if missing.
	Dir string
	// Persistence is what the server keeps of its writes. Default
	// RedisMemoryOnly.
	Persistence RedisPersistence
	// StartTimeout bounds the wait for the server to answer PING.
	// Default 10s.
	StartTimeout time.Duration
}

// RedisPersistence is what a redis-server keeps of its writes; every
// level also turns RDB snapshots off (save ""), so that only the
// append-only file, if any, touches the disk.
type RedisPersistence int

const (
	// RedisMemoryOnly is "appendonly no": nothing touches the disk, and
	// a crash of the process loses every write.
	RedisMemoryOnly RedisPersistence = iota
	// RedisAOFNoFsync is "appendonly yes" with "appendfsync no": Redis
	// writes each write to its append-only file before it replies, and
	// leaves the write-back to the kernel, so a crash of the process
	// loses nothing and one of the machine may (as rkv's --sync none).
	RedisAOFNoFsync
	// RedisAOFAlways is "appendonly yes" with "appendfsync always": each
	// write is fsynced before it is acknowledged (as rkv's --sync always).
	RedisAOFAlways
)

func (p RedisPersistence) String() string {
	switch p {
	case RedisMemoryOnly:
		return "appendonly no"
	case RedisAOFNoFsync:
		return "appendonly yes, appendfsync no"
	case RedisAOFAlways:
		return "appendonly yes, appendfsync always"
	}
	return fmt.Sprintf("RedisPersistence(%d)", int(p))
}

// Redis is a running redis-server.
type Redis struct {
	// Addr is its "127.0.0.1:port".
	Addr string
	proc *Process
}

// StartRedis writes a config into opts.Dir, starts redis-server on a
// free loopback port and waits until it answers PING.
func StartRedis(ctx context.Context, opts RedisOptions) (*Redis, error) {
	if opts.Dir == "" {
		return nil, errors.New("redis: RedisOptions.Dir is required")
	}
	if opts.Binary == "" {
		opts.Binary = "redis-server"
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = 10 * time.Second
	}
	bin, err := exec.LookPath(opts.Binary)
	if err != nil {
		return nil, fmt.Errorf("redis: %w (install Debian's redis-server package)", err)
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	port, err := freeport.Loopback()
	if err != nil {
		return nil, err
	}
	conf := filepath.Join(opts.Dir, "redis.conf")
	cfg, err := RedisConfig(port, opts.Dir, opts.Persistence)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
		return nil, fmt.Errorf("redis: writing its config: %w", err)
	}
	p, err := StartProcess(fmt.Sprintf("redis-server :%d", port), filepath.Join(opts.Dir, "redis.log"), bin, conf)
	if err != nil {
		return nil, err
	}
	r := &Redis{Addr: fmt.Sprintf("127.0.0.1:%d", port), proc: p}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	c := redis.NewClient(r.clientOptions(1))
	defer c.Close()
	for {
		err := c.Ping(ctx).Err()
		if err == nil {
			return r, nil
		}
		select {
		case <-ctx.Done():
			_ = p.Stop(5 * time.Second)
			return nil, fmt.Errorf("redis at %s not answering PING: %v; log %s:\n%s", r.Addr, err, p.LogPath, p.LogTail(20))
		case <-p.Exited():
			_ = p.Stop(0)
			return nil, fmt.Errorf("redis at %s exited at start; log %s:\n%s", r.Addr, p.LogPath, p.LogTail(20))
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// RedisConfig is the redis.conf StartRedis writes: loopback only, one
// database, persistence p, and nothing else changed.
func RedisConfig(port int, dir string, p RedisPersistence) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "bind 127.0.0.1\nport %d\nprotected-mode no\ndaemonize no\ndir %s\nlogfile \"\"\ndatabases 1\nsave \"\"\n", port, dir)
	switch p {
	case RedisMemoryOnly:
		b.WriteString("appendonly no\n")
	case RedisAOFNoFsync:
		b.WriteString("appendonly yes\nappendfsync no\n")
	case RedisAOFAlways:
		b.WriteString("appendonly yes\nappendfsync always\n")
	default:
		return "", fmt.Errorf("redis: unknown persistence %v", p)
	}
	return b.String(), nil
}

// Close stops the server (SIGTERM, then SIGKILL after 10s).
func (r *Redis) Close() error { return r.proc.Stop(10 * time.Second) }

// Process is the server's process.
func (r *Redis) Process() *Process { return r.proc }

func (r *Redis) clientOptions(pool int) *redis.Options {
	return &redis.Options{
		Addr:                     r.Addr,
		PoolSize:                 pool,
		MinIdleConns:             pool,
		ContextTimeoutEnabled:    true,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
	}
}

// RedisVersion returns what "redis-server --version" prints (bin ""
// means redis-server in PATH).
func RedisVersion(bin string) (string, error) {
	if bin == "" {
		bin = "redis-server"
	}
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "", fmt.Errorf("%s --version: %w", bin, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// RedisTarget is a loadgen target on go-redis clients, one for each of
// its redis-servers, each client with a pool of one connection per
// loadgen worker. With several servers, a key's server is its xxhash
// modulo their number: redis-server processes do not talk to each other,
// so the client shards the keys, as rkv's client spreads them over its
// servers by the cluster map. Get and Put are one command each, on a
// connection of their own, without pipelining; MultiGet and MultiPut send
// a batch as one pipeline (GETs or SETs) to each server holding some of
// its keys, to all of them at once.
type RedisTarget struct {
	shards []*redis.Client
}

// NewTarget returns a target on r alone, with a pool of workers
// connections.
func (r *Redis) NewTarget(ctx context.Context, workers int) (*RedisTarget, error) {
	return NewRedisTarget(ctx, []*Redis{r}, workers)
}

// NewRedisTarget returns a target sharding the keys over servers, with a
// pool of workers connections to each (as an rkv client has
// ConnsPerServer connections to each of its servers). It pings every
// server first.
func NewRedisTarget(ctx context.Context, servers []*Redis, workers int) (*RedisTarget, error) {
	if len(servers) == 0 {
		return nil, errors.New("redis target: no servers")
	}
	if workers <= 0 {
		workers = 1
	}
	t := &RedisTarget{}
	for _, r := range servers {
		c := redis.NewClient(r.clientOptions(workers))
		t.shards = append(t.shards, c)
		if err := c.Ping(ctx).Err(); err != nil {
			t.Close()
			return nil, fmt.Errorf("redis target on %s: %w", r.Addr, err)
		}
	}
	return t, nil
}

// shard returns the index of key's server.
func (t *RedisTarget) shard(key []byte) int {
	if len(t.shards) == 1 {
		return 0
	}
	return int(xxhash.Sum64(key) % uint64(len(t.shards)))
}

// Get is GET key; an absent key is loadgen.ErrNotFound.
func (t *RedisTarget) Get(ctx context.Context, key []byte) ([]byte, error) {
	v, err := t.shards[t.shard(key)].Get(ctx, string(key)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, loadgen.ErrNotFound
	}
	return v, err
}

// Put is SET key value.
func (t *RedisTarget) Put(ctx context.Context, key, value []byte) error {
	return t.shards[t.shard(key)].Set(ctx, string(key), value, 0).Err()
}

// MultiGet GETs keys in a pipeline per server (loadgen.MultiGetter); an
// absent key's value is nil.
func (t *RedisTarget) MultiGet(ctx context.Context, keys [][]byte) ([][]byte, error) {
	cmds, err := t.pipelined(ctx, keys, nil, func(p redis.Pipeliner, i int) redis.Cmder {
		return p.Get(ctx, string(keys[i]))
	})
	vals := make([][]byte, len(keys))
	for i, c := range cmds {
		v, cerr := c.(*redis.StringCmd).Bytes()
		switch {
		case errors.Is(cerr, redis.Nil):
		case cerr != nil:
			return nil, fmt.Errorf("GET %s in a pipeline of %d: %w", keys[i], len(keys), cerr)
		default:
			vals[i] = v
		}
	}
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	return vals, nil
}

// MultiPut SETs keys in a pipeline per server (loadgen.MultiPutter). A
// key given twice is SET once, to its last value, as rkv's
// client.MultiPut stores it: both systems do the same writes for a batch
// (zipfian batches often hold a hot key twice).
func (t *RedisTarget) MultiPut(ctx context.Context, keys, values [][]byte) error {
	if len(keys) != len(values) {
		return fmt.Errorf("redis target: MultiPut of %d keys with %d values", len(keys), len(values))
	}
	last := make(map[string]int, len(keys))
	for i, k := range keys {
		last[string(k)] = i
	}
	send := make([]int, 0, len(last))
	for i, k := range keys {
		if last[string(k)] == i {
			send = append(send, i)
		}
	}
	cmds, err := t.pipelined(ctx, keys, send, func(p redis.Pipeliner, i int) redis.Cmder {
		return p.Set(ctx, string(keys[i]), values[i], 0)
	})
	for _, i := range send {
		if cerr := cmds[i].Err(); cerr != nil {
			return fmt.Errorf("SET %s in a pipeline of %d: %w", keys[i], len(send), cerr)
		}
	}
	return err
}

// pipelined sends a pipeline to each server holding some of keys, all at
// once, queue adding key i's command, and returns the commands in key
// order, with the first error (a redis.Nil reply among them). Only the
// keys whose indexes are in send go (nil: all); the others' commands are
// nil.
func (t *RedisTarget) pipelined(ctx context.Context, keys [][]byte, send []int, queue func(p redis.Pipeliner, i int) redis.Cmder) ([]redis.Cmder, error) {
	if send == nil {
		send = make([]int, len(keys))
		for i := range send {
			send[i] = i
		}
	}
	cmds := make([]redis.Cmder, len(keys))
	exec := func(c *redis.Client, idx []int) error {
		_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, i := range idx {
				cmds[i] = queue(p, i)
			}
			return nil
		})
		return err
	}
	if len(t.shards) == 1 {
		return cmds, exec(t.shards[0], send)
	}
	byShard := make([][]int, len(t.shards))
	for _, i := range send {
		s := t.shard(keys[i])
		byShard[s] = append(byShard[s], i)
	}
	errs := make([]error, len(t.shards))
	var wg sync.WaitGroup
	for s, idx := range byShard {
		if len(idx) > 0 {
			wg.Go(func() { errs[s] = exec(t.shards[s], idx) })
		}
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return cmds, err
		}
	}
	return cmds, nil
}

// Close closes the pools.
func (t *RedisTarget) Close() error {
	var errs []error
	for _, c := range t.shards {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
