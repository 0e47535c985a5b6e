// Internal: the two Client back ends behind Client::Connect. Not part of the public interface.
#ifndef GRADSNAP_CLIENT_BACKENDS_H_
#define GRADSNAP_CLIENT_BACKENDS_H_

#include <memory>

#include "absl/status/statusor.h"
#include "client/client.h"

namespace gradsnap {
namespace cluster {
struct EtcdOptions;  // cluster/etcd_client.h
}  // namespace cluster

namespace client {

class ByteBudget;

// The storage engine in options.local_dir, in this process (client/embedded_client.cc).
absl::StatusOr<std::unique_ptr<Client>> NewEmbeddedClient(const ClientOptions& options);

// For tests: the budget bounding the asynchronous saves of `client` when it is an embedded
// client (its usage().peak counts that client's saves only), nullptr for any other Client. Valid
// while `client` lives.
const ByteBudget* EmbeddedSaveBudget(const Client& client);

// gRPC to gradsnap-server nodes in options.endpoints (client/remote_client.cc).
absl::StatusOr<std::unique_ptr<Client>> NewRemoteClient(const ClientOptions& options);

// The keys the remote client over options.endpoints ranks its nodes by (remote_placement.h's
// RankEndpoints), in endpoint order: NodePlacementKey(id) for each node that answers Health
// with its id, else the endpoint. For tests and drills that predict placement.
absl::StatusOr<std::vector<std::string>> StaticPlacementKeys(const ClientOptions& options);

// Cluster mode (options.etcd set; cluster_client.cc): nodes, catalog and epochs from etcd.
absl::StatusOr<std::unique_ptr<Client>> NewClusterClient(const ClientOptions& options);

// The etcd connection of cluster mode: options.etcd's endpoints with options.etcd_tls,
// etcd_user and etcd_password (the cluster client's and the CLI's cluster views'), the other
// EtcdOptions at their defaults. INVALID_ARGUMENT for bad endpoints (ParseEtcdEndpoints).
absl::StatusOr<cluster::EtcdOptions> EtcdOptionsFor(const ClientOptions& options);

// The checks of options every back end shares: INVALID_ARGUMENT when max_attempts or replicas
// is below 1 (client/connect_remote.cc).
absl::Status ValidateClientOptions(const ClientOptions& options);

}  // namespace client
}  // namespace gradsnap

#endif  // GRADSNAP_CLIENT_BACKENDS_H_
