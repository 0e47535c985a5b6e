// The repair worker of cluster mode (docs/protocol.md, "Cluster mode", "Repair"): every
// gradsnap-server started with --etcd runs one; exactly one of them, the node holding the key
// /gradsnap/repair/leader (put under the node's own membership lease, so it goes when the node
// dies or loses its lease), repairs at a time.
//
// OVERVIEW
//   Every node checks (and campaigns for) the leadership each second. Each pass (every
//   quarter of repair_after, 0.2..10 s) the repairer reads the live nodes and every checkpoint
//   record. A COMMITTED rank is under-replicated when fewer of its replica nodes are live than
//   the record's `replicas` (clamped to the live nodes). It is repaired once a copy has been
//   missing for repair_after: since the repairer first saw the node gone (a new repairer counts
//   from when it took over), or since the commit for a rank committed with fewer copies. A
//   repair asks the next live node of the shard's rendezvous order that holds no copy to copy
//   it itself from a live replica (PullCopy, node to node: the target checks the source's size
//   and digest before it writes, else DATA_LOSS "source node ..." and the next replica, counted
//   as a failure; it reads back what it wrote), or, for a target from before PullCopy, relays
//   the copy through this node. Then it sets the rank's replicas (the live holders, then the
//   new copies; nodes gone are dropped, so their copies are never served again) in one etcd
//   transaction that compares the record's revision and the leader key's creation: a delete or
//   rewrite that came first wins and the new copies are dropped; a repairer that lost its lease
//   writes nothing.
//
// ERROR HANDLING
//   Nothing is returned: failures are logged (WARNING) and counted in
//   gradsnap_repair_failures_total; the rank is tried again on the next pass.
//
// THREAD SAFETY
//   The worker runs on its own thread; the destructor stops it (a copy in flight is abandoned,
//   the next repairer resumes it) and gives the leadership up.
#ifndef GRADSNAP_CLIENT_CLUSTER_REPAIR_H_
#define GRADSNAP_CLIENT_CLUSTER_REPAIR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "client/client.h"
#include "cluster/catalog.h"
#include "cluster/etcd_client.h"

namespace gradsnap {
namespace client {

// The repairer's election key; its value is the repairer's node id.
inline constexpr char kRepairLeaderKey[] = "/gradsnap/repair/leader";

struct RepairOptions {
  std::string node_id;  // this node's id. Required.
  // This node's membership lease (0 while it holds none: it does not campaign). Required.
  std::function<int64_t()> lease;
  // How long a copy must be missing before it is restored (--repair-after). Default: 10 min.
  int64_t repair_after_ms = 600000;
  // Cap on the bytes per second each copy reads from its source (--repair-bandwidth-mib-s):
  // a copy's target paces its own reads; 0: none. Default: 0.
  uint64_t bandwidth_bytes_per_s = 0;
  // Ranks the repairer repairs at once (--repair-parallel), each copy going to a node that
  // takes at most kMaxPulls of them at a time. Default: 4.
  int parallel = 4;
  // How the repairer reaches the nodes (tls: the peers' CA and this node's client certificate;
  // timeouts); endpoints and the token are set per node and job. Default: plaintext.
  ClientOptions node_options;
  // The cluster's token secret (the nodes' shared --auth-secret-file): the repairer sends each
  // node the token of the local job it copies. Default: empty (no token sent).
  std::string auth_secret;
  // This node's advertised address (--advertise): where Pull writes the copy it fetched.
  // Default: empty (Pull refuses).
  std::string self_address;
};

class RepairWorker {
 public:
  // Starts the worker's thread; it campaigns for the leadership at once.
  static std::unique_ptr<RepairWorker> Start(cluster::EtcdClient* etcd, RepairOptions options);
  ~RepairWorker();

  // The PullCopy RPC's work, on the node that is to hold a new copy (any thread; at most
  // kMaxPulls at once, else RESOURCE_EXHAUSTED): reads the node-local checkpoint (`local`,
  // `step`) whole from node `source_id` (its address read from etcd now), checks its size and
  // XXH3-128 against `raw_bytes` and `digest` (DATA_LOSS "source node ...: ..." otherwise), writes
  // it to this node through its own address and checks the digest of what it serves then.
  // `cancelled`: the caller went away (the copy stops). Returns the payload bytes copied.
  absl::StatusOr<uint64_t> Pull(const std::string& local, int64_t step,
                                const std::string& source_id, const std::string& digest,
                                uint64_t raw_bytes, const std::function<bool()>& cancelled);
  static constexpr int kMaxPulls = 2;
  RepairWorker(const RepairWorker&) = delete;
  RepairWorker& operator=(const RepairWorker&) = delete;

 private:
  struct Source;  // a verified copy read from a replica
  RepairWorker(cluster::EtcdClient* etcd, RepairOptions options);
  void Loop();
  // Takes or confirms the leadership; true while this node holds it.
  bool Lead();
  // One pass over every record; returns the under-replicated ranks seen.
  int64_t Pass();
  // Restores rank `rank` of the record (re-read) to its wanted copies.
  absl::Status RepairRank(const std::string& job, int64_t step, int32_t rank);
  // Asks node `target` to pull rank `rank` of `c` from node `source` (PullCopy).
  absl::Status PullTo(const std::string& target, const std::string& source,
                      const cluster::ClusterCheckpoint& c, int32_t rank);
  // The copy of node-local checkpoint (local, step) read whole from `node` (node `id`), its
  // size and digest checked against the record's.
  absl::Status ReadCopy(Client& node, const std::string& id, const std::string& local,
                        int64_t step, uint64_t raw_bytes, const std::string& digest,
                        const std::function<bool()>& cancelled, Source* out);
  // Writes `src` to `node` (node `id`) and checks the digest of what it then serves.
  absl::Status WriteCopy(Client& node, const std::string& id, const std::string& local,
                         int64_t step, const std::string& digest, const Source& src);
  // A client of the node at `address` for the node-local job `local` with this node's
  // credentials (the job's token when the cluster has a secret). Any thread.
  absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& address,
                                                  const std::string& local) const;
  // A client of node `id` for the node-local job `local` (UNAVAILABLE when the node is not
  // live), kept for the pass.
  absl::StatusOr<std::shared_ptr<Client>> Node(const std::string& id, const std::string& local);
  // Waits until node `id` takes another copy from this repairer (fewer than kMaxPulls under
  // way there); false when the worker stops meanwhile. Release gives the place back.
  bool Acquire(const std::string& id);
  void Release(const std::string& id);
  bool stopping();

  cluster::EtcdClient* const etcd_;
  const RepairOptions options_;
  cluster::ClusterCatalog catalog_;
  int64_t leader_revision_ = 0;  // create_revision of our leader key; 0: not the leader
  // Node id -> address of the live nodes, as of the pass (written by the worker's thread
  // between passes; only read while the pass's repairs run).
  std::map<std::string, std::string> live_;
  // Node id -> wall-clock ms when this worker first saw it gone (the worker's thread only).
  std::map<std::string, int64_t> absent_since_;
  // (node id, token) -> (address, client): the clients made this pass.
  absl::Mutex clients_mu_;
  std::map<std::pair<std::string, std::string>, std::pair<std::string, std::shared_ptr<Client>>>
      clients_ ABSL_GUARDED_BY(clients_mu_);
  // Node id -> copies this repairer has under way to it (Acquire); and in all, and the most
  // at once during the pass (logged at its end).
  absl::Mutex targets_mu_;
  std::map<std::string, int> targets_ ABSL_GUARDED_BY(targets_mu_);
  int copies_ ABSL_GUARDED_BY(targets_mu_) = 0;
  int copies_max_ ABSL_GUARDED_BY(targets_mu_) = 0;

  absl::Mutex pulls_mu_;
  int pulls_ ABSL_GUARDED_BY(pulls_mu_) = 0;  // Pull calls under way

  absl::Notification stop_;  // the destructor's: the worker's thread ends
  std::thread thread_;
};

}  // namespace client
}  // namespace gradsnap

#endif  // GRADSNAP_CLIENT_CLUSTER_REPAIR_H_
