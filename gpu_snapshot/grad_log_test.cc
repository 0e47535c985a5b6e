// Tests of the gradient log: FULL + DELTAs replayed on the host equal the state of every
// logged step; the DELTA header format.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_snapshot/engine_test_util.h"
#include "gpu_snapshot/grad_log.h"
#include "gpu_snapshot/host_replay.h"
#include "gtest/gtest.h"

namespace gradsnap {
namespace gpu_snapshot {
namespace {

using namespace ::gradsnap::gpu_snapshot::enginetest;  // NOLINT: test helpers

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

// On the host device the engine copies each logged gradient straight into memory the sink
// lends (SnapshotSink::LendDeltaBuffer) and hands it over in the record: the chain replays
// exactly as with the engine's own log buffer, lent memory that becomes no record (the FULL
// steps) comes back, none is left out; a sink that lends only now and then mixes both paths.
TEST(GradLogTest, LentBuffersCarryTheRecordsAndComeBack) {
  for (int every : {1, 3}) {
    RunConfig rc;
    rc.grad_log = true;
    MemorySink sink;
    sink.lend_every = every;
    RunResult r = RunSim(rc, &sink);
    ReplayPool pool(2);
    ASSERT_EQ(sink.deltas.size(), static_cast<size_t>(rc.steps - 2));
    EXPECT_EQ(sink.lent, (rc.steps + every - 1) / every) << every;
    EXPECT_EQ(sink.lent, sink.lent_records + sink.returned) << every;
    EXPECT_EQ(sink.outstanding(), 0u);
    if (every == 1) {
      EXPECT_EQ(sink.returned, 2);  // steps 4 and 11: a FULL, no DELTA
    }
    EXPECT_GT(sink.lent_records, 0);
    for (int64_t u = 1; u <= rc.steps; ++u) {
      if (u == 4 || u == 11) continue;
      EXPECT_TRUE(Restore(sink, u, &pool) == r.reference[u]) << "every " << every << " step " << u;
    }
  }
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


// ApplyChain (every update of a block at once) equals Apply called per update, bit for bit:
// fp32 and bf16 gradients, a skipped update, a range that starts inside the state and ends
// inside a block, on 1 and 3 threads.
TEST(GradLogTest, ApplyChainEqualsOneApplyPerUpdate) {
  const size_t total = 3 * ReplayPool::kChainBlock + 1000, begin = 37, end = total - 501;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> p0(total), m0(total), v0(total);
  for (size_t i = 0; i < total; ++i) {
    p0[i] = d(rng);
    m0[i] = d(rng) * 0.1f;
    v0[i] = std::abs(d(rng)) * 0.01f;
  }
  std::vector<float> g32(end - begin);
  std::vector<uint16_t> g16(end - begin);
  for (size_t i = 0; i < g32.size(); ++i) {
    g32[i] = d(rng);
    g16[i] = FloatToBf16(d(rng));
  }
  std::vector<ReplayPool::ChainStep> steps(4);
  for (size_t k = 0; k < steps.size(); ++k) {
    AdamWStepParams& a = steps[k].update.adamw;
    a.lr = 1e-3f * static_cast<float>(k + 1);
    a.grad_scale = 0.5f;
    a.config.beta1 = 0.9f;
    a.config.beta2 = 0.95f;
    a.config.eps = 1e-8f;
    a.config.weight_decay = 0.1f;
    a.bias_correction1 = 1.0f - 0.5f / static_cast<float>(k + 2);
    a.bias_correction2 = 1.0f - 0.25f / static_cast<float>(k + 2);
    steps[k].dtype = k % 2 == 0 ? DType::kF32 : DType::kBF16;
    steps[k].grad = k % 2 == 0 ? static_cast<const void*>(g32.data()) : g16.data();
  }
  steps[2].update.skipped = true;
  for (int threads : {1, 3}) {
    SCOPED_TRACE(threads);
    ReplayPool pool(threads);
    std::vector<float> p1 = p0, m1 = m0, v1 = v0, p2 = p0, m2 = m0, v2 = v0;
    for (const ReplayPool::ChainStep& s : steps) {
      pool.Apply({p1.data(), m1.data(), v1.data(), total}, begin, end, s.grad, s.dtype, s.update);
    }
    pool.ApplyChain({p2.data(), m2.data(), v2.data(), total}, begin, end, steps);
    EXPECT_EQ(0, std::memcmp(p1.data(), p2.data(), total * 4));
    EXPECT_EQ(0, std::memcmp(m1.data(), m2.data(), total * 4));
    EXPECT_EQ(0, std::memcmp(v1.data(), v2.data(), total * 4));
    EXPECT_NE(0, std::memcmp(p1.data(), p0.data(), total * 4));  // it did update
    EXPECT_EQ(p2[0], p0[0]);                                      // outside [begin, end)
    EXPECT_EQ(p2[total - 1], p0[total - 1]);
  }
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

// The eight AdamW floats sit at the offsets docs/gockpt.md gives (56 + 4 * i), so DELTA records
// written before AdamWStepParams nested its AdamWConfig read back the same.
TEST(GradLogTest, HeaderAdamWFloatsAtDocumentedOffsets) {
  DeltaHeader h;
  AdamWStepParams& a = h.update.adamw;
  a.lr = 1.0f;
  a.grad_scale = 2.0f;
  a.config.beta1 = 3.0f;
  a.config.beta2 = 4.0f;
  a.config.eps = 5.0f;
  a.config.weight_decay = 6.0f;
  a.bias_correction1 = 7.0f;
  a.bias_correction2 = 8.0f;
  const std::string b = EncodeDeltaHeader(h);
  ASSERT_EQ(b.size(), kDeltaHeaderBytes);
  for (int i = 0; i < 8; ++i) {
    float f = 0.0f;
    memcpy(&f, b.data() + 56 + 4 * i, sizeof(f));  // little-endian hosts only, as the format
    EXPECT_EQ(f, static_cast<float>(i + 1)) << "float " << i;
  }
  auto d = DecodeDeltaHeader(b);
  ASSERT_TRUE(d.ok()) << d.status();
  const AdamWStepParams& r = d->update.adamw;
  EXPECT_EQ(r.lr, 1.0f);
  EXPECT_EQ(r.grad_scale, 2.0f);
  EXPECT_EQ(r.config.beta1, 3.0f);
  EXPECT_EQ(r.config.beta2, 4.0f);
  EXPECT_EQ(r.config.eps, 5.0f);
  EXPECT_EQ(r.config.weight_decay, 6.0f);
  EXPECT_EQ(r.bias_correction1, 7.0f);
  EXPECT_EQ(r.bias_correction2, 8.0f);
}

}  // namespace
}  // namespace gpu_snapshot
}  // namespace gradsnap
