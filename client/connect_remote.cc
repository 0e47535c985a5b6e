// Client::ConnectRemote, the entry point of gradsnap::client_remote (the remote back end alone:
// no storage engine, no RocksDB), the option checks both entry points share, and the Client
// methods with a default implementation.
// Client::Connect (client.cc, gradsnap::client) calls ConnectRemote when endpoints are given.
#include "absl/status/status.h"
#include "client/backends.h"
#include "client/client.h"
#include "common/status.h"

namespace gradsnap {
namespace client {

absl::Status ValidateClientOptions(const ClientOptions& options) {
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError("ClientOptions.max_attempts must be >= 1");
  }
  if (options.read_streams < 1) {
    return absl::InvalidArgumentError("ClientOptions.read_streams must be >= 1");
  }
  if (options.connections_per_node < 1 || options.connections_per_node > 16) {
    return absl::InvalidArgumentError("ClientOptions.connections_per_node must be 1..16");
  }
  if (options.replicas < 1) {
    return absl::InvalidArgumentError("ClientOptions.replicas must be >= 1");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Client>> Client::ConnectRemote(const ClientOptions& options) {
  RETURN_IF_ERROR(ValidateClientOptions(options));
  if (!options.etcd.empty()) {
    if (!options.endpoints.empty() || !options.local_dir.empty()) {
      return absl::InvalidArgumentError(
          "ClientOptions: etcd (cluster mode) excludes endpoints and local_dir");
    }
    if (options.cluster_replicas < 1 || options.min_replicas < 1) {
      return absl::InvalidArgumentError(
          "ClientOptions: cluster_replicas and min_replicas must be >= 1");
    }
    return NewClusterClient(options);
  }
  if (options.endpoints.empty()) {
    return absl::InvalidArgumentError("ClientOptions needs endpoints (HOST:PORT of the servers)");
  }
  return NewRemoteClient(options);
}

// The default for back ends that cannot lend their bytes (the remote client): no hold, so the
// sink copies what it keeps (into buffers it reuses) rather than a copy per piece here.
absl::Status Client::RestoreShardLent(const std::string& job, int64_t step, int32_t rank,
                                      const LentSink& sink, const ProgressFn& progress) {
  return RestoreShard(
      job, step, rank, [&](const void* data, size_t n) { return sink(data, n, nullptr); },
      progress);
}

}  // namespace client
}  // namespace gradsnap
