// The recovery library against the real embedded engine: resharding any world size to any
// other is exact (FULL slices and the DELTA chain replayed), restore directories read back what
// was written, damage falls back as specified, and the small parsers refuse bad input.
#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/rank_slice.h"
#include "common/sha256.h"
#include "gpu_snapshot/grad_log.h"
#include "gtest/gtest.h"
#include "recovery/layout.h"
#include "recovery/recovery_point.h"
#include "recovery/restore_dir.h"
#include "recovery/restore_state.h"
#include "recovery/state_source.h"
#include "recovery/state_text.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace recovery {
namespace {

namespace fs = std::filesystem;
using client::TensorRef;
using storage::CheckpointInfo;
using storage::CheckpointKind;
using storage::CheckpointState;
using storage::TensorSpec;

constexpr uint64_t kTotal = 10007;  // odd, so slices differ in length
const char* kLayout = "a.weight:100x100:0;b.bias:7:10000";

std::string StateText(int64_t step, int world) {
  return absl::StrCat(kStateVersionLine, "\nstep=", step, "\nworld_size=", world, "\nopt_t=", step,
                      "\n", kParamLayoutKey, "=", kLayout, "\n");
}

AdamWStepParams Update(int64_t u) {
  AdamWStepParams a;
  a.lr = 1e-3f * static_cast<float>(u);
  a.grad_scale = 0.75f;
  a.config.beta1 = 0.9f;
  a.config.beta2 = 0.95f;
  a.config.eps = 1e-8f;
  a.config.weight_decay = 0.1f;
  a.bias_correction1 = 1.0f - 0.5f / static_cast<float>(u);
  a.bias_correction2 = 1.0f - 0.25f / static_cast<float>(u);
  return a;
}

std::vector<float> Random(uint64_t seed, size_t n, float scale) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TensorSpec Flat(const std::string& name, DType dt, uint64_t lo, uint64_t n) {
  TensorSpec t;
  t.name = name;
  t.dtype = dt;
  t.shape = {static_cast<int64_t>(n)};
  t.byte_length = n * DTypeSize(dt);
  t.flat_name = name;
  t.flat_offset = lo;
  t.flat_total = kTotal;
  return t;
}

TensorSpec Bytes(const std::string& name, size_t n) {
  TensorSpec t;
  t.name = name;
  t.dtype = DType::kU8;
  t.shape = {static_cast<int64_t>(n)};
  t.byte_length = n;
  return t;
}

class RecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    scratch_ = tmp_.path();
    client::ClientOptions o;
    o.local_dir = scratch_ + "/ckpt";
    auto c = client::Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
    p_ = Random(1, kTotal, 1.0f);
    m_ = Random(2, kTotal, 0.01f);
    v_ = Random(3, kTotal, 0.0001f);
    for (float& x : v_) x = std::abs(x);
  }
  // Empties the scratch directory too: a test calls TearDown() and SetUp() for a fresh store.
  void TearDown() override {
    client_.reset();
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(scratch_, ec)) fs::remove_all(e.path(), ec);
  }

  // FULL `step` of the current reference state, written by `world` ranks.
  void SaveFull(int64_t step, int world) {
    const std::string text = StateText(step, world);
    ASSERT_TRUE(client_->BeginCheckpoint({"j", step, CheckpointKind::kFull, -1, world, text}).ok());
    for (int r = 0; r < world; ++r) {
      const auto [lo, hi] = SliceOfRank(kTotal, r, world);
      client::ShardSpec s{"j", step, r, {}, text};
      std::vector<TensorRef> refs = {{Flat(kFlatParams, DType::kF32, lo, hi - lo), p_.data() + lo},
                                     {Flat(kFlatAdamM, DType::kF32, lo, hi - lo), m_.data() + lo},
                                     {Flat(kFlatAdamV, DType::kF32, lo, hi - lo), v_.data() + lo},
                                     {Bytes(kReplicatedTensor, text.size()), text.data()}};
      ASSERT_TRUE(client_->SaveShard(s, refs).ok());
    }
  }

  // DELTA u on `base` written by `world` ranks; advances the reference state. With
  // `wrong_header_rank` >= 0 that rank's header names a slice one element off (it reads back
  // intact but does not match its checkpoint).
  // `short_grad_rank` >= 0: that rank's gradient slice lacks its last element (the pieces do
  // not cover the flat buffer).
  void SaveDelta(int64_t u, int64_t base, int world, int wrong_header_rank = -1,
                 int short_grad_rank = -1) {
    const std::string text = StateText(u, world);
    const std::vector<float> g = Random(100 + u, kTotal, 0.5f);
    ASSERT_TRUE(client_->BeginCheckpoint({"j", u, CheckpointKind::kDelta, base, world, text}).ok());
    for (int r = 0; r < world; ++r) {
      const auto [lo, hi] = SliceOfRank(kTotal, r, world);
      gpu_snapshot::DeltaHeader h;
      h.step = u;
      h.base_step = base;
      h.update.adamw = Update(u);
      h.numel = hi - lo;
      h.elem_offset = lo + (r == wrong_header_rank ? 1 : 0);
      const std::string header = gpu_snapshot::EncodeDeltaHeader(h);
      client::ShardSpec s{"j", u, r, {}, text};
      std::vector<TensorRef> refs = {{Bytes(kDeltaHeaderTensor, header.size()), header.data()},
                                     {Flat(kFlatGrad, DType::kF32, lo,
                                           hi - lo - (r == short_grad_rank ? 1 : 0)),
                                      g.data() + lo},
                                     {Bytes(kReplicatedTensor, text.size()), text.data()}};
      ASSERT_TRUE(client_->SaveShard(s, refs).ok());
    }
    ReferenceAdamW(Update(u), g);
  }

  // The expected state after one update, written here from AdamW's definition (decoupled weight
  // decay, docs/gockpt.md) rather than with the replay under test (gpu_snapshot/adamw.h,
  // host_replay.h): a defect there must not move the expectation with it. Same operation order
  // as the device, one rounding per operation (-ffp-contract=off), so equal bit for bit.
  void ReferenceAdamW(const AdamWStepParams& h, const std::vector<float>& grad) {
    const float b1 = h.config.beta1, b2 = h.config.beta2;
    for (size_t i = 0; i < kTotal; ++i) {
      const float g = grad[i] * h.grad_scale;
      m_[i] = b1 * m_[i] + (1.0f - b1) * g;
      v_[i] = b2 * v_[i] + (1.0f - b2) * (g * g);
      const float step = (m_[i] / h.bias_correction1) /
                             (std::sqrt(v_[i] / h.bias_correction2) + h.config.eps) +
                         h.config.weight_decay * p_[i];
      p_[i] = p_[i] - h.lr * step;
    }
  }

  // Restores [0, kTotal) cut for `world` ranks and compares with the reference state.
  void ExpectResharded(StateSource& src, const RecoveryPoint& rp, int world, int64_t step) {
    for (int r = 0; r < world; ++r) {
      const auto [lo, hi] = SliceOfRank(kTotal, r, world);
      std::vector<float> p(hi - lo), m(hi - lo), v(hi - lo);
      RestoreOptions o;
      o.range_bytes = 4096;       // many ranges, read in parallel
      o.prefetch_deltas = 1 + r;  // the chain fetched in batches of 1, 2, 3, ...
      auto got = RestoreRange(src, rp, lo, hi, p.data(), m.data(), v.data(), o);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(got->damage.empty()) << got->damage;
      EXPECT_EQ(got->step, step);
      EXPECT_EQ(0, std::memcmp(p.data(), p_.data() + lo, p.size() * 4)) << "rank " << r;
      EXPECT_EQ(0, std::memcmp(m.data(), m_.data() + lo, m.size() * 4)) << "rank " << r;
      EXPECT_EQ(0, std::memcmp(v.data(), v_.data() + lo, v.size() * 4)) << "rank " << r;
      // Exactly the bytes needed: 3 slices of the FULL and one gradient slice per DELTA.
      EXPECT_EQ(got->bytes_read, (3 + rp.delta_steps.size()) * (hi - lo) * 4);
    }
  }

  void FlipMiddle(int64_t step, int rank) {
    ASSERT_GT(gradsnap::testing::FlipSegmentBytes(scratch_ + "/ckpt", "j", step, rank), 0)
        << "no segment file of step " << step << " rank " << rank;
  }

  gradsnap::testing::TempDir tmp_{"recovery"};
  std::string scratch_;
  std::unique_ptr<client::Client> client_;
  std::vector<float> p_, m_, v_;
};

TEST_F(RecoveryTest, ReshardsAnyWorldSizeToAnyOtherExactly) {
  for (int from : {2, 3, 4}) {
    SCOPED_TRACE(from);
    TearDown();  // a fresh store for each writer world size
    SetUp();
    SaveFull(10, from);
    auto src = NewClientSource(client_.get(), "j");
    for (int to : {1, 2, 3, 5}) ExpectResharded(*src, RecoveryPoint{10, {}}, to, 10);
    SaveDelta(11, 10, from);
    SaveDelta(12, 10, from);
    SaveDelta(13, 10, from);
    auto list = src->List();
    ASSERT_TRUE(list.ok());
    const RecoveryPoint rp = FindRecoveryPoint(*list);
    EXPECT_EQ(rp.Describe(), "full 10 + 3 deltas -> step 13");
    for (int to : {1, 2, 3, 5}) ExpectResharded(*src, rp, to, 13);
  }
}

// The whole state at job "j"'s recovery point, as `gradsnap restore` holds it before writing.
void RestoreLatest(client::Client* c, FullState* s) {
  auto src = NewClientSource(c, "j");
  s->job = "j";
  s->master.resize(kTotal);
  s->m.resize(kTotal);
  s->v.resize(kTotal);
  std::vector<std::string> damage;
  auto r = RestoreRecoveryPoint(*src, 0, kTotal, s->master.data(), s->m.data(), s->v.data(),
                                RestoreOptions(), &damage);
  ASSERT_TRUE(r.ok()) << r.status();
  s->step = r->step;
  s->state = r->state;
}

TEST_F(RecoveryTest, RestoreDirectoriesReadBackExactly) {
  SaveFull(10, 2);
  SaveDelta(11, 10, 2);
  FullState s;
  ASSERT_NO_FATAL_FAILURE(RestoreLatest(client_.get(), &s));
  s.source = RecoveryPoint{10, {11}};
  for (bool consolidated : {false, true}) {
    SCOPED_TRACE(consolidated);
    const std::string dir = absl::StrCat(scratch_, "/out", consolidated);
    fs::create_directories(dir);
    auto files = consolidated ? WriteConsolidated(dir, s, DType::kF32)
                              : WriteRankFiles(s, 3, [&](int k) { return RankFilePath(dir, k); });
    ASSERT_TRUE(files.ok()) << files.status();
    // Without manifest.json the directory is incomplete.
    auto incomplete = OpenDirSource(dir);
    EXPECT_EQ(incomplete.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(incomplete.status().message().find("manifest.json"), std::string::npos);
    ASSERT_TRUE(WriteRestoreManifest(dir, s, 3, consolidated, *files).ok());
    auto d = OpenDirSource(dir);
    ASSERT_TRUE(d.ok()) << d.status();
    ExpectResharded(**d, RecoveryPoint{11, {}}, 2, 11);
    // A byte flipped in a written file: refused, never read as state.
    const std::string file = dir + (consolidated ? "/optimizer.safetensors" : "/rank1.safetensors");
    ASSERT_TRUE(gradsnap::testing::FlipByte(file, fs::file_size(file) - 100, 1).ok());
    auto damaged = OpenDirSource(dir, /*verify_all=*/true);
    EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss) << damaged.status();
    EXPECT_NE(damaged.status().message().find("SHA-256"), std::string::npos);
    // Opened without the full check, the damaged tensor is refused when it is read.
    auto lazy = OpenDirSource(dir);
    ASSERT_TRUE(lazy.ok()) << lazy.status();
    std::vector<float> p(kTotal), m(kTotal), v(kTotal);
    auto got = RestoreRange(**lazy, RecoveryPoint{11, {}}, 0, kTotal, p.data(), m.data(),
                            v.data(), RestoreOptions());
    if (consolidated) {  // the FULL is damaged: reported, nothing restored
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(got->full_damaged);
      EXPECT_NE(got->damage.find("SHA-256"), std::string::npos) << got->damage;
    }
  }
  // bf16 weights cannot continue training exactly.
  const std::string bf = scratch_ + "/bf16";
  fs::create_directories(bf);
  auto files = WriteConsolidated(bf, s, DType::kBF16);
  ASSERT_TRUE(files.ok());
  ASSERT_TRUE(WriteRestoreManifest(bf, s, 1, true, *files).ok());
  auto d = OpenDirSource(bf);
  ASSERT_TRUE(d.ok()) << d.status();
  std::vector<float> p(kTotal), m(kTotal), v(kTotal);
  auto got = RestoreRange(**d, RecoveryPoint{11, {}}, 0, kTotal, p.data(), m.data(), v.data(),
                          RestoreOptions());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition) << got.status();

  // f64 weights (an export converted by another tool, its digests recomputed): refused before
  // any read, since their bytes are twice what the f32 buffers hold. Each buffer here is
  // followed by a guard of as many floats, which must come back untouched.
  const std::string wide = scratch_ + "/f64";
  fs::create_directories(wide);
  auto wide_files = WriteConsolidated(wide, s, DType::kF32);
  ASSERT_TRUE(wide_files.ok());
  auto kv = ParseStateText(s.state);
  ASSERT_TRUE(kv.ok());
  auto layout = DecodeLayout(kv->at(std::string(kParamLayoutKey)));
  ASSERT_TRUE(layout.ok());
  std::vector<double> f64(s.master.begin(), s.master.end());
  std::vector<SafetensorsTensor> model;
  std::vector<std::pair<std::string, std::string>> meta = {
      {"format", "gradsnap-model-v1"}, {"job", s.job}, {"step", absl::StrCat(s.step)},
      {"dtype", "f64"}, {"train_state", s.state}};
  for (const ParamEntry& e : *layout) {
    model.push_back({e.name, DType::kF64, e.shape, f64.data() + e.offset, e.numel() * 8});
    meta.push_back({"sha256." + e.name, Sha256Hex(model.back().data, model.back().bytes)});
  }
  ASSERT_TRUE(WriteSafetensors(wide + "/model.safetensors", meta, model).ok());
  for (WrittenFile& f : *wide_files) {
    if (f.path == wide + "/model.safetensors") f.bytes = f64.size() * 8;
  }
  ASSERT_TRUE(WriteRestoreManifest(wide, s, 1, true, *wide_files).ok());
  auto wd = OpenDirSource(wide, /*verify_all=*/true);
  ASSERT_TRUE(wd.ok()) << wd.status();
  constexpr float kGuard = 12345.5f;
  std::vector<float> gp(2 * kTotal, kGuard), gm(2 * kTotal, kGuard), gv(2 * kTotal, kGuard);
  auto refused = RestoreRange(**wd, RecoveryPoint{11, {}}, 0, kTotal, gp.data(), gm.data(),
                              gv.data(), RestoreOptions());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_NE(refused.status().message().find("f64"), std::string::npos) << refused.status();
  for (const std::vector<float>* b : {&gp, &gm, &gv}) {
    for (size_t i = kTotal; i < b->size(); ++i) {
      ASSERT_EQ((*b)[i], kGuard) << "written past at " << i;
    }
  }
}

// WriteRankFiles stages every rank's file before renaming any: a failure on a later rank
// leaves the earlier ranks' files of those names as they were (no set of two checkpoints).
TEST_F(RecoveryTest, RankFilesAreReplacedTogetherOrNotAtAll) {
  SaveFull(10, 2);
  FullState s;
  ASSERT_NO_FATAL_FAILURE(RestoreLatest(client_.get(), &s));
  const std::string dir = scratch_ + "/staged";
  fs::create_directories(dir);
  auto first = WriteRankFiles(s, 2, [&](int k) { return RankFilePath(dir, k); });
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string rank0 = gradsnap::testing::ReadFileOrEmpty(RankFilePath(dir, 0));
  ASSERT_FALSE(rank0.empty());
  s.step = 99;  // another checkpoint; rank 1's file cannot be created (no such directory)
  auto failed = WriteRankFiles(s, 2, [&](int k) {
    return k == 0 ? RankFilePath(dir, 0) : scratch_ + "/missing/rank1.safetensors";
  });
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kNotFound) << failed.status();
  EXPECT_EQ(gradsnap::testing::ReadFileOrEmpty(RankFilePath(dir, 0)), rank0);
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  }
  // The same for a consolidated set: a trainer_state.json that cannot be replaced (a directory
  // of that name) leaves model.safetensors as it was, and nothing staged behind.
  const std::string cons = scratch_ + "/staged_cons";
  fs::create_directories(cons + "/trainer_state.json");
  auto c = WriteConsolidated(cons, s, DType::kF32);
  EXPECT_FALSE(c.ok());
  EXPECT_FALSE(fs::exists(cons + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(cons + "/optimizer.safetensors"));
  for (const auto& e : fs::directory_iterator(cons)) {
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

TEST_F(RecoveryTest, DamagedDeltaCutsTheChainDamagedFullFallsBack) {
  SaveFull(5, 2);
  SaveDelta(6, 5, 2);
  SaveDelta(7, 5, 2);
  const std::vector<float> p7 = p_;
  SaveFull(8, 2);
  SaveDelta(9, 8, 2);
  SaveDelta(10, 8, 2);
  auto src = NewClientSource(client_.get(), "j");
  std::vector<float> p(kTotal), m(kTotal), v(kTotal);
  std::vector<std::string> damage;
  // The recovery point after the damage so far, with this round's damage reports.
  auto restore = [&] {
    damage.clear();
    return RestoreRecoveryPoint(*src, 0, kTotal, p.data(), m.data(), v.data(), RestoreOptions(),
                                &damage);
  };
  // The newest DELTA of rank 1: the chain stops one step earlier.
  FlipMiddle(10, 1);
  auto r = restore();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 9);
  ASSERT_EQ(damage.size(), 1u);
  // grad shares a packed chunk with the small delta_header (docs/format.md, "Packed chunks").
  EXPECT_NE(damage[0].find("job j step 10 rank 1 tensor"), std::string::npos) << damage[0];
  EXPECT_NE(damage[0].find("packed chunk holding tensors delta_header, grad"), std::string::npos)
      << damage[0];
  // A damaged FULL: the previous FULL and its whole chain.
  FlipMiddle(8, 0);
  r = restore();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->full_step, 5);
  EXPECT_EQ(r->step, 7);
  EXPECT_EQ(0, std::memcmp(p.data(), p7.data(), kTotal * 4));
  ASSERT_EQ(damage.size(), 1u);
  EXPECT_NE(damage[0].find("job j step 8 rank 0"), std::string::npos) << damage[0];
  // A middle DELTA of that chain: stops before it.
  FlipMiddle(7, 0);
  r = restore();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 6);
  FlipMiddle(5, 1);
  r = restore();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
}

// A DELTA's headers are read beside its gradient and the FULL, and checked before it is replayed:
// one that reads back intact but names another slice stops the chain before it, and the DELTAs
// after it, read in the same batch, are not applied either.
TEST_F(RecoveryTest, MismatchedDeltaHeaderStopsTheChainBeforeIt) {
  SaveFull(5, 2);
  SaveDelta(6, 5, 2);
  const std::vector<float> p6 = p_, m6 = m_, v6 = v_;
  SaveDelta(7, 5, 2, /*wrong_header_rank=*/1);
  SaveDelta(8, 5, 2);
  auto src = NewClientSource(client_.get(), "j");
  std::vector<float> p(kTotal), m(kTotal), v(kTotal);
  std::vector<std::string> damage;
  for (int batch : {1, 4}) {
    SCOPED_TRACE(batch);
    RestoreOptions o;
    o.prefetch_deltas = batch;
    o.threads = 1 + batch;
    damage.clear();
    auto r = RestoreRecoveryPoint(*src, 0, kTotal, p.data(), m.data(), v.data(), o, &damage);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->full_step, 5);
    EXPECT_EQ(r->step, 6);
    EXPECT_EQ(r->deltas, 1);
    EXPECT_EQ(0, std::memcmp(p.data(), p6.data(), kTotal * 4));
    EXPECT_EQ(0, std::memcmp(m.data(), m6.data(), kTotal * 4));
    EXPECT_EQ(0, std::memcmp(v.data(), v6.data(), kTotal * 4));
    ASSERT_EQ(damage.size(), 1u);
    EXPECT_NE(damage[0].find("step 7 rank 1 tensor delta_header: does not match its checkpoint"),
              std::string::npos)
        << damage[0];
  }
}

// A DELTA whose gradient pieces do not cover the range is not planned (its reads never go out,
// so none is left writing into its buffers): the chain stops before it.
TEST_F(RecoveryTest, DeltaWithAHoleInItsGradientStopsTheChainBeforeIt) {
  SaveFull(5, 2);
  SaveDelta(6, 5, 2);
  const std::vector<float> p6 = p_;
  SaveDelta(7, 5, 2, -1, /*short_grad_rank=*/0);
  SaveDelta(8, 5, 2);
  auto src = NewClientSource(client_.get(), "j");
  std::vector<float> p(kTotal), m(kTotal), v(kTotal);
  std::vector<std::string> damage;
  auto r = RestoreRecoveryPoint(*src, 0, kTotal, p.data(), m.data(), v.data(), RestoreOptions(),
                                &damage);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step, 6);
  EXPECT_EQ(0, std::memcmp(p.data(), p6.data(), kTotal * 4));
  ASSERT_EQ(damage.size(), 1u);
  EXPECT_NE(damage[0].find("step 7: grad does not hold elements"), std::string::npos) << damage[0];
}

TEST(RecoveryPointTest, PlansAndMissingBases) {
  auto info = [](int64_t step, CheckpointKind k, int64_t base) {
    CheckpointInfo i;
    i.step = step;
    i.kind = k;
    i.base_step = base;
    i.state = CheckpointState::kCommitted;
    return i;
  };
  std::vector<CheckpointInfo> list = {
      info(5, CheckpointKind::kFull, -1), info(6, CheckpointKind::kDelta, 5),
      info(7, CheckpointKind::kDelta, 5), info(9, CheckpointKind::kDelta, 5),
      info(12, CheckpointKind::kDelta, 10)};
  RecoveryPoint rp = FindRecoveryPoint(list);
  EXPECT_EQ(rp.full_step, 5);
  EXPECT_EQ(rp.step(), 7);
  auto plan = PlanForStep(list, 7);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->delta_steps, (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(PlanForStep(list, 5)->delta_steps.size(), 0u);
  auto gap = PlanForStep(list, 9);
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(gap.status().message().find("DELTA 8"), std::string::npos) << gap.status();
  auto no_base = PlanForStep(list, 12);
  EXPECT_EQ(no_base.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(no_base.status().message().find("needs FULL 10"), std::string::npos);
  EXPECT_EQ(PlanForStep(list, 8).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FindRecoveryPoint({}).full_step, -1);
  EXPECT_EQ(FindRecoveryPoint(list, 4).full_step, -1);
}

TEST(LayoutTest, RoundTripAndBadInput) {
  auto l = DecodeLayout(kLayout);
  ASSERT_TRUE(l.ok()) << l.status();
  ASSERT_EQ(l->size(), 2u);
  EXPECT_EQ((*l)[0].shape, (std::vector<int64_t>{100, 100}));
  EXPECT_EQ(LayoutTotal(*l), kTotal);
  EXPECT_EQ(EncodeLayout(*l), kLayout);
  for (const char* bad : {"", "a:3:1", "a:3:0;a:2:3", "a:0:0", "a:x:0", "a:3", "a:3:0;b:2:4"}) {
    EXPECT_EQ(DecodeLayout(bad).status().code(), absl::StatusCode::kDataLoss) << bad;
  }
}

TEST(StateTextTest, ReadsAndRewritesFields) {
  auto kv = ParseStateText(StateText(7, 2));
  ASSERT_TRUE(kv.ok());
  EXPECT_EQ(*StateInt(*kv, "step"), 7);
  const std::string t = SetStateField(StateText(7, 2), "world_size", "5");
  EXPECT_EQ(*StateInt(*ParseStateText(t), "world_size"), 5);
  EXPECT_EQ(ParseStateText("garbage").status().code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace recovery
}  // namespace gradsnap
