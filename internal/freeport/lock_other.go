//go:build !unix

package freeport

import (
	"errors"
	"os"
)

// lockPort cannot lock across processes here: Loopback lets the kernel
// choose instead.
func lockPort(dir string, port int) (*os.File, error) {
	return nil, errors.New("freeport: no port locks on this system")
}
