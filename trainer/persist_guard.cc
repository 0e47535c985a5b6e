// PersistGuard; see persist_guard.h.
#include "trainer/persist_guard.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/status.h"

namespace gradsnap {
namespace trainer {
namespace {

bool IsTransient(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

int64_t NowMs() { return MonotonicNanos() / 1000000; }

}  // namespace

bool IsPermanentStoreError(const absl::Status& s) {
  return absl::IsUnauthenticated(s) || absl::IsPermissionDenied(s) ||
         absl::IsInvalidArgument(s) || IsSuperseded(s);
}

PersistGuard::PersistGuard(ShardStore* store, const CheckpointerOptions& options, int rank,
                           int64_t resumed_step)
    : store_(store), options_(options), rank_(rank) {
  absl::MutexLock lock(&mu_);
  recovery_point_ = resumed_step;
  recovery_ms_ = NowMs();
}

absl::Status PersistGuard::RunWithRetry(const std::function<absl::Status()>& work) {
  const int64_t deadline = NowMs() + std::max<int64_t>(0, options_.persist_timeout_ms);
  int64_t backoff_ms = 100;
  for (;;) {
    absl::Status s = work();
    // Funneled saves are collective: a retry on one rank alone would break the protocol.
    if (s.ok() || !IsTransient(s) || store_->collective_saves()) return s;
    if (NowMs() + backoff_ms > deadline) return s;
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min<int64_t>(1000, backoff_ms * 2);
  }
}

void PersistGuard::RollBack(int64_t step) {
  client::Client* c = store_->client();
  if (rank_ != 0 || c == nullptr) return;
  // With this attempt's epoch: a zombie of an older attempt never aborts the new one's step.
  absl::Status s = c->AbortCheckpoint(options_.job, step, store_->epoch());
  // NOT_FOUND: nothing was begun; FAILED_PRECONDITION: it did commit after all (kept).
  if (!s.ok() && IsTransient(s)) pending_aborts_.push_back(step);
}

void PersistGuard::RetryRollBacks() {
  std::vector<int64_t> steps;
  steps.swap(pending_aborts_);
  for (int64_t step : steps) RollBack(step);
}

void PersistGuard::QueueRollBack(int64_t step) {
  if (rank_ == 0 && store_->client() != nullptr) pending_aborts_.push_back(step);
}

absl::Status PersistGuard::Persist(client::CheckpointKind kind, int64_t step, int64_t base,
                                   const std::function<absl::Status()>& work) {
  const bool full = kind == client::CheckpointKind::kFull;
  const int64_t chain = full ? step : base;
  if (!full && cut_.count(base) != 0) {
    absl::MutexLock lock(&mu_);
    ++skipped_;
    return absl::CancelledError(absl::StrCat("DELTA ", step, " skipped: the chain on FULL ",
                                             base, " was cut by an earlier failure"));
  }
  absl::Status s = RunWithRetry(work);
  absl::StatusOr<bool> all = store_->AllAgree(s.ok());
  const bool ok = all.ok() && *all;
  if (ok) {
    // The store answers again: roll back what failed while it did not.
    if (!pending_aborts_.empty()) RetryRollBacks();
    absl::MutexLock lock(&mu_);
    if (step > recovery_point_) {
      recovery_point_ = step;
      auto it = step_end_ms_.find(step);
      recovery_ms_ = it != step_end_ms_.end() ? it->second : NowMs();
    }
    return absl::OkStatus();
  }
  if (s.ok()) {
    s = all.ok() ? absl::UnavailableError("the persist failed on another rank") : all.status();
  }
  s = Annotate(s, absl::StrCat("persist ", full ? "FULL " : "DELTA ", step));
  cut_[chain] = true;
  // A superseded attempt leaves the store alone: the newer attempt may be writing this step.
  // While the store does not answer, the roll-back waits for the next successful persist
  // instead of adding another round of retries to this one.
  if (IsTransient(s)) {
    QueueRollBack(step);
  } else if (!IsSuperseded(s)) {
    RollBack(step);
  }
  bool fatal = IsPermanentStoreError(s) || options_.stop_on_failure;
  // A permanent error on one rank stops every rank the same way (exit 2, no restart), not by
  // the collectives failing after the first one exits.
  absl::StatusOr<bool> none_fatal = store_->AllAgree(!fatal);
  if (!fatal && none_fatal.ok() && !*none_fatal) {
    fatal = true;
    s = absl::FailedPreconditionError(
        absl::StrCat(s.message(), "; another rank hit a permanent error and stops the job"));
  }
  if (!fatal) GS_LOG(WARNING) << "checkpointing degraded (training continues): " << s;
  absl::MutexLock lock(&mu_);
  ++failures_;
  if (fatal && fatal_.ok()) fatal_ = s;
  return s;
}

void PersistGuard::NoteStepEnd(int64_t step) {
  absl::MutexLock lock(&mu_);
  last_step_ = step;
  step_end_ms_[step] = NowMs();
  // Persists lag a few steps behind; keep a bounded window of end times.
  while (step_end_ms_.size() > 4096) step_end_ms_.erase(step_end_ms_.begin());
}

CheckpointHealth PersistGuard::health() const {
  absl::MutexLock lock(&mu_);
  CheckpointHealth h;
  h.failures = failures_;
  h.skipped = skipped_;
  h.recovery_point = recovery_point_;
  h.recovery_age_s =
      recovery_point_ >= 0 ? static_cast<double>(NowMs() - recovery_ms_) / 1000.0 : 0.0;
  return h;
}

absl::Status PersistGuard::fatal() const {
  absl::MutexLock lock(&mu_);
  return fatal_;
}

}  // namespace trainer
}  // namespace gradsnap
