// AdamW (gpu_snapshot/adamw.h, as the trainer calls it) against a straightforward reference,
// the LR schedule, and the replicated-state encoding.
#include <cmath>
#include <cstring>
#include <vector>

#include "gpu_snapshot/adamw.h"
#include "gtest/gtest.h"
#include "trainer/data.h"
#include "trainer/train_state.h"

namespace gradsnap {
namespace trainer {
namespace {

// Textbook AdamW with decoupled weight decay, in double, t steps from zero moments.
void ReferenceAdamW(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
                    const std::vector<double>& g, double lr, double scale, int t,
                    const AdamWConfig& c) {
  for (size_t i = 0; i < p.size(); ++i) {
    const double gi = g[i] * scale;
    m[i] = c.beta1 * m[i] + (1 - c.beta1) * gi;
    v[i] = c.beta2 * v[i] + (1 - c.beta2) * gi * gi;
    const double mhat = m[i] / (1 - std::pow(c.beta1, t));
    const double vhat = v[i] / (1 - std::pow(c.beta2, t));
    p[i] -= lr * (mhat / (std::sqrt(vhat) + c.eps) + c.weight_decay * p[i]);
  }
}

TEST(AdamWTest, HostUpdateMatchesReference) {
  const AdamWConfig c;
  const size_t n = 1000;
  std::vector<float> p(n), m(n, 0), v(n, 0);
  std::vector<double> pd(n), md(n, 0), vd(n, 0);
  for (size_t i = 0; i < n; ++i) pd[i] = p[i] = 0.05f * std::sin(0.37f * i);
  for (int t = 1; t <= 20; ++t) {
    std::vector<float> g(n);
    std::vector<double> gd(n);
    for (size_t i = 0; i < n; ++i) gd[i] = g[i] = 0.01f * std::cos(0.11f * i * t);
    const float lr = 1e-3f * t, scale = t % 3 == 0 ? 0.5f : 1.0f;
    AdamWUpdateHost(p.data(), m.data(), v.data(), g.data(), n,
                    MakeAdamWStepParams(c, lr, scale, t));
    ReferenceAdamW(pd, md, vd, gd, lr, scale, t, c);
  }
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(p[i], pd[i], 1e-5 * std::fabs(pd[i]) + 1e-7) << i;
    ASSERT_NEAR(m[i], md[i], 1e-5 * std::fabs(md[i]) + 1e-9) << i;
  }
}

TEST(AdamWTest, Bf16GradientsWidenExactly) {
  const AdamWConfig c;
  std::vector<float> p1(64, 0.1f), m1(64, 0), v1(64, 0), p2 = p1, m2 = m1, v2 = v1;
  std::vector<uint16_t> gb(64);
  std::vector<float> gf(64);
  for (int i = 0; i < 64; ++i) {
    gb[i] = FloatToBf16(0.001f * (i - 32));
    gf[i] = Bf16ToFloat(gb[i]);
  }
  const AdamWStepParams h = MakeAdamWStepParams(c, 1e-3f, 1.0f, 1);
  AdamWUpdateHost(p1.data(), m1.data(), v1.data(), gf.data(), 64, h);
  AdamWUpdateHostBf16(p2.data(), m2.data(), v2.data(), gb.data(), 64, h);
  EXPECT_EQ(0, std::memcmp(p1.data(), p2.data(), 64 * sizeof(float)));
}

TEST(LearningRateTest, WarmupThenCosine) {
  ReplicatedState s;
  s.max_lr = 1.0f;
  s.min_lr = 0.1f;
  s.warmup_steps = 10;
  s.total_steps = 110;
  EXPECT_FLOAT_EQ(LearningRate(s, 1), 0.1f);
  EXPECT_FLOAT_EQ(LearningRate(s, 10), 1.0f);
  EXPECT_NEAR(LearningRate(s, 60), 0.55f, 1e-6);
  EXPECT_FLOAT_EQ(LearningRate(s, 110), 0.1f);
  EXPECT_FLOAT_EQ(LearningRate(s, 500), 0.1f);
  for (int64_t t = 11; t < 110; ++t) EXPECT_LE(LearningRate(s, t + 1), LearningRate(s, t));
}

TEST(ReplicatedStateTest, RoundTripsExactly) {
  ReplicatedState s;
  s.step = 42;
  s.opt_t = 41;
  s.skipped_steps = 1;
  s.seed = 0xfeedbeefcafeull;
  s.loader = {SplitMix64(3), 42};
  s.max_lr = 3e-4f;
  s.min_lr = 1.234567e-5f;
  s.warmup_steps = 7;
  s.total_steps = 1000;
  s.grad_clip = 1.0f;
  s.adamw.eps = 1e-8f;
  s.model_config = "name=tiny vocab=256 seq=32 layers=2 heads=2 channels=64";
  s.world_size = 4;
  s.global_batch = 16;
  s.seq_len = 32;
  s.data_fingerprint = "123:abc";
  auto back = ReplicatedState::Parse(s.Serialize());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->Serialize(), s.Serialize());
  EXPECT_EQ(back->min_lr, s.min_lr);
  EXPECT_EQ(back->loader.seed, s.loader.seed);
  EXPECT_EQ(back->model_config, s.model_config);
  EXPECT_TRUE(absl::IsDataLoss(ReplicatedState::Parse("garbage").status()));
  std::string cut = s.Serialize();
  cut.resize(cut.size() / 2);
  EXPECT_FALSE(ReplicatedState::Parse(cut).ok());
}

}  // namespace
}  // namespace trainer
}  // namespace gradsnap
