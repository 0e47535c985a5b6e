#include "common/dtype.h"

namespace gradsnap {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kBF16: return 2;
    case DType::kF16: return 2;
    case DType::kF64: return 8;
    case DType::kI32: return 4;
    case DType::kI64: return 8;
    case DType::kU8: return 1;
    default: return 0;
  }
}

bool DTypeIsFloat(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || t == DType::kF16 || t == DType::kF64;
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF64: return "f64";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
    default: return "unknown";
  }
}

const char* DTypeSafetensorsName(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF64: return "F64";
    case DType::kI32: return "I32";
    case DType::kI64: return "I64";
    case DType::kU8: return "U8";
    default: return "UNKNOWN";
  }
}

std::optional<DType> DTypeFromName(absl::string_view name) {
  for (uint32_t v = 1; v <= 7; ++v) {
    DType t = static_cast<DType>(v);
    if (name == DTypeName(t)) return t;
  }
  return std::nullopt;
}

std::optional<DType> DTypeFromInt(uint32_t v) {
  if (v < 1 || v > 7) return std::nullopt;
  return static_cast<DType>(v);
}

}  // namespace gradsnap
