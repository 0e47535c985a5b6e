// IdleWatch: cancels streaming calls whose client stops taking part (--stream-idle-ms).
//
// Keepalive (--keepalive-ms) ends calls of a client that is gone or frozen below gRPC; a
// client whose process is alive but does nothing (a malicious one, one wedged above gRPC
// without a deadline) answers the pings and would hold its shard and its share of the upload
// or read budget for as long as it likes. Each Write and Read call registers a Scope and says
// when it waits on the client (Waiting): for an upload's next message, or for a download's
// client to take the next one (flow control holding the server's write). A call that has
// waited `limit` is cancelled (ServerContext::TryCancel); an upload's handler then flushes
// what arrived (resumable). Time the server spends on its own (waiting for budget, reading
// the disk, flushing) does not count.
//
// THREAD SAFETY: thread-safe. A Scope must end before its call does (the watch holds the
// context pointer only while the Scope lives).
#ifndef GRADSNAP_SERVICE_IDLE_WATCH_H_
#define GRADSNAP_SERVICE_IDLE_WATCH_H_

#include <cstdint>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server_context.h"

namespace gradsnap {
namespace service {

class IdleWatch {
 public:
  // A limit of zero or less watches nothing (no thread).
  explicit IdleWatch(absl::Duration limit);
  ~IdleWatch();  // Not copyable (owns its thread and mutex).

  class Scope {
   public:
    Scope(IdleWatch* watch, grpc::ServerContext* ctx);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;
    // Runs `wait` (a stream Read or Write: the call waits on the client, for its next message
    // or for room to send it one) with the idle clock running; returns what it returns.
    template <typename Fn>
    bool WhileWaiting(Fn&& wait) {
      Waiting(true);
      const bool done = wait();
      Waiting(false);
      return done;
    }

   private:
    void Waiting(bool waiting);

    IdleWatch* const watch_;
    grpc::ServerContext* const ctx_;
  };

 private:
  struct Entry {
    absl::Time waiting_since = absl::InfiniteFuture();  // InfiniteFuture: not waiting
    bool cancelled = false;
  };
  void Loop();

  const absl::Duration limit_;
  mutable absl::Mutex mu_;
  std::map<grpc::ServerContext*, Entry> calls_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace service
}  // namespace gradsnap

#endif  // GRADSNAP_SERVICE_IDLE_WATCH_H_
