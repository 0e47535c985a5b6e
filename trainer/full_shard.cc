#include "trainer/full_shard.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace gradsnap {
namespace trainer {
namespace {

client::TensorSpec SliceSpec(const char* name, const TrainStateView& view) {
  client::TensorSpec t;
  t.name = name;
  t.dtype = DType::kF32;
  t.shape = {static_cast<int64_t>(view.count())};
  t.byte_length = view.count() * sizeof(float);
  t.flat_name = name;
  t.flat_offset = view.lo;
  t.flat_total = view.flat_total;
  return t;
}

}  // namespace

FullShard BuildFullShard(const std::string& job, int64_t step, const TrainStateView& view,
                         const float* master, const float* m, const float* v,
                         const ReplicatedState& state) {
  FullShard f;
  f.replicated = state.Serialize();
  f.checkpoint.job = job;
  f.checkpoint.step = step;
  f.checkpoint.kind = client::CheckpointKind::kFull;
  f.checkpoint.world_size = view.world_size;
  f.checkpoint.metadata = f.replicated;
  f.shard.job = job;
  f.shard.step = step;
  f.shard.rank = view.rank;
  f.shard.metadata = f.replicated;
  const float* data[3] = {master, m, v};
  const char* names[3] = {kFlatParams, kFlatAdamM, kFlatAdamV};
  for (int i = 0; i < 3; ++i) {
    f.shard.tensors.push_back(SliceSpec(names[i], view));
    f.tensors.push_back(client::TensorRef{f.shard.tensors.back(), data[i]});
  }
  client::TensorSpec rep;
  rep.name = kReplicatedTensor;
  rep.dtype = DType::kU8;
  rep.shape = {static_cast<int64_t>(f.replicated.size())};
  rep.byte_length = f.replicated.size();
  f.shard.tensors.push_back(rep);
  f.tensors.push_back(client::TensorRef{rep, f.replicated.data()});
  return f;
}

absl::Status SaveFullShard(ShardStore& store, const std::string& job, int64_t step,
                           const TrainStateView& view, const float* master, const float* m,
                           const float* v, const ReplicatedState& state) {
  FullShard f = BuildFullShard(job, step, view, master, m, v, state);
  RETURN_IF_ERROR(store.BeginCheckpoint(f.checkpoint));
  return store.SaveShard(f.shard, f.tensors);
}

absl::StatusOr<int64_t> ResolveResumeStep(ShardStore& store, const std::string& job,
                                          const std::string& resume) {
  if (resume == "none") return -1;
  int64_t wanted = -1;
  if (resume != "latest" && (!absl::SimpleAtoi(resume, &wanted) || wanted < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--resume must be none, latest or a step number, not '", resume, "'"));
  }
  ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> list, store.ListCommitted(job));
  int64_t latest = -1;
  for (const client::CheckpointInfo& c : list) {
    if (c.kind != client::CheckpointKind::kFull) continue;
    if (resume == "latest") latest = std::max(latest, c.step);
    if (c.step == wanted) return wanted;
  }
  if (resume == "latest") return latest;
  return absl::NotFoundError(
      absl::StrCat("job ", job, " has no committed FULL checkpoint at step ", wanted));
}

absl::StatusOr<ReplicatedState> ReadCheckpointState(ShardStore& store, const std::string& job,
                                                    int64_t step) {
  ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> list, store.ListCommitted(job));
  for (const client::CheckpointInfo& c : list) {
    if (c.step != step) continue;
    ASSIGN_OR_RETURN(ReplicatedState s, ReplicatedState::Parse(c.metadata));
    if (s.world_size != c.world_size) {
      return absl::DataLossError(absl::StrCat("checkpoint ", job, "@", step,
                                              ": metadata and manifest disagree on world size"));
    }
    return s;
  }
  return absl::NotFoundError(absl::StrCat("no committed checkpoint ", job, "@", step));
}

absl::StatusOr<ReplicatedState> RestoreFullShard(ShardStore& store, const std::string& job,
                                                 int64_t step, const TrainStateView& view,
                                                 float* master, float* m, float* v) {
  const size_t bytes = view.count() * sizeof(float);
  std::vector<TensorOut> outs = {{kFlatParams, master, bytes},
                                 {kFlatAdamM, m, bytes},
                                 {kFlatAdamV, v, bytes}};
  ASSIGN_OR_RETURN(std::string metadata, store.RestoreTensors(job, step, view.rank, outs));
  ASSIGN_OR_RETURN(ReplicatedState s, ReplicatedState::Parse(metadata));
  if (s.world_size != view.world_size) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", job, "@", step, " has world size ", s.world_size,
                     ", this run ", view.world_size));
  }
  return s;
}

}  // namespace trainer
}  // namespace gradsnap
