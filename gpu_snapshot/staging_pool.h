// Pinned host staging memory for checkpointing, allocated once and reused across checkpoints.
//
// StagingPool holds a fixed number of equal chunk buffers (for gradients on their way to the
// host replay) and PinnedBuffer holds the large, long-lived regions (the host copy of the
// rank's state, gradient-log buffers). Everything is allocated through Device::AllocPinned,
// which pre-touches the pages, and counted, so the host memory used by checkpointing can be
// measured and bounded (DESIGN.md section 7: <= 1.25 x one copy of the rank's state).
//
// THREAD SAFETY
//   Both classes are thread-safe. Acquire blocks until a chunk is free.
#ifndef GRADSNAP_GPU_SNAPSHOT_STAGING_POOL_H_
#define GRADSNAP_GPU_SNAPSHOT_STAGING_POOL_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "gpu_snapshot/device.h"

namespace gradsnap {
namespace gpu_snapshot {

// Counts the pinned bytes held by one engine.
class HostMemoryAccount {
 public:
  void Add(size_t n) { bytes_ += n; peak_ = std::max<size_t>(peak_, bytes_.load()); }
  void Sub(size_t n) { bytes_ -= n; }
  size_t bytes() const { return bytes_.load(); }
  size_t peak() const { return peak_.load(); }

 private:
  std::atomic<size_t> bytes_{0};
  std::atomic<size_t> peak_{0};
};

// One pinned allocation, freed on destruction.
class PinnedBuffer {
 public:
  static absl::StatusOr<std::unique_ptr<PinnedBuffer>> Create(Device* device, size_t bytes,
                                                              HostMemoryAccount* account);
  ~PinnedBuffer();
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  PinnedBuffer(Device* d, void* p, size_t n, HostMemoryAccount* a)
      : device_(d), data_(p), size_(n), account_(a) {}
  Device* device_;
  void* data_;
  size_t size_;
  HostMemoryAccount* account_;
};

class StagingPool {
 public:
  // `count` chunks of `chunk_bytes` each; count >= 1.
  static absl::StatusOr<std::unique_ptr<StagingPool>> Create(Device* device, size_t chunk_bytes,
                                                             size_t count,
                                                             HostMemoryAccount* account);
  size_t chunk_bytes() const { return chunk_bytes_; }
  size_t count() const { return buffers_.size(); }
  // Blocks until a chunk is free and returns it.
  void* Acquire();
  void Release(void* chunk);

 private:
  explicit StagingPool(size_t chunk_bytes) : chunk_bytes_(chunk_bytes) {}
  const size_t chunk_bytes_;
  std::vector<std::unique_ptr<PinnedBuffer>> buffers_;  // constant after Create
  absl::Mutex mu_;
  std::vector<void*> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_STAGING_POOL_H_
