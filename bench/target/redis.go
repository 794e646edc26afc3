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
	"time"

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
	// Durable selects the persistence: true is "appendonly yes" with
	// "appendfsync always" (a write is fsynced before it is
	// acknowledged); false is "appendonly no" with no RDB snapshots
	// ("save ''"): nothing touches the disk.
	Durable bool
	// StartTimeout bounds the wait for the server to answer PING.
	// Default 10s.
	StartTimeout time.Duration
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
	if err := os.WriteFile(conf, []byte(RedisConfig(port, opts.Dir, opts.Durable)), 0o644); err != nil {
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
// database, the persistence Durable selects, and nothing else changed.
func RedisConfig(port int, dir string, durable bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "bind 127.0.0.1\nport %d\nprotected-mode no\ndaemonize no\ndir %s\nlogfile \"\"\ndatabases 1\nsave \"\"\n", port, dir)
	if durable {
		b.WriteString("appendonly yes\nappendfsync always\n")
	} else {
		b.WriteString("appendonly no\n")
	}
	return b.String()
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

// RedisTarget is a loadgen target on a go-redis client whose pool holds
// one connection per loadgen worker, without pipelining: every GET and
// SET is one round trip on a connection of its own.
type RedisTarget struct {
	c *redis.Client
}

// NewTarget returns a target with a pool of workers connections, dialed
// at once.
func (r *Redis) NewTarget(ctx context.Context, workers int) (*RedisTarget, error) {
	if workers <= 0 {
		workers = 1
	}
	c := redis.NewClient(r.clientOptions(workers))
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		return nil, fmt.Errorf("redis target on %s: %w", r.Addr, err)
	}
	return &RedisTarget{c: c}, nil
}

// Get is GET key; an absent key is loadgen.ErrNotFound.
func (t *RedisTarget) Get(ctx context.Context, key []byte) ([]byte, error) {
	v, err := t.c.Get(ctx, string(key)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, loadgen.ErrNotFound
	}
	return v, err
}

// Put is SET key value.
func (t *RedisTarget) Put(ctx context.Context, key, value []byte) error {
	return t.c.Set(ctx, string(key), value, 0).Err()
}

// Close closes the pool.
func (t *RedisTarget) Close() error { return t.c.Close() }
