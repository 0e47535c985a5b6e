// The host memory that checkpoints wait in for the store (docs/trainer.md, "When checkpointing
// fails"): the snapshot checkpointer copies each FULL snapshot and DELTA record it is handed
// into memory of its own, so the snapshot engine's buffers (and the training step that waits
// for them) are free again at once, and persists them from there, one at a time, in order.
// The memory is bounded by a budget (--ckpt-backlog-bytes): a record that does not fit is not
// kept, and its checkpoint is skipped on every rank (PersistGuard::Persist, `have_data`).
//
// THREAD SAFETY: thread-safe.
#ifndef GRADSNAP_TRAINER_PERSIST_BACKLOG_H_
#define GRADSNAP_TRAINER_PERSIST_BACKLOG_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace gradsnap {
namespace trainer {

// The DELTAs that the automatic budget holds beside one FULL, and its floor (small models:
// a store that is merely slower than a checkpoint every step does not make them skip).
constexpr uint64_t kBacklogAutoDeltas = 8;
constexpr uint64_t kBacklogAutoMinBytes = 64ull << 20;

// --ckpt-backlog-bytes: "auto" (0) or a positive byte count, optionally with a binary suffix
// K, M or G (KiB, MiB, GiB). Anything else (0, negative, garbage, overflow) is an error naming
// the flag and the value.
absl::StatusOr<uint64_t> ParseBacklogBytes(absl::string_view value);

// The automatic budget: one FULL shard of this rank plus kBacklogAutoDeltas DELTA records
// (DELTAs only with the gradient log), at least kBacklogAutoMinBytes.
uint64_t AutoBacklogBytes(uint64_t full_bytes, uint64_t delta_bytes, bool grad_log);

class PersistBacklog {
 public:
  explicit PersistBacklog(uint64_t budget) : budget_(budget) {}
  // Reserves `bytes` when they fit within the budget beside what is held; false (and nothing
  // reserved) otherwise.
  bool TryReserve(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  void Release(uint64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t budget() const { return budget_; }
  // What is held now, and the most that was held at once.
  struct Usage {
    uint64_t used = 0;
    uint64_t peak = 0;
  };
  Usage usage() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const uint64_t budget_;
  mutable absl::Mutex mu_;
  Usage usage_ ABSL_GUARDED_BY(mu_);
};

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_PERSIST_BACKLOG_H_
