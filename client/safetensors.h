// Export of checkpoint shards as safetensors files (docs/cli.md, "safetensors layout"), so other
// tools can load a gradsnap checkpoint; `gradsnap restore` and `gradsnap export` both write it.
//
// FORMAT
//   8-byte little-endian header length N, N bytes of JSON (padded with spaces to a multiple of 8),
//   then the shard's payload: its tensors' raw bytes in manifest order, back to back. The header
//   maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} relative to the
//   start of the payload, plus "__metadata__" with string values describing the checkpoint
//   (job, step, rank, world size, kind, per-tensor SHA-256, slices, base64 metadata blobs).
//   EncodeSafetensorsHeader and ParseSafetensorsHeader are the one writer and the one reader of
//   this header in the tree: the export here, restore directories (recovery/restore_dir.cc)
//   and their reader (recovery/dir_source.cc).
//
// THREAD SAFETY
//   Stateless functions; concurrent exports to different files are fine.
#ifndef GRADSNAP_CLIENT_SAFETENSORS_H_
#define GRADSNAP_CLIENT_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/client.h"

namespace gradsnap {
namespace client {

// One tensor's entry in a safetensors header; the tensors lie back to back in the given order.
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t bytes = 0;
};

// The header bytes (length prefix included) for `tensors` in order, with the string `metadata`
// (key, value; JSON-quoted here, in this order) under "__metadata__"; the JSON is padded with
// spaces to a multiple of 8 so the payload starts 8-byte aligned. The one encoder of the
// layout: the export and `gradsnap restore`'s files (recovery/restore_dir.cc) both use it.
std::string EncodeSafetensorsHeader(
    const std::vector<std::pair<std::string, std::string>>& metadata,
    const std::vector<SafetensorsEntry>& tensors);

// Headers longer than this are refused by the reader (ours are a few KiB; gpt2-1558m's model
// file ~100 KiB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 64u << 20;

// A safetensors header as read back: the decoder of what EncodeSafetensorsHeader writes (and of
// any safetensors file of the dtypes gradsnap knows).
struct SafetensorsHeaderInfo {
  struct Tensor {
    DType dtype = DType::kUnknown;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;  // byte range in the data section
  };
  uint64_t data_start = 0;                    // where the data section begins: 8 + JSON length
  std::map<std::string, std::string> metadata;  // "__metadata__" (a non-string value: its text)
  std::map<std::string, Tensor> tensors;        // by name
};

// The JSON length N of a safetensors file of `file_bytes` bytes, from `file_start`, its first 8
// bytes (fewer only when the file is shorter). DATA_LOSS naming `what` when the file is shorter
// than 8 bytes or N runs past its end or over kMaxSafetensorsHeaderBytes.
absl::StatusOr<uint64_t> SafetensorsHeaderLength(absl::string_view file_start,
                                                 uint64_t file_bytes, const std::string& what);

// Parses `json`, the header of a safetensors file of `file_bytes` bytes (its 8-byte length
// prefix and `json` included). DATA_LOSS naming `what` on bad JSON, a header that is not an
// object, or a tensor entry without a known dtype, a shape of non-negative integers, or a data
// range inside the file.
absl::StatusOr<SafetensorsHeaderInfo> ParseSafetensorsHeader(absl::string_view json,
                                                             uint64_t file_bytes,
                                                             const std::string& what);

// SafetensorsHeaderLength and ParseSafetensorsHeader over a whole file in memory.
absl::StatusOr<SafetensorsHeaderInfo> ParseSafetensors(absl::string_view file,
                                                       const std::string& what);

// The header bytes (length prefix included) of `shard` of checkpoint `ckpt`.
absl::StatusOr<std::string> SafetensorsHeader(const CheckpointInfo& ckpt, const ShardInfo& shard);

// The file name of `rank` for an export to `file`: `file` itself when world_size is 1, else
// `file` with ".rank<R>" inserted before the extension ("model.safetensors" ->
// "model.rank3.safetensors"; no extension: "model" -> "model.rank3").
std::string RankFileName(const std::string& file, int32_t rank, int32_t world_size);

// OK where a file may be written as `path` (replacing whatever of that name is there): not an
// existing directory (nor a symlink to one), not a device, FIFO or socket (an export must never
// replace /dev/null), and not a name that can only be a directory's (ending in '/', or whose
// last part is "." or ".."). INVALID_ARGUMENT naming `path` otherwise.
absl::Status CheckOutputFile(const std::string& path);

// Streams shard `rank` of the committed checkpoint `m` to `path` as a safetensors file. Writes a
// temporary of its own beside it (storage::UniqueTempPath), fsyncs and renames it over `path`,
// so `path` is either complete or as it was. Memory use is the client's read buffer, not the
// shard. `progress` gets this shard's payload bytes. With `staged`, the complete, synced
// temporary is not renamed: its name goes to *staged, for the caller to rename (several files
// replaced together) or remove. `path` is checked first (CheckOutputFile).
absl::Status ExportShardSafetensors(Client& client, const Manifest& m, int32_t rank,
                                    const std::string& path, const ProgressFn& progress = nullptr,
                                    std::string* staged = nullptr);

}  // namespace client
}  // namespace gradsnap

#endif  // GRADSNAP_CLIENT_SAFETENSORS_H_
