// The data directory's identity: the server ID made at its first start, and the name it was made for.

package server

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// identityFile holds "name id\n".
const identityFile = "server.id"

// loadIdentity returns the data directory's server ID, making one (16 hex
// digits, random) when the directory has none. A directory made for
// another name is refused: the cluster map knows a server by its name and
// ID together, and a renamed data directory would look like a stranger
// holding another server's data.
func loadIdentity(dir, name string) (string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("server: the data directory: %w", err)
	}
	path := filepath.Join(dir, identityFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		fields := strings.Fields(string(b))
		if len(fields) != 2 || len(fields[1]) != 16 {
			return "", fmt.Errorf("server: %s is corrupt (want \"name id\"): fix or remove it only if this data directory is new", path)
		}
		if fields[0] != name {
			return "", fmt.Errorf("server: the data directory %s belongs to server %q, not %q: a server's name must not change (start it with --name %s, or give this server its own --data-dir)",
				dir, fields[0], name, fields[0])
		}
		return fields[1], nil
	case !errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("server: reading the server ID: %w", err)
	}
	var raw [8]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", err
	}
	id := hex.EncodeToString(raw[:])
	tmp := path + ".tmp"
	if err := writeSynced(tmp, []byte(name+" "+id+"\n")); err != nil {
		return "", fmt.Errorf("server: recording the server ID: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("server: recording the server ID: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		err = d.Sync()
		d.Close()
		if err != nil {
			return "", fmt.Errorf("server: syncing %s: %w", dir, err)
		}
	}
	return id, nil
}

func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
