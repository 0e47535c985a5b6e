// The CUDA back end (backend.h): bf16 compute with fp32 master weights and bf16 gradients.
//
// Device buffers: the bf16 compute copy of all parameters; this rank's fp32 master slice and
// AdamW moments; fp32 weight gradients accumulated by backward, then cast to the bf16 gradient
// buffer that the reduce-scatter and the optimizer read (so the optimizer, and a checkpointer's
// gradient log, see bf16 gradients). ZeRO-1 collectives are NCCL reduce/broadcast per slice
// (slices may differ in length by one element). Everything runs on one stream, stream_.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/deadline_wait.h"
#include "common/status.h"
#include "trainer/backend.h"
#include "trainer/cuda_layers.h"
#include "trainer/cuda_testing.h"
#include "trainer/cuda_util.h"
#include "trainer/layer_activations.h"

#if defined(GRADSNAP_HAVE_NCCL)
#include <nccl.h>
#endif

namespace gradsnap {
namespace trainer {
namespace {

using cuda::bf16;

#if defined(GRADSNAP_HAVE_NCCL)
#define NCCL_RETURN(expr)                                                                \
  do {                                                                                   \
    ncclResult_t r_ = (expr);                                                            \
    if (r_ != ncclSuccess) {                                                             \
      return absl::UnavailableError(absl::StrCat("NCCL error at ", __FILE__, ":",        \
                                                 __LINE__, ": ", ncclGetErrorString(r_))); \
    }                                                                                    \
  } while (0)
#endif


// Waits for `event` by polling cudaEventQuery with the deadline of `wait`; calls `abort` (the
// NCCL communicator's) when it passes. A CUDA error of the work is returned as such. Without a
// deadline (one rank), cudaEventSynchronize.
absl::Status WaitForCudaEvent(cudaEvent_t event, const DeadlineWait& wait,
                              absl::FunctionRef<void()> abort) {
  if (wait.timeout.count() <= 0) return GS_CUDA_STATUS(cudaEventSynchronize(event));
  return WaitWithDeadline(
      wait,
      [event]() -> absl::StatusOr<bool> {
        const cudaError_t r = cudaEventQuery(event);
        if (r == cudaErrorNotReady) return false;
        CUDA_RETURN_IF_ERROR(r);
        return true;
      },
      abort);
}

enum TensorIndex { kWte, kWpe, kLn1w, kLn1b, kQkvw, kQkvb, kAttprojw, kAttprojb,
                   kLn2w, kLn2b, kFcw, kFcb, kFcprojw, kFcprojb, kLnfw, kLnfb };

class CudaBackend : public Backend {
 public:
  CudaBackend(const ModelConfig& config, int B, int T, Comm* comm,
              std::chrono::milliseconds collective_timeout)
      : config_(config),
        layout_(config),
        B_(B),
        T_(T),
        comm_(comm),
        timeout_(comm->world_size() > 1 ? collective_timeout : std::chrono::milliseconds(0)) {
    slice_ = SliceOfRank(layout_.total(), comm->rank(), comm->world_size());
  }
  ~CudaBackend() override {
    // A failed rank may leave NCCL work with a frozen peer queued, which ncclCommDestroy would
    // wait for: bounded (and aborted) too.
    if (stream_ != nullptr && work_done_ != nullptr) {
      (void)WaitStream("the device's remaining work");
    }
#if defined(GRADSNAP_HAVE_NCCL)
    if (nccl_ != nullptr) ncclCommDestroy(nccl_);
#endif
    if (cublas_ != nullptr) cublasDestroy(cublas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (sums_ready_ != nullptr) cudaEventDestroy(sums_ready_);
    if (work_done_ != nullptr) cudaEventDestroy(work_done_);
    if (host_sums_ != nullptr) cudaFreeHost(host_sums_);
    if (host_losses_ != nullptr) cudaFreeHost(host_losses_);
  }

  absl::Status Init(int device_ordinal) {
    RETURN_IF_ERROR(gpu_snapshot::CheckCudaOrdinal(device_ordinal));
    device_ = device_ordinal;
    // The training thread's current device for the whole run (every launch, cuBLAS and NCCL
    // call of this back end; the snapshot engine's calls restore it).
    CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream_));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&sums_ready_, cudaEventDisableTiming));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&work_done_, cudaEventDisableTiming));
    CUDA_RETURN_IF_ERROR(cudaMallocHost(&host_sums_, (cuda::kNormBlocks + 1) * sizeof(double)));
    CUDA_RETURN_IF_ERROR(
        cudaMallocHost(&host_losses_, static_cast<size_t>(B_) * T_ * sizeof(float)));
    CUBLAS_RETURN(cublasCreate(&cublas_));
    CUBLAS_RETURN(cublasSetStream(cublas_, stream_));
    RETURN_IF_ERROR(InitNccl());
    const size_t L = config_.num_layers, C = config_.channels, V = config_.vocab_size;
    const size_t NH = config_.num_heads, BT = static_cast<size_t>(B_) * T_;
    const size_t att = static_cast<size_t>(B_) * NH * T_ * T_, total = layout_.total();
    RETURN_IF_ERROR(params_bf16_.Alloc(total));
    RETURN_IF_ERROR(grads_.Alloc(total));
    RETURN_IF_ERROR(grads_bf16_.Alloc(total));
    RETURN_IF_ERROR(master_.Alloc(slice_.size()));
    RETURN_IF_ERROR(m_.Alloc(slice_.size()));
    RETURN_IF_ERROR(v_.Alloc(slice_.size()));
    RETURN_IF_ERROR(partials_.Alloc(cuda::kNormBlocks));
    RETURN_IF_ERROR(inputs_.Alloc(BT));
    RETURN_IF_ERROR(targets_.Alloc(BT));
    for (auto* a : {&encoded_, &lnf_, &dres_, &dres_prev_, &dres2_, &dln_, &datty_, &dattproj_,
                    &dfcproj_}) {
      RETURN_IF_ERROR(a->Alloc(BT * C));
    }
    for (auto* a : {&ln1_, &atty_, &attproj_, &residual2_, &ln2_, &fcproj_, &residual3_}) {
      RETURN_IF_ERROR(a->Alloc(L * BT * C));
    }
    for (auto* a : {&ln1_mean_, &ln1_rstd_, &ln2_mean_, &ln2_rstd_}) {
      RETURN_IF_ERROR(a->Alloc(L * BT));
    }
    for (auto* a : {&lnf_mean_, &lnf_rstd_, &losses_}) RETURN_IF_ERROR(a->Alloc(BT));
    RETURN_IF_ERROR(qkv_.Alloc(L * BT * 3 * C));
    RETURN_IF_ERROR(preatt_.Alloc(L * att));
    RETURN_IF_ERROR(att_.Alloc(L * att));
    RETURN_IF_ERROR(fch_.Alloc(L * BT * 4 * C));
    RETURN_IF_ERROR(fch_gelu_.Alloc(L * BT * 4 * C));
    acts_ = {encoded_.get(), ln1_.get(),      ln1_mean_.get(), ln1_rstd_.get(), qkv_.get(),
             atty_.get(),    preatt_.get(),   att_.get(),      attproj_.get(),  residual2_.get(),
             ln2_.get(),     ln2_mean_.get(), ln2_rstd_.get(), fch_.get(),      fch_gelu_.get(),
             fcproj_.get(),  residual3_.get()};
    RETURN_IF_ERROR(logits_.Alloc(BT * V));
    RETURN_IF_ERROR(probs_.Alloc(BT * V));
    RETURN_IF_ERROR(dlogits_.Alloc(BT * V));
    RETURN_IF_ERROR(dqkv_.Alloc(BT * 3 * C));
    RETURN_IF_ERROR(dpreatt_.Alloc(att));
    RETURN_IF_ERROR(dfch_.Alloc(BT * 4 * C));
    RETURN_IF_ERROR(dfch_gelu_.Alloc(BT * 4 * C));
    const size_t scratch = BT * std::max<size_t>(4 * C, V);
    RETURN_IF_ERROR(scratch_a_.Alloc(scratch));
    return scratch_b_.Alloc(scratch);
  }

  TrainStateView View() override {
    TrainStateView v =
        SliceStateView(*comm_, layout_.total(), slice_, master_.get(), m_.get(), v_.get());
    v.on_device = true;
    v.stream = stream_;
    v.device = DeviceKind::kCuda;
    v.device_ordinal = device_;
    return v;
  }

  absl::Status SetParams(const float* host) override {
    DeviceArray<float> full;
    RETURN_IF_ERROR(full.Alloc(layout_.total()));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpy(full.get(), host, layout_.total() * 4, cudaMemcpyHostToDevice));
    cuda::FloatToBf16(stream_, params_bf16_.get(), full.get(), layout_.total());
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(master_.get(), full.get() + slice_.lo,
                                         slice_.size() * 4, cudaMemcpyDeviceToDevice, stream_));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(m_.get(), 0, slice_.size() * 4, stream_));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(v_.get(), 0, slice_.size() * 4, stream_));
    return WaitStream("the device's work");
  }

  absl::Status SliceToHost(float* master, float* m, float* v) override {
    const size_t bytes = slice_.size() * 4;
    RETURN_IF_ERROR(WaitStream("the device's work"));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(master, master_.get(), bytes, cudaMemcpyDeviceToHost));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(m, m_.get(), bytes, cudaMemcpyDeviceToHost));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(v, v_.get(), bytes, cudaMemcpyDeviceToHost));
    return absl::OkStatus();
  }

  absl::Status SliceFromHost(const float* master, const float* m, const float* v) override {
    const size_t bytes = slice_.size() * 4;
    CUDA_RETURN_IF_ERROR(cudaMemcpy(master_.get(), master, bytes, cudaMemcpyHostToDevice));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(m_.get(), m, bytes, cudaMemcpyHostToDevice));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(v_.get(), v, bytes, cudaMemcpyHostToDevice));
    cuda::FloatToBf16(stream_, params_bf16_.get() + slice_.lo, master_.get(), slice_.size());
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    RETURN_IF_ERROR(GatherParams());
    return WaitStream("the parameter broadcast");
  }

  // Enqueues the step's forward and backward; no wait (the losses come back with ReduceGrads).
  absl::Status ForwardBackward(const int32_t* inputs, const int32_t* targets,
                               float dloss) override {
    const size_t BT = static_cast<size_t>(B_) * T_;
    // From pageable memory: returns once the source was staged, so the caller may reuse it.
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(inputs_.get(), inputs, BT * 4, cudaMemcpyHostToDevice, stream_));
    CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(targets_.get(), targets, BT * 4, cudaMemcpyHostToDevice, stream_));
    CUDA_RETURN_IF_ERROR(cudaMemsetAsync(grads_.get(), 0, layout_.total() * 4, stream_));
    Forward();
    Backward(dloss);
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_losses_, losses_.get(), BT * 4,
                                         cudaMemcpyDeviceToHost, stream_));
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    CUDA_RETURN_IF_ERROR(cudaEventRecord(work_done_, stream_));
    return TakeLaunchStatus();
  }

  absl::StatusOr<Sums> ReduceGrads() override {
    cuda::FloatToBf16(stream_, grads_bf16_.get(), grads_.get(), layout_.total());
    if (comm_->world_size() > 1) {
#if defined(GRADSNAP_HAVE_NCCL)
      RETURN_IF_ERROR(EveryRankSlice(grads_bf16_.get(), [this](bf16* p, size_t n, int r) {
        return ncclReduce(p, p, n, ncclBfloat16, ncclSum, r, nccl_, stream_);
      }));
#endif
    }
    cuda::SquaredNormPartials(stream_, partials_.get(), grads_bf16_.get() + slice_.lo,
                              slice_.size());
    CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_sums_, partials_.get(),
                                         cuda::kNormBlocks * sizeof(double),
                                         cudaMemcpyDeviceToHost, stream_));
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    // The step's one wait for the device: the losses and the norm, for the loss print and the
    // clip coefficient. An event, not a stream synchronization; polled with the collective
    // deadline, since the NCCL reduction of a frozen peer never completes.
    CUDA_RETURN_IF_ERROR(cudaEventRecord(sums_ready_, stream_));
    RETURN_IF_ERROR(WaitEvent(sums_ready_, "the gradient reduction"));
    double sq = 0.0;
    for (int i = 0; i < cuda::kNormBlocks; ++i) sq += host_sums_[i];
    double loss = 0.0;
    for (size_t i = 0; i < static_cast<size_t>(B_) * T_; ++i) loss += host_losses_[i];
    return Sums{loss, sq};
  }

  bool ReduceOverwritesGrads() const override { return true; }

  double StalledMillis(double elapsed_ms) override {
    // Busy with the work enqueued before the hook: the hook stalled nothing. Idle: the moment it
    // went idle is not known here, so all of the hook counts (an upper bound).
    return work_done_ != nullptr && cudaEventQuery(work_done_) == cudaErrorNotReady ? 0.0
                                                                                    : elapsed_ms;
  }

  GradSliceView Grads() override {
    GradSliceView g = SliceGradView(slice_, grads_bf16_.get() + slice_.lo, DType::kBF16);
    g.on_device = true;
    return g;
  }

  absl::Status UpdateRange(const AdamWStepParams& p, size_t begin, size_t end) override {
    if (begin >= end) return absl::OkStatus();
    cuda::AdamWUpdate(stream_, master_.get() + begin, m_.get() + begin, v_.get() + begin,
                      reinterpret_cast<const uint16_t*>(grads_bf16_.get() + slice_.lo + begin),
                      reinterpret_cast<uint16_t*>(params_bf16_.get() + slice_.lo + begin),
                      end - begin, p);
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    CUDA_RETURN_IF_ERROR(cudaEventRecord(work_done_, stream_));
    return absl::OkStatus();
  }

  // Enqueued; no wait (the next step's work is ordered after it on the stream).
  absl::Status GatherParams() override {
    if (comm_->world_size() > 1) {
#if defined(GRADSNAP_HAVE_NCCL)
      RETURN_IF_ERROR(EveryRankSlice(params_bf16_.get(), [this](bf16* p, size_t n, int r) {
        return ncclBroadcast(p, p, n, ncclBfloat16, r, nccl_, stream_);
      }));
#endif
    }
    CUDA_RETURN_IF_ERROR(cudaGetLastError());
    CUDA_RETURN_IF_ERROR(cudaEventRecord(work_done_, stream_));
    return absl::OkStatus();
  }

  std::string AbortCollectives() override {
    AbortNccl();
    return "the NCCL communicator";
  }

  absl::Status FullMasterParams(std::vector<float>* out) override {
    out->assign(layout_.total(), 0.0f);
    RETURN_IF_ERROR(WaitStream("the parameter broadcast"));
    CUDA_RETURN_IF_ERROR(cudaMemcpy(out->data() + slice_.lo, master_.get(), slice_.size() * 4,
                                    cudaMemcpyDeviceToHost));
    return comm_->AllGather(out->data(), out->size());
  }

 private:
  // Host waits for device work that may hold an NCCL collective: the deadline (several ranks)
  // aborts the communicator when a peer never joins (common/deadline_wait.h).
  absl::Status WaitEvent(cudaEvent_t event, absl::string_view what) {
    const std::string where = absl::StrCat(what, " on cuda:", device_);
    return WaitForCudaEvent(event, {where, timeout_, "the NCCL communicator"},
                            [this] { AbortNccl(); });
  }
  absl::Status WaitStream(absl::string_view what) {
    CUDA_RETURN_IF_ERROR(cudaEventRecord(work_done_, stream_));
    return WaitEvent(work_done_, what);
  }
  // ncclCommAbort: the communicator's kernels stop and its resources go; later NCCL calls of
  // this back end fail (a null communicator).
  void AbortNccl() {
#if defined(GRADSNAP_HAVE_NCCL)
    if (nccl_ != nullptr) {
      (void)ncclCommAbort(nccl_);
      nccl_ = nullptr;
    }
#endif
  }

  absl::Status InitNccl() {
    if (comm_->world_size() == 1) return absl::OkStatus();
#if defined(GRADSNAP_HAVE_NCCL)
    ncclUniqueId id;
    if (comm_->rank() == 0) {
      NCCL_RETURN(ncclGetUniqueId(&id));
      for (int r = 1; r < comm_->world_size(); ++r) {
        RETURN_IF_ERROR(comm_->Send(r, 900, &id, sizeof(id)));
      }
    } else {
      RETURN_IF_ERROR(comm_->Recv(0, 900, &id, sizeof(id)));
    }
    NCCL_RETURN(ncclCommInitRank(&nccl_, comm_->world_size(), id, comm_->rank()));
    return absl::OkStatus();
#else
    return absl::UnimplementedError("--device cuda with several ranks needs NCCL in the build");
#endif
  }

#if defined(GRADSNAP_HAVE_NCCL)
  // One NCCL group of op(p, n, r) over every rank r's slice [p, p + n) of the flat buffer
  // `buf`. Every call of the group is checked, the group is always closed, and errors that NCCL
  // reports only asynchronously are polled after it.
  template <typename Op>
  absl::Status EveryRankSlice(bf16* buf, Op op) {
    NCCL_RETURN(ncclGroupStart());
    ncclResult_t first = ncclSuccess;
    for (int r = 0; r < comm_->world_size() && first == ncclSuccess; ++r) {
      const RankSlice s = SliceOfRank(layout_.total(), r, comm_->world_size());
      first = op(buf + s.lo, s.size(), r);
    }
    const ncclResult_t end = ncclGroupEnd();
    NCCL_RETURN(first);
    NCCL_RETURN(end);
    return NcclAsyncError();
  }

  absl::Status NcclAsyncError() {
    ncclResult_t async = ncclSuccess;
    NCCL_RETURN(ncclCommGetAsyncError(nccl_, &async));
    NCCL_RETURN(async);
    return absl::OkStatus();
  }
#endif

  // Launch errors of the void helpers (cuBLAS, cudaMemsetAsync), first one wins.
  void Blas(cublasStatus_t st) {
    launch_status_.Update(CublasStatus(st, "the forward/backward"));
  }
  absl::Status TakeLaunchStatus() { return std::exchange(launch_status_, absl::OkStatus()); }

  const bf16* P(int i) const { return params_bf16_.get() + layout_.tensors()[i].offset; }
  float* G(int i) { return grads_.get() + layout_.tensors()[i].offset; }

  void Forward() {
    const int B = B_, T = T_, C = config_.channels, NH = config_.num_heads;
    const int V = config_.vocab_size, BT = B * T;
    const size_t sC = static_cast<size_t>(BT) * C;
    const size_t sAtt = static_cast<size_t>(B) * NH * T * T;
    cudaStream_t s = stream_;
    cuda::EncoderForward(s, encoded_.get(), inputs_.get(), P(kWte), P(kWpe), B, T, C);
    for (int l = 0; l < config_.num_layers; ++l) {
      const LayerActivations a = acts_.Layer(l, BT, C, sAtt);
      cuda::LayerNormForward(s, a.ln1, a.ln1_mean, a.ln1_rstd, a.residual, P(kLn1w) + l * C,
                             P(kLn1b) + l * C, BT, C);
      Blas(cuda::MatmulForward(cublas_, s, a.qkv, a.ln1, P(kQkvw) + l * 3 * C * C,
                               P(kQkvb) + l * 3 * C, BT, C, 3 * C, scratch_a_.get()));
      cuda::AttentionForward(s, a.atty, a.preatt, a.att, a.qkv, B, T, C, NH);
      Blas(cuda::MatmulForward(cublas_, s, a.attproj, a.atty, P(kAttprojw) + l * C * C,
                               P(kAttprojb) + l * C, BT, C, C, scratch_a_.get()));
      cuda::ResidualForward(s, a.residual2, a.residual, a.attproj, BT * C);
      cuda::LayerNormForward(s, a.ln2, a.ln2_mean, a.ln2_rstd, a.residual2, P(kLn2w) + l * C,
                             P(kLn2b) + l * C, BT, C);
      Blas(cuda::MatmulForward(cublas_, s, a.fch, a.ln2, P(kFcw) + l * 4 * C * C,
                               P(kFcb) + l * 4 * C, BT, C, 4 * C, scratch_a_.get()));
      cuda::GeluForward(s, a.fch_gelu, a.fch, BT * 4 * C);
      Blas(cuda::MatmulForward(cublas_, s, a.fcproj, a.fch_gelu, P(kFcprojw) + l * 4 * C * C,
                               P(kFcprojb) + l * C, BT, 4 * C, C, scratch_a_.get()));
      cuda::ResidualForward(s, a.residual3, a.residual2, a.fcproj, BT * C);
    }
    const float* last = residual3_.get() + (config_.num_layers - 1) * sC;
    cuda::LayerNormForward(s, lnf_.get(), lnf_mean_.get(), lnf_rstd_.get(), last, P(kLnfw),
                           P(kLnfb), BT, C);
    Blas(cuda::MatmulForward(cublas_, s, logits_.get(), lnf_.get(), P(kWte), nullptr, BT, C, V,
                        scratch_a_.get()));
    cuda::SoftmaxCrossEntropyForward(s, probs_.get(), losses_.get(), logits_.get(),
                                     targets_.get(), BT, V);
  }

  void Zero(DeviceArray<float>& a) {
    launch_status_.Update(GS_CUDA_STATUS(cudaMemsetAsync(a.get(), 0, a.size() * 4, stream_)));
  }

  void Backward(float dloss) {
    const int B = B_, T = T_, C = config_.channels, NH = config_.num_heads;
    const int V = config_.vocab_size, BT = B * T, L = config_.num_layers;
    const size_t sC = static_cast<size_t>(BT) * C;
    const size_t sAtt = static_cast<size_t>(B) * NH * T * T;
    cudaStream_t s = stream_;
    bf16* sa = scratch_a_.get();
    bf16* sb = scratch_b_.get();
    Zero(dlogits_);
    Zero(dln_);
    Zero(dres_);
    cuda::CrossEntropySoftmaxBackward(s, dlogits_.get(), probs_.get(), targets_.get(), dloss, BT,
                                      V);
    Blas(cuda::MatmulBackward(cublas_, s, dln_.get(), G(kWte), nullptr, dlogits_.get(), lnf_.get(),
                         P(kWte), BT, C, V, sa, sb));
    const float* last = residual3_.get() + (L - 1) * sC;
    cuda::LayerNormBackward(s, dres_.get(), G(kLnfw), G(kLnfb), dln_.get(), last, P(kLnfw),
                            lnf_mean_.get(), lnf_rstd_.get(), BT, C);
    for (int l = L - 1; l >= 0; --l) {
      const LayerActivations a = acts_.Layer(l, BT, C, sAtt);
      for (auto* d : {&dres_prev_, &dres2_, &dln_, &dqkv_, &datty_, &dattproj_, &dfch_,
                      &dfch_gelu_, &dfcproj_}) {
        Zero(*d);
      }
      cuda::ResidualBackward(s, dres2_.get(), dfcproj_.get(), dres_.get(), BT * C);
      Blas(cuda::MatmulBackward(cublas_, s, dfch_gelu_.get(), G(kFcprojw) + l * 4 * C * C,
                           G(kFcprojb) + l * C, dfcproj_.get(), a.fch_gelu,
                           P(kFcprojw) + l * 4 * C * C, BT, 4 * C, C, sa, sb));
      cuda::GeluBackward(s, dfch_.get(), a.fch, dfch_gelu_.get(), BT * 4 * C);
      Blas(cuda::MatmulBackward(cublas_, s, dln_.get(), G(kFcw) + l * 4 * C * C, G(kFcb) + l * 4 * C,
                           dfch_.get(), a.ln2, P(kFcw) + l * 4 * C * C, BT, C,
                           4 * C, sa, sb));
      cuda::LayerNormBackward(s, dres2_.get(), G(kLn2w) + l * C, G(kLn2b) + l * C, dln_.get(),
                              a.residual2, P(kLn2w) + l * C,
                              a.ln2_mean, a.ln2_rstd, BT, C);
      cuda::ResidualBackward(s, dres_prev_.get(), dattproj_.get(), dres2_.get(), BT * C);
      Blas(cuda::MatmulBackward(cublas_, s, datty_.get(), G(kAttprojw) + l * C * C,
                           G(kAttprojb) + l * C, dattproj_.get(), a.atty,
                           P(kAttprojw) + l * C * C, BT, C, C, sa, sb));
      cuda::AttentionBackward(s, dqkv_.get(), dpreatt_.get(), datty_.get(),
                              a.qkv, a.att, B, T, C, NH);
      Zero(dln_);
      Blas(cuda::MatmulBackward(cublas_, s, dln_.get(), G(kQkvw) + l * 3 * C * C,
                           G(kQkvb) + l * 3 * C, dqkv_.get(), a.ln1,
                           P(kQkvw) + l * 3 * C * C, BT, C, 3 * C, sa, sb));
      cuda::LayerNormBackward(s, dres_prev_.get(), G(kLn1w) + l * C, G(kLn1b) + l * C,
                              dln_.get(), a.residual, P(kLn1w) + l * C, a.ln1_mean,
                              a.ln1_rstd, BT, C);
      dres_.Swap(dres_prev_);
    }
    cuda::EncoderBackward(s, G(kWte), G(kWpe), dres_.get(), inputs_.get(), B, T, C, V);
  }

  ModelConfig config_;
  ParamLayout layout_;
  int B_, T_;
  Comm* comm_;
  const std::chrono::milliseconds timeout_;  // of a wait for device work; 0: none (one rank)
  RankSlice slice_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t sums_ready_ = nullptr;
  cudaEvent_t work_done_ = nullptr;  // after the last work enqueued (stall accounting)
  double* host_sums_ = nullptr;    // pinned: the norm partials of the step
  float* host_losses_ = nullptr;   // pinned: the token losses of the step
  absl::Status launch_status_;
  cublasHandle_t cublas_ = nullptr;
#if defined(GRADSNAP_HAVE_NCCL)
  ncclComm_t nccl_ = nullptr;
#endif
  DeviceArray<bf16> params_bf16_, grads_bf16_, scratch_a_, scratch_b_;
  DeviceArray<float> grads_, master_, m_, v_;
  DeviceArray<double> partials_;
  DeviceArray<int32_t> inputs_, targets_;
  DeviceArray<float> encoded_, ln1_, ln1_mean_, ln1_rstd_, qkv_, atty_, preatt_, att_, attproj_,
      residual2_, ln2_, ln2_mean_, ln2_rstd_, fch_, fch_gelu_, fcproj_, residual3_, lnf_,
      lnf_mean_, lnf_rstd_, logits_, probs_, losses_;
  DeviceArray<float> dres_, dres_prev_, dres2_, dln_, dqkv_, datty_, dpreatt_, dattproj_, dfch_,
      dfch_gelu_, dfcproj_, dlogits_;
  LayerActivations acts_{};  // layer 0's slices of the buffers above (Layer(l): layer l's)
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> NewCudaBackend(
    const ModelConfig& config, int local_batch, int seq_len, Comm* comm, int device_ordinal,
    std::chrono::milliseconds collective_timeout) {
  RETURN_IF_ERROR(RequireDevice());
  auto b = std::make_unique<CudaBackend>(config, local_batch, seq_len, comm, collective_timeout);
  RETURN_IF_ERROR(b->Init(device_ordinal));
  return std::unique_ptr<Backend>(std::move(b));
}

absl::Status DeviceAdamWForTest(float* param, float* m, float* v, const uint16_t* grad, size_t n,
                                const AdamWStepParams& p) {
  RETURN_IF_ERROR(RequireDevice());
  DeviceArray<float> dp, dm, dv;
  DeviceArray<uint16_t> dg, dbf;
  RETURN_IF_ERROR(dp.Alloc(n));
  RETURN_IF_ERROR(dm.Alloc(n));
  RETURN_IF_ERROR(dv.Alloc(n));
  RETURN_IF_ERROR(dg.Alloc(n));
  RETURN_IF_ERROR(dbf.Alloc(n));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(dp.get(), param, n * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(dm.get(), m, n * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(dv.get(), v, n * 4, cudaMemcpyHostToDevice));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(dg.get(), grad, n * 2, cudaMemcpyHostToDevice));
  cuda::AdamWUpdate(nullptr, dp.get(), dm.get(), dv.get(), dg.get(), dbf.get(), n, p);
  CUDA_RETURN_IF_ERROR(cudaGetLastError());
  CUDA_RETURN_IF_ERROR(cudaMemcpy(param, dp.get(), n * 4, cudaMemcpyDeviceToHost));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(m, dm.get(), n * 4, cudaMemcpyDeviceToHost));
  CUDA_RETURN_IF_ERROR(cudaMemcpy(v, dv.get(), n * 4, cudaMemcpyDeviceToHost));
  return absl::OkStatus();
}

namespace {
void CUDART_CB BlockUntilReleased(void* released) {
  while (!static_cast<std::atomic<bool>*>(released)->load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}
}  // namespace

absl::Status NcclDeadlineForTest(std::chrono::milliseconds timeout, bool block, bool* aborted) {
  *aborted = false;
  RETURN_IF_ERROR(RequireDevice());
#if defined(GRADSNAP_HAVE_NCCL)
  CUDA_RETURN_IF_ERROR(cudaSetDevice(0));
  ncclComm_t comm = nullptr;
  int device = 0;
  NCCL_RETURN(ncclCommInitAll(&comm, 1, &device));
  cudaStream_t stream = nullptr;
  cudaEvent_t event = nullptr;
  DeviceArray<float> data;
  std::atomic<bool> released{!block};
  absl::Status waited = [&]() -> absl::Status {
    CUDA_RETURN_IF_ERROR(cudaStreamCreate(&stream));
    CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    RETURN_IF_ERROR(data.Alloc(1024));
    NCCL_RETURN(ncclAllReduce(data.get(), data.get(), 1024, ncclFloat, ncclSum, comm, stream));
    CUDA_RETURN_IF_ERROR(cudaLaunchHostFunc(stream, BlockUntilReleased, &released));
    CUDA_RETURN_IF_ERROR(cudaEventRecord(event, stream));
    return WaitForCudaEvent(event, {"a blocked stream on cuda:0", timeout, "the NCCL communicator"},
                            [&] {
                              (void)ncclCommAbort(comm);
                              comm = nullptr;
                              *aborted = true;
                            });
  }();
  released = true;
  if (stream != nullptr) {
    waited.Update(GS_CUDA_STATUS(cudaStreamSynchronize(stream)));
    cudaStreamDestroy(stream);
  }
  if (event != nullptr) cudaEventDestroy(event);
  if (comm != nullptr) ncclCommDestroy(comm);
  return waited;
#else
  (void)timeout;
  (void)block;
  return absl::UnimplementedError("built without NCCL");
#endif
}

}  // namespace trainer
}  // namespace gradsnap
