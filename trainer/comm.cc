// LocalComm (one process) and GlooComm (Gloo TCP, full mesh of pairs). See comm.h.
#include "trainer/comm.h"

#include <cstring>
#include <exception>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/file_store.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/transport/tcp/device.h"
#include "gloo/transport/unbound_buffer.h"
#include "trainer/model_config.h"

namespace gradsnap {
namespace trainer {
namespace {

class LocalComm : public Comm {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  absl::Status ReduceScatter(float*, size_t) override { return absl::OkStatus(); }
  absl::Status AllGather(float*, size_t) override { return absl::OkStatus(); }
  absl::Status AllReduceSum(double*, size_t) override { return absl::OkStatus(); }
  absl::Status Send(int, uint32_t, const void*, size_t) override {
    return absl::FailedPreconditionError("Send in a one-rank group");
  }
  absl::Status Recv(int, uint32_t, void*, size_t) override {
    return absl::FailedPreconditionError("Recv in a one-rank group");
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
};

// The one place where Gloo's exceptions become a Status.
absl::Status GlooError(const char* op, const std::exception& e) {
  return absl::UnavailableError(absl::StrCat("gloo ", op, ": ", e.what()));
}

using Buffer = std::unique_ptr<gloo::transport::UnboundBuffer>;

class GlooComm : public Comm {
 public:
  GlooComm(std::shared_ptr<gloo::rendezvous::Context> ctx, std::chrono::milliseconds timeout)
      : ctx_(std::move(ctx)), timeout_(timeout) {}
  ~GlooComm() override {
    absl::MutexLock lock(&abort_mu_);
    // See comm.h (ERRORS): closing the pairs could block on a frozen peer for ever.
    if (aborted_) new std::shared_ptr<gloo::rendezvous::Context>(std::move(ctx_));
  }
  int rank() const override { return ctx_->rank; }
  int world_size() const override { return ctx_->size; }

  absl::Status ReduceScatter(float* buf, size_t total) override {
    return Run("reduce-scatter", [&] { return DoReduceScatter(buf, total); });
  }
  absl::Status AllGather(float* buf, size_t total) override {
    return Run("all-gather", [&] { return DoAllGather(buf, total); });
  }
  absl::Status AllReduceSum(double* vals, size_t n) override {
    return Run("all-reduce", [&] { return DoAllReduce(vals, n); });
  }
  absl::Status Send(int dst, uint32_t tag, const void* data, size_t n) override {
    return Run("send", [&] {
      Buffer b = ctx_->createUnboundBuffer(const_cast<void*>(data), n);
      b->send(dst, kP2pSlotBase + tag);
      return Wait(b, /*send=*/true);
    });
  }
  absl::Status Recv(int src, uint32_t tag, void* data, size_t n) override {
    return Run("recv", [&] {
      Buffer b = ctx_->createUnboundBuffer(data, n);
      b->recv(src, kP2pSlotBase + tag);
      return Wait(b, /*send=*/false);
    });
  }
  absl::Status Barrier() override {
    double one = 1.0;
    return AllReduceSum(&one, 1);
  }
  void Abort() override {
    absl::MutexLock lock(&abort_mu_);
    aborted_ = true;
    for (gloo::transport::UnboundBuffer* b : waiting_) {
      b->abortWaitRecv();
      b->abortWaitSend();
    }
  }

 private:
  static constexpr uint64_t kP2pSlotBase = 1ull << 40;

  // No limit (op_timeout 0): a year, far beyond any deadline a caller sets.
  static constexpr std::chrono::milliseconds kNoLimit{365LL * 24 * 3600 * 1000};

  // Runs the operation `op` unless the group was aborted (posting an operation takes the locks
  // that a Gloo thread stuck on a frozen peer holds), converting Gloo's exceptions.
  template <typename Op>
  absl::Status Run(const char* name, Op op) {
    {
      absl::MutexLock lock(&abort_mu_);
      if (aborted_) return Aborted(name);
    }
    try {
      return op();
    } catch (const std::exception& e) {
      return GlooError(name, e);
    }
  }
  static absl::Status Aborted(const char* name) {
    return absl::UnavailableError(absl::StrCat("gloo ", name, ": the group was aborted"));
  }

  absl::Status Wait(Buffer& b, bool send) {
    {
      absl::MutexLock lock(&abort_mu_);
      if (aborted_) return Aborted(send ? "send" : "recv");
      waiting_.insert(b.get());
    }
    const std::chrono::milliseconds limit = timeout_.count() > 0 ? timeout_ : kNoLimit;
    const bool ok = send ? b->waitSend(limit) : b->waitRecv(limit);
    absl::MutexLock lock(&abort_mu_);
    waiting_.erase(b.get());
    if (!ok) return absl::UnavailableError("gloo operation aborted");
    return absl::OkStatus();
  }

  // Memory to send or receive; an empty region is not posted.
  struct Region {
    void* p;
    size_t bytes;
  };

  // Posts, for every other rank j, a send of send(j) and a receive into recv(j) under one new
  // slot, and appends what it posted to *sends and *recvs.
  template <typename SendFn, typename RecvFn>
  void PostExchange(SendFn send, RecvFn recv, std::vector<Buffer>* sends,
                    std::vector<Buffer>* recvs) {
    const uint64_t slot = next_slot_++;
    for (int j = 0; j < world_size(); ++j) {
      if (j == rank()) continue;
      const Region out = send(j), in = recv(j);
      if (out.bytes > 0) {
        sends->push_back(ctx_->createUnboundBuffer(out.p, out.bytes));
        sends->back()->send(j, slot);
      }
      if (in.bytes > 0) {
        recvs->push_back(ctx_->createUnboundBuffer(in.p, in.bytes));
        recvs->back()->recv(j, slot);
      }
    }
  }
  absl::Status WaitAll(std::vector<Buffer>& buffers, bool send) {
    for (Buffer& b : buffers) RETURN_IF_ERROR(Wait(b, send));
    return absl::OkStatus();
  }

  absl::Status DoReduceScatter(float* buf, size_t total) {
    const int P = world_size(), me = rank();
    const RankSlice mine = SliceOfRank(total, me, P);
    const size_t n = mine.size();
    std::vector<float> recv(n * P);
    std::vector<Buffer> sends, recvs;
    PostExchange(
        [&](int j) {
          const RankSlice s = SliceOfRank(total, j, P);
          return Region{buf + s.lo, s.size() * sizeof(float)};
        },
        [&](int j) { return Region{recv.data() + j * n, n * sizeof(float)}; }, &sends, &recvs);
    RETURN_IF_ERROR(WaitAll(recvs, /*send=*/false));
    if (n > 0) std::memcpy(recv.data() + me * n, buf + mine.lo, n * sizeof(float));
    // Sum in rank order, independent of arrival order.
    float* out = buf + mine.lo;
    for (size_t i = 0; i < n; ++i) out[i] = recv[i];
    for (int j = 1; j < P; ++j) {
      const float* c = recv.data() + j * n;
      for (size_t i = 0; i < n; ++i) out[i] += c[i];
    }
    return WaitAll(sends, /*send=*/true);
  }

  absl::Status DoAllGather(float* buf, size_t total) {
    const int P = world_size();
    const RankSlice mine = SliceOfRank(total, rank(), P);
    std::vector<Buffer> sends, recvs;
    PostExchange([&](int) { return Region{buf + mine.lo, mine.size() * sizeof(float)}; },
                 [&](int j) {
                   const RankSlice s = SliceOfRank(total, j, P);
                   return Region{buf + s.lo, s.size() * sizeof(float)};
                 },
                 &sends, &recvs);
    RETURN_IF_ERROR(WaitAll(recvs, /*send=*/false));
    return WaitAll(sends, /*send=*/true);
  }

  absl::Status DoAllReduce(double* vals, size_t n) {
    const int P = world_size(), me = rank();
    std::vector<double> all(n * P);
    std::memcpy(all.data() + me * n, vals, n * sizeof(double));
    std::vector<Buffer> sends, recvs;
    PostExchange([&](int) { return Region{vals, n * sizeof(double)}; },
                 [&](int j) { return Region{all.data() + j * n, n * sizeof(double)}; }, &sends,
                 &recvs);
    RETURN_IF_ERROR(WaitAll(recvs, /*send=*/false));
    RETURN_IF_ERROR(WaitAll(sends, /*send=*/true));
    for (size_t i = 0; i < n; ++i) {
      double acc = all[i];
      for (int j = 1; j < P; ++j) acc += all[j * n + i];
      vals[i] = acc;
    }
    return absl::OkStatus();
  }

  std::shared_ptr<gloo::rendezvous::Context> ctx_;
  std::chrono::milliseconds timeout_;
  uint64_t next_slot_ = 1;
  absl::Mutex abort_mu_;
  bool aborted_ ABSL_GUARDED_BY(abort_mu_) = false;
  // The buffers whose wait is under way: what Abort interrupts.
  std::set<gloo::transport::UnboundBuffer*> waiting_ ABSL_GUARDED_BY(abort_mu_);
};

}  // namespace

std::unique_ptr<Comm> NewLocalComm() { return std::make_unique<LocalComm>(); }

absl::StatusOr<std::unique_ptr<Comm>> NewGlooComm(const GlooOptions& options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad rank ", options.rank, " of world size ", options.world_size));
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.hostname;
    auto dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::FileStore file_store(options.rdzv_dir);
    gloo::rendezvous::PrefixStore store(options.prefix, file_store);
    auto ctx =
        std::make_shared<gloo::rendezvous::Context>(options.rank, options.world_size);
    ctx->setTimeout(options.timeout);
    ctx->connectFullMesh(store, dev);
    return std::unique_ptr<Comm>(new GlooComm(std::move(ctx), options.op_timeout));
  } catch (const std::exception& e) {
    return GlooError("rendezvous", e);
  }
}

}  // namespace trainer
}  // namespace gradsnap
