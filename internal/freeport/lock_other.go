//go:build !unix

package freeport

import "errors"

// portLocks cannot lock across processes here: Loopback lets the kernel
// choose instead.
type portLocks struct{}

func openPortLocks(string) (*portLocks, error) {
	return nil, errors.New("freeport: no port locks on this system")
}

func (*portLocks) lock(int) error { return errors.New("freeport: no port locks on this system") }

func (*portLocks) unlock(int) {}
