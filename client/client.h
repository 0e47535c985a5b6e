// gradsnap client library: the public interface a trainer links (DESIGN.md sections 1, 2, 6).
//
// OVERVIEW
//   A Client talks either to one or more gradsnap-server nodes over gRPC (endpoints set) or to
//   an embedded storage engine in a local directory (local_dir set). Both back ends behave the
//   same: the trainer saves each rank's shard from host memory, the checkpoint commits when all
//   world_size shards are durable, and a shard restores into caller-provided memory.
//   This header has no gRPC, protobuf or CUDA types; the data model structs come from
//   storage/types.h.
//
// ERRORS
//   absl::Status codes as in storage/engine.h. UNAVAILABLE is retried internally with backoff
//   (uploads resume from the server's committed offset) before it is returned.
//
// THREAD SAFETY
//   Client is thread-safe; several shards may be saved concurrently.
#ifndef GRADSNAP_CLIENT_CLIENT_H_
#define GRADSNAP_CLIENT_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/types.h"

namespace gradsnap {
namespace client {

using storage::CheckpointInfo;
using storage::CheckpointKind;
using storage::CheckpointSpec;
using storage::CheckpointState;
using storage::GcPolicy;
using storage::GcResult;
using storage::Manifest;
using storage::ShardInfo;
using storage::ShardSpec;
using storage::TensorInfo;
using storage::TensorSpec;

struct ClientOptions {
  // Remote mode: "host:port" of each storage node. Default: empty.
  std::vector<std::string> endpoints;
  // Embedded mode (used when endpoints is empty): the engine's data directory.
  // Default: empty (one of the two must be set).
  std::string local_dir;
  // Embedded mode: open the engine read-only (storage::EngineOptions::read_only); saves,
  // deletes and GC then fail with FAILED_PRECONDITION. Default: false.
  bool read_only = false;
  // Bearer token for the job (gradsnap token JOB). Default: empty (server runs open).
  std::string token;
  // PEM CA certificate: when set, connect with TLS. Default: empty (plaintext).
  std::string tls_ca_file;
  // Client certificate and key for mutual TLS. Default: empty.
  std::string tls_cert_file;
  std::string tls_key_file;
  // Copies of every shard across endpoints (rendezvous hashing). Default: 1.
  int replicas = 1;
  // Upper bound on bytes buffered by asynchronous saves in this client. Default: 256 MiB.
  size_t max_inflight_bytes = 256u << 20;
  // Attempts for an operation that fails with UNAVAILABLE or RESOURCE_EXHAUSTED-by-backpressure.
  // Default: 8.
  int max_attempts = 8;
  // Deadline for unary calls, in milliseconds; an upload stream gets this plus the time its
  // remaining bytes take at 8 MiB/s, so a hung server cannot hold a save forever.
  // Default: 30000.
  int rpc_timeout_ms = 30000;
};

// One tensor's bytes in caller memory, for saving.
struct TensorRef {
  TensorSpec spec;
  const void* data = nullptr;  // spec.byte_length bytes; must stay valid until the save resolves
};

// Progress callback: bytes done so far and total (restore, verify, export).
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

class Client {
 public:
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  virtual ~Client() = default;

  // Starts a checkpoint; every rank may call it with the identical spec (idempotent).
  virtual absl::Status BeginCheckpoint(const CheckpointSpec& spec) = 0;
  // Saves one shard. The returned future resolves once the shard is durable on every replica
  // (and the checkpoint committed, if this was its last shard). Tensor memory must stay valid
  // until then. Several saves may be in flight; memory use stays under max_inflight_bytes.
  // spec.tensors may be left empty (it is taken from `tensors`, in order) or must equal the
  // specs in `tensors`; the payload is the tensors' bytes in that order. A mismatch, a bad name,
  // or a byte_length other than product(shape) * DTypeSize(dtype) is INVALID_ARGUMENT.
  virtual std::future<absl::Status> SaveShardAsync(const ShardSpec& spec,
                                                   std::vector<TensorRef> tensors) = 0;
  absl::Status SaveShard(const ShardSpec& spec, std::vector<TensorRef> tensors) {
    return SaveShardAsync(spec, std::move(tensors)).get();
  }
  virtual absl::Status AbortCheckpoint(const std::string& job, int64_t step) = 0;
  // Takes the job's next writer epoch (docs/protocol.md, "Epochs"). Saves and begins whose spec
  // carries an older non-zero epoch are refused from then on (FAILED_PRECONDITION "superseded by
  // attempt N"). Remote: the largest epoch over all nodes, every node told.
  virtual absl::StatusOr<uint64_t> AcquireEpoch(const std::string& job) = 0;

  virtual absl::StatusOr<std::vector<std::string>> ListJobs() = 0;
  virtual absl::StatusOr<std::vector<CheckpointInfo>> List(const std::string& job,
                                                           bool include_pending = false) = 0;
  virtual absl::StatusOr<Manifest> Show(const std::string& job, int64_t step) = 0;
  // Restores one tensor of a committed shard into out[0, out_len), verified.
  virtual absl::Status RestoreTensor(const std::string& job, int64_t step, int32_t rank,
                                     const std::string& tensor, void* out, size_t out_len) = 0;
  // Streams a shard's whole payload (tensors in manifest order) through `sink`, verified.
  virtual absl::Status RestoreShard(const std::string& job, int64_t step, int32_t rank,
                                    const std::function<absl::Status(const void*, size_t)>& sink,
                                    const ProgressFn& progress = nullptr) = 0;
  // Reads payload bytes [offset, offset + length) of a committed shard (its tensors back to back
  // in manifest order) into out[0, length): a ranged read, for resharding. Every chunk the range
  // touches is checked against its checksum (DATA_LOSS on a mismatch); a tensor's SHA-256 is
  // checked only by whole-tensor reads. A range past the payload is OUT_OF_RANGE. Thread-safe:
  // several ranges may be read at once.
  virtual absl::Status ReadShardRange(const std::string& job, int64_t step, int32_t rank,
                                      uint64_t offset, uint64_t length, void* out) = 0;
  virtual absl::Status Verify(const std::string& job, int64_t step,
                              const ProgressFn& progress = nullptr) = 0;
  virtual absl::Status Delete(const std::string& job, int64_t step) = 0;
  virtual absl::StatusOr<GcResult> Gc(const std::string& job, const GcPolicy& policy) = 0;
  // OK when every endpoint answers (or the local engine is open).
  virtual absl::Status Health() = 0;
};

}  // namespace client
}  // namespace gradsnap

#endif  // GRADSNAP_CLIENT_CLIENT_H_
