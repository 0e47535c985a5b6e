#include "common/clock.h"

#include <thread>

namespace gradsnap {
namespace {
class RealClock : public Clock {
 public:
  int64_t NowUnixMillis() override { return UnixMillis(); }
  int64_t NowMonotonicMillis() override { return MonotonicNanos() / 1000000; }
  void SleepForMillis(int64_t ms) override {
    if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }
};
}  // namespace

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();
  return clock;
}

}  // namespace gradsnap
