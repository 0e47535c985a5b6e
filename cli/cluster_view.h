// The cluster's state as `gradsnap health` and `gradsnap show` print it with --etcd
// (docs/cli.md): read from etcd directly (node records, checkpoint records, the repairer's key),
// not through the Client interface, which has no notion of nodes.
#ifndef GRADSNAP_CLI_CLUSTER_VIEW_H_
#define GRADSNAP_CLI_CLUSTER_VIEW_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"

namespace gradsnap {
namespace cli {

struct ClusterNodeView {
  std::string id;
  std::string address;  // empty for a node named by records that holds no lease
  bool alive = false;   // registered under a live lease
  uint64_t capacity_bytes = 0;
  uint64_t free_bytes = 0;  // as the node last registered it
  uint64_t shards = 0;      // committed rank copies the records place on it
};

struct ClusterView {
  std::vector<ClusterNodeView> nodes;  // by id: the live ones and those records name
  std::string repairer;                // the repairer's node id; empty: none
  uint64_t under_replicated = 0;       // committed ranks with fewer live copies than wanted
};

// `options`: the CLI's client options (etcd, and etcd_tls, etcd_user, etcd_password).
absl::StatusOr<ClusterView> ReadClusterView(const client::ClientOptions& options);

// Rank -> its replicas as "ID (ADDRESS)" or "ID (gone)", of (job, step)'s record.
absl::StatusOr<std::map<int32_t, std::vector<std::string>>> ReadReplicas(
    const client::ClientOptions& options, const std::string& job, int64_t step);

}  // namespace cli
}  // namespace gradsnap

#endif  // GRADSNAP_CLI_CLUSTER_VIEW_H_
