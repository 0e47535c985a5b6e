// PersistGuard; see persist_guard.h.
#include "trainer/persist_guard.h"

#include <algorithm>

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

}  // namespace

bool IsPermanentStoreError(const absl::Status& s) {
  return absl::IsUnauthenticated(s) || absl::IsPermissionDenied(s) ||
         absl::IsInvalidArgument(s) || IsSuperseded(s);
}

bool IsFullDisk(const absl::Status& s) {
  // The server's backpressure (client/remote_rpc.h) heals by itself; a full disk does not.
  return absl::IsResourceExhausted(s) &&
         s.message().find("server busy") == absl::string_view::npos;
}

PersistGuard::PersistGuard(ShardStore* store, const CheckpointerOptions& options, int rank,
                           int64_t resumed_step, Clock* clock)
    : store_(store), options_(options), rank_(rank), clock_(ClockOrReal(clock)) {
  absl::MutexLock lock(&mu_);
  health_.recovery_point = resumed_step;
  recovery_ms_ = NowMs();
}

absl::StatusOr<bool> PersistGuard::AgreeToTry(bool have_data) {
  // Rank 0's clock alone decides the back-off: the agreement makes it every rank's decision.
  const bool backing_off = rank_ == 0 && backoff_ms_ > 0 && NowMs() < next_try_ms_;
  return store_->AllAgree(have_data && !backing_off);
}

void PersistGuard::NoteFailure(const absl::Status& s) {
  const int64_t longest = std::max<int64_t>(kFirstBackoffMs, options_.persist_timeout_ms);
  if (IsFullDisk(s)) {
    backoff_ms_ = longest;
  } else {
    backoff_ms_ = backoff_ms_ == 0 ? kFirstBackoffMs : std::min(longest, 2 * backoff_ms_);
  }
  next_try_ms_ = NowMs() + backoff_ms_;
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
                                   const std::function<absl::Status()>& work, bool have_data) {
  const bool full = kind == client::CheckpointKind::kFull;
  const int64_t chain = full ? step : base;
  if (!full && cut_.count(base) != 0) {
    absl::MutexLock lock(&mu_);
    ++health_.skipped;
    return absl::CancelledError(absl::StrCat("DELTA ", step, " skipped: the chain on FULL ",
                                             base, " was cut by an earlier failure"));
  }
  absl::StatusOr<bool> try_it = AgreeToTry(have_data);
  if (try_it.ok() && !*try_it) {
    cut_[chain] = true;
    absl::MutexLock lock(&mu_);
    ++health_.untried;
    return absl::CancelledError(absl::StrCat(
        full ? "FULL " : "DELTA ", step, " skipped untried: ",
        have_data ? "backing off after failed persists" : "a rank's persist backlog is full"));
  }
  // A failed agreement (the store's communicator) fails the persist like a failed save.
  absl::Status s = !try_it.ok() ? try_it.status()
                   : have_data  ? work()
                                : absl::InternalError("no data kept for the persist");
  absl::StatusOr<bool> all = try_it.ok() ? store_->AllAgree(s.ok()) : try_it;
  const bool ok = all.ok() && *all;
  if (ok) {
    backoff_ms_ = 0;
    // The store answers again: roll back what failed while it did not.
    if (!pending_aborts_.empty()) RetryRollBacks();
    absl::MutexLock lock(&mu_);
    ++(full ? health_.fulls : health_.deltas);
    if (step > health_.recovery_point) {
      health_.recovery_point = step;
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
  NoteFailure(s);
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
  ++health_.failures;
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
  CheckpointHealth h = health_;
  h.recovery_age_s =
      h.recovery_point >= 0 ? static_cast<double>(NowMs() - recovery_ms_) / 1000.0 : 0.0;
  return h;
}

absl::Status PersistGuard::fatal() const {
  absl::MutexLock lock(&mu_);
  return fatal_;
}

}  // namespace trainer
}  // namespace gradsnap
