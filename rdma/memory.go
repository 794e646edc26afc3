// Registrable memory: page-aligned mappings outside the Go heap.

package rdma

import (
	"os"

	"github.com/rkv-io/rkv/rdma/internal/mem"
)

// Memory is a page-aligned mapping outside the Go heap, the only memory that
// can be registered. See Alloc and MapFile.
type Memory = mem.Memory

// MemlockError is returned by Register when the pages cannot be pinned; its
// message says how to raise RLIMIT_MEMLOCK.
type MemlockError = mem.MemlockError

// Alloc maps size bytes of zeroed anonymous memory, rounded up to whole
// pages, for use as registered buffers. Unmap it with Close once no
// registration covers it.
func Alloc(size int) (*Memory, error) { return mem.Alloc(size) }

// MapFile maps size bytes of f from offset (a multiple of the page size),
// shared and writable, for registration: stores through the mapping, local
// or by remote RDMA_WRITE, reach the file, and Memory.Sync makes them
// durable.
func MapFile(f *os.File, offset int64, size int) (*Memory, error) {
	return mem.MapFile(f, offset, size)
}

// PageSize is the system page size.
var PageSize = mem.PageSize
