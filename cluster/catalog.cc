// ClusterCatalog (catalog.h).
#include "cluster/catalog.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/clock.h"
#include "common/key_value_text.h"
#include "common/names.h"
#include "common/status.h"
#include "openssl/rand.h"

namespace gradsnap {
namespace cluster {

namespace pb = ::etcdserverpb;
using storage::CheckpointKind;
using storage::CheckpointState;

namespace {

constexpr char kRecordVersion[] = "gradsnap-checkpoint 1";
constexpr int kCommitTries = 8;

std::string EpochKey(const std::string& job) { return absl::StrCat("/gradsnap/epochs/", job); }
std::string JobPrefix(const std::string& job) { return absl::StrCat(kCheckpointsPrefix, job, "/"); }
std::string RecordKey(const std::string& job, int64_t step) {
  return absl::StrCat(JobPrefix(job), absl::StrFormat("%020d", step));
}
std::string StagedPrefix(const std::string& job, int64_t step) {
  return absl::StrCat("/gradsnap/staged/", job, "/", absl::StrFormat("%020d", step), "/");
}

std::string RandomId() {
  unsigned char b[8] = {};
  if (RAND_bytes(b, sizeof(b)) != 1) {
    // Falls back to the clock: ids only tell two writers apart.
    const int64_t t = UnixMillis();
    for (size_t i = 0; i < sizeof(b); ++i) b[i] = static_cast<unsigned char>(t >> (8 * i));
  }
  std::string id;
  for (unsigned char c : b) id += absl::StrFormat("%02x", c);
  return id;
}

// "<raw_bytes> <digest> <node>,<node>"
std::string EncodeRank(const RankReplicas& r) {
  return absl::StrCat(r.raw_bytes, " ", r.digest.empty() ? "-" : r.digest, " ",
                      absl::StrJoin(r.nodes, ","));
}

bool DecodeRank(absl::string_view text, RankReplicas* r) {
  std::vector<std::string> f = absl::StrSplit(text, ' ');
  if (f.size() != 3 || !absl::SimpleAtoi(f[0], &r->raw_bytes)) return false;
  r->digest = f[1] == "-" ? "" : f[1];
  r->nodes = absl::StrSplit(f[2], ',', absl::SkipEmpty());
  return !r->nodes.empty();
}

// Compare: the job's epoch key holds `epoch` (nothing for epoch 0, unfenced).
void AddEpochCompare(pb::TxnRequest* txn, const std::string& job, uint64_t epoch) {
  if (epoch == 0) return;
  pb::Compare* c = txn->add_compare();
  c->set_key(EpochKey(job));
  c->set_target(pb::Compare::VALUE);
  c->set_result(pb::Compare::EQUAL);
  c->set_value(absl::StrCat(epoch));
}

void AddModCompare(pb::TxnRequest* txn, const std::string& key, int64_t mod_revision) {
  pb::Compare* c = txn->add_compare();
  c->set_key(key);
  c->set_target(pb::Compare::MOD);
  c->set_result(pb::Compare::EQUAL);
  c->set_mod_revision(mod_revision);
}

void AddPut(pb::TxnRequest* txn, const std::string& key, const std::string& value) {
  pb::PutRequest* p = txn->add_success()->mutable_request_put();
  p->set_key(key);
  p->set_value(value);
}

void AddDeletePrefix(pb::TxnRequest* txn, const std::string& prefix) {
  pb::DeleteRangeRequest* d = txn->add_success()->mutable_request_delete_range();
  d->set_key(prefix);
  d->set_range_end(PrefixEnd(prefix));
}

absl::Status CheckJobStep(const std::string& job, int64_t step) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  if (step < 0) return absl::InvalidArgumentError(absl::StrCat("step ", step, " < 0"));
  return absl::OkStatus();
}

std::string Name(const std::string& job, int64_t step) {
  return absl::StrCat("checkpoint job ", job, " step ", step);
}

// FAILED_PRECONDITION unless the job's epoch `current` is the caller's `epoch`.
absl::Status EpochMismatch(const std::string& job, uint64_t epoch, uint64_t current) {
  if (current != epoch) {
    return absl::FailedPreconditionError(
        current > epoch ? absl::StrCat("job ", job, ": epoch ", epoch, " superseded by attempt ",
                                       current)
                        : absl::StrCat("job ", job, ": epoch ", epoch,
                                       " was never acquired (newest ", current, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string CheckpointRecordKey(const std::string& job, int64_t step) { return RecordKey(job, step); }

std::string EncodeCheckpointRecord(const ClusterCheckpoint& c) {
  std::string out = absl::StrCat(
      kRecordVersion, "\nstate=", c.state == CheckpointState::kCommitted ? "COMMITTED" : "PENDING",
      "\nkind=", c.kind == CheckpointKind::kDelta ? "DELTA" : "FULL", "\nbase=", c.base_step,
      "\nworld_size=", c.world_size, "\nepoch=", c.epoch, "\ncreated_unix_ms=",
      c.created_unix_ms, "\n");
  if (c.replicas > 0) absl::StrAppend(&out, "replicas=", c.replicas, "\n");
  if (c.state == CheckpointState::kCommitted) {
    absl::StrAppend(&out, "committed_unix_ms=", c.committed_unix_ms, "\ncommitted_by=",
                    c.committed_by, "\n");
  }
  for (const auto& [rank, r] : c.ranks) absl::StrAppend(&out, "rank.", rank, "=", EncodeRank(r), "\n");
  return out;
}

absl::StatusOr<ClusterCheckpoint> DecodeCheckpointRecord(const std::string& job, int64_t step,
                                                         const std::string& text) {
  ASSIGN_OR_RETURN(auto f, ParseKeyValueText(text, kRecordVersion));
  ClusterCheckpoint c;
  c.job = job;
  c.step = step;
  const std::string& state = f["state"];
  const std::string& kind = f["kind"];
  bool ok = (state == "PENDING" || state == "COMMITTED") && (kind == "FULL" || kind == "DELTA") &&
            absl::SimpleAtoi(f["base"], &c.base_step) &&
            absl::SimpleAtoi(f["world_size"], &c.world_size) &&
            absl::SimpleAtoi(f["epoch"], &c.epoch) &&
            absl::SimpleAtoi(f["created_unix_ms"], &c.created_unix_ms) && c.world_size >= 1;
  if (ok && f.count("replicas")) ok = absl::SimpleAtoi(f["replicas"], &c.replicas) && c.replicas >= 0;
  c.state = state == "COMMITTED" ? CheckpointState::kCommitted : CheckpointState::kPending;
  c.kind = kind == "DELTA" ? CheckpointKind::kDelta : CheckpointKind::kFull;
  if (ok && c.state == CheckpointState::kCommitted) {
    ok = absl::SimpleAtoi(f["committed_unix_ms"], &c.committed_unix_ms);
    c.committed_by = f["committed_by"];
  }
  for (const auto& [key, value] : f) {
    if (!ok || key.rfind("rank.", 0) != 0) continue;
    int32_t rank = -1;
    RankReplicas r;
    ok = absl::SimpleAtoi(absl::string_view(key).substr(5), &rank) && rank >= 0 &&
         rank < c.world_size && DecodeRank(value, &r);
    c.ranks[rank] = std::move(r);
  }
  if (!ok) return absl::DataLossError(absl::StrCat(Name(job, step), ": malformed record"));
  return c;
}

absl::StatusOr<ClusterCheckpoint> DecodeCheckpointKv(const EtcdKv& kv) {
  const size_t prefix = sizeof(kCheckpointsPrefix) - 1;
  const std::string rest = kv.key.substr(std::min(prefix, kv.key.size()));
  const size_t slash = rest.rfind('/');
  int64_t step = -1;
  if (kv.key.rfind(kCheckpointsPrefix, 0) != 0 || slash == std::string::npos ||
      !absl::SimpleAtoi(rest.substr(slash + 1), &step)) {
    return absl::InvalidArgumentError(absl::StrCat("not a checkpoint record key: ", kv.key));
  }
  ASSIGN_OR_RETURN(ClusterCheckpoint c,
                   DecodeCheckpointRecord(rest.substr(0, slash), step, kv.value));
  c.mod_revision = kv.mod_revision;
  return c;
}

ClusterCatalog::ClusterCatalog(EtcdClient* etcd) : etcd_(etcd), writer_id_(RandomId()) {}

absl::StatusOr<uint64_t> ClusterCatalog::CurrentEpoch(const std::string& job) {
  auto kv = etcd_->Get(EpochKey(job));
  if (absl::IsNotFound(kv.status())) return 0;
  RETURN_IF_ERROR(kv.status());
  uint64_t e = 0;
  if (!absl::SimpleAtoi(kv->value, &e)) {
    return absl::DataLossError(absl::StrCat("job ", job, ": malformed epoch in etcd"));
  }
  return e;
}

absl::StatusOr<uint64_t> ClusterCatalog::AcquireEpoch(const std::string& job) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  for (int attempt = 0; attempt < kCommitTries; ++attempt) {
    auto kv = etcd_->Get(EpochKey(job));
    if (!kv.ok() && !absl::IsNotFound(kv.status())) return kv.status();
    uint64_t current = 0;
    if (kv.ok() && !absl::SimpleAtoi(kv->value, &current)) {
      return absl::DataLossError(absl::StrCat("job ", job, ": malformed epoch in etcd"));
    }
    const uint64_t next = std::max<uint64_t>(current + 1, static_cast<uint64_t>(UnixMillis()));
    pb::TxnRequest txn;
    pb::Compare* c = txn.add_compare();
    c->set_key(EpochKey(job));
    c->set_result(pb::Compare::EQUAL);
    if (kv.ok()) {
      c->set_target(pb::Compare::MOD);
      c->set_mod_revision(kv->mod_revision);
    } else {
      c->set_target(pb::Compare::VERSION);
      c->set_version(0);  // absent
    }
    AddPut(&txn, EpochKey(job), absl::StrCat(next));
    ASSIGN_OR_RETURN(pb::TxnResponse resp, etcd_->Txn(txn));
    if (resp.succeeded()) return next;
  }
  return absl::AbortedError(absl::StrCat("job ", job, ": epoch kept changing"));
}

absl::Status ClusterCatalog::CheckEpoch(const std::string& job, uint64_t epoch) {
  if (epoch == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(uint64_t current, CurrentEpoch(job));
  return EpochMismatch(job, epoch, current);
}

absl::StatusOr<ClusterCheckpoint> ClusterCatalog::Get(const std::string& job, int64_t step) {
  RETURN_IF_ERROR(CheckJobStep(job, step));
  auto kv = etcd_->Get(RecordKey(job, step));
  if (absl::IsNotFound(kv.status())) {
    return absl::NotFoundError(absl::StrCat(Name(job, step), " not found"));
  }
  RETURN_IF_ERROR(kv.status());
  ASSIGN_OR_RETURN(ClusterCheckpoint c, DecodeCheckpointRecord(job, step, kv->value));
  c.mod_revision = kv->mod_revision;
  return c;
}

absl::StatusOr<std::vector<ClusterCheckpoint>> ClusterCatalog::List(const std::string& job,
                                                                    bool include_pending) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  ASSIGN_OR_RETURN(std::vector<EtcdKv> kvs, etcd_->GetPrefix(JobPrefix(job)));
  std::vector<ClusterCheckpoint> out;
  for (const EtcdKv& kv : kvs) {  // keys sort by step: 20 digits
    int64_t step = -1;
    if (!absl::SimpleAtoi(kv.key.substr(JobPrefix(job).size()), &step)) continue;
    ASSIGN_OR_RETURN(ClusterCheckpoint c, DecodeCheckpointRecord(job, step, kv.value));
    c.mod_revision = kv.mod_revision;
    if (c.state == CheckpointState::kCommitted || include_pending) out.push_back(std::move(c));
  }
  return out;
}

absl::Status ClusterCatalog::Begin(const storage::CheckpointSpec& spec, int32_t replicas) {
  RETURN_IF_ERROR(CheckJobStep(spec.job, spec.step));
  if (spec.world_size < 1 || spec.world_size > 65536) {
    return absl::InvalidArgumentError("world_size must be 1..65536");
  }
  ClusterCheckpoint c;
  c.job = spec.job;
  c.step = spec.step;
  c.kind = spec.kind;
  c.base_step = spec.kind == CheckpointKind::kDelta ? spec.base_step : -1;
  c.world_size = spec.world_size;
  c.epoch = spec.epoch;
  c.replicas = std::max(replicas, 0);
  c.created_unix_ms = UnixMillis();
  const std::pair<std::string, int64_t> base_key{spec.job, spec.base_step};
  // One transaction, with what a failure needs to tell why read in its failure branch: every
  // rank of a checkpoint begins it, and all but the first find it begun. A DELTA's FULL is
  // compared at the revision this catalog saw it at (bases_), read first only when unknown.
  for (int tries = 0; tries < 2; ++tries) {
    pb::TxnRequest txn;
    AddEpochCompare(&txn, spec.job, spec.epoch);
    pb::Compare* absent = txn.add_compare();
    absent->set_key(RecordKey(spec.job, spec.step));
    absent->set_target(pb::Compare::VERSION);
    absent->set_result(pb::Compare::EQUAL);
    absent->set_version(0);
    bool remembered = false;
    if (spec.kind == CheckpointKind::kDelta) {
      int64_t base_revision = 0;
      {
        absl::MutexLock lock(&bases_mu_);
        auto it = bases_.find(base_key);
        if (it != bases_.end()) base_revision = it->second, remembered = true;
      }
      if (!remembered) {
        auto base = Get(spec.job, spec.base_step);
        if (!base.ok() && !absl::IsNotFound(base.status())) return base.status();
        if (!base.ok() || base->kind != CheckpointKind::kFull) {
          return absl::FailedPreconditionError(absl::StrCat(
              "DELTA step ", spec.step, " of job ", spec.job,
              " needs a FULL checkpoint at step ", spec.base_step));
        }
        base_revision = base->mod_revision;
        absl::MutexLock lock(&bases_mu_);
        if (bases_.size() >= kBasesMax) bases_.erase(bases_.begin());
        bases_[base_key] = base_revision;
      }
      AddModCompare(&txn, RecordKey(spec.job, spec.base_step), base_revision);
    }
    AddPut(&txn, RecordKey(spec.job, spec.step), EncodeCheckpointRecord(c));
    txn.add_failure()->mutable_request_range()->set_key(EpochKey(spec.job));
    txn.add_failure()->mutable_request_range()->set_key(RecordKey(spec.job, spec.step));
    ASSIGN_OR_RETURN(pb::TxnResponse resp, etcd_->Txn(txn));
    if (resp.succeeded()) return absl::OkStatus();
    // Why not: fenced, begun already (the same spec is fine), or the base changed meanwhile.
    if (resp.responses_size() != 2) return absl::InternalError("etcd: short begin transaction");
    if (spec.epoch != 0) {
      const pb::RangeResponse& e = resp.responses(0).response_range();
      uint64_t current = 0;
      if (e.kvs_size() > 0 && !absl::SimpleAtoi(e.kvs(0).value(), &current)) {
        return absl::DataLossError(absl::StrCat("job ", spec.job, ": malformed epoch in etcd"));
      }
      RETURN_IF_ERROR(EpochMismatch(spec.job, spec.epoch, current));
    }
    const pb::RangeResponse& r = resp.responses(1).response_range();
    if (r.kvs_size() > 0) {
      ASSIGN_OR_RETURN(ClusterCheckpoint existing,
                       DecodeCheckpointRecord(spec.job, spec.step, r.kvs(0).value()));
      if (existing.kind != c.kind || existing.base_step != c.base_step ||
          existing.world_size != c.world_size) {
        return absl::AlreadyExistsError(
            absl::StrCat(Name(spec.job, spec.step), " exists with another spec"));
      }
      return absl::OkStatus();
    }
    {  // the FULL changed since it was read (repaired, deleted): read it again, once
      absl::MutexLock lock(&bases_mu_);
      bases_.erase(base_key);
    }
    if (!remembered) break;
  }
  return absl::AbortedError(absl::StrCat(Name(spec.job, spec.step),
                                         ": its FULL changed while it began; try again"));
}

absl::Status ClusterCatalog::StageRank(const std::string& job, int64_t step, int32_t rank,
                                       uint64_t epoch, const RankReplicas& replicas) {
  ASSIGN_OR_RETURN(ClusterCheckpoint c, Get(job, step));
  if (rank < 0 || rank >= c.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " outside world_size ",
                                                   c.world_size));
  }
  if (replicas.nodes.empty() || replicas.digest.find(' ') != std::string::npos) {
    return absl::InvalidArgumentError("a staged rank needs replica nodes and a digest without spaces");
  }
  if (c.state == CheckpointState::kCommitted) {
    auto it = c.ranks.find(rank);
    if (it != c.ranks.end() && it->second.raw_bytes == replicas.raw_bytes &&
        it->second.digest == replicas.digest) {
      return absl::OkStatus();  // the same shard, committed already
    }
    return absl::AlreadyExistsError(absl::StrCat(Name(job, step), " is committed"));
  }
  pb::TxnRequest txn;
  AddEpochCompare(&txn, job, epoch);
  AddModCompare(&txn, RecordKey(job, step), c.mod_revision);
  AddPut(&txn, absl::StrCat(StagedPrefix(job, step), absl::StrFormat("%06d", rank)),
         EncodeRank(replicas));
  ASSIGN_OR_RETURN(pb::TxnResponse resp, etcd_->Txn(txn));
  if (resp.succeeded()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckEpoch(job, epoch));
  return absl::AbortedError(absl::StrCat(Name(job, step), " changed (aborted or committed)"));
}

absl::StatusOr<ClusterCheckpoint> ClusterCatalog::WithStaged(const std::string& job,
                                                             int64_t step) {
  RETURN_IF_ERROR(CheckJobStep(job, step));
  // One read-only transaction: the record and the staged ranks at the same revision (a commit
  // in between would otherwise show a PENDING record without its staged ranks).
  pb::TxnRequest txn;
  txn.add_success()->mutable_request_range()->set_key(RecordKey(job, step));
  pb::RangeRequest* staged = txn.add_success()->mutable_request_range();
  staged->set_key(StagedPrefix(job, step));
  staged->set_range_end(PrefixEnd(StagedPrefix(job, step)));
  ASSIGN_OR_RETURN(pb::TxnResponse resp, etcd_->Txn(txn));
  if (resp.responses_size() != 2) return absl::InternalError("etcd: short read transaction");
  const pb::RangeResponse& head = resp.responses(0).response_range();
  if (head.kvs_size() == 0) return absl::NotFoundError(absl::StrCat(Name(job, step), " not found"));
  ASSIGN_OR_RETURN(ClusterCheckpoint c, DecodeCheckpointRecord(job, step, head.kvs(0).value()));
  c.mod_revision = head.kvs(0).mod_revision();
  if (c.state == CheckpointState::kCommitted) return c;
  for (const etcdserverpb::KeyValue& kv : resp.responses(1).response_range().kvs()) {
    int32_t rank = -1;
    RankReplicas r;
    if (!absl::SimpleAtoi(kv.key().substr(StagedPrefix(job, step).size()), &rank) ||
        !DecodeRank(kv.value(), &r)) {
      return absl::DataLossError(absl::StrCat("malformed staged rank ", kv.key()));
    }
    c.ranks[rank] = std::move(r);
  }
  return c;
}

absl::Status ClusterCatalog::Commit(const std::string& job, int64_t step, uint64_t epoch) {
  for (int attempt = 0; attempt < kCommitTries; ++attempt) {
    ASSIGN_OR_RETURN(ClusterCheckpoint c, WithStaged(job, step));
    if (c.state == CheckpointState::kCommitted) {
      if (c.committed_by == writer_id_) return absl::OkStatus();  // a retry of our own commit
      return absl::AlreadyExistsError(
          absl::StrCat(Name(job, step), " was committed by another writer"));
    }
    RETURN_IF_ERROR(CheckEpoch(job, epoch));
    std::vector<std::string> missing;
    for (int32_t r = 0; r < c.world_size && missing.size() < 8; ++r) {
      if (!c.ranks.count(r)) missing.push_back(absl::StrCat(r));
    }
    if (!missing.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          Name(job, step), ": ranks not durable yet: ", absl::StrJoin(missing, ","),
          static_cast<int32_t>(c.ranks.size()) + 8 < c.world_size ? ",..." : ""));
    }
    pb::TxnRequest txn;
    AddEpochCompare(&txn, job, epoch);
    AddModCompare(&txn, RecordKey(job, step), c.mod_revision);
    if (c.kind == CheckpointKind::kDelta) {
      auto base = Get(job, c.base_step);
      if (!base.ok() && !absl::IsNotFound(base.status())) return base.status();
      if (!base.ok() || base->state != CheckpointState::kCommitted) {
        return absl::FailedPreconditionError(absl::StrCat(
            "DELTA step ", step, " of job ", job, " commits only with its FULL step ",
            c.base_step, " committed"));
      }
      AddModCompare(&txn, RecordKey(job, c.base_step), base->mod_revision);
    }
    c.state = CheckpointState::kCommitted;
    c.committed_unix_ms = UnixMillis();
    c.committed_by = writer_id_;
    AddPut(&txn, RecordKey(job, step), EncodeCheckpointRecord(c));
    AddDeletePrefix(&txn, StagedPrefix(job, step));
    ASSIGN_OR_RETURN(pb::TxnResponse resp, etcd_->Txn(txn));
    if (resp.succeeded()) return absl::OkStatus();
  }
  return absl::AbortedError(absl::StrCat(Name(job, step), ": the record kept changing"));
}

absl::Status ClusterCatalog::Abort(const std::string& job, int64_t step, uint64_t epoch) {
  ASSIGN_OR_RETURN(ClusterCheckpoint c, Get(job, step));
  if (c.state == CheckpointState::kCommitted) {
    return absl::FailedPreconditionError(absl::StrCat(Name(job, step), " is committed"));
  }
  return RemoveRecord(job, step, epoch, c.mod_revision, "aborted");
}

absl::Status ClusterCatalog::RemoveRecord(const std::string& job, int64_t step, uint64_t epoch,
                                          int64_t mod_revision, const char* what) {
  pb::TxnRequest txn;
  AddEpochCompare(&txn, job, epoch);
  AddModCompare(&txn, RecordKey(job, step), mod_revision);
  txn.add_success()->mutable_request_delete_range()->set_key(RecordKey(job, step));
  AddDeletePrefix(&txn, StagedPrefix(job, step));
  ASSIGN_OR_RETURN(pb::TxnResponse resp, etcd_->Txn(txn));
  if (resp.succeeded()) return absl::OkStatus();
  RETURN_IF_ERROR(CheckEpoch(job, epoch));
  return absl::AbortedError(absl::StrCat(Name(job, step), " changed while it was ", what));
}

absl::Status ClusterCatalog::SetReplicas(const ClusterCheckpoint& c, int32_t rank,
                                         const std::vector<std::string>& nodes,
                                         const pb::Compare* guard) {
  if (c.state != CheckpointState::kCommitted || !c.ranks.count(rank) || nodes.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(Name(c.job, c.step), ": replicas are set only on a committed rank"));
  }
  ClusterCheckpoint updated = c;
  updated.ranks[rank].nodes = nodes;
  pb::TxnRequest txn;
  AddModCompare(&txn, RecordKey(c.job, c.step), c.mod_revision);
  if (guard != nullptr) *txn.add_compare() = *guard;
  AddPut(&txn, RecordKey(c.job, c.step), EncodeCheckpointRecord(updated));
  ASSIGN_OR_RETURN(pb::TxnResponse resp, etcd_->Txn(txn));
  if (resp.succeeded()) return absl::OkStatus();
  return absl::AbortedError(
      absl::StrCat(Name(c.job, c.step), " changed (or the guard failed) while its replicas were set"));
}

absl::Status ClusterCatalog::Delete(const std::string& job, int64_t step, uint64_t epoch) {
  ASSIGN_OR_RETURN(std::vector<ClusterCheckpoint> all, List(job, /*include_pending=*/true));
  const ClusterCheckpoint* target = nullptr;
  for (const ClusterCheckpoint& c : all) {
    if (c.step == step) target = &c;
    if (c.kind == CheckpointKind::kDelta && c.base_step == step) {
      return absl::FailedPreconditionError(absl::StrCat(
          Name(job, step), ": DELTA step ", c.step, " is based on it; delete the DELTAs first"));
    }
  }
  if (target == nullptr) return absl::NotFoundError(absl::StrCat(Name(job, step), " not found"));
  return RemoveRecord(job, step, epoch, target->mod_revision, "deleted");
}

}  // namespace cluster
}  // namespace gradsnap
