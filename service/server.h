// gradsnap-server as a library: the engine, the gRPC service with TLS and auth, the RAM tier,
// the in-flight limiter and the metrics endpoint, started and stopped together. The binary
// (server_main.cc) parses flags into ServerOptions; tests and benchmarks embed a Server.
//
// Thread-safe: Start() then any thread may call Shutdown() once; the accessors are constant.
#ifndef GRADSNAP_SERVICE_SERVER_H_
#define GRADSNAP_SERVICE_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "gradsnap/tls.h"
#include "grpcpp/server.h"
#include "service/storage_service.h"
#include "storage/engine.h"

namespace gradsnap {
namespace service {

struct ServerOptions {
  ServerOptions() {
    engine.queue_depth = kUploadQueueDepth;
    engine.prefault_writers = kPrefaultUploads;
    engine.prefault_read_ahead = true;
  }
  // Chunks each upload's engine writer keeps in flight (EngineOptions::queue_depth): 5 chunks
  // of 4 MiB keep a disk's sequential bandwidth, and bound an upload's buffers to about
  // 44 MiB whatever the durable interval (StorageServiceOptions::flush_bytes).
  static constexpr int kUploadQueueDepth = 5;
  // Uploads whose engine record buffers are faulted in when the server starts
  // (EngineOptions::prefault_writers): 2 x 6 buffers of 4 MiB, 48 MiB resident, so the first
  // checkpoints after a start do not copy into fresh pages (--prefault-uploads).
  static constexpr int kPrefaultUploads = 2;
  // Engine options; engine.data_dir is the server's --data-dir. Required. Default: the
  // engine's, except queue_depth = kUploadQueueDepth, prefault_writers = kPrefaultUploads and
  // prefault_read_ahead = true (--prefault-read-ahead).
  storage::EngineOptions engine;
  // gRPC address; port 0 picks a free port. Default: "127.0.0.1:0".
  std::string listen = "127.0.0.1:0";
  // PEM files (--tls-cert, --tls-key, --tls-client-ca): the server certificate chain and key
  // enable TLS; a client CA (tls.ca_file) additionally requires and verifies client
  // certificates (mutual TLS). Default: all empty (plaintext).
  TlsFiles tls;
  // Token secret (the bytes, not the file). Default: empty (open server, logged at start).
  std::string auth_secret;
  // Cluster mode (--etcd): a job's token also grants its node-local jobs "<job>.r<rank>"
  // (Authorizer). Default: false.
  bool cluster_mode = false;
  // RAM tier budget in bytes. Default: 0 (off).
  uint64_t cache_bytes = 0;
  // Budget for upload bytes held in memory; disk reads get a budget of the same size.
  // Default: 256 MiB.
  uint64_t max_inflight_bytes = 256u << 20;
  // Prometheus endpoint "host:port". Default: empty (off).
  std::string metrics_listen;
  // While a connection has calls in flight the server pings its client every keepalive_ms and
  // closes it when a ping goes unanswered for keepalive_ms / 3 (at least 1 s): a client frozen
  // or cut off mid-upload frees its shard (and its share of the upload budget) instead of
  // holding them until its own deadline. 0: off (gRPC's default, hours). Default: 30000.
  int keepalive_ms = 30000;
  StorageServiceOptions service;
};

// The gRPC health checking service (grpc.health.v1.Health, Check and Watch; gRPC's own) answers
// for these names (docs/deploy.md, "Health probes"):
//   "" and "gradsnap.v1.Storage": SERVING while the node takes checkpoints; NOT_SERVING while it
//     refuses writes (below its catalog's free-space reserve: WriteSpace) and from the start of a
//     shutdown.
//   "gradsnap.v1.Storage/read": SERVING while the node serves reads (also when it refuses
//     writes); NOT_SERVING from the start of a shutdown.
// The write state is read from the disk every kHealthRefreshMs, so the answer follows free space
// coming and going without a restart.
inline constexpr char kHealthWriteService[] = "gradsnap.v1.Storage";
inline constexpr char kHealthReadService[] = "gradsnap.v1.Storage/read";
inline constexpr int kHealthRefreshMs = 1000;

class Server {
 public:
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();

  // "host:port" with the real port.
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  storage::Engine* engine() { return engine_.get(); }
  ShardCache* cache() { return cache_.get(); }

  // Stops accepting calls, lets running ones finish for up to `grace` (then cancels them:
  // uploads flush what they received and stay resumable; nothing partial is ever committed),
  // and closes the engine. Idempotent.
  void Shutdown(absl::Duration grace);

 private:
  Server() = default;
  // Sets the health services from WriteSpace() until health_stop_ is notified.
  void RefreshHealth();

  std::string address_;
  int port_ = 0;
  std::unique_ptr<storage::Engine> engine_;
  std::unique_ptr<Authorizer> auth_;
  std::unique_ptr<InflightLimiter> limiter_;
  std::unique_ptr<InflightLimiter> read_limiter_;
  std::unique_ptr<ShardCache> cache_;
  std::unique_ptr<StorageService> service_;
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<MetricsHttpServer> metrics_;
  absl::Notification health_stop_;
  std::thread health_thread_;
  bool stopped_ = false;
};

}  // namespace service
}  // namespace gradsnap

#endif  // GRADSNAP_SERVICE_SERVER_H_
