//go:build unix

package freeport

import (
	"errors"
	"os"
	"syscall"
)

// portLocks is one file that every process using this package shares; a
// port's lock is a POSIX record lock on the byte at the port's offset.
// The kernel drops a process's locks when it exits, however it exits, and
// no file per port is left behind. The file stays open for the life of
// the process: closing any descriptor of it would drop all of them.
type portLocks struct{ f *os.File }

func openPortLocks(path string) (*portLocks, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	return &portLocks{f: f}, nil
}

// lock takes port's lock without waiting: errPortLocked when another
// process holds it.
func (l *portLocks) lock(port int) error {
	err := l.set(syscall.F_WRLCK, port)
	if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES) {
		return errPortLocked
	}
	return err
}

// unlock releases port's lock.
func (l *portLocks) unlock(port int) { _ = l.set(syscall.F_UNLCK, port) }

func (l *portLocks) set(typ int16, port int) error {
	return syscall.FcntlFlock(l.f.Fd(), syscall.F_SETLK, &syscall.Flock_t{Type: typ, Whence: 0, Start: int64(port), Len: 1})
}
