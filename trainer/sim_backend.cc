// The simulated-device back end; see sim_backend.h.
#include "trainer/sim_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/deadline_wait.h"
#include "common/status.h"
#include "gpu_snapshot/adamw.h"
#include "trainer/cpu_gpt.h"

namespace gradsnap {
namespace trainer {
namespace {

using gpu_snapshot::SimGpu;
using gpu_snapshot::SimStream;
using Range = SimStream::Range;

class SimBackend : public Backend {
 public:
  SimBackend(const ModelConfig& config, int B, int T, Comm* comm, SimGpu* gpu,
             std::chrono::milliseconds collective_timeout)
      : model_(config, B, T),
        bt_(static_cast<size_t>(B) * T),
        comm_(comm),
        gpu_(gpu),
        timeout_(comm->world_size() > 1 ? collective_timeout : std::chrono::milliseconds(0)) {
    total_ = model_.layout().total();
    slice_ = SliceOfRank(total_, comm->rank(), comm->world_size());
  }
  ~SimBackend() override {
    if (stream_ != nullptr) {
      // A failed rank may leave a collective with a frozen peer queued: bounded too.
      (void)WaitStream("the device's remaining work");
      stream_.reset();
    }
    for (float* p : {params_, compute_, grads_, m_, v_}) gpu_->Free(p);
    for (uint16_t* p : {params_bf16_, gslice_bf16_}) gpu_->Free(p);
  }

  absl::Status Init() {
    gpu_snapshot::SetCurrentSimGpu(gpu_);  // like cudaSetDevice on the training thread
    stream_ = gpu_->NewStream();
    ASSIGN_OR_RETURN(params_, Alloc(total_));
    ASSIGN_OR_RETURN(compute_, Alloc(total_));
    ASSIGN_OR_RETURN(params_bf16_, Alloc<uint16_t>(total_));
    ASSIGN_OR_RETURN(grads_, Alloc(total_));
    ASSIGN_OR_RETURN(gslice_bf16_, Alloc<uint16_t>(slice_.size()));
    ASSIGN_OR_RETURN(m_, Alloc(slice_.size()));
    ASSIGN_OR_RETURN(v_, Alloc(slice_.size()));
    return absl::OkStatus();
  }

  TrainStateView View() override {
    TrainStateView v = SliceStateView(*comm_, total_, slice_, params_ + slice_.lo, m_, v_);
    v.on_device = true;
    v.stream = stream_.get();
    v.device = DeviceKind::kSim;
    v.device_ordinal = gpu_->ordinal();
    return v;
  }

  absl::Status SetParams(const float* host) override {
    RETURN_IF_ERROR(WaitStream("the device's work"));
    std::memcpy(params_, host, total_ * sizeof(float));
    ToBf16(params_, params_bf16_, total_);
    std::memset(m_, 0, slice_.size() * sizeof(float));
    std::memset(v_, 0, slice_.size() * sizeof(float));
    return absl::OkStatus();
  }

  absl::Status SliceToHost(float* master, float* m, float* v) override {
    RETURN_IF_ERROR(WaitStream("the device's work"));
    const size_t bytes = slice_.size() * sizeof(float);
    std::memcpy(master, params_ + slice_.lo, bytes);
    std::memcpy(m, m_, bytes);
    std::memcpy(v, v_, bytes);
    return absl::OkStatus();
  }

  absl::Status SliceFromHost(const float* master, const float* m, const float* v) override {
    RETURN_IF_ERROR(WaitStream("the device's work"));
    const size_t bytes = slice_.size() * sizeof(float);
    std::memcpy(params_ + slice_.lo, master, bytes);
    std::memcpy(m_, m, bytes);
    std::memcpy(v_, v, bytes);
    ToBf16(params_ + slice_.lo, params_bf16_ + slice_.lo, slice_.size());
    RETURN_IF_ERROR(GatherParams());  // the other ranks' slices and their compute copy
    return WaitStream("the parameter all-gather");
  }

  absl::Status ForwardBackward(const int32_t* inputs, const int32_t* targets,
                               float dloss) override {
    auto in = std::make_shared<std::vector<int32_t>>(inputs, inputs + bt_);
    auto tg = std::make_shared<std::vector<int32_t>>(targets, targets + bt_);
    return stream_->Launch(
        [this, in, tg, dloss] {
          // The CPU kernels compute in fp32 from the bf16 compute copy's values.
          for (size_t i = 0; i < total_; ++i) {
            compute_[i] = Bf16ToFloat(params_bf16_[i]);
          }
          std::memset(grads_, 0, total_ * sizeof(float));
          loss_sum_ = model_.ForwardBackward(compute_, grads_, in->data(), tg->data(), dloss);
          return absl::OkStatus();
        },
        {Range{grads_, total_ * sizeof(float)}, Range{compute_, total_ * sizeof(float)}});
  }

  absl::StatusOr<Sums> ReduceGrads() override {
    RETURN_IF_ERROR(stream_->Launch(
        [this]() -> absl::Status {
          RETURN_IF_ERROR(comm_->ReduceScatter(grads_, total_));
          // The bf16 gradient slice the optimizer, the norm and the snapshot engine read.
          ToBf16(grads_ + slice_.lo, gslice_bf16_, slice_.size());
          double sq = 0.0;
          for (size_t i = 0; i < slice_.size(); ++i) {
            const double g = Bf16ToFloat(gslice_bf16_[i]);
            sq += g * g;
          }
          grad_sq_ = sq;
          return absl::OkStatus();
        },
        {Range{grads_, total_ * sizeof(float)},
         Range{gslice_bf16_, slice_.size() * sizeof(uint16_t)}}));
    // The step's one wait for the device: the sums feed the loss print and the clip.
    RETURN_IF_ERROR(WaitStream("the gradient reduce-scatter"));
    return Sums{loss_sum_, grad_sq_};
  }

  bool ReduceOverwritesGrads() const override { return true; }

  double StalledMillis(double elapsed_ms) override {
    return std::min(elapsed_ms, static_cast<double>(stream_->IdleNanos()) * 1e-6);
  }

  GradSliceView Grads() override {
    GradSliceView g = SliceGradView(slice_, gslice_bf16_, DType::kBF16);
    g.on_device = true;
    return g;
  }

  absl::Status UpdateRange(const AdamWStepParams& p, size_t begin, size_t end) override {
    if (begin >= end) return absl::OkStatus();
    const size_t n = end - begin, bytes = n * sizeof(float);
    float* param = params_ + slice_.lo + begin;
    uint16_t* param_bf16 = params_bf16_ + slice_.lo + begin;
    float* m = m_ + begin;
    float* v = v_ + begin;
    const uint16_t* g = gslice_bf16_ + begin;
    // Declares exactly the range it writes: a block copy still reading the rest of the slice
    // is not disturbed (poison, late copies).
    return stream_->Launch(
        [=] {
          AdamWUpdateHostBf16(param, m, v, g, n, p);
          ToBf16(param, param_bf16, n);
          return absl::OkStatus();
        },
        {Range{param, bytes}, Range{m, bytes}, Range{v, bytes},
         Range{param_bf16, n * sizeof(uint16_t)}});
  }

  absl::Status GatherParams() override {
    if (comm_->world_size() == 1) return absl::OkStatus();
    // Writes the other ranks' slices (and their compute copy); this rank's slice keeps its
    // bytes.
    std::vector<Range> writes;
    if (slice_.lo > 0) {
      writes.push_back(Range{params_, slice_.lo * sizeof(float)});
      writes.push_back(Range{params_bf16_, slice_.lo * sizeof(uint16_t)});
    }
    if (slice_.hi < total_) {
      writes.push_back(Range{params_ + slice_.hi, (total_ - slice_.hi) * sizeof(float)});
      writes.push_back(Range{params_bf16_ + slice_.hi, (total_ - slice_.hi) * sizeof(uint16_t)});
    }
    return stream_->Launch(
        [this]() -> absl::Status {
          RETURN_IF_ERROR(comm_->AllGather(params_, total_));
          ToBf16(params_, params_bf16_, slice_.lo);
          ToBf16(params_ + slice_.hi, params_bf16_ + slice_.hi, total_ - slice_.hi);
          return absl::OkStatus();
        },
        std::move(writes));
  }

  std::string AbortCollectives() override {
    comm_->Abort();
    return "the device's collective group";
  }

  absl::Status FullMasterParams(std::vector<float>* out) override {
    RETURN_IF_ERROR(WaitStream("the parameter all-gather"));
    out->assign(params_, params_ + total_);
    return absl::OkStatus();
  }

 private:
  // Waits for the kernels launched so far, as the CUDA back end waits for NCCL: polling the
  // stream's event with the collective deadline, aborting the device's group when it passes (a
  // frozen peer), so the stuck kernel fails and the stream drains.
  absl::Status WaitStream(absl::string_view what) {
    const uint64_t seq = stream_->Record();
    if (timeout_.count() <= 0) return stream_->Wait(seq);  // one rank: no collectives
    const std::string where = absl::StrCat(what, " on sim:", gpu_->ordinal());
    RETURN_IF_ERROR(WaitWithDeadline(
        {where, timeout_, "the device's collective group"},
        [&]() -> absl::StatusOr<bool> { return stream_->Reached(seq); },
        [&] { comm_->Abort(); }));
    return stream_->Wait(seq);
  }

  // Device memory for n elements of T (float, or uint16_t holding bf16).
  template <typename T = float>
  absl::StatusOr<T*> Alloc(size_t n) {
    ASSIGN_OR_RETURN(void* p, gpu_->Malloc(n * sizeof(T)));
    return static_cast<T*>(p);
  }
  static void ToBf16(const float* in, uint16_t* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = FloatToBf16(in[i]);
  }

  CpuGpt model_;  // used on the stream's thread only
  const size_t bt_;  // tokens per ForwardBackward
  Comm* comm_;    // by kernels (Abort: by the training thread at a deadline)
  SimGpu* const gpu_;
  const std::chrono::milliseconds timeout_;  // of a wait for the stream; 0: none (one rank)
  size_t total_ = 0;
  RankSlice slice_;
  std::unique_ptr<SimStream> stream_;
  // As on CUDA: the fp32 master weights (this rank's slice of params_; params_ holds every
  // rank's, gathered), the bf16 compute copy of all parameters, fp32 gradients accumulated by
  // backward and the bf16 reduced gradient slice that the norm, the optimizer and the snapshot
  // engine read; compute_ holds the compute copy's values in fp32 for the CPU kernels.
  float *params_ = nullptr, *compute_ = nullptr, *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr;
  uint16_t *params_bf16_ = nullptr, *gslice_bf16_ = nullptr;
  double loss_sum_ = 0, grad_sq_ = 0;  // written by kernels, read after a Synchronize
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> NewSimBackend(
    const ModelConfig& config, int local_batch, int seq_len, Comm* comm, int device_ordinal,
    const gpu_snapshot::SimOptions& sim, std::chrono::milliseconds collective_timeout) {
  ASSIGN_OR_RETURN(SimGpu* gpu, SimGpu::Open(device_ordinal, sim));
  auto b = std::make_unique<SimBackend>(config, local_batch, seq_len, comm, gpu,
                                        collective_timeout);
  RETURN_IF_ERROR(b->Init());
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace trainer
}  // namespace gradsnap
