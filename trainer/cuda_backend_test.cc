// The CUDA back end against the CPU reference, the device AdamW against the host one bit for
// bit, and the NCCL deadline. All skip on a machine without a GPU (or a build without CUDA).
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "trainer/backend.h"
#include "trainer/cuda_testing.h"
#include "trainer/data.h"

namespace gradsnap {
namespace trainer {
namespace {

// Skips only for "no device / no driver" (FAILED_PRECONDITION from the back end's device check)
// or a build without CUDA; any other error (a broken GPU) fails the test.
bool NoGpu(const absl::Status& s) {
  return absl::IsFailedPrecondition(s) || absl::IsUnimplemented(s);
}

// The NCCL deadline (the abort path of a frozen peer, on one GPU): a wait on a stream that never
// completes ends at the deadline with one clear UNAVAILABLE line, having aborted the
// communicator; work that completes is waited for and nothing is aborted.
TEST(CudaBackendTest, NcclDeadlineAbortsTheCommunicatorWhenTheWorkNeverEnds) {
  bool aborted = false;
  const absl::Status s = NcclDeadlineForTest(std::chrono::milliseconds(500), true, &aborted);
  if (NoGpu(s)) GTEST_SKIP() << s;
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_TRUE(aborted);
  EXPECT_EQ(std::string(s.message()),
            "collective deadline: a blocked stream on cuda:0 did not complete in 0.5 s "
            "(--collective-timeout-s): a peer rank is frozen or gone; the NCCL communicator "
            "aborted");
}

TEST(CudaBackendTest, NcclDeadlineWaitsForWorkThatEnds) {
  bool aborted = true;
  const absl::Status s = NcclDeadlineForTest(std::chrono::milliseconds(60000), false, &aborted);
  if (NoGpu(s)) GTEST_SKIP() << s;
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_FALSE(aborted);
}

TEST(CudaBackendTest, DeviceAdamWMatchesHostBitForBit) {
  const size_t n = 4096;
  std::vector<float> p(n), m(n), v(n);
  std::vector<uint16_t> g(n);
  for (size_t i = 0; i < n; ++i) {
    p[i] = 0.1f * std::sin(0.3f * i);
    m[i] = 1e-3f * std::cos(0.7f * i);
    v[i] = 1e-6f * (1 + (i % 7));
    g[i] = FloatToBf16(0.02f * std::sin(1.3f * i));
  }
  std::vector<float> hp = p, hm = m, hv = v;
  const AdamWStepParams h = MakeAdamWStepParams(AdamWConfig{}, 3e-4f, 0.75f, 17);
  const absl::Status s = DeviceAdamWForTest(p.data(), m.data(), v.data(), g.data(), n, h);
  if (NoGpu(s)) GTEST_SKIP() << s;
  ASSERT_TRUE(s.ok()) << s;
  AdamWUpdateHostBf16(hp.data(), hm.data(), hv.data(), g.data(), n, h);
  EXPECT_EQ(0, std::memcmp(p.data(), hp.data(), n * 4));
  EXPECT_EQ(0, std::memcmp(m.data(), hm.data(), n * 4));
  EXPECT_EQ(0, std::memcmp(v.data(), hv.data(), n * 4));
}

// The trainer's own AdamW kernel against the host replay over many steps: the state evolves on
// the device and on the host from the same start with the same bf16 gradients, LR schedule,
// clip coefficients and weight decay; every step must agree bit for bit.
TEST(CudaBackendTest, DeviceAdamWMatchesHostOverManySteps) {
  const size_t n = 1 << 16;
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f);
  for (size_t i = 0; i < n; ++i) p[i] = 0.02f * std::sin(0.37f * i);
  std::vector<float> hp = p, hm = m, hv = v;
  std::vector<uint16_t> g(n);
  AdamWConfig cfg;
  cfg.weight_decay = 0.1f;
  for (int t = 1; t <= 200; ++t) {
    for (size_t i = 0; i < n; ++i) {
      g[i] = FloatToBf16(0.05f * std::sin(0.011f * t * (i % 977) + 0.3f * t));
    }
    const float lr = 6e-4f * (t < 20 ? t / 20.0f : 1.0f - 0.004f * (t - 20));
    const float scale = (t % 7 == 0) ? 0.5f : 1.0f;
    const AdamWStepParams h = MakeAdamWStepParams(cfg, lr, scale, t);
    const absl::Status s = DeviceAdamWForTest(p.data(), m.data(), v.data(), g.data(), n, h);
    if (t == 1 && NoGpu(s)) GTEST_SKIP() << s;
    ASSERT_TRUE(s.ok()) << s;
    AdamWUpdateHostBf16(hp.data(), hm.data(), hv.data(), g.data(), n, h);
    ASSERT_EQ(0, std::memcmp(p.data(), hp.data(), n * 4)) << "params differ at step " << t;
    ASSERT_EQ(0, std::memcmp(m.data(), hm.data(), n * 4)) << "m differs at step " << t;
    ASSERT_EQ(0, std::memcmp(v.data(), hv.data(), n * 4)) << "v differs at step " << t;
  }
}

// bf16 compute vs the fp32 reference: losses agree to 2%, parameters after 3 updates to 5e-3.
TEST(CudaBackendTest, MatchesCpuReferenceOnTinyModel) {
  const ModelConfig c = *ModelConfigByName("tiny");
  const int B = 4, T = 32;
  auto comm = NewLocalComm();
  auto gpu = NewCudaBackend(c, B, T, comm.get());
  if (NoGpu(gpu.status())) GTEST_SKIP() << gpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto cpu = NewCpuBackend(c, B, T, comm.get());
  std::vector<float> init(ParamLayout(c).total());
  InitParams(c, 3, init.data());
  ASSERT_TRUE(cpu->SetParams(init.data()).ok());
  ASSERT_TRUE((*gpu)->SetParams(init.data()).ok());
  auto corpus = LoadCorpus("", T);
  ASSERT_TRUE(corpus.ok());
  DataLoader loader(&*corpus, T, B, 0, 1);
  std::vector<int32_t> in(B * T), tgt(B * T);
  for (int step = 1; step <= 3; ++step) {
    loader.Batch(LoaderPosition{1, step}, in.data(), tgt.data());
    ASSERT_TRUE(cpu->ForwardBackward(in.data(), tgt.data(), 1.0f / (B * T)).ok());
    const absl::Status fb = (*gpu)->ForwardBackward(in.data(), tgt.data(), 1.0f / (B * T));
    ASSERT_TRUE(fb.ok()) << fb;
    auto nc = cpu->ReduceGrads();
    auto ng = (*gpu)->ReduceGrads();
    ASSERT_TRUE(nc.ok() && ng.ok()) << ng.status();
    EXPECT_NEAR(ng->loss_sum, nc->loss_sum, 0.02 * nc->loss_sum) << "step " << step;
    EXPECT_NEAR(std::sqrt(ng->grad_sq), std::sqrt(nc->grad_sq), 0.05 * std::sqrt(nc->grad_sq));
    const AdamWStepParams h = MakeAdamWStepParams(AdamWConfig{}, 1e-3f, 1.0f, step);
    ASSERT_TRUE(cpu->Update(h).ok());
    ASSERT_TRUE((*gpu)->Update(h).ok());
    ASSERT_TRUE(cpu->GatherParams().ok());
    ASSERT_TRUE((*gpu)->GatherParams().ok());
  }
  std::vector<float> pc, pg;
  ASSERT_TRUE(cpu->FullMasterParams(&pc).ok());
  ASSERT_TRUE((*gpu)->FullMasterParams(&pg).ok());
  ASSERT_EQ(pc.size(), pg.size());
  double max_diff = 0;
  for (size_t i = 0; i < pc.size(); ++i) {
    max_diff = std::max<double>(max_diff, std::fabs(pc[i] - pg[i]));
  }
  EXPECT_LT(max_diff, 5e-3);
}

}  // namespace
}  // namespace trainer
}  // namespace gradsnap
