// Element types of stored tensors. Public (installed with gradsnap/client.h). The numeric values
// are part of the on-disk and wire formats (docs/format.md, docs/protocol.md): never renumber,
// only append.
#ifndef GRADSNAP_INCLUDE_GRADSNAP_DTYPE_H_
#define GRADSNAP_INCLUDE_GRADSNAP_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace gradsnap {

enum class DType : uint8_t {
  kUnknown = 0,
  kF32 = 1,
  kBF16 = 2,
  kF16 = 3,
  kF64 = 4,
  kI32 = 5,
  kI64 = 6,
  kU8 = 7,
};

// Bytes per element; 0 for kUnknown or an out-of-range value.
size_t DTypeSize(DType t);
// True for the floating-point types, which the byte-shuffle filter helps.
bool DTypeIsFloat(DType t);
// "f32", "bf16", ... and the reverse; nullopt for anything else.
const char* DTypeName(DType t);
std::optional<DType> DTypeFromName(absl::string_view name);
// Safetensors names ("F32", "BF16", ...).
const char* DTypeSafetensorsName(DType t);
// From the wire or disk: nullopt when `v` is not a known dtype.
std::optional<DType> DTypeFromInt(uint32_t v);

}  // namespace gradsnap

#endif  // GRADSNAP_INCLUDE_GRADSNAP_DTYPE_H_
