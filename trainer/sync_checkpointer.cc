// The `none` and `sync` checkpointers. sync is the stop-the-world baseline: at EndStep(s) with
// s % every == 0 the rank copies its slice to host buffers (reused across checkpoints) and
// persists a FULL shard through the store, blocking until it is durable.
#include "trainer/sync_checkpointer.h"

#include <memory>
#include <vector>

#include "common/status.h"
#include "trainer/device_copy.h"
#include "trainer/full_shard.h"
#include "trainer/persist_guard.h"

namespace gradsnap {
namespace trainer {
namespace {

class NoneCheckpointer : public Checkpointer {
 public:
  absl::Status Start(const ReplicatedState&) override { return absl::OkStatus(); }
  absl::Status BeforeStep(int64_t) override { return absl::OkStatus(); }
  absl::Status AfterBackward(int64_t, const GradSliceView&) override { return absl::OkStatus(); }
  absl::Status AfterUpdate(int64_t, const UpdateInfo&) override { return absl::OkStatus(); }
  absl::Status EndStep(int64_t, const ReplicatedState&) override { return absl::OkStatus(); }
  absl::Status Finish() override { return absl::OkStatus(); }
};

class SyncCheckpointer : public Checkpointer {
 public:
  SyncCheckpointer(const CheckpointerOptions& options, const TrainStateView& view,
                   ShardStore* store)
      : options_(options), view_(view), store_(store) {}

  absl::Status Start(const ReplicatedState& state) override {
    guard_ = std::make_unique<PersistGuard>(store_, options_, view_.rank,
                                            state.step > 0 ? state.step : -1);
    return absl::OkStatus();
  }
  absl::Status BeforeStep(int64_t) override { return absl::OkStatus(); }
  absl::Status AfterBackward(int64_t, const GradSliceView&) override { return absl::OkStatus(); }
  absl::Status AfterUpdate(int64_t, const UpdateInfo&) override { return absl::OkStatus(); }

  absl::Status EndStep(int64_t step, const ReplicatedState& state) override {
    guard_->NoteStepEnd(step);
    if (options_.every <= 0 || step % options_.every != 0) return absl::OkStatus();
    const float* master = view_.master;
    const float* m = view_.m;
    const float* v = view_.v;
    if (view_.on_device) {
      const size_t n = view_.count(), bytes = n * sizeof(float);
      host_.resize(3 * n);
      RETURN_IF_ERROR(CopyToHost(host_.data(), view_.master, bytes, true));
      RETURN_IF_ERROR(CopyToHost(host_.data() + n, view_.m, bytes, true));
      RETURN_IF_ERROR(CopyToHost(host_.data() + 2 * n, view_.v, bytes, true));
      master = host_.data();
      m = master + n;
      v = m + n;
    }
    // A failed persist is counted and training goes on (persist_guard.h), unless it is fatal.
    guard_->Persist(client::CheckpointKind::kFull, step, -1, [&] {
      return SaveFullShard(*store_, options_.job, step, view_, master, m, v, state);
    }).IgnoreError();
    return guard_->fatal();
  }

  absl::Status Finish() override { return guard_->fatal(); }
  CheckpointHealth Health() const override {
    return guard_ != nullptr ? guard_->health() : CheckpointHealth();
  }

 private:
  const CheckpointerOptions options_;
  const TrainStateView view_;
  ShardStore* const store_;
  std::vector<float> host_;  // device builds: the host copy of master, m, v
  std::unique_ptr<PersistGuard> guard_;
};

}  // namespace

std::unique_ptr<Checkpointer> NewNoneCheckpointer() {
  return std::make_unique<NoneCheckpointer>();
}

std::unique_ptr<Checkpointer> NewSyncCheckpointer(const CheckpointerOptions& options,
                                                  const TrainStateView& view, ShardStore* store) {
  return std::make_unique<SyncCheckpointer>(options, view, store);
}

}  // namespace trainer
}  // namespace gradsnap
