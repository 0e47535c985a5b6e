// Tests of the snapshot engine on the host device: a training loop is simulated here (random
// gradients, global-norm clipping, warmup + cosine LR, a skipped step) and every checkpoint the
// engine produces is compared byte for byte with a stop-the-world copy of the same step.
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "absl/synchronization/notification.h"
#include "gpu_snapshot/copy_queue.h"
#include "gpu_snapshot/grad_log.h"
#include "gpu_snapshot/snapshot_engine.h"
#include "gtest/gtest.h"

namespace gradsnap {
namespace gpu_snapshot {
namespace {

struct State {
  std::vector<float> p, m, v;
  bool operator==(const State& o) const {
    return p.size() == o.p.size() &&
           std::memcmp(p.data(), o.p.data(), p.size() * 4) == 0 &&
           std::memcmp(m.data(), o.m.data(), m.size() * 4) == 0 &&
           std::memcmp(v.data(), o.v.data(), v.size() * 4) == 0;
  }
};

State Copy(const HostStateRef& s) {
  return {{s.params, s.params + s.numel}, {s.m, s.m + s.numel}, {s.v, s.v + s.numel}};
}

// A fake trainer: the "device" is host memory, the optimizer is adamw.h's.
class SimTrainer {
 public:
  SimTrainer(size_t n, DType gdt, int64_t skip_step) : n_(n), gdt_(gdt), skip_(skip_step) {
    std::mt19937 rng(7);
    std::normal_distribution<float> d(0.0f, 0.02f);
    s_.p.resize(n);
    for (auto& x : s_.p) x = d(rng);
    s_.m.assign(n, 0.0f);
    s_.v.assign(n, 0.0f);
    g_.resize(n);
    gb_.resize(n);
  }
  DeviceState Device() { return {s_.p.data(), s_.m.data(), s_.v.data(), n_, 0, nullptr}; }
  const void* grad() const { return gdt_ == DType::kBF16 ? (const void*)gb_.data() : g_.data(); }
  const State& state() const { return s_; }

  void Backward(int64_t u) {
    std::mt19937 rng(1000 + u);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (size_t i = 0; i < n_; ++i) {
      g_[i] = d(rng);
      gb_[i] = FloatToBf16(g_[i]);
      if (gdt_ == DType::kBF16) g_[i] = Bf16ToFloat(gb_[i]);
    }
  }
  UpdateInfo Update(int64_t u) {
    double norm = 0;
    for (float x : g_) norm += double(x) * x;
    norm = std::sqrt(norm);
    float clip = static_cast<float>(std::min(1.0, 1.0 / norm));  // max norm 1: always active
    float lr = u <= 3 ? 1e-3f * u / 3 : 1e-3f * 0.5f * (1 + std::cos(3.14159f * u / 40));
    UpdateInfo info;
    info.step = u;
    info.params.skipped = u == skip_;
    info.params.adamw = MakeAdamWStepParams(cfg_, lr, clip, t_ + 1);
    info.loader_position = static_cast<uint64_t>(u) * 4096;
    info.small_state = "small@" + std::to_string(u);
    if (!info.params.skipped) {
      ++t_;
      AdamWUpdateHost(s_.p.data(), s_.m.data(), s_.v.data(), g_.data(), n_, info.params.adamw);
    }
    return info;
  }

 private:
  size_t n_;
  DType gdt_;
  int64_t skip_;
  AdamWConfig cfg_;
  int64_t t_ = 0;
  State s_;
  std::vector<float> g_;
  std::vector<uint16_t> gb_;
};

struct SavedDelta {
  DeltaHeader h;
  std::string header_bytes;
  std::vector<char> grad;
  std::string small_state;
};

// Keeps every snapshot and delta in memory. Optionally holds FULL completions until Release.
class MemorySink : public SnapshotSink {
 public:
  void PersistFull(const HostSnapshot& s, DoneFn done) override {
    absl::MutexLock lock(&mu_);
    fulls[s.step] = Copy(s.state);
    windows[s.step] = s.window;
    small[s.step] = s.small_state;
    if (hold_) {
      held_ = std::move(done);
    } else {
      done(absl::OkStatus());
    }
  }
  void PersistDelta(const DeltaRecord& r, DoneFn done) override {
    SavedDelta d;
    d.h = {r.step, r.base_step, r.update, r.loader_position, r.grad_dtype, r.numel,
           r.elem_offset};
    d.header_bytes = EncodeDeltaHeader(d.h);
    const char* g = static_cast<const char*>(r.grad);
    d.grad.assign(g, g + r.numel * DTypeSize(r.grad_dtype));
    d.small_state = r.small_state;
    {
      absl::MutexLock lock(&mu_);
      deltas[r.step] = std::move(d);
    }
    // Complete from another thread, as a real persist would.
    std::thread([done] { done(absl::OkStatus()); }).detach();
  }
  void Hold(bool h) {
    absl::MutexLock lock(&mu_);
    hold_ = h;
  }
  void Release() {
    DoneFn d;
    {
      absl::MutexLock lock(&mu_);
      d = std::move(held_);
      held_ = nullptr;
    }
    if (d) d(absl::OkStatus());
  }

  absl::Mutex mu_;
  std::map<int64_t, State> fulls;
  std::map<int64_t, int> windows;
  std::map<int64_t, std::string> small;
  std::map<int64_t, SavedDelta> deltas;

 private:
  bool hold_ = false;
  DoneFn held_;
};

struct RunConfig {
  SnapshotMode mode = SnapshotMode::kGoCkpt;
  int window = 3;
  bool overlap = false;
  bool grad_log = false;
  DType gdt = DType::kF32;
  int steps = 16;
  std::vector<int64_t> due = {2, 9};
  int64_t skip = 4;
  size_t n = 40000;
};

struct RunResult {
  std::map<int64_t, State> reference;  // stop-the-world state after every update
  std::vector<StepStats> stats;
  EngineCounters counters;
  size_t peak = 0, state_bytes = 0;
};

RunResult RunSim(const RunConfig& rc, MemorySink* sink) {
  SimTrainer sim(rc.n, rc.gdt, rc.skip);
  auto dev = NewHostDevice();
  EngineOptions o;
  o.mode = rc.mode;
  o.window = rc.window;
  o.overlap_grads = rc.overlap;
  o.grad_log = rc.grad_log;
  o.grad_dtype = rc.gdt;
  o.chunk_bytes = 16 << 10;  // many chunks: exercises chunking and pool reuse
  auto engine = SnapshotEngine::Create(dev.get(), sim.Device(), o, sink);
  EXPECT_TRUE(engine.ok()) << engine.status();
  RunResult r;
  r.reference[0] = sim.state();
  (*engine)->SetBaseStep(0);
  {
    absl::MutexLock lock(&sink->mu_);
    sink->fulls[0] = sim.state();
  }
  for (int64_t u = 1; u <= rc.steps; ++u) {
    EXPECT_TRUE((*engine)->BeforeGradOverwrite(u).ok());
    sim.Backward(u);
    EXPECT_TRUE((*engine)->AfterBackward(u, sim.grad()).ok());
    UpdateInfo info = sim.Update(u);
    bool due = std::find(rc.due.begin(), rc.due.end(), u) != rc.due.end();
    EXPECT_TRUE((*engine)->AfterUpdate(info, due).ok());
    r.stats.push_back((*engine)->TakeStepStats());
    r.reference[u] = sim.state();
  }
  EXPECT_TRUE((*engine)->Finish().ok());
  r.counters = (*engine)->counters();
  r.peak = (*engine)->host_bytes_peak();
  r.state_bytes = (*engine)->state_bytes();
  return r;
}

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
State Restore(MemorySink& sink, int64_t u, ReplayPool* pool) {
  const SavedDelta& last = sink.deltas.at(u);
  State s = sink.fulls.at(last.h.base_step);
  HostStateRef ref{s.p.data(), s.m.data(), s.v.data(), s.p.size()};
  for (int64_t k = last.h.base_step + 1; k <= u; ++k) {
    const SavedDelta& d = sink.deltas.at(k);
    EXPECT_EQ(d.h.base_step, last.h.base_step);
    auto h = DecodeDeltaHeader(d.header_bytes);
    EXPECT_TRUE(h.ok());
    EXPECT_TRUE(ApplyDelta(pool, ref, *h, d.grad.data(), d.grad.size()).ok());
  }
  return s;
}

TEST(GradLogTest, ReplayOfDeltasGivesEveryLoggedStep) {
  for (DType gdt : {DType::kF32, DType::kBF16}) {
    RunConfig rc;
    rc.grad_log = true;
    rc.gdt = gdt;
    rc.overlap = gdt == DType::kBF16;
    MemorySink sink;
    RunResult r = RunSim(rc, &sink);
    ReplayPool pool(2);
    // A FULL step (4 = 2 + 3 - 1, and 11) has no DELTA: the FULL is its recovery point.
    ASSERT_EQ(sink.deltas.size(), static_cast<size_t>(rc.steps - 2));
    for (int64_t u = 1; u <= rc.steps; ++u) {
      if (u == 4 || u == 11) {
        EXPECT_EQ(sink.deltas.count(u), 0u);
        EXPECT_TRUE(sink.fulls.at(u) == r.reference[u]);
        continue;
      }
      const SavedDelta& d = sink.deltas.at(u);
      // Updates 1..3 extend the initial state, 5..10 the FULL of step 4, 12.. the FULL of 11.
      EXPECT_EQ(d.h.base_step, u < 4 ? 0 : (u < 11 ? 4 : 11)) << u;
      EXPECT_EQ(d.h.update.skipped, u == rc.skip);
      EXPECT_EQ(d.h.loader_position, static_cast<uint64_t>(u) * 4096);
      EXPECT_EQ(d.small_state, "small@" + std::to_string(u));
      EXPECT_TRUE(Restore(sink, u, &pool) == r.reference[u]) << "step " << u;
    }
  }
}

TEST(GoCkptTest, OneInFlightAndDeferral) {
  RunConfig rc;
  rc.window = 2;
  rc.due = {2, 5, 6, 10};
  rc.steps = 14;
  MemorySink sink;
  sink.Hold(true);  // the first FULL's persist does not finish on its own
  SimTrainer sim(rc.n, rc.gdt, rc.skip);
  auto dev = NewHostDevice();
  EngineOptions o;
  o.window = rc.window;
  o.chunk_bytes = 16 << 10;
  auto engine = SnapshotEngine::Create(dev.get(), sim.Device(), o, &sink);
  ASSERT_TRUE(engine.ok());
  std::map<int64_t, State> ref;
  std::vector<StepStats> stats(rc.steps + 1);
  for (int64_t u = 1; u <= rc.steps; ++u) {
    if (u == 8) {
      sink.Hold(false);
      sink.Release();
    }
    sim.Backward(u);
    ASSERT_TRUE((*engine)->AfterBackward(u, sim.grad()).ok());
    bool due = std::find(rc.due.begin(), rc.due.end(), u) != rc.due.end();
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

TEST(GradLogTest, FinishAbandonsAnOpenWindowWhoseStepsAreLogged) {
  RunConfig rc;
  rc.window = 6;
  rc.due = {7};
  rc.steps = 9;  // the window would end at 12
  rc.grad_log = true;
  MemorySink sink;
  RunResult r = RunSim(rc, &sink);
  EXPECT_EQ(r.counters.abandoned, 1);
  EXPECT_EQ(sink.fulls.size(), 1u);  // only the initial state the test put there
  ReplayPool pool(2);
  for (int64_t u = 1; u <= 9; ++u) {
    ASSERT_EQ(sink.deltas.count(u), 1u) << u;
    EXPECT_EQ(sink.deltas[u].h.base_step, 0);
  }
  EXPECT_TRUE(Restore(sink, 9, &pool) == r.reference[9]);
}

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

TEST(GradLogTest, HeaderRoundTripAndCorruption) {
  DeltaHeader h;
  h.step = 42;
  h.base_step = 40;
  h.update.skipped = true;
  h.update.adamw.lr = 3e-4f;
  h.loader_position = 99;
  h.grad_dtype = DType::kBF16;
  h.numel = 1000;
  h.elem_offset = 5000;
  std::string b = EncodeDeltaHeader(h);
  ASSERT_EQ(b.size(), kDeltaHeaderBytes);
  auto d = DecodeDeltaHeader(b);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->step, 42);
  EXPECT_EQ(d->base_step, 40);
  EXPECT_TRUE(d->update.skipped);
  EXPECT_EQ(d->update.adamw.lr, 3e-4f);
  EXPECT_EQ(d->grad_dtype, DType::kBF16);
  EXPECT_EQ(d->elem_offset, 5000u);
  b[0] ^= 1;
  EXPECT_EQ(DecodeDeltaHeader(b).status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(DecodeDeltaHeader("short").status().code(), absl::StatusCode::kDataLoss);
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
