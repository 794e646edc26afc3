// Shards: how a key finds its shard, and the shard words a server publishes for one-sided readers.

package proto

import (
	"encoding/binary"
	"fmt"

	"github.com/cespare/xxhash/v2"
)

// The cluster map assigns the key space to servers in NumShards shards. A
// key's shard depends on the key alone, so every process computes it the
// same way; the map says which servers hold each shard at each epoch.
//
// NumShards is part of the format (the store keys its Pebble entries by
// shard, the index region holds one word per shard): 1024 balances a
// cluster of up to ~100 servers within 10% and keeps the map a client
// fetches near 10 KiB.
const NumShards = 1024

// shardBits is log2(NumShards).
const shardBits = 10

// Shard is a shard number, below NumShards.
type Shard uint16

// ShardOf returns key's shard: the top bits of a hash independent of the
// index's (which is seeded per table).
func ShardOf(key []byte) Shard {
	h := xxhash.Sum64(key) ^ 0x7368617264736565 // "shardsee"
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return Shard(h >> (64 - shardBits))
}

func (s Shard) String() string { return fmt.Sprintf("shard %d", uint16(s)) }

// Shard words. A server's index region is its hash table followed by one
// little-endian 8-byte word per shard. While the server owns the shard the
// word holds, in its low 48 bits, the map epoch since which it owns it (the
// shard's Since in the map that made it the owner) and, in its top 16
// bits, a sequence number the server bumps at every activation of a shard;
// it is 0 while the server does not own the shard. The server sets the
// word once the shard's keys are all in its index, and clears it before it
// takes any out when it hands the shard over.
//
// A one-sided reader needs it for one case only. A record it finds live
// (the key's, with a valid CRC) is current whoever owns the shard, because
// a server marks its records of a shard dead before it gives the shard up
// and keeps records of a shard it is receiving dead until it owns it. But
// "not found" in a server's index means something only if that server
// owned the shard for the whole time the index was read: so on a miss the
// reader READs the word, the key's neighborhood again, and the word again,
// each fenced behind the one before. Only if both words are equal and say
// the Since of the shard in the reader's map, and the neighborhood still
// holds no record of the key, is the key absent; otherwise the reader
// refreshes its map and retries, never answering "not found". The
// sequence number makes an ownership that ended and began again between
// the two READs (a move away aborted) show as a change.
const ShardWordSize = 8

// MaxShardSince is the largest epoch a shard word holds.
const MaxShardSince = 1<<48 - 1

// ShardWord is the word of a shard owned since epoch since, at activation
// seq.
func ShardWord(since, seq uint64) uint64 { return since&MaxShardSince | seq<<48 }

// ShardWordSince is the epoch a shard word says, 0 when it says the
// server does not own the shard.
func ShardWordSince(w uint64) uint64 { return w & MaxShardSince }

// ShardWordsBytes is the size of the shard words at the end of an index
// region.
const ShardWordsBytes = NumShards * ShardWordSize

// RegionBytes is the size of a server's whole index region: the table,
// then the shard words.
func (g IndexGeometry) RegionBytes() int { return g.TableBytes() + ShardWordsBytes }

// ShardWordOffset is the byte offset of shard s's word in the index
// region.
func (g IndexGeometry) ShardWordOffset(s Shard) int {
	return g.TableBytes() + int(s)*ShardWordSize
}

// DecodeShardWord reads a shard word READ from a server.
func DecodeShardWord(b []byte) uint64 { return binary.LittleEndian.Uint64(b) }

// PrefixEnd returns the smallest key greater than every key with prefix,
// or nil if there is none (the prefix is all 0xff): a scan from prefix to
// PrefixEnd(prefix) lists the keys with that prefix.
func PrefixEnd(prefix []byte) []byte {
	end := append([]byte(nil), prefix...)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i]++; end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}
