// The time source gradsnap decides by: the storage engine's stored timestamps and quarantine
// ages, the client's retry backoff and the deadlines of bounded waits (common/retry.h). Every
// options struct that takes one (ClientOptions, storage::EngineOptions) treats nullptr as the
// real clock; tests pass a FakeClock and advance it instead of sleeping.
#ifndef GRADSNAP_INCLUDE_GRADSNAP_CLOCK_H_
#define GRADSNAP_INCLUDE_GRADSNAP_CLOCK_H_

#include <atomic>
#include <cstdint>

namespace gradsnap {

class Clock {
 public:
  virtual ~Clock() = default;
  // Wall-clock milliseconds since the Unix epoch.
  virtual int64_t NowUnixMillis() = 0;
  // Milliseconds of a time that never steps (for deadlines), from an arbitrary origin. The real
  // clock reads the monotonic clock; by default (FakeClock) it is NowUnixMillis().
  virtual int64_t NowMonotonicMillis() { return NowUnixMillis(); }
  // Waits `ms` milliseconds of this clock (the real clock sleeps; a fake one moves on).
  virtual void SleepForMillis(int64_t ms) = 0;
  // The real clock; never null, never freed.
  static Clock* Real();
};

// `clock`, or the real clock when it is null.
inline Clock* ClockOrReal(Clock* clock) { return clock != nullptr ? clock : Clock::Real(); }

// A clock that moves only when told (or slept on). Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'700'000'000'000) : now_(start_ms) {}
  int64_t NowUnixMillis() override { return now_.load(); }
  // Returns at once, the clock `ms` later; slept() counts every such wait.
  void SleepForMillis(int64_t ms) override {
    now_ += ms;
    slept_ += ms;
  }
  void AdvanceMillis(int64_t ms) { now_ += ms; }
  void AdvanceSeconds(int64_t s) { now_ += s * 1000; }
  // Total milliseconds waited in SleepForMillis.
  int64_t slept() const { return slept_.load(); }

 private:
  std::atomic<int64_t> now_;
  std::atomic<int64_t> slept_{0};
};

}  // namespace gradsnap

#endif  // GRADSNAP_INCLUDE_GRADSNAP_CLOCK_H_
