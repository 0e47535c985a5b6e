#include "service/idle_watch.h"

#include <algorithm>
#include <system_error>

#include "common/logging.h"

namespace gradsnap {
namespace service {

IdleWatch::IdleWatch(absl::Duration limit) : limit_(limit) {
  if (limit_ <= absl::ZeroDuration()) return;
  try {
    thread_ = std::thread([this] { Loop(); });
  } catch (const std::system_error& e) {
    GS_LOG(ERROR) << "stream idle watch not started (" << e.what() << "): idle streams are "
                  << "ended only by keepalive and their deadlines";
  }
}

IdleWatch::~IdleWatch() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

IdleWatch::Scope::Scope(IdleWatch* watch, grpc::ServerContext* ctx) : watch_(watch), ctx_(ctx) {
  if (!watch_->thread_.joinable()) return;
  absl::MutexLock lock(&watch_->mu_);
  watch_->calls_[ctx_] = Entry{};
}

IdleWatch::Scope::~Scope() {
  if (!watch_->thread_.joinable()) return;
  absl::MutexLock lock(&watch_->mu_);
  watch_->calls_.erase(ctx_);
}

void IdleWatch::Scope::Waiting(bool waiting) {
  if (!watch_->thread_.joinable()) return;
  absl::MutexLock lock(&watch_->mu_);
  auto it = watch_->calls_.find(ctx_);
  if (it != watch_->calls_.end()) {
    it->second.waiting_since = waiting ? absl::Now() : absl::InfiniteFuture();
  }
}

void IdleWatch::Loop() {
  // Checks a few times per limit (at most once a second): a call is cancelled between limit
  // and limit plus one period after its last message.
  const absl::Duration period = std::min(absl::Seconds(1), limit_ / 4);
  absl::MutexLock lock(&mu_);
  for (;;) {
    auto stopped = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
    if (mu_.AwaitWithTimeout(absl::Condition(&stopped), period)) return;
    const absl::Time now = absl::Now();
    for (auto& [ctx, e] : calls_) {
      if (e.cancelled || now - e.waiting_since < limit_) continue;
      GS_LOG(WARNING) << "stream of " << ctx->peer() << " idle for "
                      << absl::FormatDuration(now - e.waiting_since)
                      << ": cancelled (--stream-idle-ms)";
      ctx->TryCancel();  // the call's handler ends it; its Scope then leaves calls_
      e.cancelled = true;
    }
  }
}

}  // namespace service
}  // namespace gradsnap
