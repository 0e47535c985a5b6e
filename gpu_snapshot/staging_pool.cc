#include "gpu_snapshot/staging_pool.h"

#include "common/logging.h"
#include "common/status.h"

namespace gradsnap {
namespace gpu_snapshot {

absl::StatusOr<std::unique_ptr<PinnedBuffer>> PinnedBuffer::Create(Device* device, size_t bytes,
                                                                   HostMemoryAccount* account) {
  ASSIGN_OR_RETURN(void* p, device->AllocPinned(bytes));
  if (account != nullptr) account->Add(bytes);
  return std::unique_ptr<PinnedBuffer>(new PinnedBuffer(device, p, bytes, account));
}

PinnedBuffer::~PinnedBuffer() {
  device_->FreePinned(data_, size_);
  if (account_ != nullptr) account_->Sub(size_);
}

absl::StatusOr<std::unique_ptr<StagingPool>> StagingPool::Create(Device* device,
                                                                  size_t chunk_bytes,
                                                                  size_t count,
                                                                  HostMemoryAccount* account) {
  if (chunk_bytes == 0 || count == 0) {
    return absl::InvalidArgumentError("staging pool needs chunk_bytes > 0 and count > 0");
  }
  std::unique_ptr<StagingPool> pool(new StagingPool(chunk_bytes));
  for (size_t i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(auto buf, PinnedBuffer::Create(device, chunk_bytes, account));
    absl::MutexLock lock(&pool->mu_);
    pool->free_.push_back(buf->data());
    pool->buffers_.push_back(std::move(buf));
  }
  return pool;
}

void* StagingPool::Acquire() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(+[](std::vector<void*>* f) { return !f->empty(); }, &free_));
  void* p = free_.back();
  free_.pop_back();
  return p;
}

void StagingPool::Release(void* chunk) {
  absl::MutexLock lock(&mu_);
  GS_CHECK(free_.size() < buffers_.size()) << "staging chunk released twice";
  free_.push_back(chunk);
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
