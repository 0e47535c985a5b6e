// Time sources. `Clock` is an interface so tests can use a fake one.
#ifndef GRADSNAP_COMMON_CLOCK_H_
#define GRADSNAP_COMMON_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

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

class Clock {
 public:
  virtual ~Clock() = default;
  virtual int64_t NowUnixMillis() = 0;
  // The real clock; never null, never freed.
  static Clock* Real();
};

// A clock that moves only when told. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'700'000'000'000) : now_(start_ms) {}
  int64_t NowUnixMillis() override { return now_.load(); }
  void AdvanceMillis(int64_t ms) { now_ += ms; }

 private:
  std::atomic<int64_t> now_;
};

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
