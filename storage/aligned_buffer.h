// Page-aligned heap buffers for O_DIRECT I/O, and a pool that reuses them.
//
// O_DIRECT needs the buffer address, the file offset and the length to be multiples of the
// logical block size; kIoAlignment (4 KiB) covers every device we target. Freshly faulted pages
// copy at a fraction of memcpy speed, so writers take buffers from a BufferPool and give them
// back, and the pages stay touched.
//
// THREAD SAFETY: an AlignedBuffer is owned by one thread at a time. BufferPool is thread-safe.
#ifndef GRADSNAP_STORAGE_ALIGNED_BUFFER_H_
#define GRADSNAP_STORAGE_ALIGNED_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace gradsnap {
namespace storage {

constexpr size_t kIoAlignment = 4096;

inline constexpr uint64_t AlignUp(uint64_t v, uint64_t a = kIoAlignment) {
  return (v + a - 1) / a * a;
}

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Capacity is rounded up to kIoAlignment.
  explicit AlignedBuffer(size_t capacity);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
};

// Hands out buffers of one fixed capacity; keeps up to `max_cached` returned ones.
class BufferPool {
 public:
  BufferPool(size_t buffer_capacity, size_t max_cached);
  size_t buffer_capacity() const { return capacity_; }
  std::unique_ptr<AlignedBuffer> Get();
  void Put(std::unique_ptr<AlignedBuffer> buf);

 private:
  const size_t capacity_;
  const size_t max_cached_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<AlignedBuffer>> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_ALIGNED_BUFFER_H_
