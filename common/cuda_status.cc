#include "common/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace gradsnap {

absl::Status CudaStatus(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return absl::OkStatus();
  std::string msg = absl::StrCat(what, ": ", cudaGetErrorString(err), " (", file, ":", line, ")");
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace gradsnap
