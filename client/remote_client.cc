// The remote back end: construction, checkpoint begin/abort and saves (remote_client.h).
#include "client/remote_client.h"

#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <map>
#include <cstring>
#include <future>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/backends.h"
#include "client/remote_placement.h"
#include "client/save_util.h"
#include "common/clock.h"
#include "proto/convert.h"
#include "proto/raw_message.h"
#include "grpcpp/impl/codegen/rpc_method.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "grpcpp/support/byte_buffer.h"

namespace gradsnap {
namespace client {
namespace remote {

namespace v1 = ::gradsnap::v1;

RemoteClient::RemoteClient(ClientOptions options, std::vector<std::unique_ptr<Node>> nodes)
    : options_(std::move(options)),
      nodes_(std::move(nodes)),
      upload_buffers_(proto::BufferPool::Create(proto::kMaxDataBytes, /*keep=*/16)) {
  for (const auto& n : nodes_) endpoints_.push_back(n->endpoint);
  keys_ = endpoints_;
  key_known_.assign(nodes_.size(), nodes_.size() == 1);  // one node: nothing to rank
  asked_ms_.assign(nodes_.size(), 0);
  replicas_ = std::min<size_t>(std::max(1, options_.replicas), nodes_.size());
  uint64_t per_save = kPerStreamBytes * replicas_;
  size_t workers = std::clamp<uint64_t>(options_.max_inflight_bytes / per_save, 1, 8);
  saves_ = std::make_unique<SaveQueue>(
      workers, [this](const ShardSpec& spec, const std::vector<TensorRef>& tensors) {
        return SaveShardNow(spec, tensors);
      });
}

// Finishes queued saves before the nodes go.
RemoteClient::~RemoteClient() { saves_.reset(); }

absl::Status RemoteClient::ForAllNodes(const std::function<absl::Status(Node&)>& fn) {
  if (nodes_.size() == 1) return fn(*nodes_[0]);
  std::vector<std::future<absl::Status>> results;
  for (auto& n : nodes_) {
    Node* node = n.get();
    results.push_back(std::async(std::launch::async, [&fn, node] { return fn(*node); }));
  }
  absl::Status first;
  for (auto& r : results) {
    absl::Status s = r.get();
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

absl::Status RemoteClient::BeginCheckpoint(const CheckpointSpec& spec) {
  v1::BeginCheckpointRequest req;
  proto::ToProto(spec, req.mutable_spec());
  return ForAllNodes(
      [&](Node& node) { return Call(node, req, &v1::Storage::Stub::BeginCheckpoint); });
}

absl::Status RemoteClient::AbortCheckpoint(const std::string& job, int64_t step,
                                           uint64_t epoch) {
  auto req = JobStep<v1::AbortCheckpointRequest>(job, step);
  req.set_epoch(epoch);
  // A begin that reached only some nodes (its client killed during the fan-out) leaves the
  // step on those only: NOT_FOUND elsewhere is fine.
  return ForAllNodesTolerant(
      [&](Node& node) { return Call(node, req, &v1::Storage::Stub::AbortCheckpoint); });
}

absl::StatusOr<uint64_t> RemoteClient::AcquireEpoch(const std::string& job) {
  // Each node counts its own epochs, and they drift apart (a node down during an acquisition,
  // a node added later). The attempt takes the largest answer; a second round raises every
  // node that answered less to it, so each node refuses the same older attempts.
  absl::Mutex mu;
  std::map<const Node*, uint64_t> answered;
  uint64_t newest = 0;
  auto ask = [&](Node& node, uint64_t raise_to) -> absl::Status {
    v1::AcquireEpochRequest req;
    req.set_job(job);
    req.set_raise_to(raise_to);
    v1::AcquireEpochResponse resp;
    RETURN_IF_ERROR(Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::AcquireEpochResponse* r) {
      return node.stub()->AcquireEpoch(ctx, req, r);
    }));
    absl::MutexLock lock(&mu);
    answered[&node] = resp.epoch();
    if (raise_to == 0) newest = std::max<uint64_t>(newest, resp.epoch());
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(ForAllNodes([&](Node& node) { return ask(node, 0); }));
  RETURN_IF_ERROR(ForAllNodes([&](Node& node) -> absl::Status {
    {
      absl::MutexLock lock(&mu);
      if (answered[&node] >= newest) return absl::OkStatus();
    }
    // A node above `newest` after this took another attempt's newer epoch: that attempt
    // supersedes this one there, as it should.
    RETURN_IF_ERROR(ask(node, newest));
    absl::MutexLock lock(&mu);
    if (answered[&node] < newest) {  // a server from before raise_to took a new epoch instead
      return absl::FailedPreconditionError(absl::StrCat(
          node.endpoint, ": answered epoch ", answered[&node], " when raised to ", newest,
          ": a server without AcquireEpochRequest.raise_to cannot fence this job (upgrade it)"));
    }
    return absl::OkStatus();
  }));
  return newest;
}

absl::Status RemoteClient::RaiseEpoch(const std::string& job, uint64_t epoch) {
  v1::AcquireEpochRequest req;
  req.set_job(job);
  req.set_raise_to(epoch);
  return ForAllNodes([&](Node& node) -> absl::Status {
    v1::AcquireEpochResponse resp;
    RETURN_IF_ERROR(Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::AcquireEpochResponse* r) {
      return node.stub()->AcquireEpoch(ctx, req, r);
    }));
    if (resp.epoch() != epoch) {
      return absl::FailedPreconditionError(absl::StrCat(
          node.endpoint, ": job ", job, ": epoch ", epoch, " superseded by attempt ",
          resp.epoch()));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<uint64_t> RemoteClient::PullCopy(const std::string& job, int64_t step,
                                                const std::string& source_node_id,
                                                const std::string& digest, uint64_t raw_bytes,
                                                int64_t deadline_ms) {
  if (nodes_.empty()) return absl::FailedPreconditionError("no node to ask");
  Node& node = *nodes_[0];
  v1::PullCopyRequest req;
  req.set_job(job);
  req.set_step(step);
  req.set_source_node_id(source_node_id);
  req.set_digest(digest);
  req.set_raw_bytes(raw_bytes);
  v1::PullCopyResponse resp;
  grpc::ClientContext ctx;
  remote::CallGuard guard(&ctx);
  remote::PrepareContext(&ctx, options_,
                         static_cast<int>(std::clamp<int64_t>(deadline_ms, 1, 1 << 30)));
  RETURN_IF_ERROR(Annotate(proto::FromGrpc(node.stub()->PullCopy(&ctx, req, &resp)),
                           node.endpoint));
  return resp.bytes();
}

std::future<absl::Status> RemoteClient::SaveShardAsync(const ShardSpec& spec,
                                                       std::vector<TensorRef> tensors) {
  return saves_->Push(spec, std::move(tensors));
}

absl::StatusOr<std::vector<size_t>> RemoteClient::Placement(const std::string& job,
                                                            int32_t rank, bool write) {
  absl::MutexLock lock(&keys_mu_);
  RETURN_IF_ERROR(keys_status_);
  const int64_t now = MonotonicNanos() / 1000000;
  std::vector<size_t> ask;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (!key_known_[i] && (write || asked_ms_[i] == 0 || now - asked_ms_[i] >= kReprobeMs)) {
      ask.push_back(i);
    }
  }
  if (!ask.empty()) {
    // One Health call per node, in parallel, one attempt each: a node down now is asked again
    // later and meanwhile ranked by its endpoint.
    const int deadline_ms = options_.rpc_timeout_ms > 0 ? std::min(options_.rpc_timeout_ms, 5000)
                                                        : 5000;
    std::vector<std::future<absl::StatusOr<std::string>>> answers;
    for (size_t i : ask) {
      Node* node = nodes_[i].get();
      answers.push_back(std::async(std::launch::async, [this, node, deadline_ms]()
                                                           -> absl::StatusOr<std::string> {
        grpc::ClientContext ctx;
        remote::PrepareContext(&ctx, options_, deadline_ms);
        v1::HealthResponse resp;
        RETURN_IF_ERROR(proto::FromGrpc(node->stub()->Health(&ctx, v1::HealthRequest(), &resp)));
        return resp.node_id();
      }));
    }
    for (size_t k = 0; k < ask.size(); ++k) {
      const size_t i = ask[k];
      absl::StatusOr<std::string> id = answers[k].get();
      asked_ms_[i] = now;
      if (!id.ok()) continue;
      key_known_[i] = true;
      if (!id->empty()) keys_[i] = NodePlacementKey(*id);
    }
    for (size_t i = 0; i < keys_.size(); ++i) {
      for (size_t j = i + 1; j < keys_.size(); ++j) {
        if (key_known_[i] && key_known_[j] && keys_[i] == keys_[j] && keys_[i] != endpoints_[i]) {
          keys_status_ = absl::InvalidArgumentError(absl::StrCat(
              "endpoints ", endpoints_[i], " and ", endpoints_[j], " are one node (id ",
              keys_[i].substr(NodePlacementKey("").size()), "): list each node once"));
          return keys_status_;
        }
      }
    }
  }
  return RankEndpoints(keys_, job, rank);
}

absl::StatusOr<std::vector<std::string>> RemoteClient::PlacementKeys() {
  RETURN_IF_ERROR(Placement("", 0, /*write=*/true).status());
  absl::MutexLock lock(&keys_mu_);
  return keys_;
}

absl::Status RemoteClient::SaveShardOnThisThread(const ShardSpec& spec,
                                                 const std::vector<TensorRef>& tensors) {
  ASSIGN_OR_RETURN(ShardSpec resolved, ResolveShardSpec(spec, tensors));
  return SaveShardNow(resolved, tensors);
}

absl::Status RemoteClient::SaveShardNow(const ShardSpec& spec,
                                        const std::vector<TensorRef>& tensors) {
  ASSIGN_OR_RETURN(std::vector<size_t> order, Placement(spec.job, spec.rank, /*write=*/true));
  std::vector<size_t> holders(order.begin(), order.begin() + replicas_);
  std::vector<std::future<absl::Status>> uploads;
  Canceller* const canceller = Canceller::Current();  // the caller's, carried to the uploads
  for (size_t i : holders) {
    Node* node = nodes_[i].get();
    uploads.push_back(std::async(std::launch::async, [this, node, &spec, &tensors, canceller] {
      const CancelScope scope(canceller);
      return UploadShard(*node, spec, tensors);
    }));
  }
  absl::Status first;
  for (auto& u : uploads) {
    absl::Status s = u.get();
    if (first.ok() && !s.ok()) first = s;
  }
  RETURN_IF_ERROR(first);
  if (holders.size() == nodes_.size()) return absl::OkStatus();
  // The real copies are durable: now the other nodes may count this rank as done.
  ShardSpec placeholder;
  placeholder.job = spec.job;
  placeholder.step = spec.step;
  placeholder.rank = spec.rank;
  placeholder.epoch = spec.epoch;  // fenced like the real copies: a zombie commits nothing
  placeholder.metadata = kPlaceholder;
  for (size_t k = replicas_; k < order.size(); ++k) {
    RETURN_IF_ERROR(UploadShard(*nodes_[order[k]], placeholder, {}));
  }
  return absl::OkStatus();
}

namespace {

// Copies payload bytes [offset, offset + n) of the concatenated tensors into one pooled slice
// that gRPC holds. This is the upload's only copy in the client (the message around it is framed
// by hand, not serialized). The caller's memory is not lent to gRPC: after a broken stream gRPC
// may keep its references to sent slices until the connection is torn down, later than the
// save may return.
grpc::Slice PayloadSlice(const std::vector<TensorRef>& tensors,
                         const std::vector<uint64_t>& starts, uint64_t offset, size_t n,
                         proto::BufferPool* pool) {
  char* out = nullptr;
  grpc::Slice slice = pool->Take(n, &out);
  size_t i = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), offset) -
                                 starts.begin()) - 1;
  while (n > 0 && i < tensors.size()) {
    uint64_t in_tensor = offset - starts[i];
    uint64_t avail = tensors[i].spec.byte_length - in_tensor;
    size_t take = static_cast<size_t>(std::min<uint64_t>(avail, n));
    if (take > 0) {
      std::memcpy(out, static_cast<const char*>(tensors[i].data) + in_tensor, take);
    }
    out += take;
    offset += take;
    n -= take;
    ++i;
  }
  return slice;
}

}  // namespace

absl::Status RemoteClient::UploadShard(Node& node, const ShardSpec& spec,
                                       const std::vector<TensorRef>& tensors) {
  std::vector<uint64_t> starts;
  uint64_t total = 0;
  for (const auto& t : tensors) {
    starts.push_back(total);
    total += t.spec.byte_length;
  }
  // Attempts count consecutive failures without progress: a long upload that keeps advancing
  // through several server restarts is not given up on.
  absl::Status s;
  uint64_t progress = 0;
  for (int failures = 0; failures < std::max(1, options_.max_attempts);) {
    if (failures > 0) {
      if (s.code() == absl::StatusCode::kUnavailable) node.OnUnavailable();
      Backoff(options_, failures);
    }
    uint64_t committed = 0;
    s = UploadAttempt(node, spec, tensors, starts, total, &committed);
    // A deadline passed (a slow link, a node frozen for a while) is retried too: the next
    // attempt resumes at what the server made durable, with a deadline for what is left.
    if (s.ok() || !(IsRetryable(s) || s.code() == absl::StatusCode::kDeadlineExceeded)) return s;
    if (committed > progress) {
      progress = committed;
      failures = 1;
    } else {
      ++failures;
    }
  }
  return s;
}

absl::Status RemoteClient::UploadAttempt(Node& node, const ShardSpec& spec,
                                         const std::vector<TensorRef>& tensors,
                                         const std::vector<uint64_t>& starts, uint64_t total,
                                         uint64_t* committed) {
  auto query = JobStep<v1::QueryWriteStatusRequest>(spec.job, spec.step);
  query.set_rank(spec.rank);
  query.set_epoch(spec.epoch);
  v1::QueryWriteStatusResponse status;
  {
    grpc::ClientContext ctx;
    CallGuard guard(&ctx);
    PrepareContext(&ctx, options_, options_.rpc_timeout_ms);
    RETURN_IF_ERROR(Annotate(proto::FromGrpc(node.stub()->QueryWriteStatus(&ctx, query, &status)),
                             node.endpoint));
  }
  if (status.complete()) {
    // Committed earlier (a restarted attempt): idempotent for the same content only.
    ASSIGN_OR_RETURN(Manifest m,
                     FetchManifest(node, JobStep<v1::GetManifestRequest>(spec.job, spec.step)));
    for (const ShardInfo& s : m.shards) {
      if (s.rank == spec.rank && s.committed && !IsPlaceholder(s)) {
        return CheckCommittedContent(spec, s, tensors);
      }
    }
    return absl::OkStatus();
  }
  uint64_t offset = status.committed_size();
  *committed = offset;
  if (offset > total) {
    return absl::FailedPreconditionError(absl::StrCat(
        node.endpoint, ": server holds ", offset, " bytes of a ", total, "-byte shard"));
  }
  grpc::ClientContext ctx;
  CallGuard guard(&ctx);  // a straggling copy the cluster client gave up on (remote_rpc.h)
  // A server that hangs (stopped, wedged) must not hold an upload forever: the stream gets the
  // unary deadline plus the time the remaining bytes take at a floor of 8 MiB/s.
  const uint64_t stream_ms = (total - offset) / ((8u << 20) / 1000);
  PrepareContext(&ctx, options_,
                 static_cast<int>(std::min<uint64_t>(options_.rpc_timeout_ms + stream_ms,
                                                     24ull * 3600 * 1000)));
  v1::WriteResponse resp;
  // Raw messages (proto/raw_message.h): `data` is one slice, framed without serializing.
  std::shared_ptr<grpc::Channel> channel = node.stream_channel();
  const grpc::internal::RpcMethod method("/gradsnap.v1.Storage/Write",
                                         grpc::internal::RpcMethod::CLIENT_STREAMING, channel);
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> stream(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel.get(), method, &ctx,
                                                                   &resp));
  v1::ShardSpec pspec;
  proto::ToProto(spec, &pspec);
  const std::string spec_bytes = pspec.SerializeAsString();
  // The first message carries the spec and as much data as fits beside it in one message (none
  // beside a spec near the 4 MiB limit).
  if (spec_bytes.size() > proto::kMaxHeadBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job ", spec.job, " step ", spec.step, " rank ", spec.rank, ": the shard spec takes ",
        spec_bytes.size(), " bytes, more than one ", proto::kMaxMessageBytes,
        "-byte message (fewer tensors, shorter names or metadata)"));
  }
  bool first = true;
  do {
    size_t n = static_cast<size_t>(std::min<uint64_t>(proto::kMaxDataBytes, total - offset));
    if (first) n = proto::FirstMessageData(spec_bytes.size(), n);
    proto::RawMessageBuilder msg;
    if (first) msg.AddBytes(proto::field::kWriteShard, spec_bytes);
    msg.AddVarint(proto::field::kWriteOffset, offset);
    std::vector<grpc::Slice> data;
    if (n > 0) data.push_back(PayloadSlice(tensors, starts, offset, n, upload_buffers_.get()));
    msg.AddSlices(proto::field::kWriteData, std::move(data), n);
    msg.AddVarint(proto::field::kWriteFinish, offset + n == total ? 1 : 0);
    if (!stream->Write(msg.Finish())) break;  // broken stream: Finish() says why
    offset += n;
    first = false;
  } while (offset < total);
  stream->WritesDone();
  RETURN_IF_ERROR(Annotate(proto::FromGrpc(stream->Finish()), node.endpoint));
  if (!resp.shard_committed()) {
    return absl::UnavailableError(absl::StrCat(node.endpoint, ": upload ended uncommitted"));
  }
  return absl::OkStatus();
}

}  // namespace remote

namespace {

// INVALID_ARGUMENT where the name service says `host` does not exist (EAI_NONAME: a typo, which
// no wait or retry mends; gRPC would report it as UNAVAILABLE, an outage to ride out). A
// temporary failure (EAI_AGAIN: the name service down) is left to the connection's retries.
absl::Status CheckHostResolves(std::string host, const std::string& endpoint) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);  // [IPv6]
  }
  if (host.find('/') != std::string::npos) return absl::OkStatus();  // a gRPC target URI
  struct addrinfo hints = {};
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found != nullptr) ::freeaddrinfo(found);
  if (rc == EAI_NONAME) {
    return absl::InvalidArgumentError(
        absl::StrCat("endpoint \"", endpoint, "\": unknown host ", host));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> NewRemoteClient(const ClientOptions& options) {
  if (options.endpoints.empty()) return absl::InvalidArgumentError("no endpoints");
  ASSIGN_OR_RETURN(auto creds, remote::MakeChannelCredentials(options.tls));
  std::vector<std::unique_ptr<remote::Node>> nodes;
  for (const std::string& e : options.endpoints) {
    const size_t colon = e.rfind(':');
    int port = 0;
    if (e.empty() || colon == std::string::npos || colon == 0 ||
        !absl::SimpleAtoi(absl::string_view(e).substr(colon + 1), &port) || port < 1 ||
        port > 65535) {
      return absl::InvalidArgumentError(
          absl::StrCat("endpoint \"", e, "\" is not HOST:PORT (PORT 1..65535)"));
    }
    for (const auto& n : nodes) {
      if (n->endpoint == e) return absl::InvalidArgumentError(absl::StrCat("endpoint ", e, " twice"));
    }
    RETURN_IF_ERROR(CheckHostResolves(e.substr(0, colon), e));
    nodes.push_back(remote::MakeNode(e, creds, options.connections_per_node));
  }
  return std::unique_ptr<Client>(new remote::RemoteClient(options, std::move(nodes)));
}

absl::StatusOr<std::vector<std::string>> StaticPlacementKeys(const ClientOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<Client> c, NewRemoteClient(options));
  return static_cast<remote::RemoteClient*>(c.get())->PlacementKeys();
}

}  // namespace client
}  // namespace gradsnap
