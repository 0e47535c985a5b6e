// Tests of the copy queue's priorities, the choice of the GoCkpt window and the CUDA device's
// error when there is no GPU.
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gpu_snapshot/copy_queue.h"
#include "gpu_snapshot/snapshot_engine.h"
#include "gtest/gtest.h"

namespace gradsnap {
namespace gpu_snapshot {
namespace {

TEST(CopyQueueTest, GradientsOvertakeStateBlocks) {
  auto dev = NewHostDevice();
  auto q = CopyQueue::Create(dev.get(), 1024, 1, nullptr);
  ASSERT_TRUE(q.ok());
  std::vector<char> src(64 * 1024, 'x'), dst(64 * 1024), gdst(8 * 1024);
  absl::Notification grads_submitted, state_started;
  absl::Mutex mu;
  std::vector<char> order;
  CopyRequest state{CopyPriority::kState, src.data(), src.size(),
                    [&](size_t off, size_t) {
                      if (off == 0) {
                        state_started.Notify();
                        grads_submitted.WaitForNotification();
                      }
                      return dst.data() + off;
                    },
                    [&](size_t, size_t, void*) {
                      absl::MutexLock l(&mu);
                      order.push_back('s');
                    }};
  CopyRequest grad{CopyPriority::kGradient, src.data(), gdst.size(),
                   [&](size_t off, size_t) { return gdst.data() + off; },
                   [&](size_t, size_t, void*) {
                     absl::MutexLock l(&mu);
                     order.push_back('g');
                   }};
  CopyTicket ts = (*q)->Submit(state);
  state_started.WaitForNotification();  // the first state chunk is being dispatched
  CopyTicket tg = (*q)->Submit(grad);
  grads_submitted.Notify();
  ASSERT_TRUE((*q)->Wait(tg).ok());
  ASSERT_TRUE((*q)->Wait(ts).ok());
  // One state chunk was already being dispatched; then all 8 gradient chunks, then the rest.
  std::string got(order.begin(), order.end());
  std::string want = "s";
  want.append(8, 'g');
  want.append(63, 's');
  EXPECT_EQ(got, want);
  EXPECT_EQ(dst, src);
}


TEST(GoCkptTest, ChooseWindowFromBandwidthAndStepTime) {
  // 1 GB of state, 1 GB/s, 0.5 s steps, half a step per block: 4 blocks.
  EXPECT_EQ(ChooseWindow(1000000000, 1e9, 0.5, 0.5, 16), 4);
  EXPECT_EQ(ChooseWindow(1000, 1e9, 0.5, 0.5, 16), 1);
  EXPECT_EQ(ChooseWindow(1000000000000ull, 1e9, 0.5, 0.5, 16), 16);
  EXPECT_EQ(ChooseWindow(1000, 0, 0, 0.5, 16), 4);  // nothing measured yet
}

TEST(DeviceTest, CudaReportsClearly) {
  auto d = NewCudaDevice(0);
  if (!CudaCompiledIn()) {
    EXPECT_EQ(d.status().code(), absl::StatusCode::kUnimplemented);
  } else if (!d.ok()) {
    EXPECT_EQ(d.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(d.status().message().find("no CUDA device"), std::string::npos);
  }
}

}  // namespace
}  // namespace gpu_snapshot
}  // namespace gradsnap
