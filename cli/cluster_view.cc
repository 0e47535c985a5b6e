// ReadClusterView, ReadReplicas (cluster_view.h).
#include "cli/cluster_view.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "client/backends.h"
#include "client/cluster_repair.h"
#include "cluster/catalog.h"
#include "cluster/etcd_client.h"
#include "cluster/membership.h"
#include "common/status.h"

namespace gradsnap {
namespace cli {

namespace {

absl::StatusOr<std::unique_ptr<cluster::EtcdClient>> Etcd(const client::ClientOptions& options) {
  ASSIGN_OR_RETURN(cluster::EtcdOptions o, client::EtcdOptionsFor(options));
  return cluster::EtcdClient::Create(o);
}

absl::StatusOr<std::map<std::string, cluster::NodeRecord>> LiveNodes(cluster::EtcdClient* etcd) {
  ASSIGN_OR_RETURN(std::vector<cluster::EtcdKv> kvs, etcd->GetPrefix(cluster::kNodesPrefix));
  std::map<std::string, cluster::NodeRecord> out;
  for (const cluster::EtcdKv& kv : kvs) {
    auto rec = cluster::DecodeNodeRecord(kv);
    if (rec.ok()) out[rec->id] = *rec;
  }
  return out;
}

}  // namespace

absl::StatusOr<ClusterView> ReadClusterView(const client::ClientOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<cluster::EtcdClient> etcd, Etcd(options));
  ASSIGN_OR_RETURN(auto live, LiveNodes(etcd.get()));
  ASSIGN_OR_RETURN(std::vector<cluster::EtcdKv> records,
                   etcd->GetPrefix(cluster::kCheckpointsPrefix));
  std::map<std::string, ClusterNodeView> nodes;
  for (const auto& [id, rec] : live) {
    ClusterNodeView& n = nodes[id];
    n.id = id;
    n.address = rec.address;
    n.alive = true;
    n.capacity_bytes = rec.capacity_bytes;
    n.free_bytes = rec.free_bytes;
  }
  ClusterView view;
  for (const cluster::EtcdKv& kv : records) {
    auto c = cluster::DecodeCheckpointKv(kv);
    if (!c.ok() || c->state != storage::CheckpointState::kCommitted) continue;
    for (const auto& [rank, r] : c->ranks) {
      size_t alive = 0;
      for (const std::string& id : r.nodes) {
        ClusterNodeView& n = nodes[id];
        n.id = id;
        ++n.shards;
        alive += n.alive ? 1 : 0;
      }
      if (alive < cluster::WantedCopies(*c, r, live.size())) ++view.under_replicated;
    }
  }
  for (auto& [id, n] : nodes) view.nodes.push_back(std::move(n));
  auto leader = etcd->Get(client::kRepairLeaderKey);
  if (leader.ok()) view.repairer = leader->value;
  if (!leader.ok() && !absl::IsNotFound(leader.status())) return leader.status();
  return view;
}

absl::StatusOr<std::map<int32_t, std::vector<std::string>>> ReadReplicas(
    const client::ClientOptions& options, const std::string& job, int64_t step) {
  ASSIGN_OR_RETURN(std::unique_ptr<cluster::EtcdClient> etcd, Etcd(options));
  ASSIGN_OR_RETURN(auto live, LiveNodes(etcd.get()));
  cluster::ClusterCatalog catalog(etcd.get());
  ASSIGN_OR_RETURN(cluster::ClusterCheckpoint c, catalog.Get(job, step));
  std::map<int32_t, std::vector<std::string>> out;
  for (const auto& [rank, r] : c.ranks) {
    for (const std::string& id : r.nodes) {
      auto it = live.find(id);
      out[rank].push_back(
          absl::StrCat(id, " (", it == live.end() ? "gone" : it->second.address, ")"));
    }
  }
  return out;
}

}  // namespace cli
}  // namespace gradsnap
