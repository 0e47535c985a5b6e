// The CPU model's backward pass against central finite differences of its forward pass.
#include "trainer/cpu_gpt.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "common/thread_pool.h"
#include "gtest/gtest.h"
#include "trainer/backend.h"

namespace gradsnap {
namespace trainer {
namespace {

ModelConfig Micro() {
  ModelConfig c;
  c.name = "micro";
  c.max_seq_len = 8;
  c.num_layers = 2;
  c.num_heads = 2;
  c.channels = 16;
  return c;
}

TEST(CpuGptTest, BackwardMatchesFiniteDifferences) {
  const ModelConfig c = Micro();
  const int B = 2, T = 8;
  CpuGpt model(c, B, T);
  const size_t n = model.layout().total();
  std::vector<float> params(n), grads(n, 0.0f);
  InitParams(c, 7, params.data());
  // Perturb LayerNorm weights and biases so their gradients are not trivially symmetric.
  for (size_t i = 0; i < n; ++i) params[i] += 0.01f * std::sin(static_cast<float>(i));
  std::vector<int32_t> in(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) {
    in[i] = (i * 37 + 11) % 256;
    tgt[i] = (i * 53 + 5) % 256;
  }
  const float dloss = 1.0f / (B * T);
  const double loss = model.ForwardBackward(params.data(), grads.data(), in.data(), tgt.data(),
                                            dloss) * dloss;
  EXPECT_NEAR(loss, std::log(256.0), 0.5);  // near-uniform predictions at init

  int checked = 0;
  for (const ParamTensor& t : model.layout().tensors()) {
    // The three elements of each tensor with the largest gradient.
    std::vector<size_t> idx(t.numel);
    std::iota(idx.begin(), idx.end(), t.offset);
    std::partial_sort(idx.begin(), idx.begin() + 3, idx.end(), [&](size_t a, size_t b) {
      return std::fabs(grads[a]) > std::fabs(grads[b]);
    });
    for (int k = 0; k < 3; ++k) {
      const size_t i = idx[k];
      const float eps = 1e-2f, saved = params[i];
      params[i] = saved + eps;
      const double up = model.Forward(params.data(), in.data(), tgt.data()) * dloss;
      params[i] = saved - eps;
      const double down = model.Forward(params.data(), in.data(), tgt.data()) * dloss;
      params[i] = saved;
      const double fd = (up - down) / (2.0 * eps);
      EXPECT_NEAR(fd, grads[i], 2e-2 * std::fabs(grads[i]) + 2e-4)
          << t.name << " element " << (i - t.offset);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 48);
}

TEST(CpuGptTest, ForwardIsDeterministic) {
  const ModelConfig c = Micro();
  CpuGpt a(c, 1, 8), b(c, 1, 8);
  std::vector<float> params(a.layout().total());
  InitParams(c, 1, params.data());
  std::vector<int32_t> in(8, 65), tgt(8, 66);
  EXPECT_EQ(a.Forward(params.data(), in.data(), tgt.data()),
            b.Forward(params.data(), in.data(), tgt.data()));
}

// The layers split their work over the pool so that every output element is computed by one
// thread in one order (cpu_layers.h): the gradients and the loss are the same bits with no pool
// and with 1, 2 or 3 threads. The shape is large enough for every layer to use the workers.
TEST(CpuGptTest, GradientsAreTheSameBitsOnAnyThreadCount) {
  ModelConfig c = Micro();
  c.max_seq_len = 32;
  c.channels = 64;
  const int B = 4, T = 32;
  std::vector<int32_t> in(B * T), tgt(B * T);
  for (int i = 0; i < B * T; ++i) {
    in[i] = (i * 37 + 11) % 256;
    tgt[i] = (i * 53 + 5) % 256;
  }
  auto run = [&](int threads, double* loss) {
    std::unique_ptr<ThreadPool> pool;
    if (threads > 0) pool = std::make_unique<ThreadPool>(threads);
    CpuGpt model(c, B, T, pool.get());
    const size_t n = model.layout().total();
    std::vector<float> params(n), grads(n, 0.0f);
    InitParams(c, 3, params.data());
    for (size_t i = 0; i < n; ++i) params[i] += 0.01f * std::sin(static_cast<float>(i));
    *loss = model.ForwardBackward(params.data(), grads.data(), in.data(), tgt.data(),
                                  1.0f / (B * T));
    return grads;
  };
  double loss0 = 0;
  const std::vector<float> g0 = run(0, &loss0);
  for (int threads : {1, 2, 3}) {
    double loss = 0;
    const std::vector<float> g = run(threads, &loss);
    EXPECT_EQ(std::memcmp(&loss, &loss0, sizeof(loss)), 0) << threads << " threads";
    ASSERT_EQ(g.size(), g0.size());
    size_t differ = 0;
    for (size_t i = 0; i < g.size(); ++i) differ += std::memcmp(&g[i], &g0[i], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << threads << " threads: " << differ << " gradient elements differ";
  }
}

TEST(ModelConfigTest, NamedConfigsAndSlices) {
  ASSERT_TRUE(ModelConfigByName("tiny").ok());
  EXPECT_LT(ParamLayout(*ModelConfigByName("tiny")).total(), 1000000u);
  const size_t small = ParamLayout(*ModelConfigByName("small")).total();
  EXPECT_GT(small, 8000000u);
  EXPECT_LT(small, 13000000u);
  // GPT-2 small's architecture; the byte vocabulary makes it 86.0M rather than 124M parameters.
  EXPECT_EQ(ParamLayout(*ModelConfigByName("gpt2-124m")).total(), 86039040u);
  EXPECT_TRUE(absl::IsInvalidArgument(ModelConfigByName("gpt5").status()));
  size_t covered = 0;
  for (int r = 0; r < 3; ++r) {
    const RankSlice s = SliceOfRank(10, r, 3);
    EXPECT_EQ(s.lo, covered);
    covered = s.hi;
  }
  EXPECT_EQ(covered, 10u);
}

}  // namespace
}  // namespace trainer
}  // namespace gradsnap
