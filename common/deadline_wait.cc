// The deadline-polling waiter; see deadline_wait.h.
#include "common/deadline_wait.h"

#include <algorithm>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gradsnap {
namespace {
constexpr absl::string_view kPrefix = "collective deadline: ";
}  // namespace

absl::Status WaitWithDeadline(const DeadlineWait& wait,
                              absl::FunctionRef<absl::StatusOr<bool>()> done,
                              absl::FunctionRef<void()> abort) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  constexpr int kYields = 64;
  constexpr std::chrono::microseconds kFirstSleep{20}, kMaxSleep{200};
  std::chrono::microseconds sleep = kFirstSleep;
  for (int polls = 0;; ++polls) {
    absl::StatusOr<bool> d = done();
    if (!d.ok()) return d.status();
    if (*d) return absl::OkStatus();
    if (wait.timeout.count() > 0 && Clock::now() - start >= wait.timeout) break;
    if (polls < kYields) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, kMaxSleep);
    }
  }
  abort();
  return CollectiveDeadlineError(wait);
}

absl::Status CollectiveDeadlineError(const DeadlineWait& wait) {
  return absl::UnavailableError(absl::StrFormat(
      "%s%s did not complete in %.3g s (--collective-timeout-s): a peer rank "
      "is frozen or gone; %s aborted",
      kPrefix, wait.what, wait.timeout.count() / 1000.0, wait.aborted));
}

bool IsCollectiveDeadline(const absl::Status& s) {
  return absl::IsUnavailable(s) && absl::StartsWith(s.message(), kPrefix);
}

}  // namespace gradsnap
