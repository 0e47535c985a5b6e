// The service's Prometheus metrics (common/stats.h Registry) and the --metrics-listen endpoint.
//
// MetricsHttpServer is a tiny HTTP/1.0 responder on a plain TCP socket: any GET gets the
// registry rendered in the Prometheus text format; one request per connection, bounded request
// size and timeouts so a slow or hostile scraper cannot hold it.
//
// Thread-safe: ServiceMetrics is a set of atomic counters; MetricsHttpServer runs one thread.
#ifndef GRADSNAP_SERVICE_METRICS_H_
#define GRADSNAP_SERVICE_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/stats.h"
#include "storage/engine.h"

namespace gradsnap {
namespace service {

struct ServiceMetrics {
  static ServiceMetrics* Get();  // registered in Registry::Global() on first use

  Counter* bytes_in;
  Counter* bytes_out;
  Counter* chunks_in;    // WriteRequest messages
  Counter* chunks_out;   // ReadResponse messages
  Counter* shard_commits;
  Counter* checkpoint_commits;
  Counter* inflight_bytes;  // gauge
  Counter* busy_rejections;
  Histogram* write_seconds;   // whole Write stream
  Histogram* read_seconds;    // whole Read stream
  Histogram* unary_seconds;
  // gradsnap_storage_write_refused_low_space (0/1) and gradsnap_storage_free_bytes.
  Counter* write_refused_low_space;
  Counter* storage_free_bytes;
  // Counts a failed call by its code: gradsnap_errors_total{code="..."}.
  void Error(int code);
  // Sets the two gauges above.
  void SetWriteSpace(const storage::WriteSpaceState& space);

 private:
  Counter* errors_[17];
};

class MetricsHttpServer {
 public:
  MetricsHttpServer() = default;
  ~MetricsHttpServer();
  // Binds "host:port" (port 0 picks one) and starts serving. `refresh`, when set, runs before
  // each scrape is rendered (gauges read from the engine now).
  absl::Status Start(const std::string& host_port, std::function<void()> refresh = nullptr);
  int port() const { return port_; }
  void Stop();

 private:
  void Loop();
  void Serve(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::function<void()> refresh_;
  std::thread thread_;
};

// Splits "host:port" (IPv4 literal or "localhost"); INVALID_ARGUMENT otherwise.
absl::Status SplitHostPort(const std::string& host_port, std::string* host, int* port);

}  // namespace service
}  // namespace gradsnap

#endif  // GRADSNAP_SERVICE_METRICS_H_
