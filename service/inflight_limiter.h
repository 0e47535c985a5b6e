// A byte budget for upload data that the server holds in memory (--max-inflight-bytes).
//
// Every Write stream reserves its share once, after its first message and token check
// (ServiceOptions::per_stream_bytes: a message plus what its engine writer can hold), and
// releases it when the stream ends. When the budget is used up a stream waits (so gRPC flow
// control stalls its sender) for a bounded time and then fails with RESOURCE_EXHAUSTED
// "server busy", which clients retry with backoff. Memory held by uploads past their first
// message therefore never exceeds the budget, however many clients connect; first messages
// (up to 4 MiB each, held while their stream waits) are bounded by gRPC's resource quota,
// which the server sets to the same budget (docs/protocol.md).
//
// Thread-safe.
#ifndef GRADSNAP_SERVICE_INFLIGHT_LIMITER_H_
#define GRADSNAP_SERVICE_INFLIGHT_LIMITER_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/stats.h"

namespace gradsnap {
namespace service {

class InflightLimiter {
 public:
  // `gauge` (may be null) mirrors the bytes reserved.
  InflightLimiter(uint64_t budget, Counter* gauge) : budget_(budget), gauge_(gauge) {}

  // Reserves n bytes, waiting up to `timeout`. False when the budget stayed full (or n exceeds
  // the whole budget).
  [[nodiscard]] bool Acquire(uint64_t n, absl::Duration timeout);
  void Release(uint64_t n);
  uint64_t in_use() const;
  uint64_t budget() const { return budget_; }

 private:
  const uint64_t budget_;
  Counter* const gauge_;
  mutable absl::Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
};

// Holds a reservation for a scope.
class InflightReservation {
 public:
  InflightReservation() = default;
  InflightReservation(const InflightReservation&) = delete;
  InflightReservation& operator=(const InflightReservation&) = delete;
  ~InflightReservation() { Reset(); }
  bool Acquire(InflightLimiter* limiter, uint64_t n, absl::Duration timeout) {
    Reset();
    if (!limiter->Acquire(n, timeout)) return false;
    limiter_ = limiter;
    n_ = n;
    return true;
  }
  void Reset() {
    if (limiter_ != nullptr) limiter_->Release(n_);
    limiter_ = nullptr;
    n_ = 0;
  }

 private:
  InflightLimiter* limiter_ = nullptr;
  uint64_t n_ = 0;
};

}  // namespace service
}  // namespace gradsnap

#endif  // GRADSNAP_SERVICE_INFLIGHT_LIMITER_H_
