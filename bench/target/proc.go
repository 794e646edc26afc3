// Package target starts the systems the comparison tool measures (a
// cluster of rkv-server processes, redis-server, a raw TCP echo server)
// and wraps each in a loadgen.Target, so that every system is driven by
// the same loadgen code.
//
// Every server runs as a process of its own, on 127.0.0.1, with its own
// directory; a process is stopped with SIGTERM (SIGKILL after a timeout)
// by Close, which callers must call.
package target

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Process is a child process whose stdout and stderr go to a log file.
// Its methods are safe for concurrent use.
type Process struct {
	// Name identifies the process in errors.
	Name string
	// LogPath is the file receiving its output.
	LogPath string
	// Started is when the process was started (just before exec).
	Started time.Time

	cmd *exec.Cmd
	// logStart is the log's size when the process started: WaitLog
	// reads only what this process wrote.
	logStart int64
	done     chan struct{}
	err      error // Wait's result, valid once done is closed
}

// StartProcess starts bin with args, its output appended to logPath
// (WaitLog and LogTail see only what this process wrote).
func StartProcess(name, logPath, bin string, args ...string) (*Process, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	defer logf.Close()
	st, err := logf.Stat()
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, logStart: st.Size(), done: make(chan struct{})}
	p.Started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s (%s %s): %w", name, bin, strings.Join(args, " "), err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// Pid is the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.done }

// Stop sends SIGTERM, waits up to timeout for the process to exit, then
// kills it. It returns an error if the process had to be killed or
// exited with a failure status (an exit caused by our own SIGTERM is a
// success). Stopping an exited process only reports how it ended.
func (p *Process) Stop(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.exitErr()
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.exitErr()
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s (pid %d) still running %v after SIGTERM: killed; log %s", p.Name, p.Pid(), timeout, p.LogPath)
	}
}

func (p *Process) exitErr() error {
	if p.err == nil {
		return nil
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
	}
	return fmt.Errorf("%s (pid %d) exited: %v; log %s:\n%s", p.Name, p.Pid(), p.err, p.LogPath, p.LogTail(20))
}

// LogTail returns the last n lines of the process's log.
func (p *Process) LogTail(n int) string {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return fmt.Sprintf("(reading %s: %v)", p.LogPath, err)
	}
	if int64(len(b)) >= p.logStart {
		b = b[p.logStart:]
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// WaitLog polls the log until a line satisfies match, and returns that
// line. It fails when ctx ends or the process exits first.
func (p *Process) WaitLog(ctx context.Context, what string, match func(line string) bool) (string, error) {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if line, ok := p.findLine(match); ok {
			return line, nil
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("waiting for %s of %s: %w; log %s:\n%s", what, p.Name, ctx.Err(), p.LogPath, p.LogTail(20))
		case <-p.done:
			if line, ok := p.findLine(match); ok {
				return line, nil
			}
			return "", fmt.Errorf("%s exited while waiting for %s: %v; log %s:\n%s", p.Name, what, p.err, p.LogPath, p.LogTail(20))
		case <-tick.C:
		}
	}
}

func (p *Process) findLine(match func(string) bool) (string, bool) {
	f, err := os.Open(p.LogPath)
	if err != nil {
		return "", false
	}
	defer f.Close()
	if _, err := f.Seek(p.logStart, io.SeekStart); err != nil {
		return "", false
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if match(sc.Text()) {
			return sc.Text(), true
		}
	}
	return "", false
}
