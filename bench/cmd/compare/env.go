// The machine and software a session ran on, for the report's method section.

package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
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
	e.CPUIdle = cpuIdleDriver()
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

// cpuIdleDriver describes the kernel's cpuidle driver, and for the
// haltpoll driver of a guest how long an idle CPU polls before it halts
// ("" without cpuidle).
func cpuIdleDriver() string {
	b, err := os.ReadFile(filepath.Join(cpuSysfs, "cpuidle/current_driver"))
	if err != nil {
		return ""
	}
	driver := strings.TrimSpace(string(b))
	if driver != "haltpoll" {
		return driver
	}
	b, err = os.ReadFile(haltPollParam)
	ns, perr := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	switch {
	case err != nil || perr != nil:
		return driver
	case ns == 0:
		return "haltpoll, an idle CPU halts at once (guest_halt_poll_ns 0)"
	}
	return fmt.Sprintf("haltpoll, an idle CPU polls up to %v before it halts", time.Duration(ns))
}

// haltPollParam is how long, in nanoseconds, the haltpoll cpuidle driver
// of a Linux guest has an idle CPU poll before it halts.
const haltPollParam = "/sys/module/haltpoll/parameters/guest_halt_poll_ns"

// setIdlePoll sets the haltpoll parameter at path to d, and returns what
// sets it back. A wake-up from a halt goes through the host: polling
// first, as one turns deep C-states off on a benchmark machine, keeps that
// cost, which varies from one session to the next, off the latencies.
func setIdlePoll(path string, d time.Duration) (restore func() error, err error) {
	old, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, []byte(strconv.FormatInt(d.Nanoseconds(), 10)), 0o644); err != nil {
		return nil, fmt.Errorf("setting %s: %w", path, err)
	}
	return func() error {
		if err := os.WriteFile(path, old, 0o644); err != nil {
			return fmt.Errorf("restoring %s to %s: %w", path, strings.TrimSpace(string(old)), err)
		}
		return nil
	}, nil
}

// cpuSysfs is where Linux describes the CPUs.
const cpuSysfs = "/sys/devices/system/cpu"

// haltingIdleStates lists the usage counters, under a CPU sysfs tree
// (cpuSysfs), of the CPUs' idle states that halt them: every cpuidle
// state but POLL, where an idle CPU spins.
func haltingIdleStates(sysfs string) []string {
	dirs, _ := filepath.Glob(filepath.Join(sysfs, "cpu[0-9]*/cpuidle/state[0-9]*"))
	var usage []string
	for _, d := range dirs {
		name, err := os.ReadFile(filepath.Join(d, "name"))
		if err == nil && strings.TrimSpace(string(name)) != "POLL" {
			usage = append(usage, filepath.Join(d, "usage"))
		}
	}
	return usage
}

// idleCounter returns a loadgen.Options.Counters that counts the
// entries into the idle states of haltingIdleStates(sysfs), as
// report.CPUIdleEntries; nil where the kernel exposes none. Once a
// counter cannot be read it counts nothing more, so that no growth is
// taken between a partial sum and a whole one.
func idleCounter(sysfs string) func() map[string]uint64 {
	usage := haltingIdleStates(sysfs)
	if len(usage) == 0 {
		return nil
	}
	var broken atomic.Bool
	return func() map[string]uint64 {
		var sum uint64
		for _, f := range usage {
			b, err := os.ReadFile(f)
			n, perr := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
			if err != nil || perr != nil {
				broken.Store(true)
			}
			sum += n
		}
		if broken.Load() {
			return nil
		}
		return map[string]uint64{report.CPUIdleEntries: sum}
	}
}
