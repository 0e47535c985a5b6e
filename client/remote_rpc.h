// gRPC plumbing of the remote client back end: one channel and stub per storage node, call
// contexts carrying the bearer token and deadline, and retry with exponential backoff.
//
// Retried: UNAVAILABLE (node down or restarting), ABORTED (another stream holds the shard) and
// RESOURCE_EXHAUSTED whose message starts with "server busy" (backpressure). Everything else is
// returned at once; DATA_LOSS in particular is never retried.
//
// Header-only. Node is safe to share between threads: its stub is swapped under a mutex when
// the node is reconnected, and gRPC stubs themselves are thread-safe.
#ifndef GRADSNAP_CLIENT_REMOTE_RPC_H_
#define GRADSNAP_CLIENT_REMOTE_RPC_H_

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "proto/convert.h"
#include "proto/tls.h"
#include "proto/transport.h"
#include "proto/gradsnap.grpc.pb.h"

namespace gradsnap {
namespace client {
namespace remote {

// TLS is on when the client has the servers' CA; a certificate then adds mutual TLS.
inline absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const TlsFiles& tls) {
  if (tls.ca_file.empty()) {
    if (!tls.cert_file.empty() || !tls.key_file.empty()) {
      return absl::InvalidArgumentError("a client certificate needs tls.ca_file (TLS)");
    }
    return grpc::InsecureChannelCredentials();
  }
  auto pem = proto::ReadTlsPem(tls);
  if (!pem.ok()) return pem.status();
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = std::move(pem->ca);
  ssl.pem_cert_chain = std::move(pem->cert);
  ssl.pem_private_key = std::move(pem->key);
  return grpc::SslCredentials(ssl);
}

inline std::shared_ptr<grpc::Channel> MakeChannel(
    const std::string& endpoint, const std::shared_ptr<grpc::ChannelCredentials>& creds) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(proto::kMaxMessageBytes));
  args.SetMaxSendMessageSize(static_cast<int>(proto::kMaxMessageBytes));
  // Reconnect quickly after a node restarts (gRPC's default first backoff is 1 s, up to 120 s).
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS stays at its default: it is also the connect timeout, and
  // a small one fails handshakes on a loaded machine.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // One connection per node and client object, not shared with other clients in the process.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  for (const auto& [name, value] : proto::TransportArgs()) args.SetInt(name, value);
  return grpc::CreateCustomChannel(endpoint, creds, args);
}

// One storage node: its endpoint, `connections` channels (each its own TCP connection) that
// can be rebuilt, and a stub on the first for unary calls.
class Node {
 public:
  Node(std::string endpoint, std::shared_ptr<grpc::ChannelCredentials> creds, int connections)
      : endpoint(std::move(endpoint)), creds_(std::move(creds)),
        channels_(static_cast<size_t>(std::max(1, connections))) {
    Reset();
  }
  // The current stub; callers hold the shared_ptr for the duration of a call.
  std::shared_ptr<gradsnap::v1::Storage::Stub> stub() {
    absl::MutexLock lock(&mu_);
    return stub_;
  }
  // The channel for a bulk stream (Write, Read): the node's connections in turn, so
  // concurrent streams spread over them. One HTTP/2 connection moves its streams' bytes
  // through one socket, written and read by one thread at a time on each side; several let
  // both cores of a small host copy at once (ClientOptions::connections_per_node).
  std::shared_ptr<grpc::Channel> stream_channel() {
    absl::MutexLock lock(&mu_);
    return channels_[next_++ % channels_.size()];
  }
  // Called before retrying after UNAVAILABLE: asks the channels to connect now and, when that
  // keeps failing, replaces them (a channel in transient failure may otherwise wait out its
  // own reconnect backoff after the node is already back).
  void OnUnavailable() {
    absl::MutexLock lock(&mu_);
    if (++unavailable_ % 3 == 0) {
      ResetLocked();
    } else {
      for (const auto& c : channels_) c->GetState(/*try_to_connect=*/true);
    }
  }

  const std::string endpoint;

 private:
  void Reset() {
    absl::MutexLock lock(&mu_);
    ResetLocked();
  }
  void ResetLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto& c : channels_) c = MakeChannel(endpoint, creds_);
    stub_ = gradsnap::v1::Storage::NewStub(channels_[0]);
  }

  const std::shared_ptr<grpc::ChannelCredentials> creds_;
  absl::Mutex mu_;
  std::vector<std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
  size_t next_ ABSL_GUARDED_BY(mu_) = 0;
  std::shared_ptr<gradsnap::v1::Storage::Stub> stub_ ABSL_GUARDED_BY(mu_);
  int unavailable_ ABSL_GUARDED_BY(mu_) = 0;
};

inline std::unique_ptr<Node> MakeNode(const std::string& endpoint,
                                      const std::shared_ptr<grpc::ChannelCredentials>& creds,
                                      int connections) {
  return std::make_unique<Node>(endpoint, creds, connections);
}

// Cancellation of the calls one thread makes (the cluster client's straggling upload of a
// copy it no longer waits for): while a CancelScope naming a Canceller is active on a thread,
// each call it starts (CallGuard) is registered there; Cancel() cancels those in flight
// (grpc::ClientContext::TryCancel: the call ends with CANCELLED, which is never retried) and
// makes the thread's later calls fail the same way at once, and its backoffs return at once.
class Canceller {
 public:
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
  }
  bool cancelled() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }
  // The canceller of this thread's calls (null: none).
  static Canceller*& Current() {
    thread_local Canceller* current = nullptr;
    return current;
  }

 private:
  friend class CallGuard;
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
};

class CancelScope {
 public:
  explicit CancelScope(Canceller* c) : previous_(Canceller::Current()) { Canceller::Current() = c; }
  ~CancelScope() { Canceller::Current() = previous_; }
  CancelScope(const CancelScope&) = delete;
  CancelScope& operator=(const CancelScope&) = delete;

 private:
  Canceller* const previous_;
};

// Registers a call's context with this thread's canceller, if any, for the call's lifetime
// (declared after the context, so it goes first); a canceller that fired already cancels the
// call before it starts.
class CallGuard {
 public:
  explicit CallGuard(grpc::ClientContext* ctx) : c_(Canceller::Current()), ctx_(ctx) {
    if (c_ == nullptr) return;
    absl::MutexLock lock(&c_->mu_);
    if (c_->cancelled_) ctx_->TryCancel();
    c_->calls_.push_back(ctx_);
  }
  ~CallGuard() {
    if (c_ == nullptr) return;
    absl::MutexLock lock(&c_->mu_);
    c_->calls_.erase(std::find(c_->calls_.begin(), c_->calls_.end(), ctx_));
  }
  CallGuard(const CallGuard&) = delete;
  CallGuard& operator=(const CallGuard&) = delete;

 private:
  Canceller* const c_;
  grpc::ClientContext* const ctx_;
};

// Fills a context: token metadata and, when deadline_ms > 0, a deadline.
inline void PrepareContext(grpc::ClientContext* ctx, const ClientOptions& o, int deadline_ms) {
  if (!o.token.empty()) ctx->AddMetadata("authorization", absl::StrCat("Bearer ", o.token));
  if (deadline_ms > 0) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  }
}

// Whether a call that failed with `s` may be made again (every call of this protocol is
// idempotent or resumes: docs/protocol.md, "Status codes").
inline bool IsRetryable(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:
      return true;
    case absl::StatusCode::kResourceExhausted:
      return absl::StartsWith(s.message(), "server busy");
    case absl::StatusCode::kInternal:
      // The stream was reset under the call (HTTP/2 RST_STREAM, which gRPC reports as INTERNAL):
      // seen when the server ended an upload early (e.g. "server busy") while the client was
      // still sending, so the reset reached the client before the server's status. A transport
      // failure like UNAVAILABLE; any other INTERNAL is returned at once.
      return absl::StrContains(s.message(), "RST_STREAM");
    default:
      return false;
  }
}

// Waits on o.clock (the real clock when null) before retry number `attempt` (1-based): 50 ms
// doubling to 2 s, with +-25% jitter.
inline void Backoff(const ClientOptions& o, int attempt) {
  if (Canceller::Current() != nullptr && Canceller::Current()->cancelled()) return;
  double ms = std::min(2000.0, 50.0 * static_cast<double>(1 << std::min(attempt - 1, 10)));
  thread_local std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<double> jitter(0.75, 1.25);
  ClockOrReal(o.clock)->SleepForMillis(static_cast<int64_t>(ms * jitter(rng)));
}

// Runs fn() up to o.max_attempts times while it fails with a retryable code, with Backoff
// between attempts; node (may be null) hears about UNAVAILABLE before each retry.
template <typename Fn>
absl::Status WithRetry(const ClientOptions& o, Node* node, Fn&& fn) {
  absl::Status s;
  for (int attempt = 1; attempt <= std::max(1, o.max_attempts); ++attempt) {
    if (attempt > 1) {
      if (node != nullptr && s.code() == absl::StatusCode::kUnavailable) node->OnUnavailable();
      Backoff(o, attempt - 1);
    }
    s = fn();
    if (s.ok() || !IsRetryable(s)) return s;
  }
  return s;
}

// Whether a call that failed with `s` may have run on the server, its answer lost: a stream
// reset or a connection broken under the call. Not a connection that was never made ("failed
// to connect", "Connection refused") nor the server's own refusal ("shutting down"), where the
// request certainly did not run.
inline bool MayHaveRun(const absl::Status& s) {
  if (absl::IsInternal(s)) return absl::StrContains(s.message(), "RST_STREAM");
  if (!absl::IsUnavailable(s)) return false;
  for (const char* never_sent : {"failed to connect", "onnection refused", "shutting down",
                                 "DNS resolution failed", "Name resolution"}) {
    if (absl::StrContains(s.message(), never_sent)) return false;
  }
  return true;
}

// WithRetry for a call that removes something (Delete): NOT_FOUND from an attempt made after
// one that may have run (MayHaveRun) is that earlier attempt's removal, and OK. NOT_FOUND from
// the first attempt, or after attempts that never reached the server or that it refused,
// stays NOT_FOUND.
template <typename Fn>
absl::Status WithRetryRemoving(const ClientOptions& o, Node* node, Fn&& fn) {
  bool may_have_run = false;
  return WithRetry(o, node, [&]() -> absl::Status {
    absl::Status s = fn();
    if (absl::IsNotFound(s) && may_have_run) return absl::OkStatus();
    if (MayHaveRun(s)) may_have_run = true;
    return s;
  });
}

}  // namespace remote
}  // namespace client
}  // namespace gradsnap

#endif  // GRADSNAP_CLIENT_REMOTE_RPC_H_
