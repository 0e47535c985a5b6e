#include "gpu_snapshot/grad_log.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace gradsnap {
namespace gpu_snapshot {
namespace {

// Little-endian field writer/reader over a fixed buffer (the hosts we build for are LE; the
// static_assert below keeps it honest).
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "delta header assumes little endian");

template <typename T>
void Put(std::string* out, size_t* pos, T v) {
  std::memcpy(out->data() + *pos, &v, sizeof(T));
  *pos += sizeof(T);
}
template <typename T>
T Get(absl::string_view in, size_t* pos) {
  T v;
  std::memcpy(&v, in.data() + *pos, sizeof(T));
  *pos += sizeof(T);
  return v;
}

}  // namespace

std::string EncodeDeltaHeader(const DeltaHeader& h) {
  std::string out(kDeltaHeaderBytes, '\0');
  size_t pos = 0;
  Put<uint32_t>(&out, &pos, kDeltaMagic);
  Put<uint32_t>(&out, &pos, kDeltaVersion);
  Put<int64_t>(&out, &pos, h.step);
  Put<int64_t>(&out, &pos, h.base_step);
  Put<uint64_t>(&out, &pos, h.loader_position);
  Put<uint64_t>(&out, &pos, h.numel);
  Put<uint64_t>(&out, &pos, h.elem_offset);
  Put<uint8_t>(&out, &pos, static_cast<uint8_t>(h.grad_dtype));
  Put<uint8_t>(&out, &pos, h.update.skipped ? 1 : 0);
  pos += 6;  // reserved
  // The eight floats in the order of docs/gockpt.md (the config's four sit between grad_scale and
  // the bias corrections), whatever the struct's layout.
  const AdamWStepParams& a = h.update.adamw;
  const AdamWConfig& c = a.config;
  for (float f : {a.lr, a.grad_scale, c.beta1, c.beta2, c.eps, c.weight_decay,
                  a.bias_correction1, a.bias_correction2}) {
    Put<float>(&out, &pos, f);
  }
  return out;  // pos == 88; the rest is reserved zeros
}

absl::StatusOr<DeltaHeader> DecodeDeltaHeader(absl::string_view in) {
  if (in.size() != kDeltaHeaderBytes) {
    return absl::DataLossError(absl::StrCat("delta header of ", in.size(), " bytes"));
  }
  size_t pos = 0;
  if (Get<uint32_t>(in, &pos) != kDeltaMagic) return absl::DataLossError("bad delta magic");
  uint32_t version = Get<uint32_t>(in, &pos);
  if (version != kDeltaVersion) {
    return absl::DataLossError(absl::StrCat("unknown delta version ", version));
  }
  DeltaHeader h;
  h.step = Get<int64_t>(in, &pos);
  h.base_step = Get<int64_t>(in, &pos);
  h.loader_position = Get<uint64_t>(in, &pos);
  h.numel = Get<uint64_t>(in, &pos);
  h.elem_offset = Get<uint64_t>(in, &pos);
  uint8_t dtype = Get<uint8_t>(in, &pos);
  uint8_t skipped = Get<uint8_t>(in, &pos);
  pos += 6;
  if (dtype != static_cast<uint8_t>(DType::kF32) && dtype != static_cast<uint8_t>(DType::kBF16)) {
    return absl::DataLossError(absl::StrCat("delta gradient dtype ", dtype));
  }
  if (skipped > 1) return absl::DataLossError("bad delta skipped flag");
  h.grad_dtype = static_cast<DType>(dtype);
  h.update.skipped = skipped == 1;
  AdamWStepParams& a = h.update.adamw;
  AdamWConfig& c = a.config;
  for (float* f : {&a.lr, &a.grad_scale, &c.beta1, &c.beta2, &c.eps, &c.weight_decay,
                   &a.bias_correction1, &a.bias_correction2}) {
    *f = Get<float>(in, &pos);
  }
  return h;
}

absl::Status ApplyDelta(ReplayPool* pool, const HostStateRef& state, const DeltaHeader& h,
                        const void* grad, size_t grad_bytes) {
  if (h.numel != state.numel) {
    return absl::FailedPreconditionError(absl::StrCat(
        "delta of step ", h.step, " has ", h.numel, " elements, state has ", state.numel));
  }
  if (grad_bytes != h.numel * DTypeSize(h.grad_dtype)) {
    return absl::DataLossError(absl::StrCat("delta of step ", h.step, ": gradient of ",
                                            grad_bytes, " bytes for ", h.numel, " elements"));
  }
  pool->Apply(state, 0, state.numel, grad, h.grad_dtype, h.update);
  return absl::OkStatus();
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
