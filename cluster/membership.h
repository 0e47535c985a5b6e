// Membership: a storage node's registration in the cluster (docs/protocol.md, "Cluster mode",
// "Membership"). The node holds an etcd lease of ttl_s seconds and, under it, the key
// /gradsnap/nodes/<node id> whose value names its advertised address and space. While the lease
// lives the node is live: clients place shards on it. A thread renews the lease every third of
// its TTL.
//
// Writes are allowed only while the lease is known to be live: WritesAllowed() is OK until
// TTL seconds after the *sending* of the last keep-alive etcd answered (etcd counts its TTL
// from the receipt, later, so the node gives up no later than etcd does). A node cut off from
// etcd therefore stops taking writes before the cluster considers it dead, and takes them again
// only once it holds a lease again (a new one, registered anew, when the old one expired).
//
// THREAD SAFETY: all methods may be called from any thread.
#ifndef GRADSNAP_CLUSTER_MEMBERSHIP_H_
#define GRADSNAP_CLUSTER_MEMBERSHIP_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cluster/etcd_client.h"

namespace gradsnap {
namespace cluster {

// The prefix of the node records: /gradsnap/nodes/<node id>.
inline constexpr char kNodesPrefix[] = "/gradsnap/nodes/";

// In the message of a write a node refuses for want of a live lease (Membership::WritesAllowed).
inline constexpr char kNoLiveLease[] = "holds no live cluster lease";

// A node record's value (docs/format.md, "Node records"): key=value lines.
struct NodeRecord {
  std::string id;  // from the key
  std::string address;
  uint64_t capacity_bytes = 0;
  uint64_t free_bytes = 0;
  int64_t lease = 0;  // from the key's lease
};
std::string EncodeNodeRecord(const NodeRecord& r);
// INVALID_ARGUMENT when a line is malformed or address is missing.
absl::StatusOr<NodeRecord> DecodeNodeRecord(const EtcdKv& kv);

struct MembershipOptions {
  std::string node_id;  // node_id.h. Required.
  std::string address;  // --advertise HOST:PORT. Required.
  // The lease's TTL in seconds (--lease-ttl-s); etcd may raise it to its minimum. Default: 10.
  int ttl_s = 10;
  // Called at each registration for the record's capacity and free bytes, and after each
  // renewal: when the free bytes moved by at least kSpaceRefreshFraction of the capacity (and
  // 1 MiB) since the record was last put, it is put again under the lease, so `gradsnap health`
  // shows current free space. Default: none (0).
  std::function<void(uint64_t* capacity, uint64_t* free)> space;
};

// The change of free bytes, as a fraction of the capacity, that makes a node put its record
// again (MembershipOptions::space): 0.1 %.
inline constexpr double kSpaceRefreshFraction = 0.001;

// Metrics (the process's Registry, common/stats.h): gradsnap_cluster_lease_losses_total (the
// count lease_losses() returns, over every Membership of the process) and
// gradsnap_cluster_lease_live (1 while writes are allowed by the lease, as last seen by the
// keep-alive thread).
class Membership {
 public:
  // Grants a lease and registers the node under it. UNAVAILABLE when etcd does not answer.
  static absl::StatusOr<std::unique_ptr<Membership>> Join(EtcdClient* etcd,
                                                          const MembershipOptions& options);
  // Stops renewing and revokes the lease (best effort): a node that stops leaves at once.
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  // OK while the lease is known live; UNAVAILABLE naming the reason otherwise (its message
  // holds kNoLiveLease, which clients look for: client/cluster_client.cc).
  absl::Status WritesAllowed() const;
  int64_t lease_id() const;
  int64_t granted_ttl_s() const;
  // How often the node lost its lease (not renewed in time, or found expired) since Join.
  uint64_t lease_losses() const;

 private:
  using Clock = std::chrono::steady_clock;
  Membership(EtcdClient* etcd, const MembershipOptions& options);
  // Grants a lease and puts the record under it; on success the lease is live.
  absl::Status Register();
  void KeepAliveLoop();
  // Marks the lease lost (once per loss) with `why` in the log.
  void LoseLease(const std::string& why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts the record again under `lease` when its free bytes are stale (MembershipOptions::space).
  void RefreshSpace(int64_t lease);

  EtcdClient* const etcd_;
  const MembershipOptions options_;

  mutable absl::Mutex mu_;
  int64_t lease_ ABSL_GUARDED_BY(mu_) = 0;  // 0: none (expired, never granted)
  int64_t ttl_s_ ABSL_GUARDED_BY(mu_) = 0;
  Clock::time_point valid_until_ ABSL_GUARDED_BY(mu_);
  bool live_ ABSL_GUARDED_BY(mu_) = false;  // as last logged
  uint64_t losses_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // The free bytes of the record last put (Join, then the keep-alive thread only).
  uint64_t put_free_ = 0;
  std::thread thread_;
};

}  // namespace cluster
}  // namespace gradsnap

#endif  // GRADSNAP_CLUSTER_MEMBERSHIP_H_
