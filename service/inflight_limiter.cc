#include "service/inflight_limiter.h"

namespace gradsnap {
namespace service {

bool InflightLimiter::Acquire(uint64_t n, absl::Duration timeout) {
  if (n > budget_) return false;
  absl::MutexLock lock(&mu_);
  auto fits = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return used_ + n <= budget_; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&fits), timeout)) return false;
  used_ += n;
  if (gauge_ != nullptr) gauge_->Set(static_cast<int64_t>(used_));
  return true;
}

void InflightLimiter::Release(uint64_t n) {
  absl::MutexLock lock(&mu_);
  used_ -= n;
  if (gauge_ != nullptr) gauge_->Set(static_cast<int64_t>(used_));
}

uint64_t InflightLimiter::in_use() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

}  // namespace service
}  // namespace gradsnap
