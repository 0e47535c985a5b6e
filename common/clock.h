// Time sources. `Clock` and `FakeClock` are public (include/gradsnap/clock.h): the injectable
// time of decisions (stored timestamps, quarantine ages, retry backoff). The free functions here
// are for measuring and for names that only need to be unique.
#ifndef GRADSNAP_COMMON_CLOCK_H_
#define GRADSNAP_COMMON_CLOCK_H_

#include <chrono>
#include <cstdint>

#include "gradsnap/clock.h"  // IWYU pragma: export

namespace gradsnap {

// Monotonic nanoseconds, for measuring durations.
inline int64_t MonotonicNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Wall-clock milliseconds since the Unix epoch, for timestamps that are stored.
inline int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Measures elapsed time from construction (or Restart()).
class Stopwatch {
 public:
  Stopwatch() : start_(MonotonicNanos()) {}
  void Restart() { start_ = MonotonicNanos(); }
  int64_t ElapsedNanos() const { return MonotonicNanos() - start_; }
  double ElapsedSeconds() const { return ElapsedNanos() * 1e-9; }
  double ElapsedMillis() const { return ElapsedNanos() * 1e-6; }

 private:
  int64_t start_;
};

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_CLOCK_H_
