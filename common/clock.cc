#include "common/clock.h"

namespace gradsnap {
namespace {
class RealClock : public Clock {
 public:
  int64_t NowUnixMillis() override { return UnixMillis(); }
};
}  // namespace

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();
  return clock;
}

}  // namespace gradsnap
