// WaitWithDeadline: completion before the deadline, expiry (abort once, one clear line), a
// failing poll, and no deadline.
#include "common/deadline_wait.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace gradsnap {
namespace {

using std::chrono::milliseconds;

TEST(DeadlineWaitTest, WorkFinishedByAnotherThreadEndsTheWait) {
  std::atomic<bool> finished{false};
  std::thread worker([&] {
    std::this_thread::sleep_for(milliseconds(30));
    finished = true;
  });
  int aborts = 0;
  const absl::Status s = WaitWithDeadline(
      {"the work", milliseconds(60000), "the communicator"},
      [&]() -> absl::StatusOr<bool> { return finished.load(); }, [&] { ++aborts; });
  worker.join();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(aborts, 0);
}

TEST(DeadlineWaitTest, ExpiryAbortsOnceAndSaysWhatInOneLine) {
  int polls = 0, aborts = 0;
  const absl::Status s = WaitWithDeadline(
      {"the gradient reduction on sim:0", milliseconds(50), "the communicator"},
      [&]() -> absl::StatusOr<bool> {
        ++polls;
        return false;
      },
      [&] { ++aborts; });
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_TRUE(IsCollectiveDeadline(s));
  EXPECT_EQ(aborts, 1);
  EXPECT_GT(polls, 1);
  EXPECT_EQ(std::string(s.message()),
            "collective deadline: the gradient reduction on sim:0 did not complete in 0.05 s "
            "(--collective-timeout-s): a peer rank is frozen or gone; the communicator aborted");
}

TEST(DeadlineWaitTest, AFailedPollIsReturnedWithoutAbort) {
  int aborts = 0;
  const absl::Status s = WaitWithDeadline(
      {"x", milliseconds(60000), "y"},
      []() -> absl::StatusOr<bool> { return absl::InternalError("device fault"); },
      [&] { ++aborts; });
  EXPECT_EQ(s, absl::InternalError("device fault"));
  EXPECT_FALSE(IsCollectiveDeadline(s));
  EXPECT_EQ(aborts, 0);
}

TEST(DeadlineWaitTest, NoTimeoutPollsUntilDone) {
  int polls = 0, aborts = 0;
  // Past the first yields into the sleeps.
  const absl::Status s = WaitWithDeadline(
      {"x", milliseconds(0), "y"},
      [&]() -> absl::StatusOr<bool> { return ++polls == 200; }, [&] { ++aborts; });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(polls, 200);
  EXPECT_EQ(aborts, 0);
}

}  // namespace
}  // namespace gradsnap
