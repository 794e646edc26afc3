// The registration comparison: time to the first served GET against the time to register every arena.

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/rkv-io/rkv/bench/report"
	"github.com/rkv-io/rkv/bench/target"
	"github.com/rkv-io/rkv/client"
	"golang.org/x/sys/unix"
)

// memorySpare is the memory left free beside the arenas.
const memorySpare = 2 << 30

var regKey = []byte("registration/key")

// measureRegistration starts the server three times per run and arena
// count, the counts interleaved, timing its first served GET and its full
// registration: fresh (in an empty data directory: the start creates the
// arena files; it then writes a key), cold and warm (see report.Start).
func measureRegistration(ctx context.Context, o *options, work, bin string, res *report.Results) error {
	var counts []int
	_, avail, err := memInfo()
	if err != nil {
		return err
	}
	for _, n := range o.arenas {
		if need := uint64(n)*uint64(o.arenaBytes) + memorySpare; need > avail {
			note := fmt.Sprintf("registration with %d arenas of %d MiB skipped: it needs %d MiB with the spare, %d MiB were available",
				n, o.arenaBytes>>20, need>>20, avail>>20)
			logf("%s", note)
			res.Notes = append(res.Notes, note)
			continue
		}
		counts = append(counts, n)
	}
	dirs := map[int]string{}
	for _, n := range counts {
		dirs[n] = filepath.Join(work, fmt.Sprintf("registration-%d", n))
	}
	for run := 1; run <= o.runs; run++ {
		for _, n := range counts {
			for _, start := range report.Starts {
				so := serverOptions(bin, dirs[n], n, o.arenaBytes)
				r, err := retryTakenPort(func() (report.Registration, error) {
					switch start {
					case report.StartFresh:
						if err := os.RemoveAll(so.Dir); err != nil {
							return report.Registration{}, err
						}
					case report.StartCold:
						if err := evictArenas(filepath.Join(so.Dir, "data")); err != nil {
							return report.Registration{}, err
						}
					}
					return timeStart(ctx, so, start == report.StartFresh)
				})
				if err != nil {
					return fmt.Errorf("registration with %d arenas, run %d, %s start: %w", n, run, start, err)
				}
				r.Run, r.Arenas, r.ArenaBytes = run, n, o.arenaBytes
				r.Fresh, r.Cold = start == report.StartFresh, start == report.StartCold
				res.Registrations = append(res.Registrations, r)
				logf("registration run %d/%d, %d arenas, %s: ready %v, first arena %v, first GET %v, all registered %v", run, o.runs, n,
					start, r.Ready.Round(time.Millisecond),
					r.FirstArena.Round(time.Millisecond), r.FirstGet.Round(time.Millisecond), r.Registered.Round(time.Millisecond))
			}
		}
	}
	for _, d := range dirs {
		if err := os.RemoveAll(d); err != nil {
			return err
		}
	}
	return nil
}

// evictArenas drops the arena files in dir from the page cache
// (fdatasync, then POSIX_FADV_DONTNEED), so that the next start faults
// every page in again, as after a reboot, without touching the rest of
// the machine's cache.
func evictArenas(dir string) error {
	files, err := filepath.Glob(filepath.Join(dir, "arena-*.rkv"))
	if err != nil || len(files) == 0 {
		return fmt.Errorf("no arena files in %s to evict (%v)", dir, err)
	}
	for _, name := range files {
		f, err := os.OpenFile(name, os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("evicting %s from the page cache: %w", name, err)
		}
		err = unix.Fdatasync(int(f.Fd()))
		if err == nil {
			err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("evicting %s from the page cache: %w", name, err)
		}
	}
	return nil
}

// retryTakenPort calls start again, up to target.StartAttempts times in
// all, while it fails because a port picked for its server was taken
// before the server bound it (target.PortTaken).
func retryTakenPort[T any](start func() (T, error)) (T, error) {
	for attempt := 1; ; attempt++ {
		v, err := start()
		if !target.PortTaken(err) || attempt == target.StartAttempts {
			return v, err
		}
		logf("a port picked for the server was taken before it bound it: starting it again on others")
	}
}

func serverOptions(bin, dir string, arenas int, arenaBytes int64) target.ServerOptions {
	return target.ServerOptions{Binary: bin, Name: "reg", Dir: dir, Sync: "always", ArenaSize: arenaBytes,
		ArenaCount: arenas, IndexSlots: 4096, LeaseSize: 1 << 20}
}

// writeRegKey writes regKey, for the starts after a fresh one to read.
func writeRegKey(ctx context.Context, s *target.Server, arenas int) error {
	t, err := target.NewRKV(ctx, target.RKVOptions{Seeds: []string{s.Gossip}, Arenas: arenas, Logger: clientLogger})
	if err != nil {
		return err
	}
	defer t.Close()
	return t.Put(ctx, regKey, []byte("registered"))
}

// timeStart starts the server and times, from the process's start, its
// /readyz first answering 200, the first GET of regKey that succeeds (in
// a fresh start, in an empty data directory, one that finds it absent;
// the start then writes it), and the registration of its first arena and
// of all of them (from its metrics).
func timeStart(ctx context.Context, so target.ServerOptions, fresh bool) (_ report.Registration, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	s, err := target.StartServer(so)
	if err != nil {
		return report.Registration{}, err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	t0 := s.Process().Started
	type readyAt struct {
		at  time.Time
		err error
	}
	readyc := make(chan readyAt, 1) // /readyz is polled from the start, beside the client
	go func() {
		at, err := s.WaitReady(ctx)
		readyc <- readyAt{at, err}
	}()
	quiet := slog.New(slog.DiscardHandler) // failed attempts are expected until the server serves
	dev, err := target.OpenDevice()
	if err != nil {
		return report.Registration{}, err
	}
	defer dev.Close()
	var c *client.Client
	for c == nil {
		jctx, jcancel := context.WithTimeout(ctx, 2*time.Second)
		c, err = client.New(jctx, client.Config{Seeds: []string{s.Gossip}, Device: dev, Logger: quiet, RetryAttempts: 1, RetryTimeout: 50 * time.Millisecond})
		jcancel()
		if err != nil {
			select {
			case <-ctx.Done():
				return report.Registration{}, fmt.Errorf("joining %s: %w", s.Gossip, err)
			case <-s.Process().Exited():
				return report.Registration{}, fmt.Errorf("server exited: %w", s.Close())
			case <-time.After(2 * time.Millisecond):
			}
		}
	}
	defer c.Close()
	var r report.Registration
	for {
		gctx, gcancel := context.WithTimeout(ctx, time.Second)
		v, err := c.Get(gctx, regKey)
		gcancel()
		if (fresh && errors.Is(err, client.ErrNotFound)) || (!fresh && err == nil && string(v) == "registered") {
			r.FirstGet = time.Since(t0)
			break
		}
		if err == nil {
			return r, fmt.Errorf("GET %s returned %q (fresh start: %v)", regKey, v, fresh)
		}
		select {
		case <-ctx.Done():
			return r, fmt.Errorf("no successful GET of %s: last error %v", regKey, err)
		case <-time.After(time.Millisecond):
		}
	}
	ready := <-readyc
	if ready.err != nil {
		return r, ready.err
	}
	reg, err := s.WaitRegistered(ctx)
	if err != nil {
		return r, err
	}
	r.Ready, r.FirstArena, r.Registered = ready.at.Sub(t0), reg.First().Sub(t0), reg.All().Sub(t0)
	if fresh {
		return r, writeRegKey(ctx, s, so.ArenaCount)
	}
	return r, nil
}
