// Internal: the SnapshotEngine implementation, shared by snapshot_engine.cc (the training
// thread's hooks) and engine_worker.cc (the worker thread: host replay, gradient-log records,
// handing finished snapshots to the sink).
#ifndef GRADSNAP_GPU_SNAPSHOT_ENGINE_IMPL_H_
#define GRADSNAP_GPU_SNAPSHOT_ENGINE_IMPL_H_

#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "gpu_snapshot/copy_queue.h"
#include "gpu_snapshot/snapshot_engine.h"
#include "gpu_snapshot/staging_pool.h"

namespace gradsnap {
namespace gpu_snapshot {

// Work for the worker thread, in the order it must happen.
struct EngineEvent {
  // kDropParked (Finish): no record comes any more, so the events parked for one are dropped,
  // their pool chunks and log buffers released (a step that failed between its gradient copy
  // and its update left them waiting).
  enum Kind { kChunk, kRecord, kGradDone, kClose, kDropParked, kStop } kind = kChunk;
  int64_t step = 0;
  // kChunk: gradient elements [elem_begin, elem_begin + elem_count) of update `step` at
  // `grad`; elements below replay_end are replayed onto the staged state.
  const void* grad = nullptr;
  size_t elem_begin = 0, elem_count = 0, replay_end = 0;
  void* pool_chunk = nullptr;  // released to the pool after use
  // kRecord
  std::shared_ptr<const UpdateRecord> info;
  // kGradDone: the whole gradient of `step` is in log buffer `log_buf`, or (log_buf < 0) in
  // `lent`, memory the sink lent (SnapshotSink::LendDeltaBuffer).
  int log_buf = -1;
  void* lent = nullptr;
  // kClose: the staged state is complete for update `step` (window K started after start).
  int window = 1;
  int64_t start_step = 0;
};

inline EngineEvent ChunkEvent(int64_t step, const void* grad, size_t begin, size_t count,
                              size_t replay_end, void* pool_chunk) {
  EngineEvent e;
  e.kind = EngineEvent::kChunk;
  e.step = step;
  e.grad = grad;
  e.elem_begin = begin;
  e.elem_count = count;
  e.replay_end = replay_end;
  e.pool_chunk = pool_chunk;
  return e;
}
inline EngineEvent CloseEvent(int64_t step, int window, int64_t start_step) {
  EngineEvent e;
  e.kind = EngineEvent::kClose;
  e.step = step;
  e.window = window;
  e.start_step = start_step;
  return e;
}
inline EngineEvent SimpleEvent(EngineEvent::Kind kind, int64_t step) {
  EngineEvent e;
  e.kind = kind;
  e.step = step;
  return e;
}

class EngineImpl : public SnapshotEngine {
 public:
  EngineImpl(Device* device, const DeviceState& state, const SnapshotEngineOptions& options,
             SnapshotSink* sink);
  ~EngineImpl() override;
  absl::Status Init();

  void SetBaseStep(int64_t step) override;
  absl::Status BeforeGradOverwrite(int64_t step) override;
  absl::Status AfterBackward(int64_t step, const void* grad) override;
  ElemRange BlockInFlight() const override { return held_; }
  absl::Status BeforeBlockUpdate(int64_t step) override;
  absl::Status AfterUpdate(const UpdateRecord& info, bool checkpoint_due) override;
  StepStats TakeStepStats() override;
  absl::Status Finish() override;
  bool in_flight() const override;
  size_t host_bytes() const override { return account_.bytes(); }
  size_t host_bytes_peak() const override { return account_.peak(); }
  size_t state_bytes() const override { return 3 * dev_.numel * sizeof(float); }
  EngineCounters counters() const override;
  int NextWindow() const override;
  WindowChoice NextWindowChoice() const override;
  size_t grad_bytes() const override { return dev_.numel * grad_elem_bytes_; }

 private:
  struct Window {
    int64_t s = 0;
    int k = 1;
    std::vector<size_t> bounds;  // k + 1 element offsets
    int submitted = 0;           // blocks whose copy was submitted
  };

  // Training thread.
  absl::Status Stall(const std::function<absl::Status()>& wait);
  // Waits for the copies of ticket t (0: all), with the copy-stall deadline
  // (SnapshotEngineOptions::copy_stall_timeout); WaitCopies counts the wait as stall.
  absl::Status AwaitCopies(CopyTicket t);
  absl::Status WaitCopies(CopyTicket t);
  // Registers a FULL of step `target` before the update's record reaches the worker.
  void RegisterFull(int64_t target);
  // Says an unfit automatic window once, traces the choice and counts it.
  void NoteWindowChoice(const WindowChoice& c);
  absl::Status StartFull(const UpdateRecord& info, int k);
  absl::StatusOr<CopyTicket> SubmitStateRange(size_t begin, size_t end, const char* label,
                                              std::optional<EngineEvent> on_landed);
  absl::Status CloseWindowEarly();
  int AcquireLogBuffer();
  void Push(EngineEvent e);
  HostStateRef Staged() const;

  // Worker thread (engine_worker.cc).
  void WorkerLoop();
  void Handle(EngineEvent& e);
  void HandleRecord(EngineEvent& e);
  void ReplayChunk(const EngineEvent& e);
  void EmitDelta(const EngineEvent& e);
  // Gives back a kGradDone event's buffer that no record took: the engine's, or the sink's.
  void FreeLogBuffer(const EngineEvent& e);
  void EmitFull(const EngineEvent& e);

  // Constant after Init.
  Device* const device_;
  const DeviceState dev_;
  const SnapshotEngineOptions opt_;
  SnapshotSink* const sink_;
  const size_t grad_elem_bytes_;
  size_t chunk_bytes_ = 0;  // copy chunk: opt_.chunk_bytes, smaller for small states
  HostMemoryAccount account_;
  std::unique_ptr<PinnedBuffer> staging_;  // params | m | v, numel floats each
  std::unique_ptr<StagingPool> pool_;
  std::vector<std::unique_ptr<PinnedBuffer>> log_bufs_;
  std::unique_ptr<CopyQueue> queue_;
  std::unique_ptr<ReplayPool> replay_;
  std::thread worker_;

  // Training thread only.
  std::optional<Window> win_;
  bool deferred_pending_ = false;
  bool finished_ = false;
  CopyTicket grad_ticket_ = 0;
  CopyTicket block_ticket_ = 0;
  // per_block_update_wait: the block whose copy the next BeforeBlockUpdate waits for, and the
  // gradient copy that AfterBackward prepared (its compute event recorded) and that is
  // submitted after that wait, so it does not overtake the block the update is waiting for.
  ElemRange held_;
  std::optional<CopyRequest> held_grad_;
  int64_t stall_ns_ = 0;
  int64_t last_step_ = -1;
  int64_t last_update_ns_ = 0;
  // Moving average of the time between updates, of steps without state copies (AfterUpdate).
  double compute_seconds_ = 0;
  int64_t last_update_us_ = 0, prev_update_us_ = 0;  // trace time of the last two updates
  // Copy bytes this step asked for, by kind (state blocks, replay gradients, gradient log).
  size_t step_state_bytes_ = 0, step_grad_bytes_ = 0, step_log_bytes_ = 0;
  bool unfit_said_ = false;
  bool state_copied_in_step_ = false;  // state was submitted since the last AfterUpdate began
  StepStats stats_;

  // Worker thread only.
  std::map<int64_t, std::shared_ptr<const UpdateRecord>> records_;
  std::deque<EngineEvent> parked_;  // events waiting for their update's record

  mutable absl::Mutex mu_;
  std::deque<EngineEvent> events_ ABSL_GUARDED_BY(mu_);
  bool full_in_flight_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<bool> log_free_ ABSL_GUARDED_BY(mu_);
  int64_t initial_base_ ABSL_GUARDED_BY(mu_) = -1;
  std::set<int64_t> full_targets_ ABSL_GUARDED_BY(mu_);  // FULL steps started, not failed
  std::vector<int64_t> completed_ ABSL_GUARDED_BY(mu_);
  EngineCounters counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_ENGINE_IMPL_H_
