#include "storage/aligned_buffer.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>

#include "common/huge_map.h"

namespace gradsnap {
namespace storage {

AlignedBuffer::AlignedBuffer(size_t capacity) : capacity_(AlignUp(capacity == 0 ? 1 : capacity)) {
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id.fetch_add(1, std::memory_order_relaxed);
  if (capacity_ >= kHugePageBytes) {
    data_ = static_cast<uint8_t*>(MapHuge(capacity_));
    if (data_ == nullptr) throw std::bad_alloc();  // out of memory is not recoverable here
    return;
  }
  data_ = static_cast<uint8_t*>(std::aligned_alloc(kIoAlignment, capacity_));
  if (data_ == nullptr) throw std::bad_alloc();  // out of memory is not a recoverable error here
}

AlignedBuffer::~AlignedBuffer() { Release(); }

void AlignedBuffer::Prefault() { FaultIn(data_, capacity_); }

void AlignedBuffer::Release() {
  if (data_ == nullptr) return;
  if (capacity_ >= kHugePageBytes) {
    UnmapHuge(data_, capacity_);
  } else {
    std::free(data_);
  }
  data_ = nullptr;
  capacity_ = 0;
  id_ = 0;
}

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      capacity_(std::exchange(o.capacity_, 0)),
      id_(std::exchange(o.id_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    Release();
    data_ = std::exchange(o.data_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
    id_ = std::exchange(o.id_, 0);
  }
  return *this;
}

BufferPool::BufferPool(size_t buffer_capacity, size_t max_cached)
    : capacity_(AlignUp(buffer_capacity)), max_cached_(max_cached) {}

std::unique_ptr<AlignedBuffer> BufferPool::Get() {
  std::unique_ptr<AlignedBuffer> b = TryGet();
  return b != nullptr ? std::move(b) : std::make_unique<AlignedBuffer>(capacity_);
}

std::unique_ptr<AlignedBuffer> BufferPool::TryGet() {
  absl::MutexLock lock(&mu_);
  if (free_.size() == set_aside_) return nullptr;
  auto b = std::move(free_.back());
  free_.pop_back();
  return b;
}

std::vector<std::unique_ptr<AlignedBuffer>> BufferPool::GetFaulted(size_t n) {
  std::vector<std::unique_ptr<AlignedBuffer>> bufs;
  bufs.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    bufs.push_back(Get());
    bufs.back()->Prefault();  // a pooled buffer is mapped already: its pages are touched again
  }
  return bufs;
}

size_t BufferPool::cached() {
  absl::MutexLock lock(&mu_);
  return free_.size() - set_aside_;
}

void BufferPool::Put(std::unique_ptr<AlignedBuffer> buf) {
  if (buf == nullptr || buf->capacity() != capacity_) return;
  absl::MutexLock lock(&mu_);
  if (free_.size() - set_aside_ < max_cached_) free_.push_back(std::move(buf));
}

void BufferPool::Reservation::Reserve(size_t n) {
  std::vector<std::unique_ptr<AlignedBuffer>> bufs = pool_->GetFaulted(n);
  absl::MutexLock lock(&pool_->mu_);
  for (auto& b : bufs) pool_->free_.push_back(std::move(b));
  reserved_ += n;
  kept_ += n;
  pool_->set_aside_ += n;
}

std::unique_ptr<AlignedBuffer> BufferPool::Reservation::Get() {
  {
    absl::MutexLock lock(&pool_->mu_);
    if (kept_ > 0) {
      --kept_;
      --pool_->set_aside_;
      auto b = std::move(pool_->free_.back());
      pool_->free_.pop_back();
      return b;
    }
  }
  return pool_->Get();
}

void BufferPool::Reservation::Put(std::unique_ptr<AlignedBuffer> buf) {
  if (buf == nullptr || buf->capacity() != pool_->capacity_) return;
  {
    absl::MutexLock lock(&pool_->mu_);
    if (kept_ < reserved_) {
      ++kept_;
      ++pool_->set_aside_;
      pool_->free_.push_back(std::move(buf));
      return;
    }
  }
  pool_->Put(std::move(buf));
}

void BufferPool::Reservation::Release() {
  std::vector<std::unique_ptr<AlignedBuffer>> excess;  // freed outside the lock
  absl::MutexLock lock(&pool_->mu_);
  pool_->set_aside_ -= kept_;
  kept_ = 0;
  reserved_ = 0;
  while (pool_->free_.size() - pool_->set_aside_ > pool_->max_cached_) {
    excess.push_back(std::move(pool_->free_.back()));
    pool_->free_.pop_back();
  }
}

size_t BufferPool::Reservation::kept() {
  absl::MutexLock lock(&pool_->mu_);
  return kept_;
}

}  // namespace storage
}  // namespace gradsnap
