// EtcdClient (etcd_client.h).
#include "cluster/etcd_client.h"

#include <chrono>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/convert.h"

namespace gradsnap {
namespace cluster {

namespace pb = ::etcdserverpb;

absl::StatusOr<std::vector<std::string>> ParseEtcdEndpoints(const std::string& text) {
  std::vector<std::string> out;
  if (text.empty()) return absl::InvalidArgumentError("--etcd: no endpoints (HOST:PORT[,...])");
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    std::string e(part);
    const std::string bad = absl::StrCat("--etcd: \"", e, "\" ");
    if (absl::StartsWith(e, "https://")) {
      return absl::InvalidArgumentError(
          absl::StrCat(bad, "uses https, which gradsnap's etcd client does not speak yet "
                            "(plaintext http:// on a private network)"));
    }
    if (absl::StartsWith(e, "http://")) e = e.substr(7);
    if (!e.empty() && e.back() == '/') e.pop_back();
    const size_t colon = e.rfind(':');
    int port = 0;
    if (e.empty() || colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(absl::string_view(e).substr(colon + 1), &port) || port < 1 ||
        port > 65535 || e.find_first_of("/ ") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(bad, "is not [http://]HOST:PORT (PORT 1..65535)"));
    }
    for (const std::string& o : out) {
      if (o == e) return absl::InvalidArgumentError(absl::StrCat(bad, "is named twice"));
    }
    out.push_back(std::move(e));
  }
  return out;
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

bool TryNextMember(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
}

void SetDeadline(grpc::ClientContext* ctx, int ms) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(ms));
}

}  // namespace

EtcdClient::EtcdClient(const EtcdOptions& options) : options_(options) {
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
    m->channel = grpc::CreateCustomChannel(e, grpc::InsecureChannelCredentials(), args);
    m->kv = pb::KV::NewStub(m->channel);
    m->lease = pb::Lease::NewStub(m->channel);
    m->watch = pb::Watch::NewStub(m->channel);
    members_.push_back(std::move(m));
  }
}

EtcdClient::~EtcdClient() = default;

absl::StatusOr<std::unique_ptr<EtcdClient>> EtcdClient::Create(const EtcdOptions& options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("etcd: no endpoints");
  if (options.rpc_timeout_ms < 1) {
    return absl::InvalidArgumentError("etcd: rpc_timeout_ms must be >= 1");
  }
  return std::unique_ptr<EtcdClient>(new EtcdClient(options));
}

absl::Status EtcdClient::OnAnyMember(
    const char* what, const std::function<grpc::Status(Member&, grpc::ClientContext*)>& call) {
  const size_t first = Preferred();
  std::vector<std::string> errors;
  for (size_t k = 0; k < members_.size(); ++k) {
    const size_t i = (first + k) % members_.size();
    Member& m = *members_[i];
    grpc::ClientContext ctx;
    SetDeadline(&ctx, options_.rpc_timeout_ms);
    // Fail fast on a member that is down rather than wait out the deadline on it.
    ctx.set_wait_for_ready(false);
    grpc::Status s = call(m, &ctx);
    if (!TryNextMember(s)) {
      preferred_.store(i);
      if (s.ok()) return absl::OkStatus();
      absl::Status a = proto::FromGrpc(s);
      return absl::Status(a.code(), absl::StrCat("etcd ", m.endpoint, ": ", what, ": ",
                                                 a.message()));
    }
    errors.push_back(absl::StrCat(m.endpoint, ": ", s.error_message()));
  }
  return absl::UnavailableError(absl::StrCat("etcd unreachable (", what, "): ",
                                             absl::StrJoin(errors, "; ")));
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

absl::StatusOr<int64_t> EtcdClient::KeepAliveOnce(int64_t lease) {
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
  }));
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
      if (resp.canceled()) break;
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
  (void)stream->Finish();
}

}  // namespace cluster
}  // namespace gradsnap
