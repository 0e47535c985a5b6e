// OrphanSweeper: in cluster mode each storage node moves to quarantine the copies it holds that
// no etcd record names (docs/protocol.md, "Cluster mode", "Orphaned copies"): a copy of a
// checkpoint deleted while the node was down, a copy repair replaced while the node was away
// (a node that comes back with old data: its copies are named by no record, so never served,
// and then moved aside), a fenced zombie's upload. Quarantine moves, it never deletes
// (docs/format.md, "Quarantine"); Gc purges entries after --quarantine-grace-seconds.
//
// A copy is a committed one-rank checkpoint of the node-local job "<job>.r<rank>". It is named
// when the record of (job, step) is PENDING (being written: never touched) or COMMITTED with
// this node among rank <rank>'s replicas. A copy found unnamed on every sweep for `grace` (the
// sweeper's own clock, from its first sightings: a restarted node waits a whole grace again) is
// quarantined. Local jobs of another shape, PENDING local checkpoints and those being written
// are left alone, and nothing is done when etcd cannot be read.
//
// THREAD SAFETY: runs on its own thread; the destructor stops it.
#ifndef GRADSNAP_SERVICE_ORPHAN_SWEEP_H_
#define GRADSNAP_SERVICE_ORPHAN_SWEEP_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/synchronization/notification.h"
#include "cluster/catalog.h"
#include "cluster/etcd_client.h"
#include "storage/engine.h"

namespace gradsnap {
namespace service {

class OrphanSweeper {
 public:
  // Sweeps every quarter of `grace_ms` (1 s..60 s); `engine` and `etcd` are borrowed.
  static std::unique_ptr<OrphanSweeper> Start(cluster::EtcdClient* etcd, storage::Engine* engine,
                                              std::string node_id, int64_t grace_ms);
  ~OrphanSweeper();
  OrphanSweeper(const OrphanSweeper&) = delete;
  OrphanSweeper& operator=(const OrphanSweeper&) = delete;

 private:
  OrphanSweeper(cluster::EtcdClient* etcd, storage::Engine* engine, std::string node_id,
                int64_t grace_ms);
  void Loop();
  void Sweep();

  cluster::ClusterCatalog catalog_;
  storage::Engine* const engine_;
  const std::string node_id_;
  const int64_t grace_ms_;
  // (local job, step) -> steady ms when first seen unnamed (the sweeper's thread only).
  std::map<std::pair<std::string, int64_t>, int64_t> unnamed_since_;
  absl::Notification stop_;  // the destructor's: the sweeper's thread ends
  std::thread thread_;
};

}  // namespace service
}  // namespace gradsnap

#endif  // GRADSNAP_SERVICE_ORPHAN_SWEEP_H_
