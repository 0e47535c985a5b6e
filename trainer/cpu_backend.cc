// The CPU back end: fp32 everywhere; the rank's master weights are its slice of the full
// parameter buffer. See backend.h.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/status.h"
#include "common/thread_pool.h"
#include "trainer/backend.h"
#include "trainer/cpu_gpt.h"
#include "trainer/data.h"

namespace gradsnap {
namespace trainer {
namespace {

// The sum of squares of g[0, n) in double: blocks of kNormBlock elements, each summed in order
// on one thread, then the block sums in block order; the same bits with any thread count.
constexpr size_t kNormBlock = 16384;
double SumOfSquares(const float* g, size_t n, ThreadPool* pool) {
  std::vector<double> block((n + kNormBlock - 1) / kNormBlock, 0.0);
  pool->ParallelFor(block.size(), [&](size_t lo, size_t hi) {
    for (size_t k = lo; k < hi; ++k) {
      double sq = 0.0;
      for (size_t i = k * kNormBlock, end = std::min(n, i + kNormBlock); i < end; ++i) {
        sq += static_cast<double>(g[i]) * g[i];
      }
      block[k] = sq;
    }
  });
  double sq = 0.0;
  for (double b : block) sq += b;
  return sq;
}

class CpuBackend : public Backend {
 public:
  CpuBackend(const ModelConfig& config, int local_batch, int seq_len, Comm* comm, int threads)
      : pool_(threads), model_(config, local_batch, seq_len, &pool_), comm_(comm) {
    const size_t total = model_.layout().total();
    slice_ = SliceOfRank(total, comm->rank(), comm->world_size());
    params_.assign(total, 0.0f);
    grads_.assign(total, 0.0f);
    m_.assign(slice_.size(), 0.0f);
    v_.assign(slice_.size(), 0.0f);
  }

  TrainStateView View() override {
    return SliceStateView(*comm_, params_.size(), slice_, params_.data() + slice_.lo, m_.data(),
                          v_.data());
  }

  absl::Status SetParams(const float* host) override {
    std::memcpy(params_.data(), host, params_.size() * sizeof(float));
    std::fill(m_.begin(), m_.end(), 0.0f);
    std::fill(v_.begin(), v_.end(), 0.0f);
    return absl::OkStatus();
  }

  absl::Status SliceToHost(float* master, float* m, float* v) override {
    const size_t bytes = slice_.size() * sizeof(float);
    std::memcpy(master, params_.data() + slice_.lo, bytes);
    std::memcpy(m, m_.data(), bytes);
    std::memcpy(v, v_.data(), bytes);
    return absl::OkStatus();
  }

  absl::Status SliceFromHost(const float* master, const float* m, const float* v) override {
    const size_t bytes = slice_.size() * sizeof(float);
    std::memcpy(params_.data() + slice_.lo, master, bytes);
    std::memcpy(m_.data(), m, bytes);
    std::memcpy(v_.data(), v, bytes);
    return comm_->AllGather(params_.data(), params_.size());
  }

  absl::Status ForwardBackward(const int32_t* inputs, const int32_t* targets,
                               float dloss) override {
    pool_.ParallelFor(grads_.size(), [this](size_t lo, size_t hi) {
      std::fill(grads_.begin() + lo, grads_.begin() + hi, 0.0f);
    }, /*min_n=*/64 * 1024);
    loss_sum_ = model_.ForwardBackward(params_.data(), grads_.data(), inputs, targets, dloss);
    return absl::OkStatus();
  }

  absl::StatusOr<Sums> ReduceGrads() override {
    RETURN_IF_ERROR(comm_->ReduceScatter(grads_.data(), grads_.size()));
    return Sums{loss_sum_, SumOfSquares(grads_.data() + slice_.lo, slice_.size(), &pool_)};
  }

  bool ReduceOverwritesGrads() const override { return false; }

  GradSliceView Grads() override {
    return SliceGradView(slice_, grads_.data() + slice_.lo, DType::kF32);
  }

  absl::Status UpdateRange(const AdamWStepParams& p, size_t begin, size_t end) override {
    // One pass over params, m, v and the gradient (AdamWElement), split by element.
    float* param = params_.data() + slice_.lo + begin;
    const float* grad = grads_.data() + slice_.lo + begin;
    float* m = m_.data() + begin;
    float* v = v_.data() + begin;
    pool_.ParallelFor(end - begin, [&](size_t lo, size_t hi) {
      AdamWUpdateHost(param + lo, m + lo, v + lo, grad + lo, hi - lo, p);
    }, /*min_n=*/64 * 1024);
    return absl::OkStatus();
  }

  absl::Status GatherParams() override {
    return comm_->AllGather(params_.data(), params_.size());
  }

  absl::Status FullMasterParams(std::vector<float>* out) override {
    *out = params_;
    return absl::OkStatus();
  }

 private:
  ThreadPool pool_;
  CpuGpt model_;
  Comm* comm_;
  RankSlice slice_;
  std::vector<float> params_, grads_, m_, v_;
  double loss_sum_ = 0;
};

// Box-Muller over SplitMix64, in double: the same numbers on every host.
double Normal(uint64_t seed, uint64_t i) {
  const double u1 = (static_cast<double>(SplitMix64(seed ^ (2 * i)) >> 11) + 1.0) * 0x1.0p-53;
  const double u2 = static_cast<double>(SplitMix64(seed ^ (2 * i + 1)) >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace

std::unique_ptr<Backend> NewCpuBackend(const ModelConfig& config, int local_batch, int seq_len,
                                       Comm* comm, int threads) {
  return std::make_unique<CpuBackend>(config, local_batch, seq_len, comm, threads);
}

void InitParams(const ModelConfig& config, uint64_t seed, float* params) {
  const ParamLayout layout(config);
  const double resid_std = 0.02 / std::sqrt(2.0 * config.num_layers);
  const uint64_t s = SplitMix64(seed ^ 0x5eedull);
  for (const ParamTensor& t : layout.tensors()) {
    float* p = params + t.offset;
    const bool layernorm_w = t.name == "ln1w" || t.name == "ln2w" || t.name == "lnfw";
    const bool bias = t.shape.size() <= 2 && t.name != "wte" && t.name != "wpe" && !layernorm_w;
    const bool resid = t.name == "attprojw" || t.name == "fcprojw";
    for (size_t i = 0; i < t.numel; ++i) {
      if (layernorm_w) {
        p[i] = 1.0f;
      } else if (bias) {
        p[i] = 0.0f;
      } else {
        p[i] = static_cast<float>(Normal(s, t.offset + i) * (resid ? resid_std : 0.02));
      }
    }
  }
}

}  // namespace trainer
}  // namespace gradsnap
