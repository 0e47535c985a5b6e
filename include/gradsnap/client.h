// gradsnap client library: the public interface a trainer links (DESIGN.md sections 1, 2, 6).
// Installed as <gradsnap/client.h> with <gradsnap/types.h>, <gradsnap/dtype.h>,
// <gradsnap/clock.h> and <gradsnap/tls.h>; link
// gradsnap::gradsnap (CMake, find_package(gradsnap)) or `pkg-config gradsnap` (docs/build.md).
//
// OVERVIEW
//   A Client talks either to one or more gradsnap-server nodes over gRPC (endpoints set) or to
//   an embedded storage engine in a local directory (local_dir set). Both back ends behave the
//   same: the trainer saves each rank's shard from host memory, the checkpoint commits when all
//   world_size shards are durable, and a shard restores into caller-provided memory.
//   This header has no gRPC, protobuf or CUDA types; the data model structs come from
//   gradsnap/types.h.
//
// ERRORS
//   Every call returns an absl::Status (or StatusOr) with a one-line message. The codes mean the
//   same for every call and back end:
//     INVALID_ARGUMENT     a bad name ([A-Za-z0-9._-]{1,128}), size, dtype, shape or option
//     NOT_FOUND            unknown job, step, rank or tensor
//     ALREADY_EXISTS       a checkpoint or shard exists with a different spec
//     FAILED_PRECONDITION  the checkpoint is in the wrong state (restoring a PENDING one,
//                          deleting a FULL that a DELTA needs, aborting a committed one), or
//                          local_dir is open in another process
//     DATA_LOSS            a checksum or SHA-256 mismatch: stored bytes are damaged
//     RESOURCE_EXHAUSTED   out of disk, or the server's memory limit
//     UNAUTHENTICATED, PERMISSION_DENIED   remote only: no token, or a token for another job
//     UNAVAILABLE          a node does not answer (remote), or the same shard is being saved
//                          by another call right now
//   Remote mode retries UNAVAILABLE, ABORTED and a busy server's RESOURCE_EXHAUSTED internally
//   with backoff (50 ms doubling to 2 s, up to ClientOptions::max_attempts); uploads and
//   downloads resume from the last byte a node holds or sent. Only the last failure is
//   returned. The embedded back end does not retry.
//
// THREAD SAFETY
//   Client is thread-safe; several shards may be saved concurrently. A RestoreShard sink runs on
//   the calling thread; see ProgressFn for progress callbacks.
#ifndef GRADSNAP_INCLUDE_GRADSNAP_CLIENT_H_
#define GRADSNAP_INCLUDE_GRADSNAP_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gradsnap/clock.h"
#include "gradsnap/tls.h"
#include "gradsnap/types.h"

namespace gradsnap {
class PopulateAhead;  // common/populate.h
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
  // Embedded mode (used when endpoints is empty): the engine's data directory, created if
  // missing. Default: empty (one of the two must be set).
  std::string local_dir;
  // Embedded mode: open the engine read-only (storage::EngineOptions::read_only); saves,
  // deletes and GC then fail with FAILED_PRECONDITION. Default: false.
  bool read_only = false;
  // Embedded mode: shard writers whose record buffers the engine allocates and faults in when
  // it opens (storage::EngineOptions::prefault_writers), so the first saves copy into mapped
  // pages instead of faulting them in on the cores that train. gradsnap-train sets 1.
  // Default: 0.
  int prefault_writers = 0;
  // Bearer token for the job (gradsnap token JOB). Default: empty (server runs open).
  std::string token;
  // Remote mode, PEM files (gradsnap/tls.h): tls.ca_file, the CA of the servers' certificates,
  // turns TLS on; tls.cert_file and tls.key_file, the client certificate and key, add mutual
  // TLS (they need tls.ca_file). Default: all empty (plaintext).
  TlsFiles tls;
  // Copies of every shard across endpoints (rendezvous hashing). Default: 1.
  int replicas = 1;
  // Cluster mode (docs/protocol.md, "Cluster mode"): the etcd endpoints,
  // "[http://]HOST:PORT[,...]". The storage nodes (live ones: those holding their lease), the
  // checkpoint catalog and the job epochs then come from etcd; endpoints and local_dir must be
  // empty. Default: empty (off).
  std::string etcd;
  // Cluster mode, https:// etcd endpoints (gradsnap's --etcd-ca/--etcd-cert/--etcd-key):
  // etcd_tls.ca_file, the CA etcd's certificates chain to (empty: the system's roots);
  // etcd_tls.cert_file and key_file, a client certificate for etcd's --client-cert-auth.
  // Must be empty with plaintext endpoints. Default: all empty.
  TlsFiles etcd_tls;
  // Cluster mode, etcd's user authentication (--etcd-user; the password from
  // --etcd-password-file or $GRADSNAP_ETCD_PASSWORD, never a flag): set together.
  // Default: empty (none).
  std::string etcd_user;
  std::string etcd_password;
  // Cluster mode: copies of every shard, on the first live nodes of its rendezvous order (node
  // ids); clamped, with a warning, to the live nodes. Default: 3.
  int cluster_replicas = 3;
  // Cluster mode: copies that must be durable for a save to succeed (a node that fails
  // mid-upload is replaced by the next live node in the shard's order first). Clamped to the
  // copies placed. Default: 2.
  int min_replicas = 2;
  // Upper bound on bytes buffered by asynchronous saves in this client. Default: 256 MiB.
  size_t max_inflight_bytes = 256u << 20;
  // Remote mode: attempts for an operation that fails with UNAVAILABLE, ABORTED or
  // RESOURCE_EXHAUSTED from a busy server (an upload also after DEADLINE_EXCEEDED); an upload
  // that makes progress between failures starts counting again. Default: 8.
  int max_attempts = 8;
  // Deadline for unary calls, in milliseconds; an upload stream gets this plus the time its
  // remaining bytes take at 8 MiB/s, so a hung server cannot hold a save forever; a Read
  // stream (restore) that receives nothing for this long while the client waits for it (a
  // frozen node, a hung disk, a silent partition) is cancelled and resumed like one that
  // broke: retried, or read from another replica, from the byte it stopped at.
  // Default: 30000.
  int rpc_timeout_ms = 30000;
  // Remote mode: Read streams one shard's restore (RestoreShard, ReadShardRange) uses at once,
  // each fetching a range of about 16 MiB (docs/protocol.md, "Parallel restore"); 1 reads the
  // shard over a single stream. A RestoreShard buffers at most 2 x read_streams ranges ahead
  // of its sink. More streams help one large shard over a high-latency link or on a host with
  // spare cores; when several shards are restored at once on a small host they cost CPU
  // (measured on 2 cores, 4 shards: 4 streams each took 1.8x the CPU per GB of 1). Must be
  // >= 1. Default: 1.
  int read_streams = 1;
  // Remote mode: TCP connections to each node. Uploads and Read streams take them in turn;
  // unary calls use the first. One HTTP/2 connection moves all of its streams' bytes through
  // one socket, copied by one thread at a time on each side, so a client restoring or saving
  // several shards at once (the CLI's restore of a job, a process holding several ranks)
  // spreads them over several (measured on 2 cores, 4 shards restored through one client:
  // service_bench restore_ratio 0.85-0.87 with 1, 0.90-0.93 with 4). A trainer rank has its
  // own client, so its own connections. Must be 1..16. Default: 4.
  int connections_per_node = 4;
  // Time source (gradsnap/clock.h), not owned: remote mode waits on it between retries, the
  // embedded engine stamps checkpoints with it (storage::EngineOptions::clock). gRPC deadlines
  // (rpc_timeout_ms) stay on the real clock. Default: nullptr, the real clock.
  Clock* clock = nullptr;
};

// One tensor's bytes in caller memory, for saving.
struct TensorRef {
  TensorSpec spec;
  const void* data = nullptr;  // spec.byte_length bytes; must stay valid until the save resolves
};

// Progress callback of RestoreShard and Verify: `done` of `total` units so far, called several
// times while the call runs, with `done` never decreasing; calls never overlap. The units are
// payload bytes. Verify against servers (remote mode) counts every node's copy (replicas
// included) and reports once per node as it answers (with several nodes the callback then runs
// on a helper thread). A callback must not call back into the Client.
using ProgressFn = std::function<void(uint64_t done, uint64_t total)>;

class Client {
 public:
  // Opens the back end: remote when options.endpoints is set (no RPC is made yet), else the
  // embedded engine in options.local_dir (opened and recovered now).
  // INVALID_ARGUMENT: neither endpoints nor local_dir, an endpoint not HOST:PORT or listed
  // twice, replicas or max_attempts below 1. FAILED_PRECONDITION: local_dir is open in another
  // process. Other codes: the engine could not open local_dir (e.g. PERMISSION_DENIED, DATA_LOSS).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  // Remote mode only: as Connect with options.endpoints set; INVALID_ARGUMENT when it is empty.
  // The entry point of the CMake target gradsnap::client_remote, the client library without
  // the embedded back end (no storage engine, no RocksDB), which has no Connect.
  static absl::StatusOr<std::unique_ptr<Client>> ConnectRemote(const ClientOptions& options);
  // Waits for every queued asynchronous save to resolve, then closes the back end.
  virtual ~Client() = default;

  // Starts a checkpoint (state PENDING); every rank may call it with the identical spec
  // (idempotent). INVALID_ARGUMENT: a bad job name, step < 0, world_size outside 1..65536, a
  // FULL with base_step != -1, a DELTA with base_step outside [0, step), metadata over 1 MiB.
  // ALREADY_EXISTS: the (job, step) is committed, or exists with a different spec.
  // FAILED_PRECONDITION: a
  // DELTA's base_step is not a FULL checkpoint.
  virtual absl::Status BeginCheckpoint(const CheckpointSpec& spec) = 0;
  // Saves one shard. The returned future resolves once the shard is durable on every replica
  // (and the checkpoint committed, if this was its last shard). Tensor memory must stay valid
  // until then. Several saves may be in flight; memory use stays under max_inflight_bytes.
  // spec.tensors may be left empty (it is taken from `tensors`, in order) or must equal the
  // specs in `tensors`; the payload is the tensors' bytes in that order. A mismatch, a bad name,
  // or a byte_length other than product(shape) * DTypeSize(dtype) is INVALID_ARGUMENT.
  // NOT_FOUND: BeginCheckpoint was not called. ALREADY_EXISTS: the rank was saved with a
  // different spec. DATA_LOSS: a tensor's bytes do not match its spec.sha256. Saving a shard
  // that is already committed with the same spec is OK (idempotent).
  [[nodiscard]] virtual std::future<absl::Status> SaveShardAsync(
      const ShardSpec& spec, std::vector<TensorRef> tensors) = 0;
  // SaveShardAsync(spec, tensors).get(): blocks until the shard is durable.
  absl::Status SaveShard(const ShardSpec& spec, std::vector<TensorRef> tensors) {
    return SaveShardAsync(spec, std::move(tensors)).get();
  }
  // Abandons a PENDING checkpoint and frees its space. NOT_FOUND: no such checkpoint.
  // FAILED_PRECONDITION: it is committed (use Delete). ABORTED: a shard of it is still being
  // written (its upload has not ended yet; remote mode retries this like any ABORTED).
  // A non-zero `epoch` older than the job's newest is FAILED_PRECONDITION "superseded by
  // attempt N": a zombie rank's rollback never aborts the new attempt's checkpoint.
  virtual absl::Status AbortCheckpoint(const std::string& job, int64_t step,
                                       uint64_t epoch = 0) = 0;
  // Takes the job's next writer epoch (docs/protocol.md, "Epochs"). Saves and begins whose spec
  // carries an older non-zero epoch are refused from then on (FAILED_PRECONDITION "superseded by
  // attempt N"). Remote: the largest epoch over all nodes, every node told.
  virtual absl::StatusOr<uint64_t> AcquireEpoch(const std::string& job) = 0;

  // Names of the jobs with at least one checkpoint (pending ones included), sorted. With a
  // token, only the token's job. Remote: the union over every node that answers.
  virtual absl::StatusOr<std::vector<std::string>> ListJobs() = 0;
  // The checkpoints of `job` by ascending step: committed ones only, PENDING ones too with
  // include_pending. An unknown job gives an empty list. INVALID_ARGUMENT: a bad job name.
  // PERMISSION_DENIED: the token is for another job.
  virtual absl::StatusOr<std::vector<CheckpointInfo>> List(const std::string& job,
                                                           bool include_pending = false) = 0;
  // The manifest of one checkpoint, PENDING or committed: its info and every shard begun so far
  // (by rank) with its tensors, sizes and SHA-256s. NOT_FOUND: no such checkpoint.
  // DATA_LOSS: its metadata is damaged.
  virtual absl::StatusOr<Manifest> Show(const std::string& job, int64_t step) = 0;
  // Restores one tensor of a committed shard into out[0, out_len), verified (chunk checksums
  // and the tensor's SHA-256). NOT_FOUND: no such checkpoint, rank or tensor.
  // INVALID_ARGUMENT: out_len differs from the tensor's byte_length. FAILED_PRECONDITION: the
  // checkpoint is PENDING. DATA_LOSS: the stored bytes are damaged (`out` then holds garbage).
  virtual absl::Status RestoreTensor(const std::string& job, int64_t step, int32_t rank,
                                     const std::string& tensor, void* out, size_t out_len) = 0;
  // Streams a shard's whole payload (tensors in manifest order) through `sink`, verified as it
  // goes; a non-OK status from `sink` stops the restore and is returned. Progress is in payload
  // bytes. Errors as RestoreTensor; on DATA_LOSS some bytes may already have reached `sink`.
  virtual absl::Status RestoreShard(const std::string& job, int64_t step, int32_t rank,
                                    const std::function<absl::Status(const void*, size_t)>& sink,
                                    const ProgressFn& progress = nullptr) = 0;
  // A sink that may keep the bytes past its return: data[0, n) stays valid and unchanged while
  // a copy of `hold` lives. A null `hold`: the bytes are valid during the call only (copy them
  // to keep them).
  using LentSink =
      std::function<absl::Status(const void* data, size_t n, std::shared_ptr<const void> hold)>;
  // As RestoreShard, for a sink that would keep bytes past its return (an export hands them to
  // its writer threads). The embedded client lends its verified chunks themselves (no copy;
  // they count against the reader's read-ahead until released); the default, used by the
  // remote client, passes a null `hold` (its pieces live in the received messages).
  virtual absl::Status RestoreShardLent(const std::string& job, int64_t step, int32_t rank,
                                        const LentSink& sink,
                                        const ProgressFn& progress = nullptr);
  // Reads payload bytes [offset, offset + length) of a committed shard (its tensors back to back
  // in manifest order) into out[0, length): a ranged read, for resharding. Every chunk the range
  // touches is checked against its checksum (DATA_LOSS on a mismatch); a tensor's SHA-256 is
  // checked only by whole-tensor reads. A range past the payload is OUT_OF_RANGE. Thread-safe:
  // several ranges may be read at once.
  virtual absl::Status ReadShardRange(const std::string& job, int64_t step, int32_t rank,
                                      uint64_t offset, uint64_t length, void* out) = 0;
  // Re-reads every chunk of every shard of a checkpoint and checks checksums and SHA-256s
  // (remote: on every node that holds it). NOT_FOUND: no such checkpoint. DATA_LOSS: damage,
  // naming the shard and tensor. Progress: see ProgressFn.
  virtual absl::Status Verify(const std::string& job, int64_t step,
                              const ProgressFn& progress = nullptr) = 0;
  // Deletes one checkpoint (committed or PENDING) and frees its space. NOT_FOUND: no such
  // checkpoint. FAILED_PRECONDITION: it is a FULL that a remaining DELTA is based on.
  // ABORTED: a shard of it is still being written (as AbortCheckpoint). A non-zero `epoch`
  // older than the job's newest is FAILED_PRECONDITION "superseded by attempt N" (a zombie of
  // an older attempt deletes nothing); 0, the default, is unfenced (the CLI).
  virtual absl::Status Delete(const std::string& job, int64_t step, uint64_t epoch = 0) = 0;
  // Retention for `job`: keeps the newest policy.keep_last committed FULLs that verify and, for
  // every multiple m of policy.keep_every, the newest FULL at or before m (one per K steps
  // where FULLs are not on multiples), deletes the other FULLs with the DELTAs based on
  // them, and returns the deleted steps (ascending) and the bytes freed. keep_last == 0 deletes
  // nothing. PENDING checkpoints are never touched. INVALID_ARGUMENT: a bad job name or a
  // negative keep_last / keep_every. `epoch` as for Delete. Remote with several nodes: the
  // client verifies and decides, each node deletes what it is told (docs/protocol.md,
  // "Retention over several nodes").
  virtual absl::StatusOr<GcResult> Gc(const std::string& job, const GcPolicy& policy,
                                      uint64_t epoch = 0) = 0;
  // OK when every endpoint answers and is serving (or the local engine is open).
  // UNAVAILABLE: a node does not answer or is stopping, naming it.
  virtual absl::Status Health() = 0;
  // Health, and one line for each node (or the local engine) that refuses writes for want of
  // space ("NODE: writes refused: N bytes free, below the catalog's reserve of R bytes; ...")
  // appended to *notes. Default: Health(), no notes.
  virtual absl::Status HealthNotes(std::vector<std::string>* notes) {
    (void)notes;
    return Health();
  }
};

// Readies the destination of a restore, [ranges[i].first, + ranges[i].second), in the order
// the restore fills it, for as long as the object lives (create it before the restore, destroy
// it after). fresh: the memory was just allocated by the caller and nothing has written it
// (Python's restore and read_range arrays): its whole pages are advised to base pages
// (MADV_NOHUGEPAGE) before any is touched. Either way a helper thread faults in the pages
// ahead of the copy (MADV_POPULATE_WRITE) when they total 16 MiB or more and are not faulted
// in already; contents never change. Why: docs/performance.md, "Restore into fresh memory".
class FreshDestination {
 public:
  FreshDestination(const std::vector<std::pair<void*, size_t>>& ranges, bool fresh);
  ~FreshDestination();
  FreshDestination(const FreshDestination&) = delete;
  FreshDestination& operator=(const FreshDestination&) = delete;

 private:
  std::unique_ptr<PopulateAhead> populate_;
};

}  // namespace client
}  // namespace gradsnap

#endif  // GRADSNAP_INCLUDE_GRADSNAP_CLIENT_H_
