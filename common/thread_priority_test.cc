// The checkpoint threads' roles: taken by the threads made for them (an OrderedWorker or a
// ThreadPool with a role, or EnterRole), not by the others; nothing while the nice value is 0.
#include "common/thread_priority.h"

#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "common/ordered_worker.h"
#include "common/thread_pool.h"
#include "gtest/gtest.h"

namespace gradsnap {
namespace {

// (nice value, scheduling policy) of the calling thread.
std::pair<int, int> Sched() {
  return {getpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid))),
          sched_getscheduler(0)};
}
const std::pair<int, int> kForeground{0, SCHED_OTHER};

std::pair<int, int> InThread(ThreadRole role) {
  std::pair<int, int> seen;
  std::thread t([&] {
    EnterRole(role);
    seen = Sched();
  });
  t.join();
  return seen;
}

TEST(ThreadPriorityTest, ThreadsTakeTheirRoleAndOthersDoNot) {
  ASSERT_EQ(Sched(), kForeground) << "the test needs to start at nice 0, SCHED_OTHER";
  SetBackgroundNice(25);
  EXPECT_EQ(BackgroundNice(), 19);  // clamped
  SetBackgroundNice(7);
  EXPECT_EQ(BackgroundNice(), 7);

  EXPECT_EQ(InThread(ThreadRole::kBackground), std::make_pair(7, SCHED_BATCH));
  EXPECT_EQ(InThread(ThreadRole::kCopy), std::make_pair(0, SCHED_BATCH));
  EXPECT_EQ(InThread(ThreadRole::kForeground), kForeground);
  EXPECT_EQ(Sched(), kForeground);  // the caller is untouched

  for (ThreadRole role : {ThreadRole::kBackground, ThreadRole::kForeground}) {
    std::pair<int, int> seen;
    OrderedWorker<int> worker(
        [&](int&) {
          seen = Sched();
          return absl::OkStatus();
        },
        role);
    ASSERT_TRUE(worker.Enqueue(0).ok());
    ASSERT_TRUE(worker.Synchronize().ok());
    EXPECT_EQ(seen, role == ThreadRole::kBackground ? std::make_pair(7, SCHED_BATCH) : kForeground);
  }

  // A pool's workers take the role; its part 0 runs on the caller, which keeps its own.
  ThreadPool pool(2, ThreadRole::kBackground);
  std::pair<int, int> part[2];
  pool.ParallelFor(2, [&](size_t begin, size_t) { part[begin] = Sched(); });
  EXPECT_EQ(part[0], kForeground);
  EXPECT_EQ(part[1], std::make_pair(7, SCHED_BATCH));

  SetBackgroundNice(0);  // 0: every role leaves a thread as it is
  EXPECT_EQ(InThread(ThreadRole::kBackground), kForeground);
  EXPECT_EQ(InThread(ThreadRole::kCopy), kForeground);
}

}  // namespace
}  // namespace gradsnap
