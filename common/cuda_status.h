// CUDA runtime errors as Status: the one place a cudaError_t becomes a Status (gpu_snapshot's
// CUDA device and the trainer's CUDA back end both use it). A CUDA-only unit: the target
// gradsnap::cuda_status exists only in builds with CUDA and links the CUDA runtime, never libcuda.
// Thread safety: free functions.
#ifndef GRADSNAP_COMMON_CUDA_STATUS_H_
#define GRADSNAP_COMMON_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "common/status.h"

namespace gradsnap {

// OK for cudaSuccess; RESOURCE_EXHAUSTED for an allocation failure (the caller may free memory
// and retry); INTERNAL for any other error. The message is "<what>: <CUDA's error string>
// (<file>:<line>)".
absl::Status CudaStatus(cudaError_t err, const char* what, const char* file, int line);

}  // namespace gradsnap

// The Status of a CUDA runtime call, naming the call and where it was made.
#define GS_CUDA_STATUS(expr) ::gradsnap::CudaStatus((expr), #expr, __FILE__, __LINE__)

// Returns the Status from the current function if the CUDA runtime call `expr` fails.
#define CUDA_RETURN_IF_ERROR(expr) RETURN_IF_ERROR(GS_CUDA_STATUS(expr))

#endif  // GRADSNAP_COMMON_CUDA_STATUS_H_
