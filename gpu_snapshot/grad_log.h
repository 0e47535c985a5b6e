// The gradient log's DELTA record (DESIGN.md section 3; format in docs/gockpt.md).
//
// A DELTA record for update u holds exactly what the optimizer consumed at u for this rank's
// slice: the gradient in the precision the optimizer read it, the AdamWStepParams (learning
// rate, clip coefficient, bias corrections...), the skipped-step flag, the data-loader position
// and the trainer's replicated small state after u. It is stored as a CheckpointKind::kDelta
// checkpoint of step u with base_step = the FULL checkpoint it extends, with three tensors:
//   "delta_header" (u8, kDeltaHeaderBytes)  the fixed little-endian header below
//   "grad"         (f32 or bf16, numel)     flat slice [elem_offset, elem_offset + numel)
//   "small_state"  (u8)                     opaque trainer bytes
// Replaying DELTAs base+1 .. u in order over FULL base gives the bit-identical state of u.
//
// THREAD SAFETY
//   Plain functions and values.
#ifndef GRADSNAP_GPU_SNAPSHOT_GRAD_LOG_H_
#define GRADSNAP_GPU_SNAPSHOT_GRAD_LOG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "gpu_snapshot/host_replay.h"

namespace gradsnap {
namespace gpu_snapshot {

inline constexpr uint32_t kDeltaMagic = 0x4c445347;  // "GSDL"
inline constexpr uint32_t kDeltaVersion = 1;
inline constexpr size_t kDeltaHeaderBytes = 96;

struct DeltaHeader {
  int64_t step = 0;        // the update this record replays
  int64_t base_step = -1;  // the FULL checkpoint it extends
  UpdateParams update;     // AdamWStepParams + skipped flag
  uint64_t loader_position = 0;
  DType grad_dtype = DType::kF32;
  uint64_t numel = 0;        // gradient elements in this rank's slice
  uint64_t elem_offset = 0;  // the slice's first element in the flat buffers
};

std::string EncodeDeltaHeader(const DeltaHeader& h);
// DATA_LOSS on a bad magic, version, length or dtype.
absl::StatusOr<DeltaHeader> DecodeDeltaHeader(absl::string_view bytes);

// Applies one DELTA to `state` (numel must match); a skipped update leaves it unchanged.
absl::Status ApplyDelta(ReplayPool* pool, const HostStateRef& state, const DeltaHeader& h,
                        const void* grad, size_t grad_bytes);

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_GRAD_LOG_H_
