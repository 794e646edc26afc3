// Under SyncNone, Pebble's WAL syncs only hand its buffered records to the kernel.

package store

import (
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// flushOnlyWAL is the file system of the index under SyncNone. Pebble keeps
// the records of commits made without a sync in a 32 KiB block in the
// process and writes the block out only when it is full, so a process
// killed after acknowledging a commit lost its index entry (while its record,
// written into the arena's shared mapping, survived). A synced commit makes
// Pebble write the block out first; on this file system the sync that
// follows does nothing for WAL files. So a commit reaches the kernel before
// it is acknowledged, a process crash loses nothing, and the kernel writes
// back when it likes: what SyncNone promises. Every other file (tables,
// MANIFEST, OPTIONS) syncs as usual, so a machine crash loses recent writes
// but never the index's consistency.
type flushOnlyWAL struct{ vfs.FS }

// isWAL reports whether name is a Pebble WAL file ("000123.log").
func isWAL(name string) bool { return strings.HasSuffix(name, ".log") }

func (fs flushOnlyWAL) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	if err != nil || !isWAL(name) {
		return f, err
	}
	return unsyncedFile{f}, nil
}

func (fs flushOnlyWAL) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, category)
	if err != nil || !isWAL(newname) {
		return f, err
	}
	return unsyncedFile{f}, nil
}

// unsyncedFile is a WAL file whose syncs are left to the kernel's
// writeback.
type unsyncedFile struct{ vfs.File }

func (unsyncedFile) Sync() error                { return nil }
func (unsyncedFile) SyncData() error            { return nil }
func (unsyncedFile) SyncTo(int64) (bool, error) { return false, nil }
