#include "common/retry.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gtest/gtest.h"

namespace gradsnap {
namespace {

// A clock that records every wait, on top of FakeClock's time.
class RecordingClock : public FakeClock {
 public:
  void SleepForMillis(int64_t ms) override {
    waits.push_back(ms);
    FakeClock::SleepForMillis(ms);
  }
  std::vector<int64_t> waits;
};

bool IsUnavailable(const absl::Status& s) { return absl::IsUnavailable(s); }

TEST(RetryWhile, BacksOffDoublingToTheCapAndStopsBeforeTheDeadline) {
  RecordingClock clock;
  const int64_t start = clock.NowMonotonicMillis();
  int calls = 0;
  const absl::Status s = RetryWhile(
      [&] {
        ++calls;
        return absl::UnavailableError("down");
      },
      IsUnavailable, RetryPolicy{/*deadline_ms=*/30000, 100, 2000}, &clock);
  EXPECT_TRUE(absl::IsUnavailable(s));
  // 100, 200, ..., 1600, then 2000 each while the next wait ends by the deadline.
  std::vector<int64_t> want = {100, 200, 400, 800, 1600};
  int64_t total = 3100;
  while (total + 2000 <= 30000) {
    want.push_back(2000);
    total += 2000;
  }
  EXPECT_EQ(clock.waits, want);
  EXPECT_EQ(calls, static_cast<int>(want.size()) + 1);
  EXPECT_LE(clock.NowMonotonicMillis() - start, 30000);
  EXPECT_EQ(clock.NowMonotonicMillis() - start, clock.slept());
}

TEST(RetryWhile, FixedIntervalRetriesWhileTheDeadlineAllowsAnotherWait) {
  RecordingClock clock;
  int calls = 0;
  absl::StatusOr<int> r = RetryWhile(
      [&]() -> absl::StatusOr<int> {
        ++calls;
        return absl::FailedPreconditionError("locked");
      },
      [](const absl::Status& s) { return absl::IsFailedPrecondition(s); },
      RetryPolicy{/*deadline_ms=*/1000, 100, 100}, &clock);
  EXPECT_TRUE(absl::IsFailedPrecondition(r.status()));
  EXPECT_EQ(clock.waits, std::vector<int64_t>(10, 100));
  EXPECT_EQ(calls, 11);
}

TEST(RetryWhile, TimeSpentInTheCallCountsAgainstTheDeadline) {
  RecordingClock clock;
  int calls = 0;
  const absl::Status s = RetryWhile(
      [&] {
        ++calls;
        clock.AdvanceMillis(450);  // each call takes 450 ms
        return absl::UnavailableError("down");
      },
      IsUnavailable, RetryPolicy{/*deadline_ms=*/1000, 100, 100}, &clock);
  EXPECT_TRUE(absl::IsUnavailable(s));
  // Calls end at 450 and 1000 (after one wait); a wait from 1000 would end past the deadline.
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(clock.waits, std::vector<int64_t>{100});
}

TEST(RetryWhile, StopsAtOnceOnSuccess) {
  RecordingClock clock;
  int calls = 0;
  absl::StatusOr<int> r = RetryWhile(
      [&]() -> absl::StatusOr<int> {
        if (++calls < 3) return absl::UnavailableError("down");
        return 42;
      },
      IsUnavailable, RetryPolicy{30000, 100, 2000}, &clock);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 42);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(clock.waits, (std::vector<int64_t>{100, 200}));
}

TEST(RetryWhile, ReturnsAnErrorItDoesNotWaitOutAtOnce) {
  RecordingClock clock;
  int calls = 0;
  const absl::Status s = RetryWhile(
      [&] {
        return ++calls == 1 ? absl::UnavailableError("down") : absl::DataLossError("bad crc");
      },
      IsUnavailable, RetryPolicy{30000, 100, 2000}, &clock);
  EXPECT_TRUE(absl::IsDataLoss(s));
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(clock.waits, std::vector<int64_t>{100});
}

TEST(RetryWhile, ANullClockIsTheRealOne) {
  int calls = 0;
  const absl::Status s = RetryWhile(
      [&] { return ++calls < 2 ? absl::UnavailableError("down") : absl::OkStatus(); },
      IsUnavailable, RetryPolicy{1000, 1, 1});
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace gradsnap
