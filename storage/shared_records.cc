#include "storage/shared_records.h"

#include <iterator>
#include <utility>

namespace gradsnap {
namespace storage {

SharedRecords::Record::~Record() {
  if (pool_ != nullptr && buffer_->capacity() == pool_->buffer_capacity()) {
    pool_->Put(std::move(buffer_));
  }
}

void SharedRecords::Record::Complete(absl::Status status) {
  std::vector<std::function<void(const absl::Status&)>> waiters;
  {
    absl::MutexLock lock(&mu_);
    ready_ = true;
    status_ = status;
    waiters.swap(waiters_);
  }
  for (auto& fn : waiters) fn(status);
}

void SharedRecords::Record::OnReady(std::function<void(const absl::Status&)> fn) {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (!ready_) {
      waiters_.push_back(std::move(fn));
      return;
    }
    status = status_;
  }
  fn(status);
}

std::shared_ptr<SharedRecords::Record> SharedRecords::Acquire(
    const Key& key, size_t capacity, const std::shared_ptr<BufferPool>& pool, bool* first) {
  *first = true;
  if (!enabled_) return nullptr;
  absl::MutexLock lock(&mu_);
  for (auto it = table_.begin(); it != table_.end();) {  // records nobody holds any more
    it = it->second.expired() ? table_.erase(it) : std::next(it);
  }
  auto it = table_.find(key);
  if (it != table_.end()) {
    if (std::shared_ptr<Record> held = it->second.lock()) {
      ++hits_;
      *first = false;
      return held;
    }
  }
  const bool pooled = pool != nullptr && capacity <= pool->buffer_capacity() &&
                      capacity > pool->buffer_capacity() / 2;
  auto record = std::make_shared<Record>(
      key, pooled ? pool->Get() : std::make_unique<AlignedBuffer>(capacity),
      pooled ? pool : nullptr);
  table_[key] = record;
  return record;
}

void SharedRecords::Forget(const Record* record) {
  absl::MutexLock lock(&mu_);
  auto it = table_.find(record->key());
  if (it == table_.end()) return;
  std::shared_ptr<Record> held = it->second.lock();
  if (held == nullptr || held.get() == record) table_.erase(it);
}

size_t SharedRecords::live() {
  absl::MutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [key, record] : table_) n += record.expired() ? 0 : 1;
  return n;
}

uint64_t SharedRecords::hits() {
  absl::MutexLock lock(&mu_);
  return hits_;
}

}  // namespace storage
}  // namespace gradsnap
