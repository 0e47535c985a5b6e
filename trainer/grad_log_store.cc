#include "trainer/grad_log_store.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gpu_snapshot/grad_log.h"
#include "gpu_snapshot/host_replay.h"

namespace gradsnap {
namespace trainer {

RecoveryPoint FindRecoveryPoint(const std::vector<client::CheckpointInfo>& committed,
                                int64_t max_step) {
  RecoveryPoint rp;
  std::map<int64_t, int64_t> delta_base;  // DELTA step -> base
  for (const client::CheckpointInfo& c : committed) {
    if (c.state != client::CheckpointState::kCommitted) continue;
    if (c.kind == client::CheckpointKind::kFull) {
      if ((max_step < 0 || c.step <= max_step) && c.step > rp.full_step) rp.full_step = c.step;
    } else {
      delta_base[c.step] = c.base_step;
    }
  }
  if (rp.full_step < 0) return rp;
  for (int64_t u = rp.full_step + 1;; ++u) {
    auto it = delta_base.find(u);
    if (it == delta_base.end() || it->second != rp.full_step) break;
    if (max_step >= 0 && u > max_step) break;
    rp.delta_steps.push_back(u);
  }
  return rp;
}

absl::Status SaveDeltaShard(ShardStore& store, const std::string& job, const TrainStateView& view,
                            const gpu_snapshot::DeltaRecord& r) {
  gpu_snapshot::DeltaHeader h;
  h.step = r.step;
  h.base_step = r.base_step;
  h.update = r.update;
  h.loader_position = r.loader_position;
  h.grad_dtype = r.grad_dtype;
  h.numel = r.numel;
  h.elem_offset = r.elem_offset;
  const std::string header = gpu_snapshot::EncodeDeltaHeader(h);

  client::CheckpointSpec spec;
  spec.job = job;
  spec.step = r.step;
  spec.kind = client::CheckpointKind::kDelta;
  spec.base_step = r.base_step;
  spec.world_size = view.world_size;
  spec.metadata = r.small_state;
  client::ShardSpec shard;
  shard.job = job;
  shard.step = r.step;
  shard.rank = view.rank;
  shard.metadata = r.small_state;
  auto add = [&](const std::string& name, DType dt, uint64_t numel, const void* data,
                 bool flat) {
    client::TensorSpec t;
    t.name = name;
    t.dtype = dt;
    t.shape = {static_cast<int64_t>(numel)};
    t.byte_length = numel * DTypeSize(dt);
    if (flat) {
      t.flat_name = name;
      t.flat_offset = view.lo;
      t.flat_total = view.flat_total;
    }
    shard.tensors.push_back(t);
    return client::TensorRef{t, data};
  };
  std::vector<client::TensorRef> refs;
  refs.push_back(add(kDeltaHeaderTensor, DType::kU8, header.size(), header.data(), false));
  refs.push_back(add(kDeltaGradTensor, r.grad_dtype, r.numel, r.grad, true));
  refs.push_back(add(kReplicatedTensor, DType::kU8, r.small_state.size(), r.small_state.data(),
                     false));
  RETURN_IF_ERROR(store.BeginCheckpoint(spec));
  return store.SaveShard(shard, std::move(refs));
}

absl::StatusOr<ReplicatedState> ReplayGradLog(ShardStore& store, const std::string& job,
                                              int64_t full_step, const TrainStateView& view,
                                              float* master, float* m, float* v,
                                              const ReplicatedState& restored) {
  ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> list, store.ListCommitted(job));
  RecoveryPoint rp = FindRecoveryPoint(list, -1);
  if (rp.full_step != full_step || rp.delta_steps.empty()) return restored;
  gpu_snapshot::ReplayPool pool(2);
  const gpu_snapshot::HostStateRef state{master, m, v, view.count()};
  ReplicatedState out = restored;
  std::string header(gpu_snapshot::kDeltaHeaderBytes, '\0');
  std::vector<char> grad;
  for (int64_t u : rp.delta_steps) {
    ASSIGN_OR_RETURN(std::string meta,
                     store.RestoreTensors(job, u, view.rank,
                                          {{kDeltaHeaderTensor, header.data(), header.size()}}));
    ASSIGN_OR_RETURN(gpu_snapshot::DeltaHeader h, gpu_snapshot::DecodeDeltaHeader(header));
    if (h.step != u || h.base_step != full_step || h.numel != view.count() ||
        h.elem_offset != view.lo) {
      return absl::DataLossError(absl::StrCat("DELTA ", u, " of job ", job, " rank ", view.rank,
                                              " does not match its checkpoint"));
    }
    grad.resize(h.numel * DTypeSize(h.grad_dtype));
    RETURN_IF_ERROR(store
                        .RestoreTensors(job, u, view.rank,
                                        {{kDeltaGradTensor, grad.data(), grad.size()}})
                        .status());
    RETURN_IF_ERROR(gpu_snapshot::ApplyDelta(&pool, state, h, grad.data(), grad.size()));
    ASSIGN_OR_RETURN(out, ReplicatedState::Parse(meta));
    if (out.step != u) {
      return absl::DataLossError(absl::StrCat("DELTA ", u, " carries the state of step ",
                                              out.step));
    }
  }
  return out;
}

}  // namespace trainer
}  // namespace gradsnap
