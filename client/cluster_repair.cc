// RepairWorker (cluster_repair.h).
#include "client/cluster_repair.h"

#include <algorithm>
#include <chrono>
#include <set>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/backends.h"
#include "client/remote_client.h"
#include "cluster/membership.h"
#include "cluster/placement.h"
#include "common/clock.h"
#include "common/digest.h"
#include "common/logging.h"
#include "common/stats.h"
#include "common/status.h"
#include "common/thread_pool.h"
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
  Counter* pulled;
  Counter* relayed;
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
      m->pulled = r->GetCounter("gradsnap_repair_pulled_bytes_total",
                                "Payload bytes this node copied in from another node for the "
                                "repairer (PullCopy)");
      m->relayed = r->GetCounter("gradsnap_repair_relayed_bytes_total",
                                 "Payload bytes the repairer carried itself, for targets that "
                                 "cannot pull (servers from before PullCopy)");
      return m;
    }();
    return m;
  }
};

// How often a rank's new replicas are set again on a record another rank's repair changed.
constexpr int kSetReplicasTries = 8;

// How a PullCopy names its source when the source is what failed ("source node ID: ..."):
// the repairer passes that source over for the rank's other targets (RepairRank).
std::string SourceFailed(const std::string& id) { return absl::StrCat("source node ", id, ": "); }

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
  {
    absl::MutexLock lock(&clients_mu_);
    clients_.clear();  // one per (node, job) copied: made again by the passes that copy
  }
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
  // Up to `parallel` ranks at once; each copy waits for a place on its target (Acquire).
  {
    absl::MutexLock lock(&targets_mu_);
    copies_max_ = 0;
  }
  int64_t repaired = 0;
  absl::Mutex under_mu;
  ForEachConcurrently(due.size(), static_cast<size_t>(std::max(1, options_.parallel)),
                      [&](size_t i) {
                        const Due& d = due[i];
                        if (stopping()) return;
                        absl::Status s = RepairRank(d.job, d.step, d.rank);
                        if (s.ok()) {
                          absl::MutexLock lock(&under_mu);
                          --under;
                          ++repaired;
                        } else {
                          GS_LOG(WARNING) << "repair: " << Shard(d.job, d.step, d.rank) << ": "
                                          << s;
                        }
                      });
  if (!due.empty()) {
    absl::MutexLock lock(&targets_mu_);
    GS_LOG(INFO) << "repair: pass done: " << repaired << " of " << due.size()
                 << " due rank(s) repaired, at most " << copies_max_ << " copies at once";
  }
  return under;
}

absl::StatusOr<std::unique_ptr<Client>> RepairWorker::Connect(const std::string& address,
                                                              const std::string& local) const {
  ClientOptions o = options_.node_options;
  o.etcd.clear();
  o.local_dir.clear();
  if (!options_.auth_secret.empty()) {
    ASSIGN_OR_RETURN(o.token, MintJobToken(options_.auth_secret, local));
  }
  o.endpoints = {address};
  o.replicas = 1;
  o.max_attempts = std::min(o.max_attempts, 3);
  return NewRemoteClient(o);
}

absl::StatusOr<std::shared_ptr<Client>> RepairWorker::Node(const std::string& id,
                                                           const std::string& local) {
  auto live = live_.find(id);
  if (live == live_.end()) return absl::UnavailableError(absl::StrCat("node ", id, " is not live"));
  std::string token;
  if (!options_.auth_secret.empty()) {
    ASSIGN_OR_RETURN(token, MintJobToken(options_.auth_secret, local));
  }
  absl::MutexLock lock(&clients_mu_);
  auto& [address, client] = clients_[{id, token}];
  if (client == nullptr || address != live->second) {
    ASSIGN_OR_RETURN(std::unique_ptr<Client> c, Connect(live->second, local));
    client = std::move(c);
    address = live->second;
  }
  return client;
}

bool RepairWorker::Acquire(const std::string& id) {
  absl::MutexLock lock(&targets_mu_);
  while (targets_[id] >= kMaxPulls) {
    if (stopping()) return false;
    targets_mu_.AwaitWithTimeout(absl::Condition(
                                     +[](int* n) { return *n < kMaxPulls; }, &targets_[id]),
                                 absl::Milliseconds(200));
  }
  ++targets_[id];
  copies_max_ = std::max(copies_max_, ++copies_);
  return true;
}

void RepairWorker::Release(const std::string& id) {
  absl::MutexLock lock(&targets_mu_);
  --targets_[id];  // kept at 0 (a waiter's condition points at it; one entry per node)
  --copies_;
}

absl::Status RepairWorker::ReadCopy(Client& node, const std::string& id,
                                    const std::string& local, int64_t step, uint64_t raw_bytes,
                                    const std::string& digest,
                                    const std::function<bool()>& cancelled, Source* out) {
  ASSIGN_OR_RETURN(storage::Manifest m, node.Show(local, step));
  if (m.shards.size() != 1 || !m.shards[0].committed || m.shards[0].raw_bytes != raw_bytes) {
    return absl::DataLossError(absl::StrCat("node ", id, " holds another copy (",
                                            m.shards.empty() ? 0 : m.shards[0].raw_bytes,
                                            " bytes; the record says ", raw_bytes, ")"));
  }
  out->shard = m.shards[0];
  out->checkpoint_metadata = m.info.metadata;
  out->payload.clear();
  out->payload.reserve(raw_bytes);
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(node.RestoreShard(local, step, 0, [&](const void* p, size_t n) {
    if (stopping() || (cancelled && cancelled())) {
      return absl::CancelledError("repair copy stopped");
    }
    out->payload.append(static_cast<const char*>(p), n);
    if (options_.bandwidth_bytes_per_s > 0) {  // paced: the copy takes at least size / rate
      const auto due = start + std::chrono::microseconds(static_cast<int64_t>(
                                   1e6 * static_cast<double>(out->payload.size()) /
                                   static_cast<double>(options_.bandwidth_bytes_per_s)));
      std::this_thread::sleep_until(due);
    }
    return absl::OkStatus();
  }));
  Digester d(DigestAlgo::kXxh3_128);
  d.Update(out->payload.data(), out->payload.size());
  const std::string got = d.FinishHex();
  if (digest.empty() || got != digest) {
    return absl::DataLossError(absl::StrCat("the copy on node ", id, " has digest ", got,
                                            ", the record ", digest.empty() ? "none" : digest));
  }
  return absl::OkStatus();
}

absl::Status RepairWorker::WriteCopy(Client& node, const std::string& id,
                                     const std::string& local, int64_t step,
                                     const std::string& digest, const Source& src) {
  CheckpointSpec spec;
  spec.job = local;
  spec.step = step;
  spec.world_size = 1;
  spec.metadata = src.checkpoint_metadata;
  ShardSpec shard;
  shard.job = local;
  shard.step = step;
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
    s = node.BeginCheckpoint(spec);
    if (s.ok()) s = node.SaveShard(shard, refs);
    if (s.ok()) {
      Digester d(DigestAlgo::kXxh3_128);  // what the target serves now, read back
      s = node.RestoreShard(local, step, 0, [&](const void* p, size_t n) {
        d.Update(p, n);
        return absl::OkStatus();
      });
      const std::string got = s.ok() ? d.FinishHex() : "";
      if (s.ok() && got == digest) return absl::OkStatus();
      if (s.ok()) {
        s = absl::DataLossError(
            absl::StrCat("node ", id, " serves digest ", got, " after the copy, not ", digest));
      }
    }
    if (!absl::IsAlreadyExists(s) && !absl::IsDataLoss(s)) return s;
    absl::Status dropped = node.Delete(local, step, 0);
    if (!dropped.ok() && !absl::IsNotFound(dropped)) return dropped;
  }
  return s;
}

absl::Status RepairWorker::PullTo(const std::string& target, const std::string& source,
                                  const ClusterCheckpoint& c, int32_t rank) {
  const RankReplicas& r = c.ranks.at(rank);
  const std::string local = LocalJob(c.job, rank);
  ASSIGN_OR_RETURN(std::shared_ptr<Client> node, Node(target, local));
  // The copy's deadline: its bytes at half the pace cap (or at 10 MiB/s without one), plus 30 s.
  const uint64_t rate = options_.bandwidth_bytes_per_s > 0
                            ? std::max<uint64_t>(1, options_.bandwidth_bytes_per_s / 2)
                            : (10ull << 20);
  const int64_t deadline_ms =
      30000 + static_cast<int64_t>(std::min<uint64_t>(r.raw_bytes / rate * 1000, 1ull << 40));
  // Node() makes remote clients only (NewRemoteClient).
  auto* remote = static_cast<remote::RemoteClient*>(node.get());
  return remote->PullCopy(local, c.step, source, r.digest, r.raw_bytes, deadline_ms).status();
}

absl::StatusOr<uint64_t> RepairWorker::Pull(const std::string& local, int64_t step,
                                            const std::string& source_id,
                                            const std::string& digest, uint64_t raw_bytes,
                                            const std::function<bool()>& cancelled) {
  if (options_.self_address.empty()) {
    return absl::FailedPreconditionError("this node has no advertised address to copy to");
  }
  if (source_id == options_.node_id) {
    return absl::InvalidArgumentError("a node does not copy from itself");
  }
  {
    absl::MutexLock lock(&pulls_mu_);
    if (pulls_ >= kMaxPulls) {
      return absl::ResourceExhaustedError(
          absl::StrCat("server busy: ", kMaxPulls, " repair copies under way on this node"));
    }
    ++pulls_;
  }
  struct Done {
    RepairWorker* w;
    ~Done() {
      absl::MutexLock lock(&w->pulls_mu_);
      --w->pulls_;
    }
  } done{this};
  // The source's address comes from etcd's membership, not from the caller.
  auto kv = etcd_->Get(cluster::kNodesPrefix + source_id);
  if (absl::IsNotFound(kv.status())) {
    return absl::UnavailableError(absl::StrCat("source node ", source_id, " is not live"));
  }
  RETURN_IF_ERROR(kv.status());
  ASSIGN_OR_RETURN(cluster::NodeRecord rec, cluster::DecodeNodeRecord(*kv));
  ASSIGN_OR_RETURN(std::unique_ptr<Client> self, Connect(options_.self_address, local));
  // This node serves the very copy already (a request repeated, or one sent to a holder): done,
  // and its copy is never dropped to be written again.
  Source here;
  if (ReadCopy(*self, options_.node_id, local, step, raw_bytes, digest, cancelled, &here).ok()) {
    return here.payload.size();
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Client> source, Connect(rec.address, local));
  GS_LOG(INFO) << "repair: pulling " << local << " step " << step << " (" << raw_bytes
               << " bytes) from node " << source_id;
  Source src;
  absl::Status read =
      ReadCopy(*source, source_id, local, step, raw_bytes, digest, cancelled, &src);
  if (!read.ok()) {
    return absl::Status(read.code(), absl::StrCat(SourceFailed(source_id), read.message()));
  }
  RETURN_IF_ERROR(WriteCopy(*self, options_.node_id, local, step, digest, src));
  RepairMetrics::Get()->pulled->Add(static_cast<int64_t>(src.payload.size()));
  return src.payload.size();
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
  // Node to node: each target pulls the copy from a holder itself (PullCopy), checking the
  // source's digest before it writes and its own after; the first holder whose copy a target
  // refuses ("source node ID: ...") is passed over for the other targets too. A target from
  // before PullCopy (UNIMPLEMENTED) gets the copy relayed through this node, read once.
  std::vector<std::string> ids;
  for (const auto& [id, address] : live_) ids.push_back(id);
  std::vector<std::string> nodes = holders;
  std::vector<std::string> made;
  std::string from;
  std::set<std::string> bad_sources;
  Source relayed;
  std::string relayed_from;
  bool relay_read = false;
  for (const std::string& id : cluster::OrderNodeIds(ids, job, rank)) {
    if (nodes.size() >= wanted || stopping()) break;
    if (std::find(nodes.begin(), nodes.end(), id) != nodes.end()) continue;
    if (!Acquire(id)) return absl::CancelledError("repair worker stopping");
    absl::Cleanup release = [this, &id] { Release(id); };
    absl::Status s = absl::UnavailableError("no source copy verified");
    bool no_source = true;  // every holder was passed over (each one logged already)
    std::string source;
    for (const std::string& h : holders) {
      if (bad_sources.count(h)) continue;
      GS_LOG(INFO) << "repair: copying " << Shard(job, step, rank) << " (" << r.raw_bytes
                   << " bytes) from node " << h << " to node " << id;
      s = PullTo(id, h, c, rank);
      no_source = false;
      if (s.ok()) {
        source = h;
        break;
      }
      if (absl::IsUnimplemented(s) || absl::IsCancelled(s)) break;
      metrics->failures->Add();
      if (absl::StrContains(s.message(), SourceFailed(h))) {
        bad_sources.insert(h);
        GS_LOG(WARNING) << "repair: " << Shard(job, step, rank) << ": source " << h << ": " << s;
        continue;
      }
      break;  // the target's own failure: the next target
    }
    if (absl::IsCancelled(s)) return s;
    if (absl::IsUnimplemented(s)) {
      if (!relay_read) {
        relay_read = true;
        for (const std::string& h : holders) {
          auto node = Node(h, LocalJob(job, rank));
          absl::Status read = node.status();
          if (read.ok()) {
            read = ReadCopy(**node, h, LocalJob(job, rank), step, r.raw_bytes, r.digest, nullptr,
                            &relayed);
          }
          if (read.ok()) {
            relayed_from = h;
            break;
          }
          if (absl::IsCancelled(read)) return read;
          metrics->failures->Add();
          GS_LOG(WARNING) << "repair: " << Shard(job, step, rank) << ": source " << h << ": "
                          << read;
        }
      }
      no_source = relayed_from.empty();
      if (no_source) {
        s = absl::UnavailableError("no source copy verified");
      } else {
        GS_LOG(INFO) << "repair: node " << id << " cannot pull (a server from before PullCopy): "
                     << "relaying the copy from node " << relayed_from;
        auto node = Node(id, LocalJob(job, rank));
        s = node.ok() ? WriteCopy(**node, id, LocalJob(job, rank), step, r.digest, relayed)
                      : node.status();
        if (s.ok()) {
          source = relayed_from;
          metrics->relayed->Add(static_cast<int64_t>(r.raw_bytes));
        }
      }
    }
    if (!s.ok()) {
      if (!no_source) {
        GS_LOG(WARNING) << "repair: " << Shard(job, step, rank) << ": target " << id << ": " << s;
      }
      continue;
    }
    if (from.empty()) from = source;
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
  // Another rank of the same checkpoint, repaired at the same time, may have updated the record
  // first: while this rank's own entry is as it was read, its replicas are set on the record as
  // it is now (a delete, a rewrite of this rank or a lost leadership still win).
  const RankReplicas read = c.ranks.at(rank);
  for (int tries = 0; absl::IsAborted(set) && tries < kSetReplicasTries; ++tries) {
    auto now = catalog_.Get(job, step);
    if (!now.ok() || now->state != storage::CheckpointState::kCommitted ||
        now->ranks.count(rank) == 0) {
      break;
    }
    const RankReplicas& current = now->ranks.at(rank);
    if (current.nodes != read.nodes || current.digest != read.digest) break;
    set = catalog_.SetReplicas(*now, rank, nodes, &guard);
  }
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
