// The store as a StateSource (state_source.h).
#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "recovery/state_source.h"

namespace gradsnap {
namespace recovery {

const FlatBuffer* CheckpointView::Flat(const std::string& name) const {
  auto it = flats.find(name);
  return it == flats.end() ? nullptr : &it->second;
}

absl::StatusOr<CheckpointView> ViewOfManifest(const storage::Manifest& m) {
  CheckpointView v;
  v.info = m.info;
  for (const storage::ShardInfo& s : m.shards) {
    for (const storage::TensorInfo& t : s.tensors) {
      v.tensors[s.rank][t.spec.name] = t.spec;
      if (t.spec.flat_name.empty()) continue;
      const size_t es = DTypeSize(t.spec.dtype);
      if (es == 0) return absl::DataLossError(absl::StrCat("tensor ", t.spec.name, ": bad dtype"));
      FlatBuffer& f = v.flats[t.spec.flat_name];
      if (f.total != 0 && f.total != t.spec.flat_total) {
        return absl::DataLossError(absl::StrCat("step ", m.info.step, ": flat buffer ",
                                                t.spec.flat_name, " has two lengths"));
      }
      f.total = t.spec.flat_total;
      f.pieces.push_back(FlatPiece{s.rank, t.spec.name, t.spec.dtype, t.spec.flat_offset,
                                   t.spec.byte_length / es, 0});
    }
  }
  for (auto& [name, f] : v.flats) {
    std::sort(f.pieces.begin(), f.pieces.end(),
              [](const FlatPiece& a, const FlatPiece& b) { return a.flat_offset < b.flat_offset; });
  }
  return v;
}

namespace {

class ClientSource : public StateSource {
 public:
  ClientSource(client::Client* c, std::string job) : client_(c), job_(std::move(job)) {}

  absl::StatusOr<std::vector<storage::CheckpointInfo>> List() override {
    ASSIGN_OR_RETURN(std::vector<storage::CheckpointInfo> all, client_->List(job_, false));
    std::vector<storage::CheckpointInfo> out;
    for (storage::CheckpointInfo& i : all) {
      if (i.state == storage::CheckpointState::kCommitted) out.push_back(std::move(i));
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
    return out;
  }

  absl::StatusOr<CheckpointView> Describe(int64_t step) override {
    ASSIGN_OR_RETURN(storage::Manifest m, client_->Show(job_, step));
    if (m.info.state != storage::CheckpointState::kCommitted) {
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_, " step ", step, " is not committed"));
    }
    ASSIGN_OR_RETURN(CheckpointView v, ViewOfManifest(m));
    // Payload offsets of every tensor, for ranged reads.
    absl::MutexLock lock(&mu_);
    for (const storage::ShardInfo& s : m.shards) {
      uint64_t off = 0;
      for (const storage::TensorInfo& t : s.tensors) {
        offsets_[Key{step, s.rank, t.spec.name}] = {off, t.spec.byte_length};
        off += t.spec.byte_length;
      }
    }
    return v;
  }

  absl::Status Read(int64_t step, int32_t rank, const std::string& tensor, uint64_t offset,
                    uint64_t length, void* out) override {
    std::pair<uint64_t, uint64_t> where;
    {
      absl::MutexLock lock(&mu_);
      auto it = offsets_.find(Key{step, rank, tensor});
      if (it == offsets_.end()) {
        return absl::NotFoundError(
            absl::StrCat("job ", job_, " step ", step, " rank ", rank, " has no tensor ", tensor));
      }
      where = it->second;
    }
    if (offset > where.second || length > where.second - offset) {
      return absl::OutOfRangeError(absl::StrCat("tensor ", tensor, ": bytes past its end"));
    }
    absl::Status s = client_->ReadShardRange(job_, step, rank, where.first + offset, length, out);
    const std::string named = absl::StrCat("job ", job_, " step ", step, " rank ", rank);
    if (!s.ok() && !absl::StartsWith(s.message(), named)) {  // the engine's reader names it
      return absl::Status(s.code(), absl::StrCat(named, " tensor ", tensor, ": ", s.message()));
    }
    return s;
  }

  std::string Name() const override { return absl::StrCat("job ", job_); }

 private:
  struct Key {
    int64_t step;
    int32_t rank;
    std::string tensor;
    bool operator<(const Key& o) const {
      return std::tie(step, rank, tensor) < std::tie(o.step, o.rank, o.tensor);
    }
  };

  client::Client* const client_;
  const std::string job_;
  absl::Mutex mu_;
  std::map<Key, std::pair<uint64_t, uint64_t>> offsets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<StateSource> NewClientSource(client::Client* client, const std::string& job) {
  return std::make_unique<ClientSource>(client, job);
}

}  // namespace recovery
}  // namespace gradsnap
