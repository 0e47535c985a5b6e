// Metadata records and their RocksDB keys (docs/format.md, "Metadata").
//
// RocksDB is the source of truth: a checkpoint, shard or chunk exists when its key does. Keys
// are ASCII with '/' separators (names cannot contain '/'); numbers are zero-padded decimal so
// keys sort by number. Values are a version byte followed by little-endian fields.
//
//   c/<job>/<step:20>                      CheckpointRecord
//   s/<job>/<step:20>/<rank:10>            ShardRecord
//   k/<job>/<step:20>/<rank:10>/<idx:10>   ChunkRecord (chunk idx of the shard's stream)
//
// THREAD SAFETY: MetaStore is thread-safe (RocksDB is); read-modify-write sequences are
// serialized by the engine.
#ifndef GRADSNAP_STORAGE_METADATA_H_
#define GRADSNAP_STORAGE_METADATA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/digest.h"
#include "storage/chunk_codec.h"
#include "storage/types.h"

namespace rocksdb {
class DB;
class WriteBatch;
}  // namespace rocksdb

namespace gradsnap {
namespace storage {

struct CheckpointRecord {
  CheckpointSpec spec;
  CheckpointState state = CheckpointState::kPending;
  int64_t created_unix_ms = 0;
  int64_t committed_unix_ms = 0;
  int32_t committed_shards = 0;
  uint64_t raw_bytes = 0;     // over committed shards
  uint64_t stored_bytes = 0;
};

struct SegmentRef {
  uint32_t seq = 0;        // file r<rank>-<seq>.seg in the checkpoint's directory
  uint64_t durable_end = 0;  // bytes of the file covered by synced metadata
};

struct ShardRecord {
  ShardSpec spec;
  bool committed = false;
  uint64_t committed_size = 0;   // durable payload bytes (a prefix of the stream)
  uint32_t chunk_count = 0;      // chunk keys 0..chunk_count-1 exist
  uint64_t stored_bytes = 0;     // sum of record lengths
  std::vector<SegmentRef> segments;
  std::vector<std::string> tensor_digests;  // hex, filled for tensors wholly durable
  // The algorithm of tensor_digests, fixed when the shard record is created. Records of
  // version 1 (written before digests were selectable) are SHA-256.
  DigestAlgo digest_algo = DigestAlgo::kSha256;
  // The writer epoch of the attempt whose bytes the durable prefix holds (0: unfenced writers
  // only). A writer of a newer attempt starts the shard over instead of resuming another
  // attempt's bytes. Records of version 1 and 2 have none (0).
  uint64_t epoch = 0;
};

// Where one tensor's bytes lie in a packed chunk (docs/format.md, "Packed chunks").
struct ChunkMember {
  uint32_t tensor = 0;  // index into ShardSpec::tensors
  uint32_t offset = 0;  // first byte in the chunk's raw bytes
  uint32_t length = 0;  // bytes of the tensor in this chunk
};

struct ChunkRecord {
  ChunkHeader header;
  uint32_t tensor = 0;    // index into ShardSpec::tensors (a packed chunk: its first tensor)
  uint32_t segment = 0;   // SegmentRef::seq
  uint64_t offset = 0;    // record offset in the segment file
  // A packed chunk (format 3) holds bytes of several consecutive small tensors: every one of
  // them, in stream order, tiling the chunk. Empty: the chunk holds bytes of `tensor` only.
  std::vector<ChunkMember> members;
};

std::string CheckpointKey(const std::string& job, int64_t step);
std::string CheckpointPrefix(const std::string& job);  // all checkpoints of a job
std::string ShardKey(const std::string& job, int64_t step, int32_t rank);
std::string ShardPrefix(const std::string& job, int64_t step);
std::string ChunkKey(const std::string& job, int64_t step, int32_t rank, uint32_t idx);
std::string ChunkPrefix(const std::string& job, int64_t step, int32_t rank);
std::string ChunkStepPrefix(const std::string& job, int64_t step);

// The name of segment file `seq` of rank `rank` inside its checkpoint's directory
// (docs/format.md, "Segment files"): r<rank, 10 digits>-<seq, 6 digits>.seg.
std::string SegmentFileName(int32_t rank, uint32_t seq);
// The inverse; false for any other name.
bool ParseSegmentName(const std::string& name, int32_t* rank, uint32_t* seq);

// Bytes free for an unprivileged writer on the file system holding `path` (or its nearest
// existing ancestor); UINT64_MAX when unknown.
uint64_t FreeBytes(const std::string& path);

// Free space segment data never takes where the catalog keeps a reserve
// (EngineOptions::catalog_reserve_bytes > 0): twice what a batch that only deletes needs, so
// that on a disk filled by checkpoint data `rm` and `gc` can still commit and free space.
inline constexpr uint64_t kSegmentFloorBytes = 2u << 20;

// Free space a batch that only deletes needs (for its WAL record), and so the least a node
// below its catalog's reserve needs to open its catalog read-write (docs/format.md, "Full
// disks"): with less, the catalog opens read-only and even rm and gc wait for a restart.
inline constexpr uint64_t kMinFreeForDeletes = 1u << 20;

// RESOURCE_EXHAUSTED when the file system holding `dir` has less than reserve_bytes free (0:
// no reserve): the one message of a write refused for want of space, naming both figures.
absl::Status CheckRoomToAdd(const std::string& dir, uint64_t reserve_bytes);

std::string EncodeCheckpoint(const CheckpointRecord& r);
std::string EncodeShard(const ShardRecord& r);
std::string EncodeChunk(const ChunkRecord& r);
// DATA_LOSS when the value is malformed.
absl::Status DecodeCheckpoint(const std::string& v, CheckpointRecord* r);
absl::Status DecodeShard(const std::string& v, ShardRecord* r);
absl::Status DecodeChunk(const std::string& v, ChunkRecord* r);
// DATA_LOSS unless the chunk's stream range lies where its records say: within `tensor`, or
// for a packed chunk tiled by its members, each within its tensor. tensor_start[i] is the
// stream offset of tensor i, with the shard's total at the end.
absl::Status CheckChunkPlacement(const std::vector<uint64_t>& tensor_start,
                                 const ChunkRecord& c);

// A thin wrapper around RocksDB that converts its errors to absl::Status.
class MetaStore {
 public:
  enum class Mode {
    kCreate,    // read-write, creating an empty database if missing
    kExisting,  // read-write, the database must exist
    kReadOnly,  // RocksDB OpenForReadOnly: never writes to `dir` (no LOCK, no LOG files)
  };
  // low_space: a read-write open below the catalog's reserve keeps what it recovers from the
  // WAL in memory (RocksDB's avoid_flush_during_recovery) instead of writing it to a new table.
  static absl::StatusOr<std::unique_ptr<MetaStore>> Open(const std::string& dir,
                                                         Mode mode = Mode::kCreate,
                                                         bool low_space = false);
  ~MetaStore();

  // NOT_FOUND when absent.
  absl::StatusOr<std::string> Get(const std::string& key);
  // (key, value) pairs with this prefix, in key order.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(
      const std::string& prefix);
  // One synced, atomic batch. `puts` then `deletes` (keys) then `delete_prefixes` ranges.
  struct Batch {
    std::vector<std::pair<std::string, std::string>> puts;
    std::vector<std::string> deletes;
    std::vector<std::string> delete_prefixes;
  };
  // FAILED_PRECONDITION when opened read-only. RESOURCE_EXHAUSTED, without calling RocksDB,
  // when the batch puts keys and the file system has less than reserve_bytes free: RocksDB is
  // never driven into ENOSPC by a write that adds data (a failed WAL write leaves it in a state
  // where its own assertions abort the process). Batches that only delete need just
  // kMinFreeForDeletes (or reserve_bytes if smaller), so space can be freed on a nearly full
  // disk.
  absl::Status Commit(const Batch& batch);
  // The batch that removes every catalog key of checkpoint (job, step): its checkpoint record,
  // its shard records and its chunk records.
  static Batch DeleteCheckpointBatch(const std::string& job, int64_t step);
  bool read_only() const { return read_only_; }
  void set_reserve_bytes(uint64_t n) { reserve_bytes_ = n; }

 private:
  MetaStore(rocksdb::DB* db, bool read_only, std::string dir)
      : db_(db), read_only_(read_only), dir_(std::move(dir)) {}
  rocksdb::DB* db_;
  const bool read_only_;
  const std::string dir_;
  uint64_t reserve_bytes_ = 0;
};

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_METADATA_H_
