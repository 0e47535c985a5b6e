#include "client/save_util.h"

#include "common/sha256.h"
#include "common/digest.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/names.h"

namespace gradsnap {
namespace client {
namespace {

bool SameSpec(const TensorSpec& a, const TensorSpec& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape &&
         a.byte_length == b.byte_length && a.flat_name == b.flat_name &&
         a.flat_offset == b.flat_offset && a.flat_total == b.flat_total && a.sha256 == b.sha256;
}

absl::Status CheckTensor(const TensorRef& t) {
  const TensorSpec& s = t.spec;
  if (absl::Status st = ValidateName(s.name, "tensor name"); !st.ok()) return st;
  size_t elem = DTypeSize(s.dtype);
  if (elem == 0) return absl::InvalidArgumentError(absl::StrCat("tensor ", s.name, ": unknown dtype"));
  uint64_t numel = 1;
  for (int64_t d : s.shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("tensor ", s.name, ": negative dim"));
    if (d != 0 && numel > UINT64_MAX / static_cast<uint64_t>(d)) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", s.name, ": shape overflows"));
    }
    numel *= static_cast<uint64_t>(d);
  }
  if (numel > UINT64_MAX / elem || numel * elem != s.byte_length) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor ", s.name, ": byte_length ", s.byte_length, " does not match shape and dtype"));
  }
  if (s.byte_length > 0 && t.data == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", s.name, ": null data"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ShardSpec> ResolveShardSpec(const ShardSpec& spec,
                                           const std::vector<TensorRef>& tensors) {
  for (const TensorRef& t : tensors) {
    if (absl::Status st = CheckTensor(t); !st.ok()) return st;
  }
  ShardSpec out = spec;
  if (out.tensors.empty()) {
    out.tensors.reserve(tensors.size());
    for (const TensorRef& t : tensors) out.tensors.push_back(t.spec);
    return out;
  }
  if (out.tensors.size() != tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat("shard spec lists ", out.tensors.size(),
                                                   " tensors but ", tensors.size(), " were given"));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!SameSpec(out.tensors[i], tensors[i].spec)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", i, " (", tensors[i].spec.name, ") differs from the shard spec"));
    }
  }
  return out;
}

absl::Status CheckCommittedContent(const ShardSpec& spec, const ShardInfo& stored,
                                   const std::vector<TensorRef>& tensors) {
  for (const TensorRef& t : tensors) {
    const TensorInfo* info = nullptr;
    for (const TensorInfo& i : stored.tensors) {
      if (i.spec.name == t.spec.name) info = &i;
    }
    // Compared with the algorithm that wrote the stored shard; a manifest from a server that
    // predates digest_algorithm carries the SHA-256 in spec.sha256 (docs/protocol.md).
    std::string want;
    DigestAlgo algo = DigestAlgo::kSha256;
    if (info != nullptr) {
      want = info->digest.empty() ? info->spec.sha256 : info->digest;
      if (!info->digest.empty()) algo = info->digest_algo;
    }
    if (want.empty() || want != DigestHex(algo, t.data, t.spec.byte_length)) {
      return absl::AlreadyExistsError(absl::StrCat(
          "conflict: job ", spec.job, " step ", spec.step, " rank ", spec.rank, " tensor ",
          t.spec.name, " is already committed with different content"));
    }
  }
  return absl::OkStatus();
}

uint64_t ShardBytes(const ShardSpec& spec) {
  uint64_t n = 0;
  for (const TensorSpec& t : spec.tensors) n += t.byte_length;
  return n;
}

namespace {

int64_t NextBudgetId() {
  static std::atomic<int64_t> next{0};
  return ++next;
}

// `base`{client="id"}: the gauge of one client.
std::string ClientMetric(const char* base, int64_t id) {
  return absl::StrCat(base, "{client=\"", id, "\"}");
}

}  // namespace

ByteBudget::ByteBudget(uint64_t limit)
    : limit_(std::max<uint64_t>(limit, 1)),
      metrics_id_(NextBudgetId()),
      gauge_(Registry::Global()->GetCounter(
          ClientMetric("gradsnap_client_inflight_bytes", metrics_id_),
          "Bytes of asynchronous saves in flight, per client", true)),
      peak_gauge_(Registry::Global()->GetCounter(
          ClientMetric("gradsnap_client_inflight_peak_bytes", metrics_id_),
          "Highest bytes of asynchronous saves in flight, per client", true)) {}

void ByteBudget::Acquire(uint64_t n) {
  absl::MutexLock lock(&mu_);
  auto fits = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_ == 0 || in_flight_ + n <= limit_;
  };
  mu_.Await(absl::Condition(&fits));
  in_flight_ += n;
  peak_ = std::max(peak_, in_flight_);
  gauge_->Set(static_cast<int64_t>(in_flight_));
  peak_gauge_->Set(static_cast<int64_t>(peak_));
}

void ByteBudget::Release(uint64_t n) {
  absl::MutexLock lock(&mu_);
  in_flight_ -= std::min(n, in_flight_);
  gauge_->Set(static_cast<int64_t>(in_flight_));
}

ByteBudget::Usage ByteBudget::usage() const {
  absl::MutexLock lock(&mu_);
  return {.in_flight = in_flight_, .peak = peak_};
}

SaveQueue::SaveQueue(size_t workers, SaveFn save) : save_(std::move(save)) {
  for (size_t i = 0; i < workers; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

SaveQueue::~SaveQueue() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

std::future<absl::Status> SaveQueue::Push(const ShardSpec& spec,
                                          std::vector<TensorRef> tensors) {
  absl::StatusOr<ShardSpec> resolved = ResolveShardSpec(spec, tensors);
  if (!resolved.ok()) {
    std::promise<absl::Status> failed;
    failed.set_value(resolved.status());
    return failed.get_future();
  }
  auto task = std::make_unique<Task>();
  std::future<absl::Status> result = task->done.get_future();
  task->spec = *std::move(resolved);
  task->tensors = std::move(tensors);
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(task));
  return result;
}

void SaveQueue::WorkerLoop() {
  for (;;) {
    std::unique_ptr<Task> task;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // stopping and drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task->done.set_value(save_(task->spec, task->tensors));
  }
}

}  // namespace client
}  // namespace gradsnap
