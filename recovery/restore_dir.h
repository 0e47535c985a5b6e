// Restore directories (docs/cli.md, "Restore directories"): what `gradsnap restore` writes for a
// replayed or resharded state and `gradsnap-train --init-from` reads.
//
// FORMAT
//   Rank files: DIR/rank<R>.safetensors for R in [0, M), each the FULL shard a trainer with M
//   ranks would have saved (tensors params, adam_m, adam_v: f32 slices of SliceOfRank-style
//   contiguous ranges; replicated_state: u8 train state text), with the gradsnap-shard-v1
//   metadata of docs/cli.md ("slice.<tensor>" = FLAT:OFFSET:TOTAL).
//   Consolidated: DIR/model.safetensors (each parameter by name and shape, F32 or BF16) or,
//   when the weights pass max_shard_bytes, DIR/model-0000I-of-0000N.safetensors (parameters
//   in layout order, at most max_shard_bytes each, a larger parameter alone) with
//   DIR/model.safetensors.index.json ({"metadata": {"total_size": BYTES}, "weight_map":
//   {name: file}}), the layout transformers loads;
//   DIR/optimizer.safetensors ("<name>.exp_avg" and "<name>.exp_avg_sq", F32) and
//   DIR/trainer_state.json. Every model file's __metadata__ carries "train_state" (the text).
//   DIR/manifest.json is written last, so a directory without it is incomplete.
//   Every file is written as NAME.tmp, fsynced and renamed.
//
// THREAD SAFETY
//   Plain functions.
#ifndef GRADSNAP_RECOVERY_RESTORE_DIR_H_
#define GRADSNAP_RECOVERY_RESTORE_DIR_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "recovery/recovery_point.h"

namespace gradsnap {
namespace recovery {

inline constexpr const char* kRestoreFormat = "gradsnap-restore-v1";

// A whole logical training state in memory.
struct FullState {
  std::string job;
  int64_t step = 0;
  std::string state;     // train state text
  RecoveryPoint source;  // the FULL and DELTAs it was restored from
  std::vector<float> master, m, v;
};

struct WrittenFile {
  std::string path;
  uint64_t bytes = 0;
  int32_t rank = -1;  // -1 for consolidated files
};

// Writes the rank files of `s` cut for world_size ranks to path_of(R) (DIR/rank<R>.safetensors
// for a restore directory), every rank or only `only_rank` (>= 0). The directory must exist.
// Every file is staged before any is renamed into place (StagedFiles): on error the files of
// these names are as they were.
absl::StatusOr<std::vector<WrittenFile>> WriteRankFiles(
    const FullState& s, int world_size, const std::function<std::string(int)>& path_of,
    int only_rank = -1);
// DIR/rank<R>.safetensors
std::string RankFilePath(const std::string& dir, int rank);
inline constexpr const char* kModelFile = "model.safetensors";
inline constexpr const char* kModelIndexFile = "model.safetensors.index.json";
// "model-0000<i+1>-of-0000<n>.safetensors": the i-th (from 0) of n model files.
std::string ModelShardName(size_t i, size_t n);
// Writes the model (in `dtype`: kF32 or kBF16) as model.safetensors, or, when its weights
// pass max_shard_bytes (0: never), as model files of at most that size with their index;
// then optimizer.safetensors and trainer_state.json, staged together as WriteRankFiles's; the
// other layout's model files already in `dir` are removed. FAILED_PRECONDITION when the state
// carries no model layout.
absl::StatusOr<std::vector<WrittenFile>> WriteConsolidated(const std::string& dir,
                                                           const FullState& s, DType dtype,
                                                           uint64_t max_shard_bytes = 0);
// Writes DIR/manifest.json describing the files: call last.
absl::Status WriteRestoreManifest(const std::string& dir, const FullState& s, int world_size,
                                  bool consolidated, const std::vector<WrittenFile>& files);

// Files written complete under temporary names, then renamed over their final names together
// (Commit): a failure before Commit leaves every final name as it was, so a set of files (the
// rank files of one export or restore) is never left mixing two checkpoints. Whatever was not
// renamed is removed by the destructor.
class StagedFiles {
 public:
  StagedFiles() = default;
  StagedFiles(const StagedFiles&) = delete;
  StagedFiles& operator=(const StagedFiles&) = delete;
  ~StagedFiles();
  // `tmp`, complete and synced, is to become `path`.
  void Add(std::string tmp, std::string path);
  // Renames every staged file into place, in the order added. Every final name is checked
  // first (client::CheckOutputFile): one taken by a directory or a device fails before any
  // rename. A rename failing after that (rare: the names share their directory) is reported,
  // naming the final name, with the files renamed before it in place and the rest removed.
  absl::Status Commit();

 private:
  std::vector<std::pair<std::string, std::string>> files_;  // temporary, final; not renamed
};

// Writes `parts` back to back to a temporary name of `path`'s own (storage::UniqueTempPath,
// created exclusively), fdatasynced, and adds it to `staged`; on error the temporary is
// removed.
absl::Status StageFile(const std::string& path,
                       const std::vector<std::pair<const void*, uint64_t>>& parts,
                       StagedFiles* staged);
// StageFile, then Commit: `path` is replaced whole or left as it was.
absl::Status WriteFileAtomically(const std::string& path,
                                 const std::vector<std::pair<const void*, uint64_t>>& parts);

// One safetensors tensor to write.
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t bytes = 0;
};
// Stages (StageFile) a safetensors file for `path` with the tensors in order and string
// metadata.
absl::Status StageSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, std::string>>& metadata,
                              const std::vector<SafetensorsTensor>& tensors, StagedFiles* staged);
// StageSafetensors, then Commit.
absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, std::string>>& metadata,
                              const std::vector<SafetensorsTensor>& tensors);

}  // namespace recovery
}  // namespace gradsnap

#endif  // GRADSNAP_RECOVERY_RESTORE_DIR_H_
