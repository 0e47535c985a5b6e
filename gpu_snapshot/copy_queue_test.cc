// Tests of the copy queue's priorities, the choice of the GoCkpt window and the CUDA device's
// error when there is no GPU.
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
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


// The deadline a hook's wait has on sim and CUDA with several ranks (a copy queued behind a
// collective that a frozen peer never joins): a wait that sees no chunk land for its limit gives
// up, leaving the copy queued; one that sees chunks keep landing waits on, however long the copy
// takes in all (here 8 chunks of 300 ms each against a limit of 1.5 s).
TEST(CopyQueueTest, WaitUnlessStalledGivesUpOnlyWhenNothingLands) {
  auto dev = NewHostDevice();
  auto q = CopyQueue::Create(dev.get(), 1024, 1, nullptr);
  ASSERT_TRUE(q.ok());
  std::vector<char> src(8 * 1024, 'x'), dst(src.size());
  absl::Notification release;
  CopyRequest stuck{CopyPriority::kState, src.data(), 1024, [&](size_t, size_t) {
                      release.WaitForNotification();
                      return dst.data();
                    },
                    nullptr};
  CopyTicket t = (*q)->Submit(stuck);
  absl::Status s = absl::UnknownError("unset");
  EXPECT_FALSE((*q)->WaitUnlessStalled(t, absl::Milliseconds(200), &s));
  EXPECT_FALSE((*q)->Done(t));
  EXPECT_FALSE((*q)->WaitUnlessStalled(0, absl::Milliseconds(100), &s));  // 0: all
  release.Notify();
  ASSERT_TRUE((*q)->WaitUnlessStalled(t, absl::Seconds(60), &s));
  EXPECT_TRUE(s.ok()) << s;

  CopyRequest slow{CopyPriority::kState, src.data(), src.size(), [&](size_t off, size_t) {
                     absl::SleepFor(absl::Milliseconds(300));
                     return dst.data() + off;
                   },
                   nullptr};
  t = (*q)->Submit(slow);
  const absl::Time start = absl::Now();
  ASSERT_TRUE((*q)->WaitUnlessStalled(t, absl::Milliseconds(1500), &s));
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(2400));
  EXPECT_EQ(dst, src);
}


// K from the whole copy traffic of a window: the block, the gradients of the blocks already
// copied (or the gradient log's whole gradient), against what a step can copy.
TEST(GoCkptTest, ChooseWindowFromTheWholeCopyTraffic) {
  WindowInputs in;
  in.state_bytes = 1200000000;  // 1.2 GB of state, bf16 gradients: a sixth of it
  in.grad_bytes = 200000000;
  in.bandwidth = 1e9;
  in.step_seconds = 0.5;
  in.fill = 0.75;               // 375 MB a step
  in.max_window = 16;
  // The busiest step asks state / K + grad * (K - 1) / K: K = 5 asks 240 + 160 = 400 MB,
  // K = 6 asks 200 + 167 = 367 MB. The state alone (the old rule) would give K = 4, whose last
  // step asks 300 + 150 = 450 MB, 1.2 steps.
  WindowChoice c = ChooseWindow(in);
  EXPECT_TRUE(c.measured);
  EXPECT_TRUE(c.fits);
  EXPECT_EQ(c.k, 6);
  EXPECT_LE(c.busiest_step_bytes, c.step_capacity_bytes);
  EXPECT_GT(BusiestWindowStepBytes(in.state_bytes, in.grad_bytes, false, 4), 375e6);
  // The gradient log copies a whole gradient every step: K = 6 asks 200 + 200 MB, K = 7
  // 171 + 200 MB.
  in.grad_log = true;
  c = ChooseWindow(in);
  EXPECT_TRUE(c.fits);
  EXPECT_EQ(c.k, 7);
  in.max_window = 5;  // 240 + 200 > 375 MB: no K fits; the largest K is the least stall
  c = ChooseWindow(in);
  EXPECT_FALSE(c.fits);
  EXPECT_EQ(c.k, 5);  // overflow 5 x 65 = 325 MB, against 4 x 125 = 500 MB at K = 4
  EXPECT_LT(WindowOverflowBytes(in.state_bytes, in.grad_bytes, true, 5, 375e6),
            WindowOverflowBytes(in.state_bytes, in.grad_bytes, true, 4, 375e6));
  // A gradient alone longer than a step (800 MB against 375) and no log: every block's
  // gradient is copied for the rest of the window, so the longest window stalls most and the
  // shortest least (K = 1 overflows 825 MB, K = 2 225 + 625 = 850 MB, K = 9 about 1.5 GB).
  in.grad_log = false;
  in.grad_bytes = 800000000;
  in.max_window = 9;
  c = ChooseWindow(in);
  EXPECT_FALSE(c.fits);
  EXPECT_EQ(c.k, 1);
  in.grad_bytes = 200000000;
  in.grad_log = true;
  in.step_seconds = 0;  // nothing measured yet
  c = ChooseWindow(in);
  EXPECT_FALSE(c.measured);
  EXPECT_EQ(c.k, 4);
  in.step_seconds = 0.5;
  in.state_bytes = 1000;  // tiny: one block
  in.grad_bytes = 100;
  EXPECT_EQ(ChooseWindow(in).k, 1);
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
