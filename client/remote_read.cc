// The remote back end: restore, listing and administrative calls (remote_client.h).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/write_space.h"
#include "grpcpp/impl/codegen/client_unary_call.h"
#include "grpcpp/impl/codegen/rpc_method.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "grpcpp/support/byte_buffer.h"
#include "client/remote_client.h"
#include "client/remote_placement.h"
#include "common/clock.h"
#include "common/gc_plan.h"
#include "common/populate.h"
#include "proto/convert.h"
#include "proto/raw_message.h"

namespace gradsnap {
namespace client {
namespace remote {

namespace v1 = ::gradsnap::v1;

absl::Status RemoteClient::ForAnyNode(const std::function<absl::Status(Node&)>& fn) {
  std::vector<absl::Status> results(nodes_.size());
  if (nodes_.size() == 1) {
    results[0] = fn(*nodes_[0]);
  } else {
    std::vector<std::thread> threads;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      threads.emplace_back([&, i] { results[i] = fn(*nodes_[i]); });
    }
    for (auto& t : threads) t.join();
  }
  absl::Status first;
  for (const auto& s : results) {
    if (s.ok()) return absl::OkStatus();
    // Prefer an answer from a live node over "unavailable".
    if (first.ok() || first.code() == absl::StatusCode::kUnavailable) first = s;
  }
  return first;
}

absl::StatusOr<std::vector<std::string>> RemoteClient::ListJobs() {
  absl::Mutex mu;
  std::set<std::string> jobs;
  RETURN_IF_ERROR(ForAnyNode([&](Node& node) -> absl::Status {
    v1::ListJobsResponse resp;
    RETURN_IF_ERROR(Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::ListJobsResponse* r) {
      return node.stub()->ListJobs(ctx, v1::ListJobsRequest(), r);
    }));
    absl::MutexLock lock(&mu);
    for (const auto& j : resp.jobs()) jobs.insert(j);
    return absl::OkStatus();
  }));
  return std::vector<std::string>(jobs.begin(), jobs.end());
}

absl::StatusOr<std::vector<CheckpointInfo>> RemoteClient::List(const std::string& job,
                                                               bool include_pending) {
  v1::ListCheckpointsRequest req;
  req.set_job(job);
  req.set_include_pending(include_pending);
  absl::Mutex mu;
  std::map<int64_t, CheckpointInfo> merged;
  RETURN_IF_ERROR(ForAnyNode([&](Node& node) -> absl::Status {
    v1::ListCheckpointsResponse resp;
    RETURN_IF_ERROR(Unary(node, &resp,
                          [&](grpc::ClientContext* ctx, v1::ListCheckpointsResponse* r) {
                            return node.stub()->ListCheckpoints(ctx, req, r);
                          }));
    absl::MutexLock lock(&mu);
    for (const auto& c : resp.checkpoints()) {
      ASSIGN_OR_RETURN(CheckpointInfo info, proto::FromProto(c));
      auto [it, inserted] = merged.emplace(info.step, info);
      if (inserted) continue;
      // With placement a node counts only the ranks it holds: keep the largest view, and
      // COMMITTED wins over PENDING.
      if (info.state == CheckpointState::kCommitted) it->second.state = info.state;
      it->second.raw_bytes = std::max(it->second.raw_bytes, info.raw_bytes);
      it->second.stored_bytes = std::max(it->second.stored_bytes, info.stored_bytes);
    }
    return absl::OkStatus();
  }));
  std::vector<CheckpointInfo> out;
  for (auto& [step, info] : merged) out.push_back(std::move(info));
  return out;
}

// The manifest from one node, page by page (docs/protocol.md, "Large manifests"). A page's
// first shard continues the previous page's last one when it has the same rank.
absl::StatusOr<Manifest> RemoteClient::FetchManifest(Node& node, v1::GetManifestRequest req) {
  req.set_paged(true);
  req.set_shard_cursor(0);
  req.set_tensor_cursor(0);
  Manifest out;
  for (int page = 0;; ++page) {
    v1::GetManifestResponse resp;
    RETURN_IF_ERROR(Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::GetManifestResponse* r) {
      return node.stub()->GetManifest(ctx, req, r);
    }));
    ASSIGN_OR_RETURN(Manifest m, proto::FromProto(resp.manifest()));
    if (page == 0) {
      out.info = m.info;
    }
    for (ShardInfo& s : m.shards) {
      if (!out.shards.empty() && out.shards.back().rank == s.rank) {
        ShardInfo& last = out.shards.back();
        if (last.metadata.empty()) last.metadata = std::move(s.metadata);
        for (auto& t : s.tensors) last.tensors.push_back(std::move(t));
      } else {
        out.shards.push_back(std::move(s));
      }
    }
    if (!resp.more()) break;  // also a server that does not page: one whole manifest
    bool advances = resp.next_shard() > req.shard_cursor() ||
                    (resp.next_shard() == req.shard_cursor() &&
                     resp.next_tensor() > req.tensor_cursor());
    if (!advances || page > 1000000) {
      return absl::DataLossError("manifest paging from the server does not advance");
    }
    req.set_shard_cursor(resp.next_shard());
    req.set_tensor_cursor(resp.next_tensor());
  }
  return out;
}

absl::StatusOr<Manifest> RemoteClient::Show(const std::string& job, int64_t step) {
  const auto req = JobStep<v1::GetManifestRequest>(job, step);
  absl::Mutex mu;
  std::vector<Manifest> found;
  bool all_answered = true;  // every node gave its manifest or said it has none
  RETURN_IF_ERROR(ForAnyNode([&](Node& node) -> absl::Status {
    absl::StatusOr<Manifest> m = FetchManifest(node, req);
    absl::MutexLock lock(&mu);
    if (!m.ok()) {
      if (!absl::IsNotFound(m.status())) all_answered = false;
      return m.status();
    }
    found.push_back(*std::move(m));
    return absl::OkStatus();
  }));
  Manifest out = found[0];
  std::map<int32_t, ShardInfo> shards;
  for (const Manifest& m : found) {
    if (m.info.state == CheckpointState::kCommitted) out.info.state = m.info.state;
    for (const ShardInfo& s : m.shards) {
      if (IsPlaceholder(s)) continue;
      auto [it, inserted] = shards.emplace(s.rank, s);
      if (!inserted && !it->second.committed && s.committed) it->second = s;
    }
  }
  out.shards.clear();
  out.info.raw_bytes = 0;
  out.info.stored_bytes = 0;
  for (auto& [rank, s] : shards) {
    if (s.committed) {
      out.info.raw_bytes += s.raw_bytes;
      out.info.stored_bytes += s.stored_bytes;
    }
    out.shards.push_back(std::move(s));
  }
  // Committed, every node answered, and a rank held by none of them (only placeholders left:
  // the node or nodes with its copies lost their data): the checkpoint cannot be restored, and
  // must not pass for one (a restore of `latest` falls back past it). With a node that did not
  // answer, the rank may be there: the manifest is returned as it is, and a read of the rank
  // reports the node unavailable.
  if (out.info.state == CheckpointState::kCommitted && all_answered) {
    for (int32_t r = 0; r < out.info.world_size; ++r) {
      if (shards.count(r) == 0) {
        return absl::DataLossError(absl::StrCat(
            "job ", job, " step ", step, " rank ", r, ": no node holds its data (every node "
            "answered; only placeholders of it are left: its copies were lost)"));
      }
    }
  }
  return out;
}

namespace {

// One ReadResponse, parsed without copying its data (proto/raw_message.h): the shard info goes
// to on_shard(bytes), the data to on_data(offset, piece) as references to the received slices.
// DATA_LOSS for malformed wire bytes.
template <typename OnShard, typename OnData>
absl::Status ParseReadResponse(const grpc::ByteBuffer& bb, OnShard&& on_shard, OnData&& on_data) {
  uint64_t offset = 0;
  return proto::ForEachField(
      bb, "Read message", absl::StatusCode::kDataLoss, [&](proto::RawField& f) -> absl::Status {
        const bool bytes = f.wire_type == 2;
        if (f.number == proto::field::kReadOffset && !bytes) {
          offset = f.varint;  // precedes data: fields are sent in number order
        } else if (f.number == proto::field::kReadShard && bytes) {
          return on_shard(f.Flatten());
        } else if (f.number == proto::field::kReadData && bytes) {
          for (const grpc::Slice& piece : f.pieces) {
            RETURN_IF_ERROR(on_data(offset, piece));
            offset += piece.size();
          }
        }
        return absl::OkStatus();
      });
}

// Cancels a Read stream that brings nothing for `timeout_ms` while its reader waits for it (a
// frozen node, a hung disk, a partition that drops packets without a reset: TCP alone never
// ends a stream that only receives). The time the reader's sink takes does not count. One
// thread per stream; none when timeout_ms <= 0.
class StallWatch {
 public:
  StallWatch(grpc::ClientContext* ctx, int timeout_ms)
      : ctx_(ctx), timeout_ns_(timeout_ms * 1000000LL) {
    if (timeout_ms > 0) thread_ = std::thread([this] { Run(); });
  }
  ~StallWatch() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  // The reader starts waiting for the next message / got one (and runs its sink).
  void Waiting() { waiting_since_.store(MonotonicNanos(), std::memory_order_relaxed); }
  void Got() { waiting_since_.store(0, std::memory_order_relaxed); }
  bool fired() const { return fired_.load(); }

 private:
  void Run() {
    absl::MutexLock lock(&mu_);
    while (!stop_) {
      const int64_t since = waiting_since_.load(std::memory_order_relaxed);
      const int64_t now = MonotonicNanos();
      int64_t wait_ns = timeout_ns_;
      if (since != 0) {
        if (now - since >= timeout_ns_) {
          fired_ = true;
          ctx_->TryCancel();
          return;
        }
        wait_ns = timeout_ns_ - (now - since);
      }
      mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Nanoseconds(wait_ns));
    }
  }

  grpc::ClientContext* const ctx_;
  const int64_t timeout_ns_;
  std::atomic<int64_t> waiting_since_{0};  // 0: not waiting
  std::atomic<bool> fired_{false};
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace

absl::Status RemoteClient::ShardVersion::Check(const storage::ShardInfo& info,
                                               const std::string& endpoint) {
  absl::MutexLock lock(&mu_);
  if (!first_.has_value()) {
    first_ = info;
    return absl::OkStatus();
  }
  if (proto::SameTensorContent(*first_, info)) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat(
      endpoint, ": holds another version of rank ", info.rank,
      " (the step was saved again under the same number on some nodes): not mixed with the "
      "bytes read from the first"));
}

uint64_t RemoteClient::ShardVersion::ResumePoint(uint64_t offset, uint64_t start) {
  absl::MutexLock lock(&mu_);
  if (!first_.has_value()) return offset;
  uint64_t begin = 0;
  for (const storage::TensorInfo& t : first_->tensors) {
    const uint64_t end = begin + t.spec.byte_length;
    if (offset < end) return begin < offset && begin >= start ? begin : offset;
    begin = end;
  }
  return offset;
}

absl::Status RemoteClient::ReadFrom(Node& node, const std::string& job, int64_t step,
                                    int32_t rank, uint64_t from, uint64_t* offset, uint64_t end,
                                    const PieceSink& sink, uint64_t* total,
                                    ShardVersion* version) {
  // Nothing left (an empty tensor, or a stream that broke after its last bytes): no call. A
  // read_limit of 0 would mean "to the end of the shard" to the server.
  if (end != kToEnd && *offset >= end) return absl::OkStatus();
  from = std::min(from, *offset);
  uint64_t pos = from;  // the stream's position
  auto req = JobStep<v1::ReadRequest>(job, step);
  req.set_rank(rank);
  req.set_read_offset(from);
  if (end != kToEnd) req.set_read_limit(end - from);
  grpc::ClientContext ctx;
  PrepareContext(&ctx, options_, 0);
  // The method called with raw ByteBuffer responses (parsed below without copying the data).
  std::shared_ptr<grpc::Channel> channel = node.stream_channel();
  const grpc::internal::RpcMethod method("/gradsnap.v1.Storage/Read",
                                         grpc::internal::RpcMethod::SERVER_STREAMING, channel);
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), method, &ctx,
                                                                   req));
  grpc::ByteBuffer bb;
  absl::Status status;
  bool first = true;
  StallWatch watch(&ctx, options_.rpc_timeout_ms);
  for (;;) {
    watch.Waiting();
    if (!status.ok() || !stream->Read(&bb)) break;
    watch.Got();
    auto on_shard = [&](const std::string& bytes) -> absl::Status {
      if (!first) return absl::OkStatus();  // only the first message's counts
      v1::ShardInfo pinfo;
      if (!pinfo.ParseFromString(bytes)) {
        return absl::DataLossError(absl::StrCat(node.endpoint, ": bad shard info in Read"));
      }
      ASSIGN_OR_RETURN(ShardInfo info, proto::FromProto(pinfo));
      if (IsPlaceholder(info)) {
        return absl::NotFoundError(absl::StrCat(node.endpoint, ": shard is held elsewhere"));
      }
      RETURN_IF_ERROR(version->Check(info, node.endpoint));
      uint64_t size = 0;
      for (const auto& t : info.tensors) size += t.spec.byte_length;
      *total = size;
      first = false;
      return absl::OkStatus();
    };
    auto on_data = [&](uint64_t at, const grpc::Slice& piece) -> absl::Status {
      if (first) return absl::DataLossError(absl::StrCat(node.endpoint, ": Read data first"));
      if (at != pos) {
        return absl::DataLossError(absl::StrCat(node.endpoint, ": Read sent offset ", at,
                                                ", expected ", pos));
      }
      if (pos > std::min(end, *total) || piece.size() > std::min(end, *total) - pos) {
        return absl::DataLossError(absl::StrCat(node.endpoint, ": Read sent bytes past ",
                                                std::min(end, *total)));
      }
      pos += piece.size();
      if (pos <= *offset) return absl::OkStatus();  // read again, delivered before
      const size_t skip = static_cast<size_t>(piece.size() - (pos - *offset));
      RETURN_IF_ERROR(sink(skip == 0 ? piece : piece.sub(skip, piece.size())));
      *offset = pos;
      return absl::OkStatus();
    };
    status = ParseReadResponse(bb, on_shard, on_data);
    if (status.ok() && first) {
      status = absl::DataLossError(absl::StrCat(node.endpoint, ": Read without shard info"));
    }
  }
  if (!status.ok()) {
    ctx.TryCancel();
    stream->Finish().IgnoreError();
    return status;
  }
  watch.Got();  // the stream has ended: Finish is not a wait for data
  absl::Status finished = Annotate(proto::FromGrpc(stream->Finish()), node.endpoint);
  if (watch.fired()) {  // cancelled by the watch: a node to retry or fail over from
    return absl::UnavailableError(absl::StrCat(node.endpoint, ": Read stalled: no data for ",
                                               options_.rpc_timeout_ms, " ms at byte ", *offset));
  }
  RETURN_IF_ERROR(finished);
  const uint64_t want = std::min(end, *total);
  if (*offset != want) {
    return absl::UnavailableError(absl::StrCat(node.endpoint, ": Read ended at ", *offset,
                                               " of ", want));
  }
  return absl::OkStatus();
}

absl::Status RemoteClient::ReadRange(const std::string& job, int64_t step, int32_t rank,
                                     uint64_t offset, uint64_t end, const PieceSink& sink,
                                     uint64_t* total_out, ShardVersion* version) {
  ShardVersion own;
  if (version == nullptr) version = &own;
  // The caller's sink failing is its own error, not the node's: returned as it is, never
  // retried (the piece would be offered to the sink again).
  bool sink_failed = false;
  const PieceSink guarded = [&](const grpc::Slice& piece) {
    absl::Status s = sink(piece);
    sink_failed = !s.ok();
    return s;
  };
  ASSIGN_OR_RETURN(std::vector<size_t> order, Placement(job, rank, /*write=*/false));
  const uint64_t start = offset;  // the range's own start
  absl::Status last = absl::NotFoundError("no node holds the shard");
  uint64_t local_total = 0;
  uint64_t* total = total_out != nullptr ? total_out : &local_total;
  for (int failures = 0; failures < std::max(1, options_.max_attempts);) {
    if (failures > 0) Backoff(options_, failures);
    uint64_t before = offset;
    bool retry = false;  // some node may answer differently later (unavailable, busy)
    for (size_t i : order) {
      // A resumed read starts again at the tensor the break cut (when this range holds its
      // start), so that the server checks that tensor's digest too.
      const uint64_t from = offset > start ? version->ResumePoint(offset, start) : offset;
      absl::Status s =
          ReadFrom(*nodes_[i], job, step, rank, from, &offset, end, guarded, total, version);
      if (s.ok() || sink_failed) return s;
      if (s.code() == absl::StatusCode::kUnavailable) nodes_[i]->OnUnavailable();
      // Another replica may have it: move on for missing, unavailable or busy nodes, and for
      // one where the step is not committed yet (each node commits when it holds every rank).
      const bool elsewhere = s.code() == absl::StatusCode::kNotFound ||
                             s.code() == absl::StatusCode::kFailedPrecondition;
      if (!IsRetryable(s) && !elsewhere) return s;
      retry = retry || IsRetryable(s);
      if (s.code() != absl::StatusCode::kNotFound || last.code() == absl::StatusCode::kNotFound) {
        last = s;
      }
    }
    if (!retry) return last;  // every node: no such shard, or not committed there
    failures = offset > before ? 1 : failures + 1;
  }
  return last;
}

namespace {

// Ends of the ranges a parallel restore of `shard` fetches: whole tensors grouped up to
// `block` bytes (a larger tensor is a range of its own), so every tensor is read by one stream
// from its start to its end and the server checks its digest.
std::vector<uint64_t> TensorAlignedCuts(const ShardInfo& shard, uint64_t block) {
  std::vector<uint64_t> cuts;
  uint64_t end = 0, start = 0;
  for (const storage::TensorInfo& t : shard.tensors) {
    end += t.spec.byte_length;
    if (end - start >= block) {
      cuts.push_back(end);
      start = end;
    }
  }
  if (end > start || cuts.empty()) cuts.push_back(end);
  return cuts;
}

// A sink copying the pieces to dst[0, len) in order; *filled counts the bytes so far (a
// resumed stream continues there).
std::function<absl::Status(const grpc::Slice&)> CopyInto(char* dst, uint64_t len,
                                                         uint64_t* filled) {
  return [dst, len, filled](const grpc::Slice& p) -> absl::Status {
    if (p.size() > len - *filled) return absl::DataLossError("server sent too many bytes");
    std::memcpy(dst + *filled, p.begin(), p.size());
    *filled += p.size();
    return absl::OkStatus();
  };
}

}  // namespace

absl::Status RemoteClient::RestoreShard(const std::string& job, int64_t step, int32_t rank,
                                        const std::function<absl::Status(const void*, size_t)>& sink,
                                        const ProgressFn& progress) {
  uint64_t total = 0;
  uint64_t done = 0;
  auto deliver = [&](const grpc::Slice& piece) -> absl::Status {
    RETURN_IF_ERROR(sink(piece.begin(), piece.size()));
    done += piece.size();
    if (progress) progress(done, total);
    return absl::OkStatus();
  };
  const size_t streams = static_cast<size_t>(std::max(1, options_.read_streams));
  for (bool fresh : {false, true}) {
    std::vector<uint64_t> cuts;
    if (streams > 1) {
      // The tensor layout decides the ranges; without a manifest one stream reads (and reports
      // why the shard cannot be read).
      absl::StatusOr<std::shared_ptr<const Manifest>> m = RestoreManifest(job, step, fresh);
      for (const ShardInfo& s : m.ok() ? (*m)->shards : std::vector<ShardInfo>()) {
        if (s.rank == rank && s.committed) cuts = TensorAlignedCuts(s, kReadBlockBytes);
      }
    }
    if (cuts.size() <= 1) return ReadRange(job, step, rank, 0, kToEnd, deliver, &total);
    total = cuts.back();
    absl::Status s = ReadRangesInOrder(job, step, rank, cuts, streams, deliver);
    // A kept manifest outdated by a checkpoint saved again under the same step by another
    // client: nothing was delivered yet (the first range failed), so read with a fresh one.
    if (s.code() != absl::StatusCode::kAborted || done > 0 || fresh) return s;
  }
  return absl::InternalError("unreachable");
}

absl::StatusOr<std::shared_ptr<const Manifest>> RemoteClient::RestoreManifest(
    const std::string& job, int64_t step, bool fresh) {
  {
    absl::MutexLock lock(&restore_mu_);
    const std::shared_ptr<const Manifest>& m = restore_manifest_;
    if (!fresh && m != nullptr && m->info.job == job && m->info.step == step) return m;
  }
  ASSIGN_OR_RETURN(Manifest m, Show(job, step));
  auto shared = std::make_shared<const Manifest>(std::move(m));
  if (shared->info.state == CheckpointState::kCommitted) {
    absl::MutexLock lock(&restore_mu_);
    restore_manifest_ = shared;
  }
  return shared;
}

void RemoteClient::ForgetRestoreManifest() {
  absl::MutexLock lock(&restore_mu_);
  restore_manifest_.reset();
}

// The ranges [cuts[k - 1], cuts[k]) (the first from 0), fetched by `streams` threads at most
// 2 * streams ranges ahead of delivery, handed to deliver in order on this thread. The received
// slices are held, not copied, until delivered.
absl::Status RemoteClient::ReadRangesInOrder(const std::string& job, int64_t step, int32_t rank,
                                             const std::vector<uint64_t>& cuts, size_t streams,
                                             const PieceSink& deliver) {
  struct Block {
    std::vector<grpc::Slice> pieces;
    absl::Status status;
    bool ready = false;
  };
  const size_t count = cuts.size();
  std::vector<Block> blocks(count);
  absl::Mutex mu;
  size_t next = 0;        // next range to fetch
  size_t delivering = 0;  // range being delivered
  bool stop = false;      // delivery failed: fetch no more
  const size_t ahead = 2 * streams;
  ShardVersion version;  // every range from the same version of the shard
  auto fetch = [&] {
    for (;;) {
      size_t k = 0;
      {
        absl::MutexLock lock(&mu);
        auto may_go = [&] { return stop || next >= count || next < delivering + ahead; };
        mu.Await(absl::Condition(&may_go));
        if (stop || next >= count) return;
        k = next++;
      }
      std::vector<grpc::Slice> pieces;
      uint64_t total = 0;
      absl::Status s = ReadRange(job, step, rank, k == 0 ? 0 : cuts[k - 1], cuts[k],
                                 [&](const grpc::Slice& p) {
                                   pieces.push_back(p);
                                   return absl::OkStatus();
                                 },
                                 &total, &version);
      if (s.ok() && total != cuts.back()) {
        s = absl::AbortedError(absl::StrCat("rank ", rank, " of ", job, " step ", step,
                                            " has ", total, " bytes, its manifest said ",
                                            cuts.back()));
      }
      absl::MutexLock lock(&mu);
      blocks[k].pieces = std::move(pieces);
      blocks[k].status = std::move(s);
      blocks[k].ready = true;
    }
  };
  std::vector<std::thread> threads;
  for (size_t i = 0; i < std::min(streams, count); ++i) threads.emplace_back(fetch);
  absl::Status result;
  for (size_t k = 0; k < count && result.ok(); ++k) {
    std::vector<grpc::Slice> pieces;
    {
      absl::MutexLock lock(&mu);
      mu.Await(absl::Condition(&blocks[k].ready));
      result = blocks[k].status;
      pieces = std::move(blocks[k].pieces);
    }
    for (size_t i = 0; i < pieces.size() && result.ok(); ++i) result = deliver(pieces[i]);
    absl::MutexLock lock(&mu);
    delivering = k + 1;
  }
  {
    absl::MutexLock lock(&mu);
    stop = true;
  }
  for (std::thread& t : threads) t.join();
  return result;
}

absl::Status RemoteClient::RestoreTensor(const std::string& job, int64_t step, int32_t rank,
                                         const std::string& tensor, void* out, size_t out_len) {
  ASSIGN_OR_RETURN(Manifest m, Show(job, step));
  for (const ShardInfo& s : m.shards) {
    if (s.rank != rank) continue;
    uint64_t offset = 0;
    for (const storage::TensorInfo& t : s.tensors) {
      if (t.spec.name != tensor) {
        offset += t.spec.byte_length;
        continue;
      }
      if (out_len != t.spec.byte_length) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", tensor, " has ",
                                                       t.spec.byte_length, " bytes, buffer ",
                                                       out_len));
      }
      // One stream over exactly the tensor: the server then checks its digest.
      PopulateAhead populate(out, out_len);  // a fresh destination faulted in ahead of the copy
      absl::Status s = ReadInto(job, step, rank, offset, offset + out_len, static_cast<char*>(out));
      // The range came from the manifest: a node whose shard is shorter holds other data.
      if (absl::IsOutOfRange(s)) return absl::DataLossError(s.message());
      return s;
    }
    return absl::NotFoundError(absl::StrCat("no tensor ", tensor, " in rank ", rank));
  }
  return absl::NotFoundError(absl::StrCat("no rank ", rank, " in ", job, " step ", step));
}

absl::Status RemoteClient::ReadInto(const std::string& job, int64_t step, int32_t rank,
                                    uint64_t from, uint64_t to, char* dst, ShardVersion* version) {
  uint64_t filled = 0;  // ReadRange resumes a broken stream where it stopped
  RETURN_IF_ERROR(ReadRange(job, step, rank, from, to, CopyInto(dst, to - from, &filled), nullptr,
                            version));
  if (filled != to - from) {  // the stream ended OK at the end of a shorter shard
    return absl::OutOfRangeError(absl::StrCat("job ", job, " step ", step, " rank ", rank,
                                              ": bytes [", from, ", ", to,
                                              ") past the payload of ", from + filled));
  }
  return absl::OkStatus();
}

absl::Status RemoteClient::ReadShardRange(const std::string& job, int64_t step, int32_t rank,
                                          uint64_t offset, uint64_t length, void* out) {
  if (length == 0) return absl::OkStatus();
  // Parallel ranges of kReadBlockBytes, each copied straight to its place in out.
  const size_t count = static_cast<size_t>((length + kReadBlockBytes - 1) / kReadBlockBytes);
  const size_t streams = std::min<size_t>(std::max(1, options_.read_streams), count);
  std::atomic<size_t> next{0};
  std::vector<absl::Status> results(streams);
  ShardVersion version;  // every range from the same version of the shard
  PopulateAhead populate(out, length);  // a fresh destination faulted in ahead of the copies
  auto fetch = [&](size_t worker) {
    for (size_t k = next++; k < count && results[worker].ok(); k = next++) {
      const uint64_t b = k * kReadBlockBytes;
      const uint64_t e = std::min(length, b + kReadBlockBytes);
      results[worker] = ReadInto(job, step, rank, offset + b, offset + e,
                                 static_cast<char*>(out) + b, &version);
    }
  };
  std::vector<std::thread> threads;
  for (size_t i = 1; i < streams; ++i) threads.emplace_back(fetch, i);
  fetch(0);
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : results) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::Status RemoteClient::Verify(const std::string& job, int64_t step,
                                  const ProgressFn& progress) {
  // Progress counts payload bytes like every other ProgressFn: the total is what the nodes
  // hold (each replica is verified), known from their manifests before verifying starts. The
  // checkpoint's info, which holds that count, is in every page: one page per node is enough.
  std::atomic<uint64_t> total{0};
  // Every rank must be held somewhere: each node verifies only what it holds, and a rank whose
  // copies were all lost leaves placeholders that verify trivially.
  if (nodes_.size() > 1) RETURN_IF_ERROR(Show(job, step).status());
  if (progress) {
    auto mreq = JobStep<v1::GetManifestRequest>(job, step);
    mreq.set_paged(true);
    RETURN_IF_ERROR(ForAllNodesTolerant([&](Node& node) -> absl::Status {
      v1::GetManifestResponse resp;
      RETURN_IF_ERROR(Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::GetManifestResponse* r) {
        return node.stub()->GetManifest(ctx, mreq, r);
      }));
      total += resp.manifest().info().raw_bytes();
      return absl::OkStatus();
    }));
  }
  const auto req = JobStep<v1::VerifyRequest>(job, step);
  absl::Mutex mu;  // progress calls never overlap, and `done` never decreases
  uint64_t done = 0;
  std::atomic<size_t> nodes_done{0};
  RETURN_IF_ERROR(ForAllNodes([&](Node& node) -> absl::Status {
    v1::VerifyResponse resp;
    absl::Status v = Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::VerifyResponse* r) {
      return node.stub()->Verify(ctx, req, r);
    });
    // A node that never saw this checkpoint is fine when another one has it.
    if (v.code() == absl::StatusCode::kNotFound && nodes_.size() > 1) return absl::OkStatus();
    RETURN_IF_ERROR(v);
    ++nodes_done;
    absl::MutexLock lock(&mu);
    done += resp.bytes_verified();
    if (progress) progress(done, std::max<uint64_t>(done, total.load()));
    return absl::OkStatus();
  }));
  if (nodes_done == 0) return absl::NotFoundError(absl::StrCat(job, " step ", step, " not found"));
  return absl::OkStatus();
}

absl::Status RemoteClient::Delete(const std::string& job, int64_t step, uint64_t epoch) {
  ForgetRestoreManifest();
  auto req = JobStep<v1::DeleteRequest>(job, step);
  req.set_epoch(epoch);
  return ForAllNodesTolerant([&](Node& node) {
    // A retry that finds the step gone after an answer was lost: the lost answer's delete.
    return remote::WithRetryRemoving(options_, &node, [&]() -> absl::Status {
      grpc::ClientContext ctx;
      remote::PrepareContext(&ctx, options_, options_.rpc_timeout_ms);
      v1::DeleteResponse resp;
      return Annotate(proto::FromGrpc(node.stub()->Delete(&ctx, req, &resp)), node.endpoint);
    });
  });
}

absl::StatusOr<GcResult> RemoteClient::Gc(const std::string& job, const GcPolicy& policy,
                                          uint64_t epoch) {
  ForgetRestoreManifest();
  v1::GcRequest req;
  req.set_job(job);
  req.set_epoch(epoch);
  if (nodes_.size() == 1) {  // the node sees every shard: its own decision is the cluster's
    req.set_keep_last(policy.keep_last);
    req.set_keep_every(policy.keep_every);
  } else {
    // Each node holds only some ranks (placeholders for the others verify trivially), so the
    // FULLs kept are decided here, over the merged listing, with a verify of every rank where
    // it is held (common/gc_plan.h); each node is sent the FULLs to delete.
    ASSIGN_OR_RETURN(std::vector<CheckpointInfo> listed, List(job, /*include_pending=*/false));
    ASSIGN_OR_RETURN(std::vector<int64_t> doomed,
                     storage::FullsOutsidePolicy(job, listed, policy, [&](int64_t step) {
                       return Verify(job, step, nullptr);
                     }));
    req.set_explicit_steps(true);
    for (int64_t step : doomed) req.add_delete_fulls(step);
  }
  absl::Mutex mu;
  std::set<int64_t> deleted;
  GcResult out;
  RETURN_IF_ERROR(ForAllNodesTolerant([&](Node& node) -> absl::Status {
    v1::GcResponse resp;
    RETURN_IF_ERROR(Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::GcResponse* r) {
      return node.stub()->Gc(ctx, req, r);
    }));
    if (req.explicit_steps() && !resp.explicit_steps()) {
      return absl::FailedPreconditionError(absl::StrCat(
          node.endpoint, ": ignored the steps gc sent it (a server without "
          "GcRequest.explicit_steps cannot take part in a gc over several nodes: upgrade it)"));
    }
    absl::MutexLock lock(&mu);
    deleted.insert(resp.deleted_steps().begin(), resp.deleted_steps().end());
    out.bytes_reclaimed += resp.bytes_reclaimed();
    return absl::OkStatus();
  }));
  out.deleted_steps.assign(deleted.begin(), deleted.end());
  return out;
}

absl::Status RemoteClient::HealthNotes(std::vector<std::string>* notes) {
  absl::Mutex mu;
  std::map<std::string, std::string> by_node;  // endpoint order, whatever order they answer in
  RETURN_IF_ERROR(ForAllNodes([&](Node& node) -> absl::Status {
    v1::HealthResponse resp;
    RETURN_IF_ERROR(Unary(node, &resp, [&](grpc::ClientContext* ctx, v1::HealthResponse* r) {
      return node.stub()->Health(ctx, v1::HealthRequest(), r);
    }));
    if (!resp.serving()) return absl::UnavailableError(absl::StrCat(node.endpoint, ": stopping"));
    WriteSpaceState space;
    space.writes_refused = resp.writes_refused_low_space();
    space.free_bytes = resp.free_bytes();
    space.reserve_bytes = resp.reserve_bytes();
    space.restart_needed = resp.restart_needed();
    if (space.writes_refused) {
      absl::MutexLock lock(&mu);
      by_node[node.endpoint] = absl::StrCat(node.endpoint, ": ", space.Note());
    }
    return absl::OkStatus();
  }));
  if (notes != nullptr) {
    for (auto& [endpoint, note] : by_node) notes->push_back(std::move(note));
  }
  return absl::OkStatus();
}

// Like ForAllNodes, but a node answering NOT_FOUND counts as done when another node succeeds.
absl::Status RemoteClient::ForAllNodesTolerant(const std::function<absl::Status(Node&)>& fn) {
  absl::Mutex mu;
  int ok = 0;
  absl::Status s = ForAllNodes([&](Node& node) -> absl::Status {
    absl::Status r = fn(node);
    if (r.code() == absl::StatusCode::kNotFound && nodes_.size() > 1) return absl::OkStatus();
    if (r.ok()) {
      absl::MutexLock lock(&mu);
      ++ok;
    }
    return r;
  });
  RETURN_IF_ERROR(s);
  if (ok == 0) return absl::NotFoundError("not found on any node");
  return absl::OkStatus();
}

}  // namespace remote
}  // namespace client
}  // namespace gradsnap
