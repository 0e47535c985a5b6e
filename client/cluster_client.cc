// The cluster-mode back end (ClientOptions::etcd; docs/protocol.md, "Cluster mode").
//
// OVERVIEW
//   The live storage nodes are the node records in etcd (cluster/membership.h), read at
//   connect time and kept current by a watch. A shard (job, rank) is placed by rendezvous
//   hashing on node ids (cluster/placement.h) on the first cluster_replicas live nodes of its
//   order; a node that fails is replaced by the next one in order, and the save succeeds once
//   min_replicas copies are durable. Each copy is, on its node, a one-rank checkpoint of the
//   node-local job "<job>.r<rank>" (so a node holds only the ranks placed on it, commits each
//   on its own and serves it; no placeholder shards), fenced on the node by the attempt's epoch
//   (raised there to the epoch etcd gave). The checkpoint's state lives in etcd
//   (cluster/catalog.h): the rank is staged with its size, digest and replica node ids, and the
//   stager that finds every rank staged commits the record in one transaction. Reads take the
//   record's replicas that are live, in order, and fail over to the next one.
//
// ERROR HANDLING
//   UNAVAILABLE when etcd is unreachable or without quorum, or fewer than min_replicas copies
//   could be made; the catalog's codes otherwise (cluster/catalog.h).
//
// THREAD SAFETY
//   All methods may be called from any thread; the node table is guarded by a mutex and
//   updated by the watch's thread.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/backends.h"
#include "client/remote_client.h"
#include "client/save_util.h"
#include "cluster/catalog.h"
#include "cluster/etcd_client.h"
#include "cluster/membership.h"
#include "cluster/placement.h"
#include "common/digest.h"
#include "common/gc_plan.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/thread_pool.h"

namespace gradsnap {
namespace client {
namespace {

using cluster::ClusterCheckpoint;
using cluster::RankReplicas;

using cluster::LocalJob;

class ClusterClient final : public Client {
 public:
  ClusterClient(ClientOptions options, std::unique_ptr<cluster::EtcdClient> etcd)
      : options_(std::move(options)), etcd_(std::move(etcd)), catalog_(etcd_.get()) {
    saves_ = std::make_unique<SaveQueue>(
        std::clamp<uint64_t>(options_.max_inflight_bytes / (64u << 20), 1, 8),
        [this](const ShardSpec& spec, const std::vector<TensorRef>& tensors) {
          return SaveShardNow(spec, tensors);
        });
  }
  ~ClusterClient() override {
    saves_.reset();
    watch_.reset();
  }

  // Reads the node records and starts the watch that keeps them current.
  absl::Status Start() {
    int64_t revision = 0;
    ASSIGN_OR_RETURN(std::vector<cluster::EtcdKv> kvs,
                     etcd_->GetPrefix(cluster::kNodesPrefix, &revision));
    {
      absl::MutexLock lock(&mu_);
      for (const auto& kv : kvs) ApplyNode(kv, /*deleted=*/false);
    }
    watch_ = etcd_->WatchPrefix(
        cluster::kNodesPrefix, revision + 1,
        [this](const std::vector<cluster::EtcdEvent>& events, int64_t, bool compacted) {
          if (compacted) {
            auto all = etcd_->GetPrefix(cluster::kNodesPrefix);
            if (!all.ok()) return;
            absl::MutexLock lock(&mu_);
            live_.clear();
            for (const auto& kv : *all) ApplyNode(kv, false);
            return;
          }
          absl::MutexLock lock(&mu_);
          for (const auto& e : events) ApplyNode(e.kv, e.deleted);
        });
    return absl::OkStatus();
  }

  absl::Status BeginCheckpoint(const CheckpointSpec& spec) override {
    RETURN_IF_ERROR(catalog_.Begin(spec, options_.cluster_replicas));
    absl::MutexLock lock(&mu_);
    // What this client's saves of the checkpoint need: rank 0's copies carry the metadata,
    // and only a FULL's commit looks for DELTAs that wait for it (TryCommit). Bounded: the
    // oldest steps go first.
    if (begun_.size() >= kBegunMax) begun_.erase(begun_.begin());
    begun_[{spec.job, spec.step}] = {spec.metadata, spec.kind};
    return absl::OkStatus();
  }

  std::future<absl::Status> SaveShardAsync(const ShardSpec& spec,
                                           std::vector<TensorRef> tensors) override {
    return saves_->Push(spec, std::move(tensors));
  }

  absl::Status AbortCheckpoint(const std::string& job, int64_t step, uint64_t epoch) override {
    absl::Status s = catalog_.Abort(job, step, epoch);
    return absl::IsNotFound(s) ? absl::OkStatus() : s;
  }

  absl::StatusOr<uint64_t> AcquireEpoch(const std::string& job) override {
    return catalog_.AcquireEpoch(job);
  }

  absl::StatusOr<std::vector<std::string>> ListJobs() override {
    ASSIGN_OR_RETURN(std::vector<cluster::EtcdKv> kvs, etcd_->GetPrefix("/gradsnap/ckpt/"));
    std::set<std::string> jobs;
    for (const auto& kv : kvs) {
      const std::string rest = kv.key.substr(sizeof("/gradsnap/ckpt/") - 1);
      jobs.insert(rest.substr(0, rest.find('/')));
    }
    return std::vector<std::string>(jobs.begin(), jobs.end());
  }

  absl::StatusOr<std::vector<CheckpointInfo>> List(const std::string& job,
                                                   bool include_pending) override {
    ASSIGN_OR_RETURN(std::vector<ClusterCheckpoint> all, catalog_.List(job, include_pending));
    std::vector<CheckpointInfo> out;
    for (const ClusterCheckpoint& c : all) out.push_back(Info(c));
    return out;
  }

  // The record, then each rank's manifest from one of its replicas, the ranks at once (a
  // round trip each). A committed record is remembered for the reads that follow (Remember).
  absl::StatusOr<Manifest> Show(const std::string& job, int64_t step) override {
    ASSIGN_OR_RETURN(ClusterCheckpoint c, catalog_.Get(job, step));
    if (c.state == CheckpointState::kCommitted) Remember(c);
    Manifest m;
    m.info = Info(c);
    std::vector<std::pair<int32_t, const RankReplicas*>> ranks;
    for (const auto& [rank, replicas] : c.ranks) ranks.emplace_back(rank, &replicas);
    std::vector<Manifest> local(ranks.size());
    std::vector<absl::Status> status(ranks.size());
    auto show = [&](size_t i) {
      status[i] = OnReplica(*ranks[i].second, [&](Client* node) -> absl::Status {
        ASSIGN_OR_RETURN(local[i], node->Show(LocalJob(job, ranks[i].first), step));
        return absl::OkStatus();
      });
    };
    ForEachConcurrently(ranks.size(), kShowThreads, show);  // a checkpoint of many ranks
    for (size_t i = 0; i < ranks.size(); ++i) {
      RETURN_IF_ERROR(status[i]);
      for (ShardInfo& s : local[i].shards) {
        s.rank = ranks[i].first;
        m.shards.push_back(std::move(s));
      }
      if (ranks[i].first == 0) m.info.metadata = local[i].info.metadata;
    }
    return m;
  }

  absl::Status RestoreTensor(const std::string& job, int64_t step, int32_t rank,
                             const std::string& tensor, void* out, size_t out_len) override {
    ASSIGN_OR_RETURN(RankReplicas replicas, Committed(job, step, rank));
    return OnReplica(replicas, [&](Client* node) {
      return node->RestoreTensor(LocalJob(job, rank), step, 0, tensor, out, out_len);
    });
  }

  absl::Status RestoreShard(const std::string& job, int64_t step, int32_t rank,
                            const std::function<absl::Status(const void*, size_t)>& sink,
                            const ProgressFn& progress) override {
    ASSIGN_OR_RETURN(RankReplicas replicas, Committed(job, step, rank));
    bool delivered = false;
    // Another replica is tried only while nothing reached the sink: a stream that broke
    // part-way was already resumed on its node by the node's client.
    return OnReplica(
        replicas,
        [&](Client* node) {
          return node->RestoreShard(
              LocalJob(job, rank), step, 0,
              [&](const void* p, size_t n) {
                delivered = true;
                return sink(p, n);
              },
              progress);
        },
        [&] { return !delivered; });
  }

  absl::Status ReadShardRange(const std::string& job, int64_t step, int32_t rank,
                              uint64_t offset, uint64_t length, void* out) override {
    ASSIGN_OR_RETURN(RankReplicas replicas, Committed(job, step, rank));
    return OnReplica(replicas, [&](Client* node) {
      return node->ReadShardRange(LocalJob(job, rank), step, 0, offset, length, out);
    });
  }

  // Every reachable copy of every rank is verified on its node: a damaged copy fails the
  // verify (DATA_LOSS); a copy on a node that is gone or unreachable is passed over, as long as
  // one copy of each rank verified (else UNAVAILABLE).
  absl::Status Verify(const std::string& job, int64_t step, const ProgressFn& progress) override {
    ASSIGN_OR_RETURN(ClusterCheckpoint c, CommittedRecord(job, step));
    uint64_t total = 0, done = 0;
    for (const auto& [rank, r] : c.ranks) total += r.raw_bytes * r.nodes.size();
    for (const auto& [rank, r] : c.ranks) {
      int verified = 0;
      absl::Status unreachable;
      for (const std::string& id : r.nodes) {
        absl::StatusOr<std::shared_ptr<remote::RemoteClient>> node = NodeClient(id);
        absl::Status s = node.ok() ? (*node)->Verify(LocalJob(job, rank), step, nullptr)
                                   : node.status();
        if (absl::IsUnavailable(s) || absl::IsDeadlineExceeded(s)) {
          unreachable = s;
          continue;
        }
        RETURN_IF_ERROR(s);
        ++verified;
        done += r.raw_bytes;
        if (progress) progress(done, total);
      }
      if (verified == 0) {
        return absl::UnavailableError(absl::StrCat("job ", job, " step ", step, " rank ", rank,
                                                   ": no replica reachable: ",
                                                   unreachable.message()));
      }
    }
    return absl::OkStatus();
  }

  // The record goes first (one transaction); then the live replicas drop their copies.
  absl::Status Delete(const std::string& job, int64_t step, uint64_t epoch) override {
    return DeleteCopies(job, step, epoch).status();
  }

  // Retention as on one node (common/gc_plan.h): the FULLs kept are decided over the records,
  // with a verify of every reachable copy (a FULL with a damaged copy is kept, not counted;
  // one that cannot be verified stops the gc before anything is deleted). Each doomed FULL goes
  // with its committed DELTAs, newest first, each by Delete: the record first (one
  // transaction), then every replica's data. A FULL that a PENDING DELTA is based on is kept.
  absl::StatusOr<GcResult> Gc(const std::string& job, const GcPolicy& policy,
                              uint64_t epoch) override {
    if (epoch != 0) {  // a zombie is refused before it spends a verify
      ASSIGN_OR_RETURN(uint64_t current, catalog_.CurrentEpoch(job));
      if (current != epoch) {
        return absl::FailedPreconditionError(absl::StrCat(
            "job ", job, ": epoch ", epoch, " superseded by attempt ", current));
      }
    }
    ASSIGN_OR_RETURN(std::vector<ClusterCheckpoint> all, catalog_.List(job, /*include_pending=*/true));
    std::vector<CheckpointInfo> committed;
    for (const ClusterCheckpoint& c : all) {
      if (c.state == CheckpointState::kCommitted) committed.push_back(Info(c));
    }
    ASSIGN_OR_RETURN(std::vector<int64_t> doomed,
                     storage::FullsOutsidePolicy(job, committed, policy, [&](int64_t step) {
                       return Verify(job, step, nullptr);
                     }));
    GcResult out;
    for (int64_t full : doomed) {
      std::vector<const ClusterCheckpoint*> deltas;
      bool pending_delta = false;
      for (const ClusterCheckpoint& c : all) {
        if (c.kind != storage::CheckpointKind::kDelta || c.base_step != full) continue;
        if (c.state != CheckpointState::kCommitted) pending_delta = true;
        deltas.push_back(&c);
      }
      if (pending_delta) {
        GS_LOG(WARNING) << "gc: job " << job << " step " << full
                        << " kept: a PENDING DELTA is based on it";
        continue;
      }
      std::vector<int64_t> steps;  // the DELTAs newest first, then the FULL
      for (auto it = deltas.rbegin(); it != deltas.rend(); ++it) steps.push_back((*it)->step);
      steps.push_back(full);
      for (int64_t step : steps) {
        ASSIGN_OR_RETURN(uint64_t freed, DeleteCopies(job, step, epoch));
        out.deleted_steps.push_back(step);
        out.bytes_reclaimed += freed;
      }
    }
    std::sort(out.deleted_steps.begin(), out.deleted_steps.end());
    return out;
  }

  absl::Status Health() override { return HealthNotes(nullptr); }

  // OK when etcd's quorum answers a read and the client knows a live node. (Nodes refusing
  // writes for want of space are not reported in cluster mode yet: `notes` stays empty.)
  absl::Status HealthNotes(std::vector<std::string>* notes) override {
    (void)notes;
    RETURN_IF_ERROR(etcd_->GetPrefix(cluster::kNodesPrefix).status());
    absl::MutexLock lock(&mu_);
    if (live_.empty()) return absl::UnavailableError("cluster: no live storage nodes in etcd");
    return absl::OkStatus();
  }

 private:
  struct LiveNode {
    std::string address;
    std::shared_ptr<remote::RemoteClient> client;  // made on first use
    int64_t lease = 0;                              // its record's etcd lease
  };

  // Delete: the record, then each replica's copy; returns the payload bytes of the copies
  // dropped. A replica that is not live or fails keeps its copy, named by no record: its node
  // quarantines it (docs/protocol.md, "Repair").
  absl::StatusOr<uint64_t> DeleteCopies(const std::string& job, int64_t step, uint64_t epoch) {
    ASSIGN_OR_RETURN(ClusterCheckpoint c, catalog_.Get(job, step));
    RETURN_IF_ERROR(catalog_.Delete(job, step, epoch));
    Forget(job, step);
    uint64_t freed = 0;
    for (const auto& [rank, r] : c.ranks) {
      for (const std::string& id : r.nodes) {
        auto node = NodeClient(id);
        absl::Status s = node.ok() ? (*node)->Delete(LocalJob(job, rank), step, 0) : node.status();
        if (s.ok()) freed += r.raw_bytes;
        if (!s.ok() && !absl::IsNotFound(s)) {
          GS_LOG(WARNING) << "cluster: node " << id << " kept job " << job << " step " << step
                          << " rank " << rank << ": " << s;
        }
      }
    }
    return freed;
  }

  void ApplyNode(const cluster::EtcdKv& kv, bool deleted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string id = kv.key.substr(sizeof(cluster::kNodesPrefix) - 1);
    if (deleted) {
      live_.erase(id);
      suspect_.erase(id);
      ForgetRaised(id);
      return;
    }
    auto rec = cluster::DecodeNodeRecord(kv);
    if (!rec.ok()) return;
    LiveNode& n = live_[id];
    if (n.address != rec->address) n.client.reset();  // moved: a new connection
    n.address = rec->address;
    // Registered anew (a restart, a lease regained; not a refresh of its free space under the
    // same lease): tried again at once.
    if (n.lease != kv.lease) {
      suspect_.erase(id);
      ForgetRaised(id);  // a restarted node may have lost its data: raise its epochs again
    }
    n.lease = kv.lease;
  }

  void ForgetRaised(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = raised_.lower_bound({id, std::string()});
         it != raised_.end() && it->first.first == id;) {
      it = raised_.erase(it);
    }
  }

  // Suspicion (docs/protocol.md, "Placement"): a node whose copy failed or was cancelled as a
  // straggler goes to the end of every placement order and replica list for a while (kSuspectMs,
  // doubled on each failure in a row up to kSuspectMaxMs), so the saves that follow place on the
  // next nodes instead of each waiting out the same dead or cut-off node (its retries, or the
  // straggler grace) until etcd drops it when its lease expires. A copy it takes again, or its
  // registering anew, ends the suspicion. Only the order changes: a suspected node is still
  // used when too few others are live.
  static constexpr int64_t kSuspectMs = 1000;
  static constexpr int64_t kSuspectMaxMs = 16000;
  struct Suspicion {
    absl::Time until;
    int failures = 0;
  };
  void Suspect(const std::string& id, const absl::Status& why) {
    absl::MutexLock lock(&mu_);
    Suspicion& sus = suspect_[id];
    const int64_t ms = std::min(kSuspectMaxMs, kSuspectMs << std::min(sus.failures, 4));
    sus.until = absl::Now() + absl::Milliseconds(ms);
    ++sus.failures;
    GS_LOG(INFO) << "cluster: node " << id << " suspected for " << ms << " ms: "
                 << (absl::IsCancelled(why) ? "its copy was cancelled as a straggler"
                                            : std::string(why.message()));
  }
  void Trusted(const std::string& id) {
    absl::MutexLock lock(&mu_);
    suspect_.erase(id);
  }
  // `ids` with the nodes suspected now moved to the end, each part in its order.
  void SuspectsLast(std::vector<std::string>* ids) {
    const absl::Time now = absl::Now();
    std::set<std::string> suspected;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, sus] : suspect_) {
        if (sus.until > now) suspected.insert(id);
      }
    }
    if (suspected.empty()) return;
    std::stable_partition(ids->begin(), ids->end(),
                          [&](const std::string& id) { return suspected.count(id) == 0; });
  }

  // The client of live node `id` (UNAVAILABLE when it is not live).
  absl::StatusOr<std::shared_ptr<remote::RemoteClient>> NodeClient(const std::string& id) {
    absl::MutexLock lock(&mu_);
    auto it = live_.find(id);
    if (it == live_.end()) return absl::UnavailableError(absl::StrCat("node ", id, " is not live"));
    if (it->second.client == nullptr) {
      ClientOptions o = options_;
      o.etcd.clear();
      o.endpoints = {it->second.address};
      o.replicas = 1;
      // A failing node is replaced by the next one in order rather than waited for long.
      o.max_attempts = std::min(options_.max_attempts, 3);
      ASSIGN_OR_RETURN(std::unique_ptr<Client> c, NewRemoteClient(o));
      it->second.client.reset(static_cast<remote::RemoteClient*>(c.release()));
    }
    return it->second.client;
  }

  // Runs `fn` on the live replicas of `r` in order until one succeeds (or `may_retry` says no
  // more); the last error otherwise.
  absl::Status OnReplica(const RankReplicas& r, const std::function<absl::Status(Client*)>& fn,
                         const std::function<bool()>& may_retry = nullptr) {
    absl::Status last = absl::UnavailableError(
        absl::StrCat("no live replica among nodes ", absl::StrJoin(r.nodes, ",")));
    std::vector<std::string> ids = r.nodes;
    SuspectsLast(&ids);
    for (const std::string& id : ids) {
      auto node = NodeClient(id);
      if (!node.ok()) continue;
      last = fn(node->get());
      if (last.ok() || absl::IsNotFound(last) || absl::IsInvalidArgument(last)) return last;
      if (may_retry && !may_retry()) return last;
    }
    return last;
  }

  absl::StatusOr<ClusterCheckpoint> CommittedRecord(const std::string& job, int64_t step) {
    ASSIGN_OR_RETURN(ClusterCheckpoint c, catalog_.Get(job, step));
    if (c.state != CheckpointState::kCommitted) {
      return absl::FailedPreconditionError(
          absl::StrCat("checkpoint job ", job, " step ", step, " is not committed"));
    }
    return c;
  }

  // A committed record this client read within kRememberMs (Show): a restore describes each
  // checkpoint, then reads its ranges, and each read would otherwise ask etcd for the record
  // again (a quorum read). A remembered record can only be stale in ways a read survives: its
  // data never changes once committed; repair may since have added copies (the read uses the
  // ones it knew) or replaced a lost node (a node no longer live is passed over); a checkpoint
  // deleted since reads back NOT_FOUND from its nodes, as it would from etcd.
  static constexpr int64_t kRememberMs = 10000;
  static constexpr size_t kShowThreads = 16;
  static constexpr size_t kRememberMax = 4096;
  void Remember(const ClusterCheckpoint& c) {
    absl::MutexLock lock(&mu_);
    if (remembered_.size() >= kRememberMax) remembered_.clear();
    remembered_[{c.job, c.step}] = {c, absl::Now()};
  }
  void Forget(const std::string& job, int64_t step) {
    absl::MutexLock lock(&mu_);
    remembered_.erase({job, step});
  }

  absl::StatusOr<RankReplicas> Committed(const std::string& job, int64_t step, int32_t rank) {
    {
      absl::MutexLock lock(&mu_);
      auto it = remembered_.find({job, step});
      if (it != remembered_.end() &&
          absl::Now() - it->second.second < absl::Milliseconds(kRememberMs)) {
        auto r = it->second.first.ranks.find(rank);
        if (r != it->second.first.ranks.end()) return r->second;
      }
    }
    ASSIGN_OR_RETURN(ClusterCheckpoint c, CommittedRecord(job, step));
    auto it = c.ranks.find(rank);
    if (it == c.ranks.end()) {
      return absl::NotFoundError(absl::StrCat("job ", job, " step ", step, ": no rank ", rank));
    }
    return it->second;
  }

  static CheckpointInfo Info(const ClusterCheckpoint& c) {
    CheckpointInfo i{.job = c.job,
                     .step = c.step,
                     .kind = c.kind,
                     .base_step = c.base_step,
                     .world_size = c.world_size,
                     .state = c.state,
                     .created_unix_ms = c.created_unix_ms,
                     .committed_unix_ms = c.committed_unix_ms,
                     .metadata = {}};  // the cluster record keeps none
    for (const auto& [rank, r] : c.ranks) i.raw_bytes += r.raw_bytes;  // one copy's bytes
    return i;
  }

  // The live nodes in the rendezvous order of (job, rank): ids.
  std::vector<std::string> Order(const std::string& job, int32_t rank) {
    std::vector<std::string> ids;
    {
      absl::MutexLock lock(&mu_);
      for (const auto& [id, n] : live_) ids.push_back(id);
    }
    ids = cluster::OrderNodeIds(ids, job, rank);
    SuspectsLast(&ids);
    return ids;
  }

  // Whether this client raised node `id`'s epoch of `local_job` to `epoch` already (under the
  // node's current lease): once per attempt and node is enough, since a node's epoch never
  // goes down, and it saves every copy a round trip.
  bool Raised(const std::string& id, const std::string& local_job, uint64_t epoch) {
    absl::MutexLock lock(&mu_);
    auto it = raised_.find({id, local_job});
    return it != raised_.end() && it->second == epoch;
  }

  // One copy on node `id`: the node's epoch raised to the attempt's (once: Raised), the
  // one-rank local checkpoint begun, the shard uploaded (resumed and idempotent as in remote
  // mode).
  absl::Status UploadTo(const std::string& id, const ShardSpec& spec,
                        const std::vector<TensorRef>& tensors) {
    ASSIGN_OR_RETURN(std::shared_ptr<remote::RemoteClient> node, NodeClient(id));
    const std::string local_job = LocalJob(spec.job, spec.rank);
    if (spec.epoch != 0 && !Raised(id, local_job, spec.epoch)) {
      RETURN_IF_ERROR(node->RaiseEpoch(local_job, spec.epoch));
      absl::MutexLock lock(&mu_);
      if (raised_.size() >= kRaisedMax) raised_.clear();
      raised_[{id, local_job}] = spec.epoch;
    }
    CheckpointSpec local;
    local.job = local_job;
    local.step = spec.step;
    local.world_size = 1;
    local.epoch = spec.epoch;
    if (spec.rank == 0) {
      absl::MutexLock lock(&mu_);
      auto it = begun_.find({spec.job, spec.step});
      if (it != begun_.end()) local.metadata = it->second.metadata;
    }
    RETURN_IF_ERROR(node->BeginCheckpoint(local));
    ShardSpec s = spec;
    s.job = local_job;
    s.rank = 0;
    absl::Status saved = node->SaveShardOnThisThread(s, tensors);  // cancellable (SaveShardNow)
    if (!absl::IsAlreadyExists(saved)) return saved;
    // The node holds other content for this step: a copy of an older (fenced) attempt or of an
    // aborted one. While etcd's record is PENDING no committed checkpoint names it, so it is
    // dropped (with this attempt's epoch: a zombie cannot drop a newer copy) and written anew.
    ASSIGN_OR_RETURN(ClusterCheckpoint c, catalog_.Get(spec.job, spec.step));
    if (c.state != CheckpointState::kPending) return saved;
    RETURN_IF_ERROR(node->Delete(local_job, spec.step, spec.epoch));
    RETURN_IF_ERROR(node->BeginCheckpoint(local));
    return node->SaveShardOnThisThread(s, tensors);
  }

  // A save that got too few copies while nodes refused writes for want of a live lease (every
  // node refuses writes while it cannot reach etcd: an etcd leader's election can outlast a
  // short --lease-ttl-s; the other refusals may come from a node that died meanwhile, whose
  // record etcd cannot expire without a leader either) is tried again after kLeaseWaitMs, up
  // to kLeaseWaits times: the nodes renew their leases as soon as etcd has a leader again.
  static constexpr int kLeaseWaits = 8;
  static constexpr int kLeaseWaitMs = 250;
  absl::Status SaveShardNow(const ShardSpec& spec, const std::vector<TensorRef>& tensors) {
    for (int wait = 0;; ++wait) {
      bool lease_refused = false;
      absl::Status s = SaveShardOnce(spec, tensors, &lease_refused);
      if (s.ok() || !lease_refused || wait >= kLeaseWaits) return s;
      GS_LOG(INFO) << "cluster: job " << spec.job << " step " << spec.step << " rank "
                   << spec.rank << ": the nodes hold no live lease; trying again in "
                   << kLeaseWaitMs << " ms";
      std::this_thread::sleep_for(std::chrono::milliseconds(kLeaseWaitMs));
    }
  }

  // One try of SaveShardNow; *lease_refused: it failed while some node refused writes for want
  // of a live lease.
  absl::Status SaveShardOnce(const ShardSpec& spec, const std::vector<TensorRef>& tensors,
                             bool* lease_refused) {
    const std::vector<std::string> order = Order(spec.job, spec.rank);
    if (order.empty()) return absl::UnavailableError("cluster: no live storage nodes in etcd");
    const size_t want = std::min<size_t>(options_.cluster_replicas, order.size());
    const size_t need = std::min<size_t>(options_.min_replicas, want);
    if (want < static_cast<size_t>(options_.cluster_replicas) && !warned_.exchange(true)) {
      GS_LOG(WARNING) << "cluster: " << order.size() << " live nodes: shards get " << want
                      << " copies, not " << options_.cluster_replicas;
    }
    // `want` uploads at once; each one that fails takes the next node in order. Once `need`
    // copies are durable, the others get as long again as those took (at least
    // kStragglerGraceMs) and are then cancelled (remote::Canceller): a node frozen or cut off
    // holds no save until its RPC deadline, and the rank is staged with the copies it has
    // (repair makes the others, docs/protocol.md "Repair").
    absl::Mutex mu;
    size_t next = want;
    size_t running = want;
    std::vector<std::pair<size_t, std::string>> held;  // (position in order, id)
    std::vector<std::string> errors;
    remote::Canceller stragglers;
    auto worker = [&](size_t pos) {
      const remote::CancelScope scope(&stragglers);
      for (;;) {
        absl::Status s = UploadTo(order[pos], spec, tensors);
        if (s.ok()) {
          Trusted(order[pos]);
        } else if (!absl::IsFailedPrecondition(s) && !absl::IsInvalidArgument(s)) {
          Suspect(order[pos], s);  // not the attempt's own refusal (fenced, bad input)
        }
        absl::MutexLock lock(&mu);
        if (s.ok()) {
          held.emplace_back(pos, order[pos]);
          --running;
          return;
        }
        errors.push_back(absl::StrCat(order[pos], ": ", s.message()));
        // A fenced attempt stops at once: no other node would take it either.
        if (absl::IsFailedPrecondition(s) || absl::IsInvalidArgument(s) ||
            next >= order.size() || stragglers.cancelled()) {
          --running;
          return;
        }
        pos = next++;
      }
    };
    const absl::Time start = absl::Now();
    std::vector<std::future<void>> uploads;
    for (size_t i = 0; i < want; ++i) {
      uploads.push_back(std::async(std::launch::async, worker, i));
    }
    {
      absl::MutexLock lock(&mu);
      auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
        return running == 0 || held.size() >= need;
      };
      mu.Await(absl::Condition(&enough));
      if (running > 0) {
        const absl::Duration grace =
            std::max(absl::Now() - start, absl::Milliseconds(kStragglerGraceMs));
        auto all_done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return running == 0; };
        if (!mu.AwaitWithTimeout(absl::Condition(&all_done), grace)) {
          stragglers.Cancel();
        }
      }
    }
    for (auto& u : uploads) u.get();  // a cancelled upload returns at once
    if (held.size() < need) {
      *lease_refused = std::any_of(errors.begin(), errors.end(), [](const std::string& e) {
        return absl::StrContains(e, cluster::kNoLiveLease);
      });
      return absl::UnavailableError(absl::StrCat(
          "job ", spec.job, " step ", spec.step, " rank ", spec.rank, ": ", held.size(),
          " of the ", need, " copies needed are durable: ", absl::StrJoin(errors, "; ")));
    }
    std::sort(held.begin(), held.end());
    RankReplicas r;
    Digester digest(DigestAlgo::kXxh3_128);
    for (const TensorRef& t : tensors) {
      digest.Update(t.data, t.spec.byte_length);
      r.raw_bytes += t.spec.byte_length;
    }
    r.digest = digest.FinishHex();
    for (const auto& [pos, id] : held) r.nodes.push_back(id);
    RETURN_IF_ERROR(catalog_.StageRank(spec.job, spec.step, spec.rank, spec.epoch, r));
    return TryCommit(spec.job, spec.step, spec.epoch);
  }

  // Commits when every rank is staged (the last stager does: etcd is linearizable); after a
  // FULL, the DELTAs on it that were waiting for it.
  absl::Status TryCommit(const std::string& job, int64_t step, uint64_t epoch) {
    absl::Status s = catalog_.Commit(job, step, epoch);
    if (absl::IsAlreadyExists(s)) return absl::OkStatus();  // another writer of the attempt
    if (absl::IsFailedPrecondition(s)) {
      // Ranks missing (another rank's save commits) or a DELTA before its FULL; a fenced
      // zombie's save fails here.
      if (absl::StrContains(s.message(), "superseded")) return s;
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(s);
    {
      // A DELTA's commit has no DELTAs waiting for it, and listing the job's records (all of
      // them, a long job's thousands) after every commit cost each checkpoint a read that grew
      // with the job. A checkpoint this client did not begin is treated as a FULL.
      absl::MutexLock lock(&mu_);
      auto it = begun_.find({job, step});
      if (it != begun_.end() && it->second.kind == storage::CheckpointKind::kDelta) {
        return absl::OkStatus();
      }
    }
    auto pending = catalog_.List(job, /*include_pending=*/true);
    if (!pending.ok()) return absl::OkStatus();  // committed; DELTAs commit on their next save
    for (const ClusterCheckpoint& c : *pending) {
      if (c.state == CheckpointState::kPending && c.kind == storage::CheckpointKind::kDelta &&
          c.base_step == step) {
        absl::Status d = catalog_.Commit(job, c.step, epoch);
        (void)d;  // ranks missing, or another writer: theirs to commit
      }
    }
    return absl::OkStatus();
  }

  // The least time a save waits for its other copies once `need` are durable.
  static constexpr int64_t kStragglerGraceMs = 100;

  const ClientOptions options_;
  std::unique_ptr<cluster::EtcdClient> etcd_;
  cluster::ClusterCatalog catalog_;
  std::unique_ptr<cluster::EtcdWatch> watch_;
  std::unique_ptr<SaveQueue> saves_;
  std::atomic<bool> warned_{false};

  absl::Mutex mu_;
  std::map<std::string, LiveNode> live_ ABSL_GUARDED_BY(mu_);  // by node id
  std::map<std::string, Suspicion> suspect_ ABSL_GUARDED_BY(mu_);  // by node id (Suspect)
  struct Begun {
    std::string metadata;
    storage::CheckpointKind kind;
  };
  static constexpr size_t kBegunMax = 4096;
  std::map<std::pair<std::string, int64_t>, Begun> begun_ ABSL_GUARDED_BY(mu_);  // BeginCheckpoint
  // The epochs this client raised, by (node id, local job) (Raised); bounded.
  static constexpr size_t kRaisedMax = 4096;
  std::map<std::pair<std::string, std::string>, uint64_t> raised_ ABSL_GUARDED_BY(mu_);
  // Committed records read lately, and when (Remember).
  std::map<std::pair<std::string, int64_t>, std::pair<ClusterCheckpoint, absl::Time>> remembered_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<cluster::EtcdOptions> EtcdOptionsFor(const ClientOptions& options) {
  cluster::EtcdOptions eo;
  ASSIGN_OR_RETURN(eo.endpoints, cluster::ParseEtcdEndpoints(options.etcd, &eo.tls));
  eo.tls_files = options.etcd_tls;
  eo.user = options.etcd_user;
  eo.password = options.etcd_password;
  return eo;
}

// The first deadline of an etcd call on one member (NewClusterClient).
constexpr int kEtcdAttemptMs = 300;

absl::StatusOr<std::unique_ptr<Client>> NewClusterClient(const ClientOptions& options) {
  ASSIGN_OR_RETURN(cluster::EtcdOptions eo, EtcdOptionsFor(options));
  // A follower that forwarded a request to a leader killed meanwhile holds it unanswered until
  // etcd's own request timeout (5 s + 2 election timeouts), while a new leader is elected in one
  // to two election timeouts (1-2 s by default) and then answers new requests at once. So each
  // member gets 300 ms, pass after pass (the first 3 passes; then the deadline doubles per pass,
  // for a slow answer such as a large listing), until 3 x the client's rpc_timeout_ms clamped to
  // 1..2 s: a call made across a leader's death goes through within about 300 ms of the new
  // leader's election (it waited 2 s with one 2 s attempt per member), and one made without a
  // quorum fails UNAVAILABLE after 3..6 s. Sending a catalog transaction again to another member
  // is safe (docs/protocol.md, "Catalog and epochs").
  eo.rpc_timeout_ms = kEtcdAttemptMs;
  eo.call_timeout_ms = 3 * std::clamp(options.rpc_timeout_ms, 1000, 2000);
  ASSIGN_OR_RETURN(std::unique_ptr<cluster::EtcdClient> etcd, cluster::EtcdClient::Create(eo));
  auto c = std::make_unique<ClusterClient>(options, std::move(etcd));
  RETURN_IF_ERROR(c->Start());
  return std::unique_ptr<Client>(std::move(c));
}

}  // namespace client
}  // namespace gradsnap
