#include "trainer/grad_log_store.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "gpu_snapshot/grad_log.h"

namespace gradsnap {
namespace trainer {

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

}  // namespace trainer
}  // namespace gradsnap
