// Tests of the snapshot engine on the host device: every checkpoint the engine produces is
// compared byte for byte with a stop-the-world copy of the same step (engine_test_util.h).
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>

#include "gpu_snapshot/engine_test_util.h"
#include "gtest/gtest.h"

namespace gradsnap {
namespace gpu_snapshot {
namespace {

using namespace ::gradsnap::gpu_snapshot::enginetest;  // NOLINT: test helpers

class GoCkptWindowTest : public ::testing::TestWithParam<std::tuple<int, bool, DType>> {};

TEST_P(GoCkptWindowTest, ReconstructedEqualsStopTheWorld) {
  RunConfig rc;
  std::tie(rc.window, rc.overlap, rc.gdt) = GetParam();
  MemorySink sink;
  RunResult r = RunSim(rc, &sink);
  // Checkpoints start after updates 2 and 9 and hold the state of s + K - 1.
  for (int64_t s : {2, 9}) {
    int64_t t = s + rc.window - 1;
    ASSERT_EQ(sink.fulls.count(t), 1u) << "no checkpoint of step " << t;
    EXPECT_TRUE(sink.fulls[t] == r.reference[t]) << "step " << t << " differs";
    if (t != rc.skip) {
      EXPECT_FALSE(sink.fulls[t] == r.reference[t - 1]);
    }
    EXPECT_EQ(sink.windows[t], rc.window);
    EXPECT_EQ(sink.small[t], "small@" + std::to_string(t));
  }
  EXPECT_EQ(r.counters.fulls_persisted, 2);
  EXPECT_TRUE(r.counters.first_error.ok());
  // Bounded host memory: one copy of the state plus the gradient pool.
  EXPECT_LE(static_cast<double>(r.peak), 1.25 * r.state_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Windows, GoCkptWindowTest,
    ::testing::Values(std::make_tuple(1, false, DType::kF32), std::make_tuple(2, false, DType::kF32),
                      std::make_tuple(3, true, DType::kF32), std::make_tuple(5, false, DType::kF32),
                      std::make_tuple(7, true, DType::kF32), std::make_tuple(4, false, DType::kBF16),
                      std::make_tuple(6, true, DType::kBF16)));

TEST(GoCkptTest, StopTheWorldModesCopyTheDueStep) {
  for (SnapshotMode mode : {SnapshotMode::kSync, SnapshotMode::kAsync}) {
    RunConfig rc;
    rc.mode = mode;
    MemorySink sink;
    RunResult r = RunSim(rc, &sink);
    for (int64_t s : {2, 9}) {
      ASSERT_EQ(sink.fulls.count(s), 1u);
      EXPECT_TRUE(sink.fulls[s] == r.reference[s]) << SnapshotModeName(mode) << " step " << s;
    }
  }
}

// FULL + DELTAs base+1..u, replayed on the host, equals the state after update u.

TEST(GoCkptTest, OneInFlightAndDeferral) {
  RunConfig rc;
  rc.window = 2;
  rc.due = {2, 5, 6, 10};
  rc.steps = 14;
  MemorySink sink;
  sink.Hold(true);  // the first FULL's persist does not finish on its own
  SimTrainer sim(rc.n, rc.gdt, rc.skip);
  auto dev = NewHostDevice();
  SnapshotEngineOptions o;
  o.window = rc.window;
  o.chunk_bytes = 16 << 10;
  o.overlap_grads = false;  // this loop never calls BeforeGradOverwrite
  auto engine = SnapshotEngine::Create(dev.get(), sim.Device(), o, &sink);
  ASSERT_TRUE(engine.ok());
  std::map<int64_t, State> ref;
  std::vector<StepStats> stats(rc.steps + 1);
  for (int64_t u = 1; u <= rc.steps; ++u) {
    if (u == 8) {
      // The worker hands the FULL to the sink asynchronously: wait until the sink holds it.
      for (int i = 0; !sink.Holding() && i < 20000; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      ASSERT_TRUE(sink.Holding());
      sink.Hold(false);
      sink.Release();
    }
    sim.Backward(u);
    ASSERT_TRUE((*engine)->AfterBackward(u, sim.grad()).ok());
    bool due = std::find(rc.due.begin(), rc.due.end(), u) != rc.due.end();
    // The FULL started at 8 (9 = 8 + 2 - 1) is handed to the sink asynchronously; let it
    // finish so the FULL due at 10 is not deferred.
    for (int i = 0; u == 10 && (*engine)->in_flight() && i < 20000; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE((*engine)->AfterUpdate(sim.Update(u), due).ok());
    stats[u] = (*engine)->TakeStepStats();
    ref[u] = sim.state();
    if (u >= 3 && u < 8) {
      EXPECT_TRUE((*engine)->in_flight()) << u;
    }
  }
  ASSERT_TRUE((*engine)->Finish().ok());
  EXPECT_TRUE(stats[2].started);
  EXPECT_TRUE(stats[5].deferred);
  EXPECT_TRUE(stats[6].deferred);
  EXPECT_FALSE(stats[7].started);
  EXPECT_TRUE(stats[8].started);  // the deferred request runs at the first free update
  EXPECT_TRUE(stats[10].started);
  EngineCounters c = (*engine)->counters();
  EXPECT_EQ(c.fulls_started, 3);
  EXPECT_EQ(c.fulls_persisted, 3);
  EXPECT_EQ(c.deferred, 2);
  for (int64_t t : {3, 9, 11}) {
    ASSERT_EQ(sink.fulls.count(t), 1u) << t;
    EXPECT_TRUE(sink.fulls[t] == ref[t]) << t;
  }
}

TEST(GoCkptTest, FinishClosesAnOpenWindowAtTheLastUpdate) {
  RunConfig rc;
  rc.window = 6;
  rc.due = {7};
  rc.steps = 9;  // the window would end at 12
  MemorySink sink;
  RunResult r = RunSim(rc, &sink);
  ASSERT_EQ(sink.fulls.count(9), 1u);
  EXPECT_TRUE(sink.fulls[9] == r.reference[9]);
}

// A rank whose step fails between its gradient copy and its update (a peer gone mid-step) tears
// its engine down: the copy of that update's gradient into the log waits for a record that never
// comes, and Finish must still return (it waited for that log buffer for ever, so the rank never
// exited and its launcher never restarted the job: found by the chaos drill).
TEST(GoCkptTest, FinishReturnsAfterAStepThatFailedBeforeItsUpdate) {
  RunConfig rc;
  SimTrainer sim(rc.n, rc.gdt, rc.skip);
  auto dev = NewHostDevice();
  SnapshotEngineOptions o;
  o.window = 2;
  o.chunk_bytes = 16 << 10;
  o.overlap_grads = false;
  o.grad_log = true;
  o.grad_log_buffers = 1;
  MemorySink sink;
  auto engine = SnapshotEngine::Create(dev.get(), sim.Device(), o, &sink);
  ASSERT_TRUE(engine.ok()) << engine.status();
  for (int64_t u = 1; u <= 4; ++u) {
    sim.Backward(u);
    ASSERT_TRUE((*engine)->AfterBackward(u, sim.grad()).ok());
    ASSERT_TRUE((*engine)->AfterUpdate(sim.Update(u), u == 1).ok());
  }
  sim.Backward(5);
  ASSERT_TRUE((*engine)->AfterBackward(5, sim.grad()).ok());  // then the step fails
  std::promise<absl::Status> finished;
  std::thread t([&] { finished.set_value((*engine)->Finish()); });
  std::future<absl::Status> f = finished.get_future();
  if (f.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::fprintf(stderr, "Finish did not return within 60 s: a log buffer held for ever\n");
    std::_Exit(1);  // the engine's threads are stuck: no clean way out
  }
  t.join();
  EXPECT_TRUE(f.get().ok());
  EXPECT_EQ(sink.fulls.count(2), 1u);  // the FULL of the window before the failure
  EXPECT_EQ(sink.deltas.count(4), 1u);  // and the DELTAs of the updates that ran
}

}  // namespace
}  // namespace gpu_snapshot
}  // namespace gradsnap
