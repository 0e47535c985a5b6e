// Copies between the trainer's state buffers and host memory, whether the state is on the host
// (CPU back end: memcpy) or in CUDA device memory (cudaMemcpy; only in CUDA builds).
// Thread safety: free functions.
#ifndef GRADSNAP_TRAINER_DEVICE_COPY_H_
#define GRADSNAP_TRAINER_DEVICE_COPY_H_

#include <cstddef>

#include "absl/status/status.h"

namespace gradsnap {
namespace trainer {

// dst (host) <- src (device memory when on_device). Synchronous: returns after the copy, ordered
// after all work queued on the default stream. UNIMPLEMENTED for on_device without CUDA.
absl::Status CopyToHost(void* dst, const void* src, size_t bytes, bool on_device);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_DEVICE_COPY_H_
