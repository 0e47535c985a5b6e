// DirectShardStore and FunnelShardStore; see shard_store.h.
#include "trainer/shard_store.h"

#include <algorithm>
#include <utility>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/retry.h"
#include "common/status.h"
#include "recovery/state_source.h"
#include "trainer/comm.h"
#include "trainer/wire.h"

namespace gradsnap {
namespace trainer {

namespace {

absl::StatusOr<std::vector<client::CheckpointInfo>> ListFromClient(client::Client& c,
                                                                   const std::string& job) {
  absl::StatusOr<std::vector<client::CheckpointInfo>> all = c.List(job);
  if (absl::IsNotFound(all.status())) return std::vector<client::CheckpointInfo>{};
  if (!all.ok()) return all.status();
  std::vector<client::CheckpointInfo> out;
  for (client::CheckpointInfo& i : *all) {
    if (i.state == client::CheckpointState::kCommitted) out.push_back(std::move(i));
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

// The calls of an attempt's start (its epoch, the list and every read of a resume) wait out a
// server outage, bounded (kReadWaitMs): an attempt that starts while the server restarts, or
// whose server is killed again in the middle of its restore, must not fail and burn another
// launcher restart. The client has already retried each call a few times (50-200 ms apart);
// this covers outages of seconds, waiting 100 ms doubling to 2 s between tries.
constexpr int64_t kReadWaitMs = 30000;

template <typename F>
auto WaitOutOutage(F call) -> decltype(call()) {
  return RetryWhile(call, [](const absl::Status& s) { return absl::IsUnavailable(s); },
                    RetryPolicy{kReadWaitMs, /*initial_backoff_ms=*/100, /*max_backoff_ms=*/2000});
}

// A StateSource whose every call waits out an outage of the store (WaitOutOutage).
class PatientSource : public recovery::StateSource {
 public:
  explicit PatientSource(std::unique_ptr<recovery::StateSource> inner)
      : inner_(std::move(inner)) {}
  absl::StatusOr<std::vector<storage::CheckpointInfo>> List() override {
    return WaitOutOutage([&] { return inner_->List(); });
  }
  absl::StatusOr<recovery::CheckpointView> Describe(int64_t step) override {
    return WaitOutOutage([&] { return inner_->Describe(step); });
  }
  absl::Status Read(int64_t step, int32_t rank, const std::string& tensor, uint64_t offset,
                    uint64_t length, void* out) override {
    return WaitOutOutage([&] { return inner_->Read(step, rank, tensor, offset, length, out); });
  }
  std::string Name() const override { return inner_->Name(); }

 private:
  std::unique_ptr<recovery::StateSource> inner_;
};

class DirectShardStore : public ShardStore {
 public:
  DirectShardStore(std::unique_ptr<client::Client> c, std::unique_ptr<Comm> comm)
      : client_(std::move(c)), comm_(std::move(comm)) {}
  absl::Status BeginCheckpoint(const client::CheckpointSpec& spec) override {
    client::CheckpointSpec fenced = spec;
    fenced.epoch = epoch_;
    return client_->BeginCheckpoint(fenced);
  }
  absl::Status SaveShard(const client::ShardSpec& spec,
                         std::vector<client::TensorRef> tensors) override {
    client::ShardSpec fenced = spec;
    fenced.epoch = epoch_;
    return client_->SaveShard(fenced, std::move(tensors));
  }
  absl::StatusOr<uint64_t> AcquireEpoch(const std::string& job) override {
    return WaitOutOutage([&] { return client_->AcquireEpoch(job); });
  }
  void SetEpoch(uint64_t epoch) override { epoch_ = epoch; }
  uint64_t epoch() const override { return epoch_; }
  absl::StatusOr<bool> AllAgree(bool ok) override {
    if (comm_ == nullptr) return ok;
    double failed = ok ? 0 : 1;
    RETURN_IF_ERROR(comm_->AllReduceSum(&failed, 1));
    return failed == 0;
  }
  bool collective_saves() const override { return false; }
  void AbortGroup() override {
    if (comm_ != nullptr) comm_->Abort();
  }
  absl::StatusOr<std::vector<client::CheckpointInfo>> ListCommitted(
      const std::string& job) override {
    return WaitOutOutage([&] { return ListFromClient(*client_, job); });
  }
  client::Client* client() override { return client_.get(); }

 private:
  std::unique_ptr<client::Client> client_;
  std::unique_ptr<Comm> comm_;
  uint64_t epoch_ = 0;
};

// Message tags of the funnel protocol (each a header + payload pair, see wire.h).
enum Tag : uint32_t { kSave = 1, kSaveAck, kList, kAgree, kAgreed };

class FunnelShardStore : public ShardStore {
 public:
  FunnelShardStore(std::unique_ptr<client::Client> c, std::unique_ptr<Comm> comm)
      : client_(std::move(c)), comm_(std::move(comm)) {}

  // Rank 0 begins it for everyone. Its failure is returned by the SaveShard that follows, on
  // every rank: the other ranks are on their way to send their shards, which rank 0 must take
  // (a rank 0 that returned here would wait for their agreement while they wait to send: both
  // stuck for good, as on a full disk).
  absl::Status BeginCheckpoint(const client::CheckpointSpec& spec) override {
    if (comm_->rank() != 0) return absl::OkStatus();
    client::CheckpointSpec fenced = spec;
    fenced.epoch = epoch_;
    begin_error_ = client_->BeginCheckpoint(fenced);
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> AcquireEpoch(const std::string& job) override {
    if (comm_->rank() != 0) return 0;
    return WaitOutOutage([&] { return client_->AcquireEpoch(job); });
  }
  void SetEpoch(uint64_t epoch) override { epoch_ = epoch; }
  uint64_t epoch() const override { return epoch_; }

  absl::StatusOr<bool> AllAgree(bool ok) override {
    if (comm_->rank() != 0) {
      RETURN_IF_ERROR(SendMessage(*comm_, 0, kAgree, ok ? "1" : "0"));
      absl::StatusOr<std::string> all = RecvMessage(*comm_, 0, kAgreed);
      if (!all.ok()) return all.status();
      return all->size() == 1 && all->front() == '1';
    }
    bool all = ok;
    for (int r = 1; r < comm_->world_size(); ++r) {
      absl::StatusOr<std::string> msg = RecvMessage(*comm_, r, kAgree);
      if (!msg.ok()) return msg.status();
      all = all && msg->size() == 1 && msg->front() == '1';
    }
    for (int r = 1; r < comm_->world_size(); ++r) {
      RETURN_IF_ERROR(SendMessage(*comm_, r, kAgreed, all ? "1" : "0"));
    }
    return all;
  }
  bool collective_saves() const override { return true; }
  void AbortGroup() override {
    if (comm_ != nullptr) comm_->Abort();
  }

  absl::Status SaveShard(const client::ShardSpec& spec,
                         std::vector<client::TensorRef> tensors) override {
    if (comm_->rank() != 0) {
      RETURN_IF_ERROR(SendMessage(*comm_, 0, kSave, EncodeShard(spec, tensors)));
      ASSIGN_OR_RETURN(std::string ack, RecvMessage(*comm_, 0, kSaveAck));
      return DecodeStatus(ack);
    }
    client::ShardSpec fenced = spec;
    fenced.epoch = epoch_;
    const absl::Status begun = std::exchange(begin_error_, absl::OkStatus());
    absl::Status result = begun.ok() ? client_->SaveShard(fenced, std::move(tensors)) : begun;
    for (int r = 1; r < comm_->world_size(); ++r) {
      ASSIGN_OR_RETURN(std::string msg, RecvMessage(*comm_, r, kSave));
      absl::Status s = begun.ok() ? SaveEncoded(msg) : begun;
      RETURN_IF_ERROR(SendMessage(*comm_, r, kSaveAck, EncodeStatus(s)));
      if (result.ok()) result = s;
    }
    return result;
  }

  absl::StatusOr<std::vector<client::CheckpointInfo>> ListCommitted(
      const std::string& job) override {
    if (comm_->rank() != 0) {
      ASSIGN_OR_RETURN(std::string msg, RecvMessage(*comm_, 0, kList));
      return DecodeInfos(msg);
    }
    absl::StatusOr<std::vector<client::CheckpointInfo>> list = ListFromClient(*client_, job);
    const std::string msg = EncodeInfos(list);
    for (int r = 1; r < comm_->world_size(); ++r) {
      RETURN_IF_ERROR(SendMessage(*comm_, r, kList, msg));
    }
    return list;
  }

  client::Client* client() override { return client_.get(); }

 private:
  absl::Status SaveEncoded(const std::string& msg) {
    client::ShardSpec spec;
    std::vector<client::TensorRef> refs;
    RETURN_IF_ERROR(DecodeShard(msg, &spec, &refs));
    spec.epoch = epoch_;
    return client_->SaveShard(spec, std::move(refs));
  }

  std::unique_ptr<client::Client> client_;
  std::unique_ptr<Comm> comm_;
  uint64_t epoch_ = 0;
  absl::Status begin_error_;  // rank 0: the last BeginCheckpoint's, for the next SaveShard
};

}  // namespace

std::unique_ptr<ShardStore> NewDirectShardStore(std::unique_ptr<client::Client> client,
                                                std::unique_ptr<Comm> comm) {
  return std::make_unique<DirectShardStore>(std::move(client), std::move(comm));
}

std::unique_ptr<ShardStore> NewFunnelShardStore(std::unique_ptr<client::Client> client,
                                                std::unique_ptr<Comm> comm) {
  return std::make_unique<FunnelShardStore>(std::move(client), std::move(comm));
}

std::unique_ptr<recovery::StateSource> NewRestoreSource(ShardStore& store, const std::string& job) {
  if (store.client() == nullptr) return nullptr;
  return std::make_unique<PatientSource>(recovery::NewClientSource(store.client(), job));
}

}  // namespace trainer
}  // namespace gradsnap
