// Internal: the remote Client back end (NewRemoteClient), over gRPC to gradsnap-server nodes
// (docs/protocol.md). Implemented in remote_client.cc (connection, saves) and remote_read.cc
// (restore, listing, admin calls).
//
// OVERVIEW
//   Every (job, rank) shard lives on `replicas` nodes chosen by rendezvous hashing
//   (remote_placement.h) on each node's stable id, learned from its Health answer
//   (HealthResponse.node_id) before the first placement, so two spellings of one node's
//   address place alike; a node whose id is not known yet (down; a server without the field)
//   is ranked by its endpoint string. Uploads stream 1 MiB messages and resume from the node's committed
//   offset (QueryWriteStatus) after a broken stream; downloads try the replicas in preference
//   order and continue from the last byte received on the next live one. Checkpoint-wide calls
//   (begin, abort, delete, gc, verify) go to every node. The storage engine commits a checkpoint
//   on a node when all world_size ranks are committed there, so a node that does not hold a
//   rank receives an empty placeholder shard for it (after the real copies are durable); the
//   client hides placeholders when it merges manifests.
//
// ERROR HANDLING
//   Retryable codes (remote_rpc.h) are retried with backoff up to max_attempts per step.
//   DATA_LOSS and validation errors are returned as is.
//
// THREAD SAFETY
//   Thread-safe. Asynchronous saves run on a few worker threads; each holds at most one
//   message per replica stream, so memory stays bounded by max_inflight_bytes.
#ifndef GRADSNAP_CLIENT_REMOTE_CLIENT_H_
#define GRADSNAP_CLIENT_REMOTE_CLIENT_H_

#include <atomic>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/client.h"
#include "client/remote_rpc.h"
#include "client/save_util.h"
#include "common/status.h"
#include "proto/raw_message.h"

namespace gradsnap {
namespace client {
namespace remote {

// Metadata of the empty shard a node gets for a rank it does not hold.
inline constexpr char kPlaceholder[] = "gradsnap.remote.placeholder.v1";
// Client memory charged per upload stream: one message, its serialized copy, slack.
inline constexpr uint64_t kPerStreamBytes = 4u << 20;

inline bool IsPlaceholder(const ShardInfo& s) { return s.metadata == kPlaceholder; }

class RemoteClient final : public Client {
 public:
  RemoteClient(ClientOptions options, std::vector<std::unique_ptr<Node>> nodes);
  ~RemoteClient() override;

  absl::Status BeginCheckpoint(const CheckpointSpec& spec) override;
  std::future<absl::Status> SaveShardAsync(const ShardSpec& spec,
                                           std::vector<TensorRef> tensors) override;
  absl::Status AbortCheckpoint(const std::string& job, int64_t step,
                               uint64_t epoch = 0) override;
  absl::StatusOr<uint64_t> AcquireEpoch(const std::string& job) override;
  // Cluster mode (cluster_client.cc): raises the job's epoch on every node to `epoch`, an epoch
  // taken from etcd, so the nodes refuse the writes of older attempts too.
  // FAILED_PRECONDITION "superseded" when a node already holds a newer one.
  absl::Status RaiseEpoch(const std::string& job, uint64_t epoch);
  // Cluster repair (docs/protocol.md, "Repair"): asks the first node to copy the node-local
  // checkpoint (job, step) from node `source_node_id` itself (PullCopy), one attempt with a
  // deadline of `deadline_ms`; the bytes it copied.
  absl::StatusOr<uint64_t> PullCopy(const std::string& job, int64_t step,
                                    const std::string& source_node_id, const std::string& digest,
                                    uint64_t raw_bytes, int64_t deadline_ms);
  absl::StatusOr<std::vector<std::string>> ListJobs() override;
  absl::StatusOr<std::vector<CheckpointInfo>> List(const std::string& job,
                                                   bool include_pending) override;
  absl::StatusOr<Manifest> Show(const std::string& job, int64_t step) override;
  absl::Status RestoreTensor(const std::string& job, int64_t step, int32_t rank,
                             const std::string& tensor, void* out, size_t out_len) override;
  absl::Status RestoreShard(const std::string& job, int64_t step, int32_t rank,
                            const std::function<absl::Status(const void*, size_t)>& sink,
                            const ProgressFn& progress) override;
  absl::Status ReadShardRange(const std::string& job, int64_t step, int32_t rank,
                              uint64_t offset, uint64_t length, void* out) override;
  absl::Status Verify(const std::string& job, int64_t step, const ProgressFn& progress) override;
  absl::Status Delete(const std::string& job, int64_t step, uint64_t epoch) override;
  absl::StatusOr<GcResult> Gc(const std::string& job, const GcPolicy& policy,
                              uint64_t epoch) override;
  absl::Status Health() override { return HealthNotes(nullptr); }
  absl::Status HealthNotes(std::vector<std::string>* notes) override;
  // The placement keys (StaticPlacementKeys, backends.h), asking every node not known yet.
  absl::StatusOr<std::vector<std::string>> PlacementKeys();
  // SaveShard on the calling thread, not on the save queue's: the cluster client's uploads,
  // so that a CancelScope on that thread (remote_rpc.h) reaches every call of the upload.
  absl::Status SaveShardOnThisThread(const ShardSpec& spec, const std::vector<TensorRef>& tensors);

 private:
  // One unary call with retries: call(ctx, resp) issues it.
  template <typename Resp, typename Call>
  absl::Status Unary(Node& node, Resp* resp, Call&& call) {
    return remote::WithRetry(options_, &node, [&]() -> absl::Status {
      grpc::ClientContext ctx;
      remote::CallGuard guard(&ctx);
      remote::PrepareContext(&ctx, options_, options_.rpc_timeout_ms);
      resp->Clear();
      return Annotate(proto::FromGrpc(call(&ctx, resp)), node.endpoint);
    });
  }
  // One unary call of `method` (a Stub member) with retries; the answer is dropped.
  template <typename Req, typename Resp>
  absl::Status Call(Node& node, const Req& req,
                    grpc::Status (v1::Storage::Stub::*method)(grpc::ClientContext*, const Req&,
                                                             Resp*)) {
    Resp resp;
    return Unary(node, &resp, [&](grpc::ClientContext* ctx, Resp* r) {
      return (node.stub().get()->*method)(ctx, req, r);
    });
  }
  // A request naming one checkpoint.
  template <typename Req>
  static Req JobStep(const std::string& job, int64_t step) {
    Req req;
    req.set_job(job);
    req.set_step(step);
    return req;
  }
  // Runs fn(node) on every node in parallel; the first error in node order, else OK.
  absl::Status ForAllNodes(const std::function<absl::Status(Node&)>& fn);
  // Like ForAllNodes, but NOT_FOUND from some nodes is fine when one node succeeded.
  absl::Status ForAllNodesTolerant(const std::function<absl::Status(Node&)>& fn);
  // Runs fn on every node; OK when any succeeds (reads that merge what live nodes know).
  absl::Status ForAnyNode(const std::function<absl::Status(Node&)>& fn);

  absl::Status SaveShardNow(const ShardSpec& spec, const std::vector<TensorRef>& tensors);
  // The whole manifest from one node, fetched page by page.
  absl::StatusOr<Manifest> FetchManifest(Node& node, v1::GetManifestRequest req);
  // Uploads (or resumes) one shard on one node until it is committed there.
  absl::Status UploadShard(Node& node, const ShardSpec& spec,
                           const std::vector<TensorRef>& tensors);
  absl::Status UploadAttempt(Node& node, const ShardSpec& spec,
                             const std::vector<TensorRef>& tensors,
                             const std::vector<uint64_t>& starts, uint64_t total,
                             uint64_t* committed);
  static constexpr uint64_t kToEnd = ~uint64_t{0};
  // The size one Read stream of a parallel restore fetches: whole tensors up to this much, or
  // one larger tensor (docs/protocol.md, "Parallel restore").
  static constexpr uint64_t kReadBlockBytes = 16u << 20;
  // Receives payload bytes as references to received gRPC slices (no copy).
  using PieceSink = std::function<absl::Status(const grpc::Slice& piece)>;
  // The version of a shard the reads of one call take their bytes from: the first node to
  // answer sets it (tensor names, sizes and digests); a node holding another version (the
  // step deleted on some nodes and saved again: replicas that disagree) is ABORTED for this
  // call, so bytes of two versions are never put together. Thread-safe.
  class ShardVersion {
   public:
    absl::Status Check(const storage::ShardInfo& info, const std::string& endpoint);
    // Where a read of a range that began at `start` resumes after it broke at `offset`: the
    // start of the tensor `offset` lies strictly inside, when that tensor begins at or after
    // `start` (the range covers it from its start, so the resumed stream does too, and the
    // server checks its digest); else `offset` itself.
    uint64_t ResumePoint(uint64_t offset, uint64_t start);
   private:
    absl::Mutex mu_;
    std::optional<storage::ShardInfo> first_ ABSL_GUARDED_BY(mu_);  // the first node's answer
  };
  // Streams [from, end) of a shard from one node, handing the bytes from *offset on
  // (from <= *offset: those before were delivered already, and are read again only so that the
  // server sees the tensor they belong to whole) through sink, advancing *offset; end may be
  // kToEnd (or past the shard: it stops at its end). *total receives the payload size.
  absl::Status ReadFrom(Node& node, const std::string& job, int64_t step, int32_t rank,
                        uint64_t from, uint64_t* offset, uint64_t end, const PieceSink& sink,
                        uint64_t* total, ShardVersion* version);
  // ReadFrom over the shard's replicas in preference order, resuming where the last left off
  // (from the start of a tensor the break cut, ShardVersion::ResumePoint).
  // total_out (may be null) receives the payload size. `version` (null: one of its own) is
  // shared by the reads of one restore.
  absl::Status ReadRange(const std::string& job, int64_t step, int32_t rank, uint64_t offset,
                         uint64_t end, const PieceSink& sink, uint64_t* total_out,
                         ShardVersion* version = nullptr);
  // ReadRange of [from, to) copied to dst[0, to - from); OUT_OF_RANGE when the shard ends
  // before `to` (the stream then ends normally at the shard's end).
  absl::Status ReadInto(const std::string& job, int64_t step, int32_t rank, uint64_t from,
                        uint64_t to, char* dst, ShardVersion* version = nullptr);
  // The payload ranges ending at `cuts` over `streams` parallel Read streams, delivered in
  // order.
  absl::Status ReadRangesInOrder(const std::string& job, int64_t step, int32_t rank,
                                 const std::vector<uint64_t>& cuts, size_t streams,
                                 const PieceSink& deliver);

  // The manifest of (job, step) for a parallel RestoreShard: the one fetched last when it is
  // for the same checkpoint and committed, else a fresh one (kept when committed). Restoring
  // the ranks of a checkpoint one after another thus fetches its manifest once.
  absl::StatusOr<std::shared_ptr<const Manifest>> RestoreManifest(const std::string& job,
                                                                  int64_t step, bool fresh);
  // Forgets that manifest (this client changed the job's checkpoints).
  void ForgetRestoreManifest();

  // The nodes in placement order for (job, rank) (remote_placement.h over placement keys):
  // first learns the ids not known yet (every unknown node for a write; for a read, those not
  // asked within kReprobeMs). INVALID_ARGUMENT when two endpoints answer one node id.
  absl::StatusOr<std::vector<size_t>> Placement(const std::string& job, int32_t rank,
                                                bool write);
  static constexpr int64_t kReprobeMs = 5000;

  const ClientOptions options_;
  std::vector<std::unique_ptr<Node>> nodes_;
  std::vector<std::string> endpoints_;
  size_t replicas_;

  // Placement keys: per node its id once a Health answer named one, else its endpoint. Held
  // while asking, so concurrent placements wait for the answer rather than rank differently.
  absl::Mutex keys_mu_;
  std::vector<std::string> keys_ ABSL_GUARDED_BY(keys_mu_);
  std::vector<bool> key_known_ ABSL_GUARDED_BY(keys_mu_);  // answered (with or without an id)
  std::vector<int64_t> asked_ms_ ABSL_GUARDED_BY(keys_mu_);  // monotonic ms of the last ask
  absl::Status keys_status_ ABSL_GUARDED_BY(keys_mu_);  // a duplicate id, once seen

  // Message buffers of uploads, reused across streams.
  const std::shared_ptr<proto::BufferPool> upload_buffers_;
  std::unique_ptr<SaveQueue> saves_;

  absl::Mutex restore_mu_;
  std::shared_ptr<const Manifest> restore_manifest_ ABSL_GUARDED_BY(restore_mu_);
};

}  // namespace remote
}  // namespace client
}  // namespace gradsnap

#endif  // GRADSNAP_CLIENT_REMOTE_CLIENT_H_
