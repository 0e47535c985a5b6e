// RepairWorker (cluster_repair.h).
#include "client/cluster_repair.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/backends.h"
#include "cluster/membership.h"
#include "cluster/placement.h"
#include "common/clock.h"
#include "common/digest.h"
#include "common/logging.h"
#include "common/stats.h"
#include "common/status.h"
#include "common/token.h"

namespace gradsnap {
namespace client {

namespace pb = ::etcdserverpb;
using cluster::ClusterCheckpoint;
using cluster::LocalJob;
using cluster::RankReplicas;

namespace {

struct RepairMetrics {
  Counter* leader;
  Counter* under_replicated;
  Counter* shards;
  Counter* bytes;
  Counter* failures;
  static RepairMetrics* Get() {
    static RepairMetrics* m = [] {
      Registry* r = Registry::Global();
      auto* m = new RepairMetrics;
      m->leader = r->GetCounter("gradsnap_repair_leader", "1 while this node is the repairer", true);
      m->under_replicated = r->GetCounter(
          "gradsnap_repair_under_replicated_shards",
          "Committed shards with fewer live copies than wanted, at the repairer's last pass", true);
      m->shards = r->GetCounter("gradsnap_repair_shards_total", "Shard copies made by repair");
      m->bytes = r->GetCounter("gradsnap_repair_bytes_total", "Payload bytes copied by repair");
      m->failures = r->GetCounter("gradsnap_repair_failures_total",
                                  "Repair copies that failed (source damaged or unreachable, "
                                  "target refused, digest mismatch, record changed)");
      return m;
    }();
    return m;
  }
};

std::string Shard(const std::string& job, int64_t step, int32_t rank) {
  return absl::StrCat("job ", job, " step ", step, " rank ", rank);
}

}  // namespace

struct RepairWorker::Source {
  storage::ShardInfo shard;
  std::string checkpoint_metadata;
  std::string payload;
};

std::unique_ptr<RepairWorker> RepairWorker::Start(cluster::EtcdClient* etcd,
                                                  RepairOptions options) {
  std::unique_ptr<RepairWorker> w(new RepairWorker(etcd, std::move(options)));
  w->thread_ = std::thread([p = w.get()] { p->Loop(); });
  return w;
}

RepairWorker::RepairWorker(cluster::EtcdClient* etcd, RepairOptions options)
    : etcd_(etcd), options_(std::move(options)), catalog_(etcd) {
  RepairMetrics::Get();
}

RepairWorker::~RepairWorker() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
  if (leader_revision_ != 0) {  // hands the leadership over at once rather than at lease expiry
    pb::TxnRequest txn;
    pb::Compare* c = txn.add_compare();
    c->set_key(kRepairLeaderKey);
    c->set_target(pb::Compare::CREATE);
    c->set_result(pb::Compare::EQUAL);
    c->set_create_revision(leader_revision_);
    txn.add_success()->mutable_request_delete_range()->set_key(kRepairLeaderKey);
    etcd_->Txn(txn).IgnoreError();
    RepairMetrics::Get()->leader->Set(0);
  }
}

bool RepairWorker::stopping() { return stop_.HasBeenNotified(); }

void RepairWorker::Loop() {
  // The leadership is checked (and campaigned for) every second, a pass made every quarter of
  // repair_after (0.2..10 s) while leading.
  const int64_t pass_ms = std::clamp<int64_t>(options_.repair_after_ms / 4, 200, 10000);
  const int64_t tick_ms = std::min<int64_t>(pass_ms, 1000);
  int64_t since_pass_ms = pass_ms;
  for (;;) {
    const bool was = leader_revision_ != 0;
    if (Lead()) {
      if (!was) since_pass_ms = pass_ms;
      if (since_pass_ms >= pass_ms) {
        RepairMetrics::Get()->under_replicated->Set(Pass());
        since_pass_ms = 0;
      }
    }
    if (stop_.WaitForNotificationWithTimeout(absl::Milliseconds(tick_ms))) return;
    since_pass_ms += tick_ms;
  }
}

bool RepairWorker::Lead() {
  const int64_t lease = options_.lease ? options_.lease() : 0;
  auto kv = etcd_->Get(kRepairLeaderKey);
  const bool was = leader_revision_ != 0;
  leader_revision_ = 0;
  if (kv.ok()) {
    if (kv->value == options_.node_id && kv->lease == lease && lease != 0) {
      leader_revision_ = kv->create_revision;
    }
  } else if (absl::IsNotFound(kv.status()) && lease != 0) {
    pb::TxnRequest txn;
    pb::Compare* c = txn.add_compare();
    c->set_key(kRepairLeaderKey);
    c->set_target(pb::Compare::VERSION);
    c->set_result(pb::Compare::EQUAL);
    c->set_version(0);
    pb::PutRequest* put = txn.add_success()->mutable_request_put();
    put->set_key(kRepairLeaderKey);
    put->set_value(options_.node_id);
    put->set_lease(lease);
    txn.add_success()->mutable_request_range()->set_key(kRepairLeaderKey);
    auto resp = etcd_->Txn(txn);
    if (resp.ok() && resp->succeeded() && resp->responses_size() == 2 &&
        resp->responses(1).response_range().kvs_size() == 1) {
      leader_revision_ = resp->responses(1).response_range().kvs(0).create_revision();
    }
  }
  const bool is = leader_revision_ != 0;
  if (is != was) {
    GS_LOG(INFO) << "repair: node " << options_.node_id
                 << (is ? " is the repairer now" : " is no longer the repairer");
    RepairMetrics::Get()->leader->Set(is ? 1 : 0);
    if (!is) RepairMetrics::Get()->under_replicated->Set(0);  // the new repairer's to report
    absent_since_.clear();  // a new repairer counts absences from when it took over
  }
  return is;
}

int64_t RepairWorker::Pass() {
  auto nodes = etcd_->GetPrefix(cluster::kNodesPrefix);
  auto records = etcd_->GetPrefix(cluster::kCheckpointsPrefix);
  if (!nodes.ok() || !records.ok()) {
    GS_LOG(DEBUG) << "repair: etcd read failed: "
                  << (nodes.ok() ? records.status() : nodes.status());
    return 0;
  }
  live_.clear();
  clients_.clear();  // one per (node, job) copied: made again by the passes that copy
  for (const cluster::EtcdKv& kv : *nodes) {
    auto rec = cluster::DecodeNodeRecord(kv);
    if (rec.ok()) live_[rec->id] = rec->address;
  }
  const int64_t now = UnixMillis();
  for (auto it = absent_since_.begin(); it != absent_since_.end();) {
    it = live_.count(it->first) ? absent_since_.erase(it) : std::next(it);
  }
  struct Due {
    std::string job;
    int64_t step;
    int32_t rank;
  };
  std::vector<Due> due;
  int64_t under = 0;
  for (const cluster::EtcdKv& kv : *records) {
    auto c = cluster::DecodeCheckpointKv(kv);
    if (!c.ok() || c->state != storage::CheckpointState::kCommitted) continue;
    for (const auto& [rank, r] : c->ranks) {
      size_t live = 0;
      int64_t since = INT64_MAX;
      for (const std::string& id : r.nodes) {
        if (live_.count(id)) {
          ++live;
        } else {
          since = std::min(since, absent_since_.emplace(id, now).first->second);
        }
      }
      const size_t wanted = cluster::WantedCopies(*c, r, live_.size());
      if (live >= wanted) continue;
      ++under;
      if (r.nodes.size() < wanted) since = std::min(since, c->committed_unix_ms);
      if (live > 0 && now - since >= options_.repair_after_ms) due.push_back({c->job, c->step, rank});
    }
  }
  for (const Due& d : due) {
    if (stopping()) break;
    absl::Status s = RepairRank(d.job, d.step, d.rank);
    if (s.ok()) {
      --under;
    } else {
      GS_LOG(WARNING) << "repair: " << Shard(d.job, d.step, d.rank) << ": " << s;
    }
  }
  return under;
}

absl::StatusOr<std::shared_ptr<Client>> RepairWorker::Node(const std::string& id,
                                                           const std::string& local) {
  auto live = live_.find(id);
  if (live == live_.end()) return absl::UnavailableError(absl::StrCat("node ", id, " is not live"));
  std::string token;
  if (!options_.auth_secret.empty()) {
    ASSIGN_OR_RETURN(token, MintJobToken(options_.auth_secret, local));
  }
  auto& [address, client] = clients_[{id, token}];
  if (client == nullptr || address != live->second) {
    ClientOptions o = options_.node_options;
    o.etcd.clear();
    o.local_dir.clear();
    o.token = token;
    o.endpoints = {live->second};
    o.replicas = 1;
    o.max_attempts = std::min(o.max_attempts, 3);
    ASSIGN_OR_RETURN(std::unique_ptr<Client> c, NewRemoteClient(o));
    client = std::move(c);
    address = live->second;
  }
  return client;
}

absl::Status RepairWorker::ReadCopy(const std::string& id, const ClusterCheckpoint& c,
                                    int32_t rank, Source* out) {
  const RankReplicas& r = c.ranks.at(rank);
  const std::string local = LocalJob(c.job, rank);
  ASSIGN_OR_RETURN(std::shared_ptr<Client> node, Node(id, local));
  ASSIGN_OR_RETURN(storage::Manifest m, node->Show(local, c.step));
  if (m.shards.size() != 1 || !m.shards[0].committed || m.shards[0].raw_bytes != r.raw_bytes) {
    return absl::DataLossError(absl::StrCat("node ", id, " holds another copy (",
                                            m.shards.empty() ? 0 : m.shards[0].raw_bytes,
                                            " bytes; the record says ", r.raw_bytes, ")"));
  }
  out->shard = m.shards[0];
  out->checkpoint_metadata = m.info.metadata;
  out->payload.clear();
  out->payload.reserve(r.raw_bytes);
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(node->RestoreShard(local, c.step, 0, [&](const void* p, size_t n) {
    if (stopping()) return absl::CancelledError("repair worker stopping");
    out->payload.append(static_cast<const char*>(p), n);
    if (options_.bandwidth_bytes_per_s > 0) {  // paced: the copy takes at least size / rate
      const auto due = start + std::chrono::microseconds(static_cast<int64_t>(
                                   1e6 * static_cast<double>(out->payload.size()) /
                                   static_cast<double>(options_.bandwidth_bytes_per_s)));
      std::this_thread::sleep_until(due);
    }
    return absl::OkStatus();
  }));
  Digester digest(DigestAlgo::kXxh3_128);
  digest.Update(out->payload.data(), out->payload.size());
  const std::string got = digest.FinishHex();
  if (r.digest.empty() || got != r.digest) {
    return absl::DataLossError(absl::StrCat("the copy on node ", id, " has digest ", got,
                                            ", the record ", r.digest.empty() ? "none" : r.digest));
  }
  return absl::OkStatus();
}

absl::Status RepairWorker::WriteCopy(const std::string& id, const ClusterCheckpoint& c,
                                     int32_t rank, const Source& src) {
  const std::string local = LocalJob(c.job, rank);
  ASSIGN_OR_RETURN(std::shared_ptr<Client> node, Node(id, local));
  CheckpointSpec spec;
  spec.job = local;
  spec.step = c.step;
  spec.world_size = 1;
  spec.metadata = src.checkpoint_metadata;
  ShardSpec shard;
  shard.job = local;
  shard.step = c.step;
  shard.metadata = src.shard.metadata;
  std::vector<TensorRef> refs;
  uint64_t offset = 0;
  for (const storage::TensorInfo& t : src.shard.tensors) {
    shard.tensors.push_back(t.spec);
    refs.push_back({t.spec, src.payload.data() + offset});
    offset += t.spec.byte_length;
  }
  if (offset != src.payload.size()) {
    return absl::DataLossError("the source's tensors do not add up to its payload");
  }
  // The target may hold another copy of this local step (it is named by no record for this
  // rank: an old incarnation's, or one a failed repair left): it is dropped and written anew.
  // Epoch 0: unfenced on the node (the record's revision fences the repair in etcd).
  absl::Status s;
  for (int attempt = 0; attempt < 2; ++attempt) {
    s = node->BeginCheckpoint(spec);
    if (s.ok()) s = node->SaveShard(shard, refs);
    if (s.ok()) {
      Digester digest(DigestAlgo::kXxh3_128);  // what the target serves now, read back
      s = node->RestoreShard(local, c.step, 0, [&](const void* p, size_t n) {
        digest.Update(p, n);
        return absl::OkStatus();
      });
      const std::string got = s.ok() ? digest.FinishHex() : "";
      if (s.ok() && got == c.ranks.at(rank).digest) return absl::OkStatus();
      if (s.ok()) {
        s = absl::DataLossError(absl::StrCat("node ", id, " serves digest ", got,
                                             " after the copy, not ", c.ranks.at(rank).digest));
      }
    }
    if (!absl::IsAlreadyExists(s) && !absl::IsDataLoss(s)) return s;
    absl::Status dropped = node->Delete(local, c.step, 0);
    if (!dropped.ok() && !absl::IsNotFound(dropped)) return dropped;
  }
  return s;
}

absl::Status RepairWorker::RepairRank(const std::string& job, int64_t step, int32_t rank) {
  RepairMetrics* metrics = RepairMetrics::Get();
  ASSIGN_OR_RETURN(ClusterCheckpoint c, catalog_.Get(job, step));
  if (c.state != storage::CheckpointState::kCommitted || !c.ranks.count(rank)) {
    return absl::OkStatus();  // gone or rewritten meanwhile: the next pass sees it
  }
  const RankReplicas& r = c.ranks.at(rank);
  std::vector<std::string> holders;
  for (const std::string& id : r.nodes) {
    if (live_.count(id)) holders.push_back(id);
  }
  const size_t wanted = cluster::WantedCopies(c, r, live_.size());
  if (holders.size() >= wanted) return absl::OkStatus();
  GS_LOG(INFO) << "repair: repairing " << Shard(job, step, rank) << " (" << r.raw_bytes
               << " bytes): live copies on " << absl::StrJoin(holders, ",") << ", " << wanted
               << " wanted";
  Source src;
  std::string from;
  std::vector<std::string> errors;
  for (const std::string& id : holders) {
    absl::Status s = ReadCopy(id, c, rank, &src);
    if (s.ok()) {
      from = id;
      break;
    }
    if (absl::IsCancelled(s)) return s;
    metrics->failures->Add();
    errors.push_back(absl::StrCat("source ", id, ": ", s.message()));
    GS_LOG(WARNING) << "repair: " << Shard(job, step, rank) << ": source " << id << ": " << s;
  }
  if (from.empty()) {
    return absl::UnavailableError(absl::StrCat("no source copy verified: ",
                                               absl::StrJoin(errors, "; ")));
  }
  std::vector<std::string> ids;
  for (const auto& [id, address] : live_) ids.push_back(id);
  std::vector<std::string> nodes = holders;
  std::vector<std::string> made;
  for (const std::string& id : cluster::OrderNodeIds(ids, job, rank)) {
    if (nodes.size() >= wanted || stopping()) break;
    if (std::find(nodes.begin(), nodes.end(), id) != nodes.end()) continue;
    GS_LOG(INFO) << "repair: copying " << Shard(job, step, rank) << " (" << r.raw_bytes
                 << " bytes) from node " << from << " to node " << id;
    absl::Status s = WriteCopy(id, c, rank, src);
    if (!s.ok()) {
      metrics->failures->Add();
      GS_LOG(WARNING) << "repair: " << Shard(job, step, rank) << ": target " << id << ": " << s;
      continue;
    }
    nodes.push_back(id);
    made.push_back(id);
  }
  if (made.empty()) return absl::UnavailableError("no target took a copy");
  pb::Compare guard;
  guard.set_key(kRepairLeaderKey);
  guard.set_target(pb::Compare::CREATE);
  guard.set_result(pb::Compare::EQUAL);
  guard.set_create_revision(leader_revision_);
  absl::Status set = catalog_.SetReplicas(c, rank, nodes, &guard);
  if (!set.ok()) {
    metrics->failures->Add();
    // A delete that came first wins: the new copies are named by nothing, so they go now.
    auto now = catalog_.Get(job, step);
    if (absl::IsNotFound(now.status())) {
      for (const std::string& id : made) {
        auto node = Node(id, LocalJob(job, rank));
        if (node.ok()) (*node)->Delete(LocalJob(job, rank), step, 0).IgnoreError();
      }
    }
    return set;
  }
  metrics->shards->Add(static_cast<int64_t>(made.size()));
  metrics->bytes->Add(static_cast<int64_t>(r.raw_bytes * made.size()));
  GS_LOG(INFO) << "repair: " << Shard(job, step, rank) << " is on " << absl::StrJoin(nodes, ",")
               << " (new: " << absl::StrJoin(made, ",") << ", from " << from << ", "
               << r.raw_bytes << " bytes each)";
  return absl::OkStatus();
}

}  // namespace client
}  // namespace gradsnap
