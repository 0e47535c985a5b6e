// The checks on what a client asks to write: checkpoint and shard specs (names, sizes,
// shapes, kinds and base steps), their comparison for a save repeated, and the stream layout
// of a shard's tensors.
//
// LOCKING: none; free functions over their arguments.
#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/names.h"
#include "common/status.h"
#include "storage/engine_impl.h"

namespace gradsnap {
namespace storage {
namespace {

constexpr size_t kMaxMetadataBytes = 1 << 20;
constexpr size_t kMaxTensors = 100000;

}  // namespace

std::string Where(const std::string& job, int64_t step, int32_t rank, const std::string& tensor) {
  std::string s = absl::StrCat("job ", job, " step ", step, " rank ", rank);
  if (!tensor.empty()) absl::StrAppend(&s, " tensor ", tensor);
  return s;
}

absl::Status ValidateCheckpointSpec(const CheckpointSpec& s) {
  RETURN_IF_ERROR(ValidateName(s.job, "job name"));
  if (s.step < 0) return absl::InvalidArgumentError(absl::StrCat("negative step ", s.step));
  if (s.world_size < 1 || s.world_size > 65536) {
    return absl::InvalidArgumentError(absl::StrCat("world_size ", s.world_size,
                                                   " outside 1..65536"));
  }
  if (s.kind != CheckpointKind::kFull && s.kind != CheckpointKind::kDelta) {
    return absl::InvalidArgumentError("unknown checkpoint kind");
  }
  if (s.kind == CheckpointKind::kFull && s.base_step != -1) {
    return absl::InvalidArgumentError("a FULL checkpoint has base_step -1");
  }
  if (s.kind == CheckpointKind::kDelta && (s.base_step < 0 || s.base_step >= s.step)) {
    return absl::InvalidArgumentError(absl::StrCat("DELTA base_step ", s.base_step,
                                                   " must be in [0, step)"));
  }
  if (s.metadata.size() > kMaxMetadataBytes) {
    return absl::InvalidArgumentError("checkpoint metadata larger than 1 MiB");
  }
  return absl::OkStatus();
}

std::vector<uint64_t> TensorStarts(const ShardSpec& spec) {
  std::vector<uint64_t> starts;
  starts.reserve(spec.tensors.size() + 1);
  uint64_t pos = 0;
  for (const TensorSpec& t : spec.tensors) {
    starts.push_back(pos);
    pos += t.byte_length;
  }
  starts.push_back(pos);
  return starts;
}

// The largest shard payload (sum of its tensors' byte_length): 2^56 bytes, so offsets and sums
// of a shard never overflow 64 bits.
constexpr uint64_t kMaxShardPayloadBytes = uint64_t{1} << 56;

absl::Status ValidateShardSpec(const ShardSpec& s, const CheckpointRecord& ckpt) {
  if (s.rank < 0 || s.rank >= ckpt.spec.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", s.rank, " outside world_size ",
                                                   ckpt.spec.world_size));
  }
  if (s.metadata.size() > kMaxMetadataBytes) {
    return absl::InvalidArgumentError("shard metadata larger than 1 MiB");
  }
  if (s.tensors.size() > kMaxTensors) {
    return absl::InvalidArgumentError("more than 100000 tensors in a shard");
  }
  std::set<std::string> names;
  unsigned __int128 payload = 0;
  for (const TensorSpec& t : s.tensors) {
    RETURN_IF_ERROR(ValidateName(t.name, "tensor name"));
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name ", t.name));
    }
    size_t es = DTypeSize(t.dtype);
    if (es == 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": unknown dtype ",
                                                     static_cast<int>(t.dtype)));
    }
    if (t.shape.size() > 64) return absl::InvalidArgumentError("more than 64 dimensions");
    unsigned __int128 numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name,
                                                                ": negative dimension"));
      numel *= static_cast<uint64_t>(d);
      if (numel > (uint64_t{1} << 50)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": too large"));
      }
    }
    if (numel * es != t.byte_length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", t.name, ": byte_length ", t.byte_length, " != product(shape) * ", es));
    }
    if (!t.flat_name.empty()) {
      RETURN_IF_ERROR(ValidateName(t.flat_name, "flat buffer name"));
      if (t.flat_offset > t.flat_total ||
          static_cast<uint64_t>(numel) > t.flat_total - t.flat_offset) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name,
                                                       ": slice outside its flat buffer"));
      }
    }
    payload += t.byte_length;
    if (payload > kMaxShardPayloadBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard payload over ", kMaxShardPayloadBytes, " bytes (at tensor ", t.name, ")"));
    }
    if (!t.sha256.empty()) {
      bool hex = t.sha256.size() == 64 &&
                 std::all_of(t.sha256.begin(), t.sha256.end(), [](char c) {
                   return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                 });
      if (!hex) return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name,
                                                               ": sha256 is not lower-case hex"));
    }
  }
  return absl::OkStatus();
}

bool SameShardSpec(const ShardSpec& a, const ShardSpec& b) {
  if (a.job != b.job || a.step != b.step || a.rank != b.rank || a.metadata != b.metadata ||
      a.tensors.size() != b.tensors.size()) {
    return false;
  }
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const TensorSpec& x = a.tensors[i];
    const TensorSpec& y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape ||
        x.byte_length != y.byte_length || x.flat_name != y.flat_name ||
        x.flat_offset != y.flat_offset || x.flat_total != y.flat_total || x.sha256 != y.sha256) {
      return false;
    }
  }
  return true;
}

}  // namespace storage
}  // namespace gradsnap
