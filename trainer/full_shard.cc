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

}  // namespace trainer
}  // namespace gradsnap
