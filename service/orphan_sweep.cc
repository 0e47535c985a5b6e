// OrphanSweeper (orphan_sweep.h).
#include "service/orphan_sweep.h"

#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/logging.h"

namespace gradsnap {
namespace service {

std::unique_ptr<OrphanSweeper> OrphanSweeper::Start(cluster::EtcdClient* etcd,
                                                    storage::Engine* engine, std::string node_id,
                                                    int64_t grace_ms) {
  std::unique_ptr<OrphanSweeper> s(new OrphanSweeper(etcd, engine, std::move(node_id), grace_ms));
  s->thread_ = std::thread([p = s.get()] { p->Loop(); });
  return s;
}

OrphanSweeper::OrphanSweeper(cluster::EtcdClient* etcd, storage::Engine* engine,
                             std::string node_id, int64_t grace_ms)
    : catalog_(etcd), engine_(engine), node_id_(std::move(node_id)), grace_ms_(grace_ms) {}

OrphanSweeper::~OrphanSweeper() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void OrphanSweeper::Loop() {
  const int64_t interval_ms = std::clamp<int64_t>(grace_ms_ / 4, 1000, 60000);
  while (!stop_.WaitForNotificationWithTimeout(absl::Milliseconds(interval_ms))) Sweep();
}

void OrphanSweeper::Sweep() {
  auto jobs = engine_->ListJobs();
  if (!jobs.ok()) return;
  const int64_t now = MonotonicNanos() / 1000000;
  std::set<std::pair<std::string, int64_t>> seen;
  for (const std::string& local : *jobs) {
    std::string job;
    int32_t rank = -1;
    if (!cluster::SplitLocalJob(local, &job, &rank)) continue;
    auto copies = engine_->ListCheckpoints(local, /*include_pending=*/false);
    if (!copies.ok() || copies->empty()) continue;
    auto records = catalog_.List(job, /*include_pending=*/true);  // after the local listing
    if (!records.ok()) {
      GS_LOG(DEBUG) << "cluster sweep: job " << job << ": " << records.status();
      continue;
    }
    std::map<int64_t, const cluster::ClusterCheckpoint*> by_step;
    for (const cluster::ClusterCheckpoint& c : *records) by_step[c.step] = &c;
    for (const storage::CheckpointInfo& copy : *copies) {
      auto it = by_step.find(copy.step);
      bool named = false;
      if (it != by_step.end()) {
        const cluster::ClusterCheckpoint& c = *it->second;
        auto r = c.ranks.find(rank);
        named = c.state != storage::CheckpointState::kCommitted ||
                (r != c.ranks.end() &&
                 std::count(r->second.nodes.begin(), r->second.nodes.end(), node_id_) > 0);
      }
      const std::pair<std::string, int64_t> key(local, copy.step);
      if (named) continue;
      seen.insert(key);
      const int64_t since = unnamed_since_.emplace(key, now).first->second;
      if (now - since < grace_ms_) continue;
      absl::Status s = engine_->Quarantine(
          local, copy.step,
          absl::StrCat("cluster: no etcd record names this node's copy of job ", job, " step ",
                       copy.step, " rank ", rank));
      if (!s.ok() && !absl::IsNotFound(s)) {
        GS_LOG(WARNING) << "cluster sweep: job " << local << " step " << copy.step << ": " << s;
      }
    }
  }
  for (auto it = unnamed_since_.begin(); it != unnamed_since_.end();) {
    it = seen.count(it->first) ? std::next(it) : unnamed_since_.erase(it);
  }
}

}  // namespace service
}  // namespace gradsnap
