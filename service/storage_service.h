// The gRPC service gradsnap.v1.Storage over a storage::Engine (DESIGN.md section 6,
// docs/protocol.md).
//
// OVERVIEW
//   Synchronous gRPC API: every call runs on a gRPC thread. Each handler validates the request
//   (proto/convert.h), authorizes it (auth.h), calls the engine, and converts the result at the
//   edge: absl::Status codes are gRPC codes. Uploads (Write) reserve memory from the in-flight
//   limiter before reading each message, append to an engine ShardWriter, make the bytes
//   durable every flush_bytes (so a resumed upload loses little) and, with a RAM tier, stage the
//   payload so the cache is filled when the checkpoint commits. Downloads (Read) are served from
//   the RAM tier when it holds the shard, else from the engine.
//
//   Zero copy: Write and Read are registered as raw methods (grpc::ByteBuffer in, ByteBuffer
//   out) and their messages are parsed and built by hand (proto/raw_message.h). A received
//   `data` field stays in gRPC's receive slices: the engine appends from them (and the RAM tier
//   copies from them into its own blocks). A Read answer's `data` is slices over the engine
//   reader's decoded chunks (ShardReader::ReadShared: the chunk stays alive and out of the
//   reader's reuse until gRPC releases the slice) or over the RAM tier's blocks (kept alive by
//   the slice); nothing is copied between the decoded chunk and the socket.
//
// ERROR HANDLING
//   A bad request fails only its own call; nothing here aborts the process. At most one stream
//   writes a given shard at a time (a second one gets ABORTED). A stream that breaks flushes
//   what it received, so committed_size (QueryWriteStatus) tells the client where to resume.
//
// THREAD SAFETY
//   All methods may be called concurrently; shared state is the engine (thread-safe), the cache
//   and limiter (thread-safe) and the active-writer set below (mutex).
#ifndef GRADSNAP_SERVICE_STORAGE_SERVICE_H_
#define GRADSNAP_SERVICE_STORAGE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "absl/synchronization/mutex.h"
#include "proto/gradsnap.grpc.pb.h"
#include "proto/raw_message.h"
#include "service/auth.h"
#include "service/idle_watch.h"
#include "service/inflight_limiter.h"
#include "service/metrics.h"
#include "service/shard_cache.h"
#include "storage/engine.h"

namespace gradsnap {
namespace service {

struct StorageServiceOptions {
  // Memory charged to the in-flight budget by each upload stream: one message plus what the
  // engine writer may hold: the lesser of what two flushes apart can queue (flush_bytes plus
  // the chunk being filled and one being encoded, each with a raw and a compressed buffer) and
  // the writer's own bound (storage::MaxShardWriterBufferBytes). 0: computed that way by
  // Server::Start. Default: 0.
  uint64_t per_stream_bytes = 0;
  // Memory charged to the read budget by each Read served from disk: the engine reader's
  // read-ahead window (128 MiB) and one message. Reads from the RAM tier are not charged.
  // Default: 132 MiB.
  uint64_t per_read_bytes = 132u << 20;
  // How long an upload waits for budget before RESOURCE_EXHAUSTED "server busy". Default: 5 s.
  int busy_wait_ms = 5000;
  // Received bytes between Flush() calls of a writer (durable points): a crash makes a client
  // resend at most this much. Each Flush waits for the writer's queue and two fsyncs, so fewer
  // is faster. Default: 64 MiB.
  uint64_t flush_bytes = 64u << 20;
  // The engine's digest for new shards (EngineOptions::digest): sizes the largest shard info a
  // Read must send (proto::ShardInfoBytesBound). Default: XXH3-128.
  DigestAlgo digest = DigestAlgo::kXxh3_128;
  // A Write or Read call that waits on its client this long (an upload's next message, a
  // download's client taking the next one) is cancelled (service/idle_watch.h): a live client
  // that stops taking part holds its shard and budget no longer. 0: off. Default: 120000
  // (2 min; clients stream without pauses).
  int stream_idle_ms = 120000;
  // Cluster mode (--etcd): asked before each write (BeginCheckpoint, AcquireEpoch, the start of
  // an upload and its commit); a non-OK answer refuses the write with that status (UNAVAILABLE
  // while the node holds no live lease, cluster/membership.h). Default: none (single node:
  // writes are never refused for this).
  std::function<absl::Status()> write_gate;
  // Cluster mode: PullCopy's work (client::RepairWorker::Pull): copy the node-local checkpoint
  // (job, step) from another node here; `cancelled` says the caller went away. Default: none
  // (PullCopy answers UNIMPLEMENTED).
  std::function<absl::StatusOr<uint64_t>(const v1::PullCopyRequest& req,
                                         const std::function<bool()>& cancelled)>
      pull_copy;
  // The node's stable id (<data-dir>/node_id, cluster/node_id.h), answered by Health so that
  // clients of a static endpoint list place shards by node, not by how an endpoint is spelled.
  // Default: empty (not answered).
  std::string node_id;
};

class StorageService final : public gradsnap::v1::Storage::Service {
 public:
  // Borrows everything; all must outlive the service. cache may have budget 0.
  StorageService(storage::Engine* engine, const Authorizer* auth, InflightLimiter* limiter,
                 InflightLimiter* read_limiter, ShardCache* cache,
                 const StorageServiceOptions& options);

  // Health reports serving=false and new uploads get UNAVAILABLE from now on.
  void BeginShutdown() { serving_ = false; }

  // The unary handlers: Name(ctx, const v1::NameRequest*, v1::NameResponse*), overriding the
  // generated service's (docs/protocol.md for each).
#define GRADSNAP_UNARY_HANDLER(Name)                                            \
  grpc::Status Name(grpc::ServerContext* ctx, const v1::Name##Request* req,     \
                    v1::Name##Response* resp) override
  GRADSNAP_UNARY_HANDLER(Health);
  GRADSNAP_UNARY_HANDLER(BeginCheckpoint);
  GRADSNAP_UNARY_HANDLER(AbortCheckpoint);
  GRADSNAP_UNARY_HANDLER(AcquireEpoch);
  GRADSNAP_UNARY_HANDLER(QueryWriteStatus);
  GRADSNAP_UNARY_HANDLER(ListJobs);
  GRADSNAP_UNARY_HANDLER(ListCheckpoints);
  GRADSNAP_UNARY_HANDLER(GetManifest);
  GRADSNAP_UNARY_HANDLER(Verify);
  GRADSNAP_UNARY_HANDLER(Delete);
  GRADSNAP_UNARY_HANDLER(Gc);
  GRADSNAP_UNARY_HANDLER(PullCopy);
#undef GRADSNAP_UNARY_HANDLER

  // One page of a manifest (docs/protocol.md, "Large manifests").
  static absl::Status ManifestPage(const storage::Manifest& m, const v1::GetManifestRequest& req,
                                   v1::GetManifestResponse* resp);

 private:
  using ShardKey = std::tuple<std::string, int64_t, int32_t>;
  using WriteStream = grpc::ServerReaderWriter<v1::WriteResponse, grpc::ByteBuffer>;
  using ReadStream = grpc::ServerSplitStreamer<v1::ReadRequest, grpc::ByteBuffer>;
  class ActiveShard;    // RAII claim on a shard being written
  class StagedPayload;  // RAII RAM-tier reservation of an upload
  struct WriteMessage;  // one WriteRequest, parsed without copying its data

  // Write and Read with raw messages (registered in the constructor in place of the generated
  // handlers; the wire format is unchanged).
  grpc::Status RawWrite(grpc::ServerContext* ctx, WriteStream* stream);
  grpc::Status RawRead(grpc::ServerContext* ctx, ReadStream* stream);

  absl::Status DoWrite(grpc::ServerContext* ctx, WriteStream* stream, v1::WriteResponse* resp);
  // Reads and parses the next message; false at the end of the stream.
  absl::StatusOr<bool> NextMessage(WriteStream* stream, WriteMessage* msg,
                                   IdleWatch::Scope* watch);
  // Appends messages to the writer (the first one is in *msg) until finish_write or the end of
  // the stream; true when finish_write arrived.
  absl::StatusOr<bool> ReceivePayload(WriteStream* stream, IdleWatch::Scope* watch,
                                      storage::ShardWriter* writer,
                                      WriteMessage* msg, StagedPayload* stage);
  // Appends one message's data past what the writer already has.
  absl::Status AppendMessage(storage::ShardWriter* writer, const WriteMessage& msg,
                             uint64_t* unflushed);
  // The stream ended without finish_write: what arrived is made durable for a resume.
  absl::Status KeepResumable(grpc::ServerContext* ctx, storage::ShardWriter* writer,
                             v1::WriteResponse* resp);
  // finish_write: commits the shard and publishes the staged payload.
  // The first step of the chain (job, step) belongs to, for the RAM tier: the base FULL of a
  // DELTA, else the step itself.
  int64_t ChainBase(const std::string& job, int64_t step);
  absl::Status FinishShard(const storage::ShardSpec& spec, storage::ShardWriter* writer,
                           StagedPayload* stage, v1::WriteResponse* resp);
  absl::Status DoRead(grpc::ServerContext* ctx, ReadStream* stream);
  // Streams payload [offset, end) in messages of at most kMaxDataBytes; the first carries the
  // shard info. From the RAM tier when cached is set, else from reader.
  absl::Status SendPayload(ReadStream* stream, IdleWatch::Scope* watch, const Payload& cached,
                           storage::ShardReader* reader, const storage::ShardInfo& info,
                           uint64_t offset, uint64_t end);
  // Slices lending the reader's decoded chunks for payload [offset, offset + n).
  absl::Status LendChunks(storage::ShardReader* reader, const storage::ShardInfo& info,
                          uint64_t offset, size_t n, std::vector<grpc::Slice>* data);

  // Runs one unary handler body: latency histogram, then Done().
  template <typename Fn>
  grpc::Status Unary(Fn&& body) {
    ScopedLatency t(metrics_->unary_seconds);
    return Done(body());
  }
  // The checks every (job[, step]) request starts with: valid names and steps, then the token.
  absl::Status Admit(const grpc::ServerContext& ctx, const std::string& job);
  absl::Status Admit(const grpc::ServerContext& ctx, const std::string& job, int64_t step);
  absl::Status Admit(const grpc::ServerContext& ctx, const std::string& job, int64_t step,
                     int32_t rank);
  // OK, or why options_.write_gate refuses writes now.
  absl::Status WriteGate() const {
    return options_.write_gate ? options_.write_gate() : absl::OkStatus();
  }
  // Counts and converts a handler's result.
  grpc::Status Done(const absl::Status& s);

  storage::Engine* const engine_;
  const Authorizer* const auth_;
  InflightLimiter* const limiter_;
  InflightLimiter* const read_limiter_;
  ShardCache* const cache_;
  const StorageServiceOptions options_;
  IdleWatch idle_watch_{absl::Milliseconds(options_.stream_idle_ms)};
  ServiceMetrics* const metrics_;
  std::atomic<bool> serving_{true};

  absl::Mutex mu_;
  // The stream writing each shard: its writer epoch and its call, which a stream of a newer
  // attempt cancels (valid while the entry exists: the claim is dropped before the call ends).
  struct ShardWriterCall {
    uint64_t epoch = 0;
    grpc::ServerContext* ctx = nullptr;
  };
  std::map<ShardKey, ShardWriterCall> active_ ABSL_GUARDED_BY(mu_);
};

}  // namespace service
}  // namespace gradsnap

#endif  // GRADSNAP_SERVICE_STORAGE_SERVICE_H_
