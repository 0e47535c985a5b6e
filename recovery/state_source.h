// Where a restore reads training state from: the checkpoints of a job in the store (through the
// client), or a directory written by `gradsnap restore` (docs/cli.md, "Restore directories").
//
// OVERVIEW
//   A source lists checkpoints and describes each as a CheckpointView: the pieces of every
//   logical flat buffer ("params", "adam_m", "adam_v", a DELTA's "grad") held by which shard
//   and tensor, plus each shard's small tensors. A restore of any element range [lo, hi) of a
//   flat buffer reads just the byte ranges of the pieces that overlap it (restore_state.h), so
//   a checkpoint written by N ranks is read back exactly by M ranks.
//
// ERRORS
//   Reads of damaged data return DATA_LOSS naming the job, step, rank and tensor.
//
// THREAD SAFETY
//   Read and Describe may be called from several threads at once (a restore describes a FULL
//   and its DELTAs together); List from one at a time.
#ifndef GRADSNAP_RECOVERY_STATE_SOURCE_H_
#define GRADSNAP_RECOVERY_STATE_SOURCE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/client.h"
#include "common/dtype.h"

namespace gradsnap {
namespace recovery {

// Names of the flat buffers and small tensors (trainer/train_state.h, gpu_snapshot/grad_log.h).
inline constexpr const char* kFlatParams = "params";
inline constexpr const char* kFlatAdamM = "adam_m";
inline constexpr const char* kFlatAdamV = "adam_v";
inline constexpr const char* kFlatGrad = "grad";
inline constexpr const char* kReplicatedTensor = "replicated_state";
inline constexpr const char* kDeltaHeaderTensor = "delta_header";

// Part of a flat buffer: elements [flat_offset, flat_offset + count) are the tensor `tensor` of
// shard `rank` from element `first` of that tensor on.
struct FlatPiece {
  int32_t rank = 0;
  std::string tensor;
  DType dtype = DType::kF32;
  uint64_t flat_offset = 0;
  uint64_t count = 0;
  uint64_t first = 0;
};

struct FlatBuffer {
  uint64_t total = 0;             // elements of the logical buffer
  std::vector<FlatPiece> pieces;  // sorted by flat_offset
};

struct CheckpointView {
  storage::CheckpointInfo info;             // info.metadata: the train state text
  std::map<std::string, FlatBuffer> flats;  // by flat name
  // Each shard's tensors by name (byte lengths, dtypes), for the small tensors.
  std::map<int32_t, std::map<std::string, storage::TensorSpec>> tensors;
  const FlatBuffer* Flat(const std::string& name) const;
};

// Builds the view of a manifest from its tensors' flat_name/flat_offset/flat_total.
absl::StatusOr<CheckpointView> ViewOfManifest(const storage::Manifest& m);

class StateSource {
 public:
  virtual ~StateSource() = default;
  // Committed checkpoints, oldest first. NOT_FOUND when the job has none.
  virtual absl::StatusOr<std::vector<storage::CheckpointInfo>> List() = 0;
  virtual absl::StatusOr<CheckpointView> Describe(int64_t step) = 0;
  // Reads `length` bytes from byte `offset` of tensor `tensor` of shard `rank` of `step`.
  virtual absl::Status Read(int64_t step, int32_t rank, const std::string& tensor, uint64_t offset,
                            uint64_t length, void* out) = 0;
  // For messages: "job J" or "directory D".
  virtual std::string Name() const = 0;
};

// The checkpoints of `job` through `client` (not owned; must outlive the source). Reads are
// ranged reads (Client::ReadShardRange), so only the bytes asked for leave the store.
std::unique_ptr<StateSource> NewClientSource(client::Client* client, const std::string& job);

// A directory written by `gradsnap restore` (rank files or --consolidate). Every tensor carries
// its SHA-256 in its file's metadata: with verify_all every tensor is checked on open, else each
// tensor when it is first read (whole, once); a mismatch is DATA_LOSS. FAILED_PRECONDITION when
// it is not a complete restore output (no manifest.json) or holds a raw DELTA record; reading
// bf16 weights is refused by RestoreRange (not exact enough to continue training).
absl::StatusOr<std::unique_ptr<StateSource>> OpenDirSource(const std::string& dir,
                                                           bool verify_all = false);

}  // namespace recovery
}  // namespace gradsnap

#endif  // GRADSNAP_RECOVERY_STATE_SOURCE_H_
