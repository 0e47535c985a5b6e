// RetryWhile: one bounded wait loop. A call is made again, after a backoff, while its status is
// one the caller chose to wait out (a server outage, a lock its dying owner still holds), and
// only until a deadline; any other status (OK included) is returned at once.
//
// Timing: the deadline is `policy.deadline_ms` after the first call, on the clock's monotonic
// time. After each call that should be retried, the loop waits the current backoff and tries
// again, unless that wait would end after the deadline: then the last status is returned. The
// backoff starts at `policy.initial_backoff_ms` and doubles after every wait, up to
// `policy.max_backoff_ms` (equal to the initial one for a fixed interval). The waits are
// SleepForMillis on `clock` (the real clock when null), so a FakeClock runs it without sleeping.
//
// THREAD SAFETY: as thread-safe as `call` and the clock.
#ifndef GRADSNAP_COMMON_RETRY_H_
#define GRADSNAP_COMMON_RETRY_H_

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"

namespace gradsnap {

struct RetryPolicy {
  int64_t deadline_ms = 0;          // how long after the first call a retry may still start
  int64_t initial_backoff_ms = 100;  // the first wait
  int64_t max_backoff_ms = 100;      // the waits double up to this
};

// The status of a call's result, Status or StatusOr<T>.
inline const absl::Status& StatusOf(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& StatusOf(const absl::StatusOr<T>& s) {
  return s.status();
}

// Calls `call` (returning absl::Status or absl::StatusOr<T>) until `retry_if(status)` is false
// or the policy's deadline is reached; returns the last result.
template <typename Call, typename Pred>
auto RetryWhile(Call&& call, Pred&& retry_if, const RetryPolicy& policy, Clock* clock = nullptr)
    -> decltype(call()) {
  clock = ClockOrReal(clock);
  const int64_t deadline = clock->NowMonotonicMillis() + policy.deadline_ms;
  for (int64_t backoff_ms = policy.initial_backoff_ms;;
       backoff_ms = std::min(policy.max_backoff_ms, 2 * backoff_ms)) {
    auto result = call();
    if (!retry_if(StatusOf(result)) || clock->NowMonotonicMillis() + backoff_ms > deadline) {
      return result;
    }
    clock->SleepForMillis(backoff_ms);
  }
}

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_RETRY_H_
