// EtcdClient: the small client of etcd's v3 gRPC API that cluster mode stands on
// (cluster/etcd/rpc.proto, docs/protocol.md "Cluster mode"). Keys and values are bytes.
//
// OVERVIEW
//   One gRPC channel per etcd member endpoint. A call goes to the member that answered last and,
//   when that member is unreachable (UNAVAILABLE, or no answer within rpc_timeout_ms), to the
//   next one, each tried once per call: a dead member changes nothing while a quorum lives.
//   Writes retried on another member are idempotent by construction (Put of the same value,
//   transactions whose compares fail the second time; callers re-read). Watches run on a thread
//   of their own and reconnect (to any member) from the revision after the last one delivered.
//
// SECURITY
//   https:// endpoints: TLS towards every member (EtcdOptions::tls_files: etcd's CA, and a
//   client certificate where etcd runs with --client-cert-auth). A user and password
//   (EtcdOptions::user, password): the client authenticates (Auth.Authenticate) before its
//   first call and sends the token etcd gave as the gRPC metadata "token" with every call and
//   watch; a token etcd no longer knows (UNAUTHENTICATED: expired, or etcd restarted) is
//   replaced by authenticating again, once per call. With TLS, gRPC's own log lines (a refused
//   handshake logs several) go to gradsnap's log at DEBUG, process-wide: the failure reaches the
//   caller as one status line.
//
// ERROR HANDLING
//   Every failure is an absl::Status naming etcd and the endpoint: UNAVAILABLE when no member
//   answered in time (etcd down, quorum lost: etcd itself answers "no leader" or times out);
//   other codes as etcd sends them (NOT_FOUND "requested lease not found", ...).
//
// THREAD SAFETY
//   All methods may be called from any thread; a watch's callback runs on its own thread.
#ifndef GRADSNAP_CLUSTER_ETCD_CLIENT_H_
#define GRADSNAP_CLUSTER_ETCD_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cluster/etcd/rpc.grpc.pb.h"
#include "gradsnap/tls.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"

namespace gradsnap {
namespace cluster {

// "host:port,host:port" with an optional "http://" or "https://" before each (etcd's own
// spelling of client URLs): the endpoints as "host:port"; *tls (when not null) says whether
// they are https://. INVALID_ARGUMENT with one line naming the bad entry for anything else
// (empty, no port, port out of 1..65535, duplicates, http:// and https:// mixed).
absl::StatusOr<std::vector<std::string>> ParseEtcdEndpoints(const std::string& text,
                                                            bool* tls = nullptr);

struct EtcdOptions {
  // "host:port" of each etcd member (ParseEtcdEndpoints). Required.
  std::vector<std::string> endpoints;
  // Deadline of each attempt of a call on one member. Default: 3000.
  int rpc_timeout_ms = 3000;
  // 0: a call tries each member once (one pass), each for rpc_timeout_ms. > 0: a call goes on
  // trying the members, pass after pass (at most one pass per 50 ms), until this many ms have
  // passed; the first 3 passes give each attempt rpc_timeout_ms, every later one twice the
  // pass before (never past the call's end). Short first deadlines get a request past members
  // that will never answer it (followers whose forwarded proposals died with the leader) soon
  // after a new leader is elected; the longer later ones still let a slow answer (a large
  // listing) through. Default: 0.
  int call_timeout_ms = 0;
  // TLS towards etcd (https:// endpoints). Default: false (plaintext).
  bool tls = false;
  // With tls (the flags --etcd-ca, --etcd-cert, --etcd-key): ca_file, the CA etcd's
  // certificates chain to (empty: the system's roots); cert_file and key_file, this client's
  // certificate and key, set together (for etcd's --client-cert-auth). Without tls they must
  // be empty. Default: all empty.
  TlsFiles tls_files;
  // etcd's user authentication (--etcd-user): the user and its password, set together.
  // Default: empty (no authentication).
  std::string user;
  std::string password;
};

// INVALID_ARGUMENT, one line naming the flags, when `o`'s security settings do not fit
// together (TLS files without https://, a certificate without its key, a user without a
// password or the other way round). EtcdClient::Create checks this too.
absl::Status CheckEtcdSecurity(const EtcdOptions& o);

// The password of --etcd-user: the first line of `password_file` when it is set (the file must
// exist and hold one), else the environment variable GRADSNAP_ETCD_PASSWORD, else "". Never
// from the command line, where other users of the host could read it. Errors name the file.
absl::StatusOr<std::string> ReadEtcdPassword(const std::string& password_file);
// EtcdOptions from the values of the --etcd* flags (gradsnap-server, gradsnap-train, the CLI):
// the endpoints parsed, the password read (ReadEtcdPassword) when there is a user, and
// CheckEtcdSecurity. INVALID_ARGUMENT, one line.
absl::StatusOr<EtcdOptions> EtcdOptionsFromFlags(const std::string& endpoints, const TlsFiles& tls,
                                                 const std::string& user,
                                                 const std::string& password_file);
// The environment variable ReadEtcdPassword reads.
inline constexpr char kEtcdPasswordEnv[] = "GRADSNAP_ETCD_PASSWORD";

struct EtcdKv {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct EtcdEvent {
  bool deleted = false;  // DELETE (kv.key only), else PUT
  EtcdKv kv;
};

// The end of the range holding every key that starts with `prefix` (etcd's "prefix + 1").
std::string PrefixEnd(const std::string& prefix);

class EtcdWatch;

class EtcdClient {
 public:
  // Makes the channels; connects lazily (the first call says whether etcd is reachable).
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(const EtcdOptions& options);
  ~EtcdClient();

  // The key's value: NOT_FOUND when it is absent.
  absl::StatusOr<EtcdKv> Get(const std::string& key);
  // Every key starting with `prefix`, sorted by key; *revision: the store's revision then.
  absl::StatusOr<std::vector<EtcdKv>> GetPrefix(const std::string& prefix,
                                                int64_t* revision = nullptr);
  // Returns the store's revision after the put. `lease` 0: none.
  absl::StatusOr<int64_t> Put(const std::string& key, const std::string& value,
                              int64_t lease = 0);
  // Returns how many keys were deleted.
  absl::StatusOr<int64_t> Delete(const std::string& key);
  absl::StatusOr<int64_t> DeletePrefix(const std::string& prefix);
  absl::StatusOr<etcdserverpb::TxnResponse> Txn(const etcdserverpb::TxnRequest& txn);

  // A new lease of `ttl_s` seconds: its id and the TTL etcd granted.
  struct Lease {
    int64_t id = 0;
    int64_t ttl_s = 0;
  };
  absl::StatusOr<Lease> GrantLease(int64_t ttl_s);
  // One keep-alive: the lease's TTL from now as etcd answers it; <= 0 when the lease has
  // expired or was revoked (its keys are gone). `member_timeout_ms` > 0: the deadline on each
  // member instead of rpc_timeout_ms (a member waiting for a new leader is left sooner).
  absl::StatusOr<int64_t> KeepAliveOnce(int64_t lease, int member_timeout_ms = 0);
  absl::Status RevokeLease(int64_t lease);

  // Watches every key starting with `prefix` from `start_revision` (0: from now). `on_events`
  // gets each batch in revision order with the revision of its last event. The watch
  // reconnects by itself; when its history was compacted away it calls `on_events` with
  // compacted = true and no events (the caller re-reads the prefix) and resumes from the
  // revision etcd names. Stops when the returned object is destroyed.
  using WatchCallback =
      std::function<void(const std::vector<EtcdEvent>& events, int64_t revision, bool compacted)>;
  std::unique_ptr<EtcdWatch> WatchPrefix(const std::string& prefix, int64_t start_revision,
                                         WatchCallback on_events);

  // "host:port,host:port" for messages.
  const std::string& endpoints_text() const { return endpoints_text_; }
  int rpc_timeout_ms() const { return options_.rpc_timeout_ms; }

 private:
  friend class EtcdWatch;
  struct Member {
    std::string endpoint;
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Auth::Stub> auth;
  };
  EtcdClient(const EtcdOptions& options, const std::shared_ptr<grpc::ChannelCredentials>& creds);

  // With a user: the token to send on `m` ("" without authentication). `stale`: a token etcd
  // refused; unless another call replaced it already, the client authenticates again (on `m`).
  absl::StatusOr<std::string> Token(Member& m, const std::string& stale = "");
  // Sets the call's deadline (`deadline_ms` from now) and, with a user, its token
  // (authenticating first when needed); returns the token ("" without a user).
  absl::StatusOr<std::string> Prepare(Member& m, grpc::ClientContext* ctx, int deadline_ms,
                                      const std::string& stale = "");

  // Runs `call` on the members in turn, from the last one that answered, until one answers
  // (any status but UNAVAILABLE or DEADLINE_EXCEEDED): one pass, or passes until
  // call_timeout_ms (EtcdOptions). Each attempt's first deadline is `attempt_ms` (0:
  // rpc_timeout_ms). `what` names the call in errors.
  absl::Status OnAnyMember(const char* what,
                           const std::function<grpc::Status(Member&, grpc::ClientContext*)>& call,
                           int attempt_ms = 0);
  // Range and DeleteRange on any member; DeleteRange returns how many keys were deleted
  // (`range_end` empty: `key` alone).
  absl::StatusOr<etcdserverpb::RangeResponse> Range(const etcdserverpb::RangeRequest& req);
  absl::StatusOr<int64_t> DeleteRange(const std::string& key, const std::string& range_end);
  // The index of the member to try first.
  size_t Preferred() const { return preferred_.load(); }

  const EtcdOptions options_;
  std::string endpoints_text_;
  std::vector<std::unique_ptr<Member>> members_;
  std::atomic<size_t> preferred_{0};
  absl::Mutex token_mu_;
  std::string token_ ABSL_GUARDED_BY(token_mu_);
};

// A running watch (EtcdClient::WatchPrefix). Destroying it cancels the stream and joins its
// thread; the callback is not called after the destructor returns.
class EtcdWatch {
 public:
  EtcdWatch(EtcdClient* client, std::string prefix, int64_t start_revision,
            EtcdClient::WatchCallback on_events);
  ~EtcdWatch();
  EtcdWatch(const EtcdWatch&) = delete;
  EtcdWatch& operator=(const EtcdWatch&) = delete;

  // Waits until the first stream was created on a member (events after this are delivered);
  // false when that did not happen within `timeout_ms`.
  bool WaitCreated(int timeout_ms);

 private:
  void Run();
  // One stream on one member until it breaks or the watch stops.
  void RunStream(EtcdClient::Member& member);

  EtcdClient* const client_;
  const std::string prefix_;
  const EtcdClient::WatchCallback on_events_;
  int64_t next_revision_;  // the revision the next stream starts at (0: now); Run's thread only
  std::string refused_token_;  // the token etcd refused last; Run's thread only
  absl::Notification created_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* live_ ABSL_GUARDED_BY(mu_) = nullptr;  // the stream to cancel on stop
  std::thread thread_;
};

}  // namespace cluster
}  // namespace gradsnap

#endif  // GRADSNAP_CLUSTER_ETCD_CLIENT_H_
