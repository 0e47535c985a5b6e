// The checkpoint data model shared by the storage engine, the service and the client
// (DESIGN.md section 3). Public (installed with gradsnap/client.h). Plain structs: no
// protobuf, gRPC or CUDA types.
#ifndef GRADSNAP_INCLUDE_GRADSNAP_TYPES_H_
#define GRADSNAP_INCLUDE_GRADSNAP_TYPES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gradsnap/digest_algo.h"
#include "gradsnap/dtype.h"

namespace gradsnap {
namespace storage {

enum class CheckpointKind : uint8_t { kFull = 1, kDelta = 2 };
enum class CheckpointState : uint8_t { kPending = 1, kCommitted = 2 };

// Everything needed to describe one tensor of a shard.
struct TensorSpec {
  std::string name;             // [A-Za-z0-9._-]{1,128}, unique within the shard
  DType dtype = DType::kUnknown;
  std::vector<int64_t> shape;   // product(shape) * DTypeSize(dtype) == byte_length
  uint64_t byte_length = 0;
  // Resharding (DESIGN.md section 3): this tensor holds elements
  // [flat_offset, flat_offset + numel) of the logical flat buffer `flat_name`, whose total
  // length is flat_total elements. Empty flat_name: the tensor is not a slice.
  std::string flat_name;
  uint64_t flat_offset = 0;
  uint64_t flat_total = 0;
  // Optional expected SHA-256 (lower-case hex). When set, Finish() fails with DATA_LOSS if the
  // received bytes hash differently, whatever the shard's digest algorithm. In a TensorInfo
  // of a SHA-256 shard it is the stored digest; of an XXH3-128 shard, the expected value given
  // at write time (empty if none).
  std::string sha256;
};

struct CheckpointSpec {
  std::string job;
  int64_t step = 0;               // >= 0
  CheckpointKind kind = CheckpointKind::kFull;
  int64_t base_step = -1;         // DELTA: the FULL checkpoint it applies to; FULL: -1
  int32_t world_size = 1;         // 1..65536
  std::string metadata;           // opaque bytes (<= 1 MiB) stored with the checkpoint
  // Writer epoch of the request (storage/epoch.h); 0 = unfenced. Not part of the stored spec.
  uint64_t epoch = 0;
};

struct ShardSpec {
  std::string job;
  int64_t step = 0;
  int32_t rank = 0;
  std::vector<TensorSpec> tensors;  // <= 100000 tensors
  std::string metadata;             // opaque per-shard bytes (<= 1 MiB)
  // Writer epoch of the request (storage/epoch.h); 0 = unfenced. Not part of the stored spec.
  uint64_t epoch = 0;
};

struct TensorInfo {
  TensorSpec spec;
  DigestAlgo digest_algo = DigestAlgo::kSha256;  // the shard's algorithm
  std::string digest;             // lower-case hex of the tensor's bytes; always filled
  uint64_t stored_bytes = 0;
  uint32_t chunks = 0;
};

struct ShardInfo {
  int32_t rank = 0;
  bool committed = false;
  uint64_t raw_bytes = 0;
  uint64_t stored_bytes = 0;
  std::string metadata;
  DigestAlgo digest_algo = DigestAlgo::kSha256;  // how its tensors were hashed when written
  std::vector<TensorInfo> tensors;
};

struct CheckpointInfo {
  std::string job;
  int64_t step = 0;
  CheckpointKind kind = CheckpointKind::kFull;
  int64_t base_step = -1;
  int32_t world_size = 1;
  CheckpointState state = CheckpointState::kPending;
  uint64_t raw_bytes = 0;         // sum over committed shards
  uint64_t stored_bytes = 0;
  int64_t created_unix_ms = 0;
  int64_t committed_unix_ms = 0;
  std::string metadata;
};

struct Manifest {
  CheckpointInfo info;
  std::vector<ShardInfo> shards;  // by rank; only shards begun so far
};

struct GcPolicy {
  int keep_last = 0;    // keep the newest N committed FULL checkpoints (0 = no limit)
  int keep_every = 0;   // also keep, per multiple of K, the newest FULL at or before it (0 = off)
};

struct GcResult {
  std::vector<int64_t> deleted_steps;
  uint64_t bytes_reclaimed = 0;
};

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_INCLUDE_GRADSNAP_TYPES_H_
