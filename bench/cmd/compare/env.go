// The machine and software a session ran on, for the report's method section.

package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/rkv-io/rkv/bench/report"
	"github.com/rkv-io/rkv/bench/target"
)

func collectEnv(ctx context.Context) (report.Env, error) {
	e := report.Env{Date: time.Now().UTC(), NProc: runtime.NumCPU(), GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				e.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if e.CPU == "" {
		e.CPU = "unknown CPU (" + runtime.GOARCH + ")"
	}
	total, avail, err := memInfo()
	if err != nil {
		return e, err
	}
	e.MemTotalBytes, e.MemAvailableBytes = total, avail
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		e.Kernel = strings.TrimSpace(string(b))
	}
	if e.Redis, err = target.RedisVersion(""); err != nil {
		return e, fmt.Errorf("%w (install Debian's redis-server package)", err)
	}
	// "Redis server v=7.0.15 sha=... malloc=... build=...": the version is enough.
	if f := strings.Fields(e.Redis); len(f) > 3 {
		e.Redis = strings.Join(f[:3], " ")
	}
	e.Commit = "unknown"
	if out, err := exec.CommandContext(ctx, "git", "describe", "--always", "--dirty").Output(); err == nil {
		e.Commit = strings.TrimSpace(string(out))
	}
	return e, nil
}

// memInfo returns MemTotal and MemAvailable from /proc/meminfo, in bytes.
func memInfo() (total, avail uint64, err error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, 0, fmt.Errorf("reading the memory size: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, err := strconv.ParseUint(fields[1], 10, 64)
		if err != nil {
			continue
		}
		switch fields[0] {
		case "MemTotal:":
			total = kb << 10
		case "MemAvailable:":
			avail = kb << 10
		}
	}
	if total == 0 || avail == 0 {
		return 0, 0, fmt.Errorf("no MemTotal or MemAvailable in /proc/meminfo")
	}
	return total, avail, sc.Err()
}
