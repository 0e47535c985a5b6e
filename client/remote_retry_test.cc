// The remote back end's retry loop (client/remote_rpc.h) on a FakeClock: which codes are retried,
// how often, and how long it waits between attempts, without sleeping.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "client/remote_rpc.h"
#include "gtest/gtest.h"

namespace gradsnap {
namespace client {
namespace {

ClientOptions WithFakeClock(FakeClock* clock, int max_attempts) {
  ClientOptions o;
  o.clock = clock;
  o.max_attempts = max_attempts;
  return o;
}

TEST(RemoteRetryTest, UnavailableIsRetriedWithDoublingBackoffOnTheClientsClock) {
  FakeClock clock;
  const int64_t start = clock.NowUnixMillis();
  int calls = 0;
  absl::Status s = remote::WithRetry(WithFakeClock(&clock, 4), nullptr, [&] {
    ++calls;
    return absl::UnavailableError("node down");
  });
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_EQ(calls, 4);
  // Three waits: 50, 100 and 200 ms, each within +-25% (rounded down to whole milliseconds).
  EXPECT_GE(clock.slept(), 350 * 3 / 4 - 3);
  EXPECT_LE(clock.slept(), 350 * 5 / 4);
  EXPECT_EQ(clock.NowUnixMillis() - start, clock.slept());
}

// A stream reset under the call (INTERNAL "RST_STREAM") is retried like UNAVAILABLE.
TEST(RemoteRetryTest, AbortedAndBusyAreRetriedToo) {
  FakeClock clock;
  int calls = 0;
  absl::Status s = remote::WithRetry(WithFakeClock(&clock, 8), nullptr, [&] {
    ++calls;
    if (calls == 1) return absl::AbortedError("superseded write, try again");
    if (calls == 2) return absl::ResourceExhaustedError("server busy: memory limit");
    if (calls == 3) {
      return absl::InternalError("127.0.0.1:4000: Received RST_STREAM with error code 1");
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 4);
  EXPECT_GE(clock.slept(), 350 * 3 / 4 - 3);
  EXPECT_LE(clock.slept(), 350 * 5 / 4);
}

// A Delete whose answer was lost (UNAVAILABLE, a reset stream) and whose retry finds the step
// gone has deleted it; NOT_FOUND at the first attempt, or after a refusal, is NOT_FOUND.
TEST(RemoteRetryTest, RemovalRetriedAfterALostAnswerFindsItGoneAndSucceeds) {
  FakeClock clock;
  auto run = [&](std::vector<absl::Status> answers) {
    size_t calls = 0;
    absl::Status s = remote::WithRetryRemoving(WithFakeClock(&clock, 8), nullptr, [&] {
      return answers[std::min(calls++, answers.size() - 1)];
    });
    EXPECT_EQ(calls, answers.size());
    return s;
  };
  const absl::Status gone = absl::NotFoundError("job j step 5 not found");
  EXPECT_TRUE(run({absl::UnavailableError("connection reset"), gone}).ok());
  EXPECT_TRUE(run({absl::InternalError("Received RST_STREAM with error code 2"), gone}).ok());
  EXPECT_TRUE(absl::IsNotFound(run({gone})));
  EXPECT_TRUE(absl::IsNotFound(run({absl::ResourceExhaustedError("server busy: memory"), gone})));
  EXPECT_TRUE(absl::IsNotFound(run({absl::AbortedError("superseded"), gone})));
  // A call that never reached the server, or that it refused, did not run.
  EXPECT_TRUE(absl::IsNotFound(run(
      {absl::UnavailableError("127.0.0.1:4000: failed to connect to all addresses; last error: "
                              "UNKNOWN: ipv4:127.0.0.1:4000: Failed to connect to remote host: "
                              "Connection refused"),
       gone})));
  EXPECT_TRUE(absl::IsNotFound(run({absl::UnavailableError("server is shutting down"), gone})));
  EXPECT_TRUE(run({absl::UnavailableError("down"), absl::OkStatus()}).ok());
}

TEST(RemoteRetryTest, OtherErrorsReturnAtOnceWithoutWaiting) {
  FakeClock clock;
  for (const absl::Status& error :
       {absl::NotFoundError("no such checkpoint"), absl::DataLossError("bad chunk"),
        absl::ResourceExhaustedError("out of disk"), absl::InternalError("bad state")}) {
    int calls = 0;
    absl::Status s = remote::WithRetry(WithFakeClock(&clock, 8), nullptr, [&] {
      ++calls;
      return error;
    });
    EXPECT_EQ(s, error);
    EXPECT_EQ(calls, 1) << error;
  }
  EXPECT_EQ(clock.slept(), 0);
}

}  // namespace
}  // namespace client
}  // namespace gradsnap
