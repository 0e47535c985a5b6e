// EtcdClient (etcd_client.h).
#include "cluster/etcd_client.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/logging.h"
#include "common/small_file.h"
#include "common/status.h"
#include "grpc/support/log.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/convert.h"
#include "proto/tls.h"

namespace gradsnap {
namespace cluster {

namespace pb = ::etcdserverpb;

absl::StatusOr<std::vector<std::string>> ParseEtcdEndpoints(const std::string& text,
                                                            bool* tls) {
  std::vector<std::string> out;
  if (text.empty()) return absl::InvalidArgumentError("--etcd: no endpoints (HOST:PORT[,...])");
  int https = 0, http = 0;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::string e(part);
    const std::string bad = absl::StrCat("--etcd: \"", e, "\" ");
    if (absl::StartsWith(e, "https://")) {
      e = e.substr(8);
      ++https;
    } else {
      if (absl::StartsWith(e, "http://")) e = e.substr(7);
      ++http;
    }
    if (!e.empty() && e.back() == '/') e.pop_back();
    const size_t colon = e.rfind(':');
    int port = 0;
    if (e.empty() || colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(absl::string_view(e).substr(colon + 1), &port) || port < 1 ||
        port > 65535 || e.find_first_of("/ ") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(bad, "is not [http[s]://]HOST:PORT (PORT 1..65535)"));
    }
    for (const std::string& o : out) {
      if (o == e) return absl::InvalidArgumentError(absl::StrCat(bad, "is named twice"));
    }
    out.push_back(std::move(e));
  }
  if (https > 0 && http > 0) {
    return absl::InvalidArgumentError(
        "--etcd: https:// and plaintext endpoints mixed (give every member as https://)");
  }
  if (tls != nullptr) *tls = https > 0;
  return out;
}

absl::Status CheckEtcdSecurity(const EtcdOptions& o) {
  const TlsFiles& t = o.tls_files;
  if (!o.tls && (!t.ca_file.empty() || !t.cert_file.empty() || !t.key_file.empty())) {
    return absl::InvalidArgumentError(
        "--etcd-ca, --etcd-cert and --etcd-key need https:// etcd endpoints");
  }
  if (t.cert_file.empty() != t.key_file.empty()) {
    return absl::InvalidArgumentError("--etcd-cert and --etcd-key go together");
  }
  if (o.user.empty() && !o.password.empty()) {
    return absl::InvalidArgumentError("an etcd password without --etcd-user");
  }
  if (!o.user.empty() && o.password.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--etcd-user ", o.user, " needs a password: --etcd-password-file FILE or $",
        kEtcdPasswordEnv));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadEtcdPassword(const std::string& password_file) {
  std::string text;
  if (!password_file.empty()) {
    ASSIGN_OR_RETURN(text, ReadSmallFile(password_file, "--etcd-password-file", 4096));
  } else if (const char* env = std::getenv(kEtcdPasswordEnv); env != nullptr) {
    text = env;
  }
  text = text.substr(0, text.find('\n'));
  if (!text.empty() && text.back() == '\r') text.pop_back();
  if (!password_file.empty() && text.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--etcd-password-file ", password_file, ": no password on its first line"));
  }
  return text;
}

absl::StatusOr<EtcdOptions> EtcdOptionsFromFlags(const std::string& endpoints, const TlsFiles& tls,
                                                 const std::string& user,
                                                 const std::string& password_file) {
  EtcdOptions o;
  ASSIGN_OR_RETURN(o.endpoints, ParseEtcdEndpoints(endpoints, &o.tls));
  o.tls_files = tls;
  o.user = user;
  ASSIGN_OR_RETURN(std::string password, ReadEtcdPassword(password_file));
  if (!user.empty()) o.password = std::move(password);
  RETURN_IF_ERROR(CheckEtcdSecurity(o));
  return o;
}

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    unsigned char c = static_cast<unsigned char>(end.back());
    if (c < 0xff) {
      end.back() = static_cast<char>(c + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

namespace {

EtcdKv FromPb(const pb::KeyValue& kv) {
  return {.key = kv.key(),
          .value = kv.value(),
          .create_revision = kv.create_revision(),
          .mod_revision = kv.mod_revision(),
          .version = kv.version(),
          .lease = kv.lease()};
}

// Passes over the members (EtcdOptions::call_timeout_ms): the least time between two, and
// how many give each attempt rpc_timeout_ms before the deadline doubles with every pass.
constexpr int kPassPauseMs = 50;
constexpr int kPassesAtFirstDeadline = 3;

bool TryNextMember(const grpc::Status& s) {
  // etcd answers a request whose deadline passed on the server side (the deadline travels with
  // the call: a linearizable read waiting for its leader, a proposal not applied in time) with
  // UNKNOWN "context deadline exceeded", not DEADLINE_EXCEEDED: the same thing.
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED ||
         (s.error_code() == grpc::StatusCode::UNKNOWN &&
          s.error_message().find("context deadline exceeded") != std::string::npos);
}

// gRPC's own log lines (a refused TLS handshake logs several at ERROR) into gradsnap's log at
// DEBUG: the failure reaches the caller as one status line, not as extra lines on stderr.
void GrpcLogToDebug(gpr_log_func_args* args) {
  GS_LOG(DEBUG) << "grpc " << args->file << ":" << args->line << ": " << args->message;
}

void SetDeadline(grpc::ClientContext* ctx, int ms) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
}

}  // namespace

EtcdClient::EtcdClient(const EtcdOptions& options,
                       const std::shared_ptr<grpc::ChannelCredentials>& creds)
    : options_(options) {
  endpoints_text_ = absl::StrJoin(options_.endpoints, ",");
  for (const std::string& e : options_.endpoints) {
    auto m = std::make_unique<Member>();
    m->endpoint = e;
    grpc::ChannelArguments args;
    // A member that went away is redialled soon after it is back (gRPC's default backs off to
    // two minutes). The minimum reconnect backoff, gRPC's connect timeout too, keeps its
    // default (20 s): lowered, a handshake on a busy host times out again and again.
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    m->channel = grpc::CreateCustomChannel(e, creds, args);
    m->kv = pb::KV::NewStub(m->channel);
    m->lease = pb::Lease::NewStub(m->channel);
    m->watch = pb::Watch::NewStub(m->channel);
    m->auth = pb::Auth::NewStub(m->channel);
    members_.push_back(std::move(m));
  }
}

EtcdClient::~EtcdClient() = default;

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(const EtcdOptions& options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoints");
  if (options.rpc_timeout_ms < 1) {
    return absl::InvalidArgumentError("etcd: rpc_timeout_ms must be >= 1");
  }
  RETURN_IF_ERROR(CheckEtcdSecurity(options));
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::InsecureChannelCredentials();
  if (options.tls) {
    static std::once_flag quiet;
    std::call_once(quiet, [] { gpr_set_log_function(GrpcLogToDebug); });
    ASSIGN_OR_RETURN(proto::TlsPem pem, proto::ReadTlsPem(options.tls_files));
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = std::move(pem.ca);  // empty: gRPC's default roots
    ssl.pem_cert_chain = std::move(pem.cert);
    ssl.pem_private_key = std::move(pem.key);
    creds = grpc::SslCredentials(ssl);
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(options, creds));
}

absl::StatusOr<std::string> EtcdClient::Token(Member& m, const std::string& stale) {
  if (options_.user.empty()) return std::string();
  absl::MutexLock lock(&token_mu_);
  if (!token_.empty() && token_ != stale) return token_;
  pb::AuthenticateRequest req;
  req.set_name(options_.user);
  req.set_password(options_.password);
  pb::AuthenticateResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.rpc_timeout_ms);
  grpc::Status s = m.auth->Authenticate(&ctx, req, &resp);
  if (!s.ok()) {
    absl::Status a = proto::FromGrpc(s);
    return absl::Status(a.code(), absl::StrCat("etcd ", m.endpoint, ": authenticate as user ",
                                               options_.user, ": ", a.message()));
  }
  token_ = resp.token();
  return token_;
}

absl::StatusOr<std::string> EtcdClient::Prepare(Member& m, grpc::ClientContext* ctx,
                                                int deadline_ms, const std::string& stale) {
  SetDeadline(ctx, deadline_ms);
  ASSIGN_OR_RETURN(std::string token, Token(m, stale));
  if (!token.empty()) ctx->AddMetadata("token", token);
  return token;
}

absl::Status EtcdClient::OnAnyMember(
    const char* what, const std::function<grpc::Status(Member&, grpc::ClientContext*)>& call,
    int attempt_ms) {
  const int64_t first_deadline_ms = attempt_ms > 0 ? attempt_ms : options_.rpc_timeout_ms;
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const Clock::time_point end = start + std::chrono::milliseconds(options_.call_timeout_ms);
  const size_t first = Preferred();
  std::vector<std::string> errors;
  for (int pass = 0;; ++pass) {
    errors.clear();
    const Clock::time_point pass_start = Clock::now();
    for (size_t k = 0; k < members_.size(); ++k) {
      int64_t deadline_ms = first_deadline_ms << std::clamp(pass - kPassesAtFirstDeadline, 0, 16);
      if (options_.call_timeout_ms > 0) {
        const int64_t left = std::chrono::duration_cast<std::chrono::milliseconds>(
                                 end - Clock::now()).count();
        if (left <= 0) break;
        deadline_ms = std::min(deadline_ms, left);
      }
      const size_t i = (first + k) % members_.size();
      Member& m = *members_[i];
      grpc::Status s;
      std::string sent;  // the token the call carried
      for (int attempt = 0; attempt < 2; ++attempt) {
        grpc::ClientContext ctx;
        absl::StatusOr<std::string> token =
            Prepare(m, &ctx, static_cast<int>(deadline_ms), sent);
        if (!token.ok()) {
          s = grpc::Status(static_cast<grpc::StatusCode>(token.status().code()),
                           std::string(token.status().message()));
          break;
        }
        sent = *token;
        // Fail fast on a member that is down rather than wait out the deadline on it.
        ctx.set_wait_for_ready(false);
        s = call(m, &ctx);
        // A token etcd no longer knows: authenticate again, once.
        if (s.error_code() != grpc::StatusCode::UNAUTHENTICATED || options_.user.empty()) break;
      }
      if (!TryNextMember(s)) {
        preferred_.store(i);
        if (s.ok()) return absl::OkStatus();
        absl::Status a = proto::FromGrpc(s);
        if (absl::StartsWith(a.message(), "etcd ")) return a;  // Token's, naming the member
        return absl::Status(a.code(), absl::StrCat("etcd ", m.endpoint, ": ", what, ": ",
                                                   a.message()));
      }
      errors.push_back(absl::StrCat(m.endpoint, ": ", s.error_message()));
    }
    if (options_.call_timeout_ms <= 0 || Clock::now() >= end) break;
    // Every member refused at once (all down, or no leader): a short pause, not a busy loop.
    const Clock::time_point pause = pass_start + std::chrono::milliseconds(kPassPauseMs);
    std::this_thread::sleep_until(std::min(pause, end));
  }
  return absl::UnavailableError(absl::StrCat(
      "etcd unreachable (", what, "): ", absl::StrJoin(errors, "; "),
      options_.tls ? " (over TLS: a certificate either side refuses fails like this too; "
                     "see --etcd-ca, --etcd-cert, --etcd-key)"
                   : ""));
}

absl::StatusOr<pb::RangeResponse> EtcdClient::Range(const pb::RangeRequest& req) {
  pb::RangeResponse resp;
  RETURN_IF_ERROR(OnAnyMember("range", [&](Member& m, grpc::ClientContext* ctx) {
    return m.kv->Range(ctx, req, &resp);
  }));
  return resp;
}

absl::StatusOr<EtcdKv> EtcdClient::Get(const std::string& key) {
  pb::RangeRequest req;
  req.set_key(key);
  ASSIGN_OR_RETURN(const pb::RangeResponse resp, Range(req));
  if (resp.kvs_size() == 0) return absl::NotFoundError(absl::StrCat("etcd: no key ", key));
  return FromPb(resp.kvs(0));
}

absl::StatusOr<std::vector<EtcdKv>> EtcdClient::GetPrefix(const std::string& prefix,
                                                          int64_t* revision) {
  pb::RangeRequest req;
  req.set_key(prefix);
  req.set_range_end(PrefixEnd(prefix));
  req.set_sort_order(pb::RangeRequest::ASCEND);
  req.set_sort_target(pb::RangeRequest::KEY);
  ASSIGN_OR_RETURN(const pb::RangeResponse resp, Range(req));
  std::vector<EtcdKv> out;
  for (const auto& kv : resp.kvs()) out.push_back(FromPb(kv));
  if (revision != nullptr) *revision = resp.header().revision();
  return out;
}

absl::StatusOr<int64_t> EtcdClient::Put(const std::string& key, const std::string& value,
                                        int64_t lease) {
  pb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  req.set_lease(lease);
  pb::PutResponse resp;
  RETURN_IF_ERROR(OnAnyMember("put", [&](Member& m, grpc::ClientContext* ctx) {
    return m.kv->Put(ctx, req, &resp);
  }));
  return resp.header().revision();
}

absl::StatusOr<int64_t> EtcdClient::Delete(const std::string& key) {
  return DeleteRange(key, /*range_end=*/"");
}

absl::StatusOr<int64_t> EtcdClient::DeletePrefix(const std::string& prefix) {
  return DeleteRange(prefix, PrefixEnd(prefix));
}

absl::StatusOr<int64_t> EtcdClient::DeleteRange(const std::string& key,
                                                const std::string& range_end) {
  pb::DeleteRangeRequest req;
  req.set_key(key);
  if (!range_end.empty()) req.set_range_end(range_end);
  pb::DeleteRangeResponse resp;
  RETURN_IF_ERROR(OnAnyMember("delete", [&](Member& m, grpc::ClientContext* ctx) {
    return m.kv->DeleteRange(ctx, req, &resp);
  }));
  return resp.deleted();
}

absl::StatusOr<pb::TxnResponse> EtcdClient::Txn(const pb::TxnRequest& txn) {
  pb::TxnResponse resp;
  RETURN_IF_ERROR(OnAnyMember("txn", [&](Member& m, grpc::ClientContext* ctx) {
    resp.Clear();
    return m.kv->Txn(ctx, txn, &resp);
  }));
  return resp;
}

absl::StatusOr<EtcdClient::Lease> EtcdClient::GrantLease(int64_t ttl_s) {
  pb::LeaseGrantRequest req;
  req.set_ttl(ttl_s);
  pb::LeaseGrantResponse resp;
  RETURN_IF_ERROR(OnAnyMember("lease grant", [&](Member& m, grpc::ClientContext* ctx) {
    return m.lease->LeaseGrant(ctx, req, &resp);
  }));
  if (!resp.error().empty()) {
    return absl::UnavailableError(absl::StrCat("etcd: lease grant: ", resp.error()));
  }
  return Lease{resp.id(), resp.ttl()};
}

absl::StatusOr<int64_t> EtcdClient::KeepAliveOnce(int64_t lease, int member_timeout_ms) {
  pb::LeaseKeepAliveRequest req;
  req.set_id(lease);
  pb::LeaseKeepAliveResponse resp;
  RETURN_IF_ERROR(OnAnyMember("lease keep-alive", [&](Member& m, grpc::ClientContext* ctx) {
    // One request and its answer on a stream of their own (what `etcdctl lease keep-alive
    // --once` does).
    auto stream = m.lease->LeaseKeepAlive(ctx);
    if (!stream->Write(req) || !stream->Read(&resp)) {
      stream->WritesDone();
      grpc::Status s = stream->Finish();
      return s.ok() ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "keep-alive stream ended")
                    : s;
    }
    stream->WritesDone();
    ctx->TryCancel();  // the answer is in; the stream is not needed to its end
    (void)stream->Finish();
    return grpc::Status::OK;
  }, member_timeout_ms));
  return resp.ttl();
}

absl::Status EtcdClient::RevokeLease(int64_t lease) {
  pb::LeaseRevokeRequest req;
  req.set_id(lease);
  pb::LeaseRevokeResponse resp;
  return OnAnyMember("lease revoke", [&](Member& m, grpc::ClientContext* ctx) {
    return m.lease->LeaseRevoke(ctx, req, &resp);
  });
}

std::unique_ptr<EtcdWatch> EtcdClient::WatchPrefix(const std::string& prefix,
                                                   int64_t start_revision,
                                                   WatchCallback on_events) {
  return std::make_unique<EtcdWatch>(this, prefix, start_revision, std::move(on_events));
}

// ---------------------------------------------------------------------------------------------

EtcdWatch::EtcdWatch(EtcdClient* client, std::string prefix, int64_t start_revision,
                     EtcdClient::WatchCallback on_events)
    : client_(client),
      prefix_(std::move(prefix)),
      on_events_(std::move(on_events)),
      next_revision_(start_revision) {
  thread_ = std::thread([this] { Run(); });
}

EtcdWatch::~EtcdWatch() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    if (live_ != nullptr) live_->TryCancel();
  }
  thread_.join();
}

bool EtcdWatch::WaitCreated(int timeout_ms) {
  return created_.WaitForNotificationWithTimeout(absl::Milliseconds(timeout_ms));
}

void EtcdWatch::Run() {
  size_t i = client_->Preferred();
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    RunStream(*client_->members_[i % client_->members_.size()]);
    ++i;  // the stream broke: the next member, after a pause that stop cuts short
    absl::MutexLock lock(&mu_);
    auto stop = [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_; };
    mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(200));
  }
}

void EtcdWatch::RunStream(EtcdClient::Member& member) {
  grpc::ClientContext ctx;
  absl::StatusOr<std::string> token = client_->Token(member, refused_token_);
  if (!token.ok()) {
    GS_LOG(DEBUG) << "etcd watch: " << token.status();
    return;  // the next member, after a pause
  }
  if (!token->empty()) ctx.AddMetadata("token", *token);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    live_ = &ctx;
  }
  auto stream = member.watch->Watch(&ctx);
  pb::WatchRequest req;
  pb::WatchCreateRequest* create = req.mutable_create_request();
  create->set_key(prefix_);
  create->set_range_end(PrefixEnd(prefix_));
  create->set_start_revision(next_revision_);
  create->set_progress_notify(true);
  if (stream->Write(req)) {
    pb::WatchResponse resp;
    while (stream->Read(&resp)) {
      if (resp.created()) {
        // A stream made "from now" continues, after a break, from the revision it was made at.
        if (next_revision_ == 0) next_revision_ = resp.header().revision() + 1;
        if (!created_.HasBeenNotified()) created_.Notify();
      }
      if (resp.compact_revision() > 0) {
        // The history from next_revision_ is gone: the caller re-reads, the watch resumes.
        next_revision_ = resp.compact_revision();
        on_events_({}, resp.header().revision(), /*compacted=*/true);
        break;
      }
      if (resp.canceled()) {
        // etcd cancels a watch whose token it does not know ("permission denied"): the next
        // stream authenticates again.
        if (!token->empty()) refused_token_ = *token;
        break;
      }
      if (resp.events_size() == 0) continue;
      std::vector<EtcdEvent> events;
      int64_t last = 0;
      for (const auto& e : resp.events()) {
        EtcdEvent ev;
        ev.deleted = e.type() == pb::Event::DELETE;
        ev.kv = FromPb(e.kv());
        last = std::max(last, e.kv().mod_revision());
        events.push_back(std::move(ev));
      }
      next_revision_ = last + 1;
      on_events_(events, last, /*compacted=*/false);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    live_ = nullptr;
  }
  ctx.TryCancel();
  // A token etcd refused is replaced before the next stream.
  if (stream->Finish().error_code() == grpc::StatusCode::UNAUTHENTICATED) refused_token_ = *token;
}

}  // namespace cluster
}  // namespace gradsnap
