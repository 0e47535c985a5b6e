#include "storage/aligned_buffer.h"

#include <cstdlib>
#include <new>
#include <utility>

namespace gradsnap {
namespace storage {

AlignedBuffer::AlignedBuffer(size_t capacity) : capacity_(AlignUp(capacity == 0 ? 1 : capacity)) {
  data_ = static_cast<uint8_t*>(std::aligned_alloc(kIoAlignment, capacity_));
  if (data_ == nullptr) throw std::bad_alloc();  // out of memory is not a recoverable error here
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), capacity_(std::exchange(o.capacity_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = std::exchange(o.data_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
  }
  return *this;
}

BufferPool::BufferPool(size_t buffer_capacity, size_t max_cached)
    : capacity_(AlignUp(buffer_capacity)), max_cached_(max_cached) {}

std::unique_ptr<AlignedBuffer> BufferPool::Get() {
  {
    absl::MutexLock lock(&mu_);
    if (!free_.empty()) {
      auto b = std::move(free_.back());
      free_.pop_back();
      return b;
    }
  }
  return std::make_unique<AlignedBuffer>(capacity_);
}

void BufferPool::Put(std::unique_ptr<AlignedBuffer> buf) {
  if (buf == nullptr || buf->capacity() != capacity_) return;
  absl::MutexLock lock(&mu_);
  if (free_.size() < max_cached_) free_.push_back(std::move(buf));
}

}  // namespace storage
}  // namespace gradsnap
