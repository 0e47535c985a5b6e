// Test helpers of the snapshot engine tests: a simulated trainer on the host device (random
// gradients, global-norm clipping, warmup + cosine LR, a skipped step), an in-memory sink, and
// a loop that runs the engine's hooks around it and keeps the stop-the-world state of every
// step for comparison. Test-only.
#ifndef GRADSNAP_GPU_SNAPSHOT_ENGINE_TEST_UTIL_H_
#define GRADSNAP_GPU_SNAPSHOT_ENGINE_TEST_UTIL_H_

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gpu_snapshot/grad_log.h"
#include "gpu_snapshot/snapshot_engine.h"
#include "gtest/gtest.h"

namespace gradsnap {
namespace gpu_snapshot {
namespace enginetest {

struct State {
  std::vector<float> p, m, v;
  bool operator==(const State& o) const {
    return p.size() == o.p.size() &&
           std::memcmp(p.data(), o.p.data(), p.size() * 4) == 0 &&
           std::memcmp(m.data(), o.m.data(), m.size() * 4) == 0 &&
           std::memcmp(v.data(), o.v.data(), v.size() * 4) == 0;
  }
};

inline State Copy(const HostStateRef& s) {
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
  UpdateRecord Update(int64_t u) {
    double norm = 0;
    for (float x : g_) norm += double(x) * x;
    norm = std::sqrt(norm);
    float clip = static_cast<float>(std::min(1.0, 1.0 / norm));  // max norm 1: always active
    float lr = u <= 3 ? 1e-3f * u / 3 : 1e-3f * 0.5f * (1 + std::cos(3.14159f * u / 40));
    UpdateRecord info;
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
      if (r.grad_in_lent_buffer) {
        ++lent_records;
        EXPECT_EQ(lent_.erase(r.grad), 1u) << "step " << r.step << ": a buffer never lent";
      }
    }
    // Complete from another thread, as a real persist would.
    std::thread([done] { done(absl::OkStatus()); }).detach();
  }
  // With lend_every > 0, every lend_every-th LendDeltaBuffer gets memory (the others null).
  void* LendDeltaBuffer(size_t bytes) override {
    absl::MutexLock lock(&mu_);
    if (lend_every <= 0 || asked_++ % lend_every != 0) return nullptr;
    auto buf = std::make_unique<char[]>(bytes);
    void* p = buf.get();
    lent_[p] = std::move(buf);
    ++lent;
    return p;
  }
  void ReturnDeltaBuffer(void* buffer) override {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(lent_.erase(buffer), 1u) << "a buffer returned that was never lent";
    ++returned;
  }
  size_t outstanding() {
    absl::MutexLock lock(&mu_);
    return lent_.size();
  }
  bool Holding() {
    absl::MutexLock lock(&mu_);
    return held_ != nullptr;
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
  int lend_every = 0;
  int lent = 0, returned = 0, lent_records = 0;

 private:
  int asked_ = 0;
  std::map<const void*, std::unique_ptr<char[]>> lent_;
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

inline RunResult RunSim(const RunConfig& rc, MemorySink* sink) {
  SimTrainer sim(rc.n, rc.gdt, rc.skip);
  auto dev = NewHostDevice();
  SnapshotEngineOptions o;
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
    UpdateRecord info = sim.Update(u);
    bool due = std::find(rc.due.begin(), rc.due.end(), u) != rc.due.end();
    // The previous FULL's persist finishes on the worker thread; wait for it, so the FULL due
    // here starts here (deferral has its own deterministic test).
    for (int i = 0; due && (*engine)->in_flight() && i < 20000; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
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

inline State Restore(MemorySink& sink, int64_t u, ReplayPool* pool) {
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


}  // namespace enginetest
}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_ENGINE_TEST_UTIL_H_
