// chaos_drill: a training job on a cluster of simulated machines while faults come and go
// (docs/deploy.md, "Cluster", and docs/build.md, "Chaos drill").
//
// Machines are network namespaces on this host, each joined by a veth pair to one bridge the
// drill makes (10.N.0.0/24, private; nothing leaves the host) and removes at the end: 3 etcd
// members, --nodes gradsnap-server nodes (R = 3, W = 2, --lease-ttl-s 3, --repair-after
// --repair_after) and 2 trainer nodes, one machine each. The job is gradsnap-train on both
// trainer nodes (--nnodes 2 --nproc 2: 4 ranks, Gloo over the bridge; --etcd, --replicas 3,
// gockpt FULLs every 10 steps and the gradient log's DELTA every step, --max_restarts). A
// bounded, seeded schedule of faults, one at a time (the first five are the five kinds in a
// seeded order, the rest drawn): SIGKILL a storage node (restarted later), cut a storage node's
// link (restored later), SIGKILL an etcd member (restarted later), SIGKILL one random rank
// (its launcher restarts the job), and SIGKILL one whole trainer node: its launcher and every
// rank, as a machine that loses power (the drill then starts the launcher again, as the
// machine's supervisor would, and it joins the running job: trainer/launcher.h; the other
// node's ranks fail in their collectives and restart too; the job resumes from its recovery
// point).
// Between faults the cluster is whole for a while. Last, one storage node is lost for good
// and replaced by an empty one (a new node id at its address), so that repair has work: the
// drill then waits (at most --repair_wait_s) until every committed shard has R live copies.
//
// The last line is key=value (docs/build.md, "Chaos drill", lists every key); --check exits 1
// unless train_exit=0, params_match=1, restore_exact=1, listed_unrestorable=0,
// under_replicated_end=0, ckpt_committed > 0 and ckpt_blocked_s <= 2 x the lease TTL x the
// machines lost during that time (at least 1).
// steps_lost_mean and recovery_ratio_max are reported, not checked (docs/build.md says why).
//
// Without the rights to make namespaces it prints why on stderr and exits 77 (ctest: skipped).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "benchmarks/common/bench_util.h"
#include "benchmarks/fault_drill/drill_util.h"
#include "benchmarks/fault_drill/training_util.h"
#include "client/backends.h"
#include "client/client.h"
#include "cluster/catalog.h"
#include "cluster/etcd_client.h"
#include "cluster/membership.h"
#include "common/clock.h"
#include "common/status.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/netns.h"
#include "tests/testing/process.h"
#include "tests/testing/server_process.h"
#include "tests/testing/trainer.h"
#include "tests/testing/util.h"

ABSL_FLAG(bool, quick, false,
          "CI-sized: 300 steps and 5 faults (one of each kind), shorter holds. Default: false "
          "(2000 steps, 16 faults)");
ABSL_FLAG(int64_t, steps, 0, "Steps of the job; 0: 300 with --quick, else 2000. Default: 0");
ABSL_FLAG(int, faults, -1, "Faults during training (the node replacement not counted); -1: 5 "
          "with --quick, else 16. Default: -1");
ABSL_FLAG(int, step_delay_ms, 20, "The job's --test_step_delay_ms (a pause before every step), "
          "0..60000. Default: 20");
ABSL_FLAG(int, nodes, 4, "Storage nodes, 4..64. Default: 4");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the fault schedule. Default: 1");
ABSL_FLAG(int, fault_steps, 0, "A storage or etcd fault holds N..2N steps, N..2N quiet steps "
          "follow each fault; 0: 15 with --quick, else 40. Default: 0");
ABSL_FLAG(std::string, repair_after, "2s", "The storage nodes' --repair-after. Default: 2s");
ABSL_FLAG(int, repair_wait_s, 300,
          "At the end, how long to wait for every committed shard to have R live copies "
          "again. Default: 300");
ABSL_FLAG(std::string, work_dir, "/tmp", "Parent of the drill's directory. Default: /tmp");
ABSL_FLAG(bool, keep, false, "Keep the drill's directory (logs) at the end. Default: false");
ABSL_FLAG(bool, fault_at_step_line, false,
          "Start each fault as soon as the drill sees the step line it waited for, instead of "
          "after a random pause of 0..--step_delay_ms (a random moment of the step's cycle, as a "
          "real failure has). Default: false");
ABSL_FLAG(bool, check, false, "Exit 1 unless the targets are met. Default: false");

namespace gradsnap {
namespace {

namespace t = testing;

constexpr int64_t kWarmupSteps = 10;
constexpr int kLeaseTtlS = 3;
constexpr int kTrainerNodes = 2;
constexpr int kRanksPerNode = 2;
const char kJob[] = "chaos";
const char kModel[] = "--model=tiny --batch=8 --seed=5 --blas_threads=1";

enum Fault { kNodeKill, kLinkDown, kEtcdKill, kRankKill, kTrainerNodeKill, kKinds };

struct Options {
  bool quick = false;
  int64_t steps = 0;
  int faults = 0;
  int nodes = 4;
  int step_delay_ms = 20;
  bool fault_at_step_line = false;
  int fault_steps = 40;
  uint64_t seed = 1;
  std::string repair_after;
  int repair_wait_s = 300;
  std::string dir;
  std::string bin_dir;
};

std::vector<std::string> Words(const std::string& text) {
  return absl::StrSplit(text, ' ', absl::SkipEmpty());
}

int64_t LastStep(const t::ChildProcess& job) { return t::LastStepLine(job).step; }

// How long the job may print no step line before the drill gives up on it (a rank that never
// exits holds its launcher, and so the job, for good): above the collective timeout (60 s)
// plus the ranks' persist agreement (81 s) and a restart.
constexpr int kStallSeconds = 240;

// Waits until the job printed step `step` or ended (false). A job that printed no step line
// for kStallSeconds sets *stalled and returns false.
bool WaitForStep(t::ChildProcess& job, int64_t step, bool* stalled) {
  t::StepLine seen;
  Stopwatch quiet;
  while (true) {
    const t::StepLine now = t::LastStepLine(job);
    if (now.step >= step) return true;
    if (job.Poll() >= 0) return false;
    if (now.step != seen.step || now.step_ms != seen.step_ms ||
        now.recovery_age_s != seen.recovery_age_s) {
      seen = now;
      quiet.Restart();
    }
    if (quiet.ElapsedSeconds() > kStallSeconds) {
      *stalled = true;
      return false;
    }
    t::SleepMs(50);
  }
}

// The lines of `text` that start with `prefix`, in order.
std::vector<std::string> LinesStarting(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (absl::StartsWith(line, prefix)) out.push_back(line);
  }
  return out;
}

// The number after `key=` in `line`, or -1.
double Field(const std::string& line, const std::string& key) {
  const size_t at = line.find(key + "=");
  double v = -1;
  if (at == std::string::npos) return v;
  const std::string rest = line.substr(at + key.size() + 1);
  return absl::SimpleAtod(rest.substr(0, rest.find(' ')), &v) ? v : -1;
}

// For each launcher restart in rank 0's output: completed steps redone, i.e. the last step the
// failed attempt printed minus the step the next attempt resumed from.
std::vector<int64_t> StepsLost(const std::string& out) {
  static const std::regex resumed_re(R"(^resumed job \S+ from step (\d+))");
  std::vector<int64_t> lost;
  std::istringstream in(out);
  int64_t last = 0;
  bool after_restart = false;
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (absl::StartsWith(line, "restart ")) {
      after_restart = true;
    } else if (after_restart && std::regex_search(line, m, resumed_re)) {
      lost.push_back(std::max<int64_t>(0, last - std::stoll(m[1])));
      after_restart = false;
    } else if (!after_restart) {
      const std::vector<t::StepLine> step = t::ParseStepLines(line);
      if (!step.empty()) last = step[0].step;
    }
  }
  return lost;
}

// The longest time during which the job's recovery point did not move, i.e. no checkpoint
// committed: within one attempt, over each run of step lines with the same recovery_point,
// the growth of recovery_age_s from its first line to its last (both ages count from the same
// step's end, so their difference is the wall time between the two lines). `first`, `last`:
// the indexes of those two lines among all the step lines of `out`.
struct Blocked {
  double seconds = 0;
  size_t first = 0, last = 0;
};
Blocked LongestWithoutCommit(const std::string& out) {
  Blocked longest;
  std::istringstream in(out);
  t::StepLine first;
  size_t first_index = 0, index = 0;
  bool open = false;
  for (std::string line; std::getline(in, line);) {
    if (absl::StartsWith(line, "restart ")) open = false;
    const std::vector<t::StepLine> step = t::ParseStepLines(line);
    if (step.empty()) continue;
    ++index;
    if (step[0].recovery_point < 0) continue;
    if (!open || step[0].recovery_point != first.recovery_point) {
      first = step[0];
      first_index = index;
      open = true;
    }
    if (step[0].recovery_age_s - first.recovery_age_s > longest.seconds) {
      longest = {step[0].recovery_age_s - first.recovery_age_s, first_index, index};
    }
  }
  return longest;
}

size_t StepLineCount(const t::ChildProcess& job) { return t::ParseStepLines(job.Output()).size(); }

// One trainer kill's recovery as the drill timed it.
struct Recovery {
  int64_t kill_ms = 0;
  double seconds = -1;   // the kill until rank 0 printed its "recovery" line (first step)
  size_t line = 0;       // index of that recovery line and of its "resumed job" line
};

class Drill {
 public:
  explicit Drill(Options o) : o_(std::move(o)), rng_(o_.seed) {}

  absl::Status Run(std::map<std::string, std::string>* kv);

 private:
  absl::Status MakeMachines();
  absl::Status StartNode(int k, const std::string& data_dir);
  absl::Status StartJob();
  std::string NodeAddress(int k) const { return absl::StrCat(Ip(20 + k), ":7070"); }
  std::string Ip(int host) const { return absl::StrCat("10.", net_, ".0.", host); }
  int Draw(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  // Rank 0's launcher (trainer node 0): its output has the step lines.
  t::ChildProcess& Job() { return *trainers_[0]; }
  // One fault and its repair, the job stepping on meanwhile; false once the job ended.
  absl::StatusOr<bool> OneFault(Fault kind);
  absl::StatusOr<bool> StorageFault(Fault kind, int64_t hold_steps);
  // SIGKILLs one rank (whole_node: one trainer node's launcher and every rank, then starts the
  // launcher again) and waits until the job printed its recovery line; false once it ended.
  absl::StatusOr<bool> TrainerFault(bool whole_node);
  // Storage node k lost for good (SIGKILL) and replaced by an empty node at its address.
  absl::Status ReplaceNode(int k);
  // Adds the copies node k's repairer made, as its log says, to repairs_ (before its log goes).
  void HarvestRepairs(int k);
  // Waits until no committed shard of the job has fewer live copies than wanted (bounded),
  // then counts the shards that have (or whose named live copy does not verify on its node).
  absl::StatusOr<int64_t> UnderReplicatedAtEnd();
  absl::StatusOr<int64_t> UnderReplicatedRecords(std::map<std::string, std::string>* live,
                                                 std::vector<cluster::ClusterCheckpoint>* recs);
  // Recovery time over (raw read of the resumed checkpoint's rank-0 bytes + rank 0's process
  // start), for each trainer kill; the largest.
  absl::StatusOr<double> RecoveryRatioMax(const std::string& out, client::Client& c,
                                          double* recovery_s_max);

  const Options o_;
  std::mt19937_64 rng_;
  int net_ = 0;
  std::string tag_;
  std::unique_ptr<t::Bridge> bridge_;
  std::vector<std::unique_ptr<t::NetNamespace>> etcd_ns_, node_ns_, trainer_ns_;
  std::unique_ptr<t::EtcdCluster> etcd_;
  std::vector<std::unique_ptr<t::ServerProcess>> nodes_;
  std::vector<std::unique_ptr<t::ChildProcess>> trainers_;
  std::vector<std::vector<std::string>> trainer_argv_;  // each trainer node's launcher command
  std::vector<std::pair<int64_t, int64_t>> windows_;  // the steps inside each storage fault
  // Each machine of the cluster lost (storage node killed, replaced or cut off, etcd member
  // killed): the number of step lines the job had printed when it went and when it was back.
  std::vector<std::pair<size_t, size_t>> losses_;
  std::vector<Recovery> recoveries_;
  int node_kills_ = 0, partitions_ = 0, etcd_kills_ = 0, restarts_ = 0;
  int rank_kills_ = 0, trainer_node_kills_ = 0, replacements_ = 0;
  int64_t repairs_ = 0;
  bool stalled_ = false;  // the job printed no step for kStallSeconds
};

absl::Status Drill::StartNode(int k, const std::string& data_dir) {
  auto node = std::make_unique<t::ServerProcess>(o_.bin_dir + "/gradsnap-server");
  node->set_wrap(node_ns_[k]->Wrap({}));
  RETURN_IF_ERROR(node->StartOn(data_dir, NodeAddress(k),
                                {"--etcd", etcd_->Endpoints(), "--advertise", NodeAddress(k),
                                 "--lease-ttl-s", absl::StrCat(kLeaseTtlS), "--repair-after",
                                 o_.repair_after}));
  nodes_[k] = std::move(node);
  return absl::OkStatus();
}

absl::Status Drill::MakeMachines() {
  net_ = t::PrivateNet();
  tag_ = absl::StrCat(::getpid() % 100000);
  ASSIGN_OR_RETURN(bridge_, t::Bridge::Create("gsbr" + tag_, Ip(1) + "/24"));
  auto machine = [&](const std::string& name, int host)
      -> absl::StatusOr<std::unique_ptr<t::NetNamespace>> {
    ASSIGN_OR_RETURN(auto ns, t::NetNamespace::Create(absl::StrCat("gsc", tag_, name)));
    RETURN_IF_ERROR(ns->AddLink(absl::StrCat("gc", tag_, name), "",
                                absl::StrCat(Ip(host), "/24"), bridge_->name()));
    return ns;
  };
  std::vector<t::EtcdCluster::Place> places;
  for (int i = 0; i < 3; ++i) {
    ASSIGN_OR_RETURN(auto ns, machine(absl::StrCat("e", i), 10 + i));
    places.push_back({.hosts = {Ip(10 + i)}, .wrap = ns->Wrap({})});
    etcd_ns_.push_back(std::move(ns));
  }
  etcd_ = std::make_unique<t::EtcdCluster>(o_.dir + "/etcd");
  std::filesystem::create_directories(o_.dir + "/etcd");
  RETURN_IF_ERROR(etcd_->Start(3, places));
  nodes_.resize(o_.nodes);
  for (int k = 0; k < o_.nodes; ++k) {
    ASSIGN_OR_RETURN(auto ns, machine(absl::StrCat("n", k), 20 + k));
    node_ns_.push_back(std::move(ns));
    RETURN_IF_ERROR(StartNode(k, absl::StrCat(o_.dir, "/node", k)));
  }
  for (int n = 0; n < kTrainerNodes; ++n) {
    ASSIGN_OR_RETURN(auto ns, machine(absl::StrCat("t", n), 90 + n));
    trainer_ns_.push_back(std::move(ns));
  }
  return absl::OkStatus();
}

absl::Status Drill::StartJob() {
  const std::string flags = absl::StrCat(
      kModel, " --steps=", o_.steps, " --job=", kJob, " --etcd=", etcd_->Endpoints(),
      " --replicas=3 --min-replicas=2 --ckpt_mode=gockpt --ckpt_every=10 --gockpt_window=2"
      " --grad_log --max_restarts=100000 --collective_timeout_s=60"
      " --ckpt_persist_timeout_ms=1000 --test_step_delay_ms=", o_.step_delay_ms, " --nproc=",
      kRanksPerNode, " --nnodes=", kTrainerNodes, " --rdzv=", o_.dir, "/rdzv");
  for (int n = 0; n < kTrainerNodes; ++n) {
    std::vector<std::string> argv = {o_.bin_dir + "/gradsnap-train"};
    for (const std::string& w : Words(flags)) argv.push_back(w);
    argv.push_back(absl::StrCat("--node-rank=", n));
    argv.push_back(absl::StrCat("--hostname=", Ip(90 + n)));
    auto job = std::make_unique<t::ChildProcess>();
    trainer_argv_.push_back(trainer_ns_[n]->Wrap(argv));
    RETURN_IF_ERROR(
        job->Start(trainer_argv_.back(), absl::StrCat(o_.dir, "/trainer", n, ".log")));
    trainers_.push_back(std::move(job));
  }
  return absl::OkStatus();
}

void Drill::HarvestRepairs(int k) {
  if (nodes_[k] == nullptr) return;
  for (const std::string& line : LinesStarting(nodes_[k]->Log(), "")) {
    const size_t at = line.find("(new: ");
    if (line.find("repair: ") == std::string::npos || at == std::string::npos) continue;
    const std::string made = line.substr(at + 6, line.find(", from ", at) - at - 6);
    repairs_ += static_cast<int64_t>(
        std::vector<std::string>(absl::StrSplit(made, ',', absl::SkipEmpty())).size());
  }
}

// The pids of a launcher's ranks (its children), read from /proc.
std::vector<pid_t> Children(pid_t launcher) {
  const std::string text =
      t::ReadFileOrEmpty(absl::StrCat("/proc/", launcher, "/task/", launcher, "/children"));
  std::vector<pid_t> out;
  for (const std::string& w : Words(text)) {
    int pid = 0;
    if (absl::SimpleAtoi(w, &pid) && pid > 0) out.push_back(pid);
  }
  return out;
}

absl::StatusOr<bool> Drill::TrainerFault(bool whole_node) {
  const int n = Draw(0, kTrainerNodes - 1);
  std::vector<pid_t> ranks;
  for (int tries = 0; tries < 200 && ranks.size() < kRanksPerNode; ++tries) {
    if (Job().Poll() >= 0) return false;
    ranks = Children(trainers_[n]->pid());
    if (ranks.size() < kRanksPerNode) t::SleepMs(50);
  }
  if (ranks.size() < kRanksPerNode) {
    return absl::InternalError(absl::StrCat("trainer node ", n, " has no ranks running"));
  }
  if (!whole_node) ranks = {ranks[Draw(0, kRanksPerNode - 1)]};
  const size_t seen = LinesStarting(Job().Output(), "recovery failure_to_first_step_ms").size();
  Recovery r;
  r.line = seen;
  r.kill_ms = UnixMillis();
  for (pid_t pid : ranks) ::kill(pid, SIGKILL);
  if (whole_node) {  // the machine: its launcher too, then its supervisor starts that again
    const std::string log = trainers_[n]->log();
    trainers_[n]->Kill();
    RETURN_IF_ERROR(trainers_[n]->Start(trainer_argv_[n], log, /*append=*/true));
  }
  std::fprintf(stderr, "step %lld: %s of trainer node %d SIGKILLed\n",
               static_cast<long long>(LastStep(Job())),
               whole_node ? "the launcher and every rank" : "one rank", n);
  (whole_node ? trainer_node_kills_ : rank_kills_)++;
  // The job's first resumed step (bounded: the collective timeout and a restart).
  for (int i = 0; i < kStallSeconds * 100; ++i) {
    if (LinesStarting(Job().Output(), "recovery failure_to_first_step_ms").size() > seen) {
      r.seconds = static_cast<double>(UnixMillis() - r.kill_ms) / 1000.0;
      break;
    }
    if (Job().Poll() >= 0) break;
    t::SleepMs(10);
  }
  recoveries_.push_back(r);
  return Job().Poll() < 0;
}

absl::StatusOr<bool> Drill::StorageFault(Fault kind, int64_t hold_steps) {
  const int64_t from = LastStep(Job()) + 1;
  const size_t from_line = StepLineCount(Job());
  if (kind == kEtcdKill) {
    const int i = Draw(0, 2);
    etcd_->Kill(i);
    ++etcd_kills_;
    std::fprintf(stderr, "step %lld: etcd member %d killed\n", static_cast<long long>(from), i);
    WaitForStep(Job(), from + hold_steps, &stalled_);
    RETURN_IF_ERROR(etcd_->Restart(i));
    ++restarts_;
  } else {
    const int k = Draw(0, o_.nodes - 1);
    const std::string link = absl::StrCat("gc", tag_, "n", k);
    if (kind == kNodeKill) {
      HarvestRepairs(k);
      nodes_[k]->Kill();
      ++node_kills_;
    } else {
      RETURN_IF_ERROR(node_ns_[k]->SetLinkUp(link, false));
      ++partitions_;
    }
    std::fprintf(stderr, "step %lld: node %d %s\n", static_cast<long long>(from), k,
                 kind == kNodeKill ? "SIGKILLed" : "cut off");
    WaitForStep(Job(), from + hold_steps, &stalled_);
    if (kind == kNodeKill) {
      RETURN_IF_ERROR(nodes_[k]->Restart());
      ++restarts_;
    } else {
      RETURN_IF_ERROR(node_ns_[k]->SetLinkUp(link, true));
    }
  }
  windows_.push_back({from, LastStep(Job())});
  losses_.push_back({from_line, StepLineCount(Job())});
  return Job().Poll() < 0;
}

absl::StatusOr<bool> Drill::OneFault(Fault kind) {
  // The drill sees a step line within 50 ms of its printing (WaitForStep polls) and would start
  // the fault then: always in the first part of the step's cycle, which is when that step's
  // DELTA commits. A machine fails at any moment of it, so the fault waits a random part of the
  // cycle first (--fault_at_step_line: no pause, the old timing).
  if (!o_.fault_at_step_line) t::SleepMs(Draw(0, o_.step_delay_ms));
  if (kind == kRankKill || kind == kTrainerNodeKill) {
    return TrainerFault(kind == kTrainerNodeKill);
  }
  return StorageFault(kind, Draw(o_.fault_steps, 2 * o_.fault_steps));
}

absl::Status Drill::ReplaceNode(int k) {
  const size_t from_line = StepLineCount(Job());
  HarvestRepairs(k);
  nodes_[k]->Kill();
  ++replacements_;
  std::fprintf(stderr, "step %lld: node %d lost for good; an empty node replaces it\n",
               static_cast<long long>(LastStep(Job())), k);
  t::SleepMs((kLeaseTtlS + 1) * 1000);  // its lease gone: the records name a dead node
  RETURN_IF_ERROR(StartNode(k, absl::StrCat(o_.dir, "/node", k, "-replacement")));
  losses_.push_back({from_line, StepLineCount(Job())});
  return absl::OkStatus();
}

absl::StatusOr<int64_t> Drill::UnderReplicatedRecords(
    std::map<std::string, std::string>* live, std::vector<cluster::ClusterCheckpoint>* recs) {
  client::ClientOptions co;
  co.etcd = etcd_->Endpoints();
  ASSIGN_OR_RETURN(cluster::EtcdOptions eo, client::EtcdOptionsFor(co));
  ASSIGN_OR_RETURN(std::unique_ptr<cluster::EtcdClient> etcd, cluster::EtcdClient::Create(eo));
  ASSIGN_OR_RETURN(std::vector<cluster::EtcdKv> kvs, etcd->GetPrefix(cluster::kNodesPrefix));
  live->clear();
  for (const cluster::EtcdKv& kv : kvs) {
    auto rec = cluster::DecodeNodeRecord(kv);
    if (rec.ok()) (*live)[rec->id] = rec->address;
  }
  cluster::ClusterCatalog catalog(etcd.get());
  ASSIGN_OR_RETURN(*recs, catalog.List(kJob));
  int64_t under = 0;
  for (const cluster::ClusterCheckpoint& c : *recs) {
    if (c.state != storage::CheckpointState::kCommitted) continue;
    for (const auto& [rank, r] : c.ranks) {
      size_t alive = 0;
      for (const std::string& id : r.nodes) alive += live->count(id);
      under += alive < cluster::WantedCopies(c, r, live->size()) ? 1 : 0;
    }
  }
  return under;
}

absl::StatusOr<int64_t> Drill::UnderReplicatedAtEnd() {
  std::map<std::string, std::string> live;
  std::vector<cluster::ClusterCheckpoint> recs;
  const Stopwatch waited;
  int64_t under = 0;
  while (true) {
    ASSIGN_OR_RETURN(under, UnderReplicatedRecords(&live, &recs));
    if (under == 0 || waited.ElapsedSeconds() > o_.repair_wait_s) break;
    t::SleepMs(500);
  }
  std::fprintf(stderr, "repair: %lld shard(s) under-replicated in the records after %.1f s\n",
               static_cast<long long>(under), waited.ElapsedSeconds());
  // Each live node's committed copies, as the node itself lists them (their bytes are verified
  // on every node by CheckStore's Verify, which reads every reachable copy).
  std::map<std::pair<std::string, int32_t>, std::set<int64_t>> held;  // (node, rank) -> steps
  int32_t world = 0;
  for (const cluster::ClusterCheckpoint& c : recs) world = std::max(world, c.world_size);
  for (const auto& [id, address] : live) {
    ASSIGN_OR_RETURN(std::unique_ptr<client::Client> node, drill::ConnectDrill({address}));
    for (int32_t rank = 0; rank < world; ++rank) {
      auto steps = node->List(cluster::LocalJob(kJob, rank));
      if (!steps.ok() && !absl::IsNotFound(steps.status())) return steps.status();
      if (!steps.ok()) continue;
      for (const client::CheckpointInfo& i : *steps) held[{id, rank}].insert(i.step);
    }
  }
  for (const cluster::ClusterCheckpoint& c : recs) {
    if (c.state != storage::CheckpointState::kCommitted) continue;
    for (const auto& [rank, r] : c.ranks) {
      size_t alive = 0, present = 0;
      for (const std::string& id : r.nodes) {
        if (live.count(id) == 0) continue;
        ++alive;
        present += held[{id, rank}].count(c.step);
      }
      // Counted once: too few live copies (the record count above) or a named one missing.
      if (alive >= cluster::WantedCopies(c, r, live.size()) && present < alive) {
        std::fprintf(stderr, "step %lld rank %d: a live node the record names lacks its copy\n",
                     static_cast<long long>(c.step), rank);
        ++under;
      }
    }
  }
  return under;
}

absl::StatusOr<double> Drill::RecoveryRatioMax(const std::string& out, client::Client& c,
                                               double* recovery_s_max) {
  static const std::regex resumed_re(R"(from step (\d+) \([^)]*: full (\d+) \+ (\d+) delta)");
  const std::vector<std::string> recovery = LinesStarting(out, "recovery failure_to_first_step_ms");
  const std::vector<std::string> resumed = LinesStarting(out, "resumed job ");
  double worst = -1;
  *recovery_s_max = -1;
  for (const Recovery& r : recoveries_) {
    if (r.seconds < 0 || r.line >= recovery.size() || r.line >= resumed.size()) continue;
    std::smatch m;
    if (!std::regex_search(resumed[r.line], m, resumed_re)) continue;
    const int64_t step = std::stoll(m[1]), full = std::stoll(m[2]);
    // The checkpoints that resume read for rank 0: the FULL and its DELTAs up to `step`.
    const Stopwatch read;
    uint64_t bytes = 0;
    for (int64_t s = full; s <= step; ++s) {
      RETURN_IF_ERROR(c.RestoreShard(kJob, s, 0, [&](const void*, size_t n) {
        bytes += n;
        return absl::OkStatus();
      }));
    }
    const double read_s = read.ElapsedSeconds();
    const double start_s = Field(recovery[r.line], "process_start_ms") / 1000.0;
    const double ratio = r.seconds / (read_s + start_s);
    std::fprintf(stderr,
                 "recovery %zu: %.3f s from the kill to the first step; read %llu bytes in "
                 "%.3f s; process start %.3f s; ratio %.2f (%s)\n",
                 r.line, r.seconds, static_cast<unsigned long long>(bytes), read_s, start_s,
                 ratio, recovery[r.line].c_str());
    worst = std::max(worst, ratio);
    *recovery_s_max = std::max(*recovery_s_max, r.seconds);
  }
  return worst;
}

absl::Status Drill::Run(std::map<std::string, std::string>* kv) {
  const std::string model = absl::StrCat(kModel, " --nproc=", kTrainerNodes * kRanksPerNode,
                                         " --steps=", o_.steps);
  const std::string train = o_.bin_dir + "/gradsnap-train";
  const Stopwatch clock;
  auto phase = [&](const char* done) {
    std::fprintf(stderr, "%.1f s: %s\n", clock.ElapsedSeconds(), done);
  };
  const t::RunResult reference = t::RunCommand(train + " " + model + " 2>&1", 3600);
  if (reference.exit_code != 0) return absl::InternalError("reference run: " + reference.out);

  phase("reference run done");
  RETURN_IF_ERROR(MakeMachines());
  RETURN_IF_ERROR(StartJob());
  phase("cluster up, job started");

  // The first five faults are the five kinds in a seeded order, the others drawn.
  std::vector<Fault> kinds;
  for (int f = 0; f < kKinds; ++f) kinds.push_back(static_cast<Fault>(f));
  std::shuffle(kinds.begin(), kinds.end(), rng_);
  for (int f = kKinds; f < o_.faults; ++f) kinds.push_back(static_cast<Fault>(Draw(0, kKinds - 1)));
  kinds.resize(o_.faults);

  // Halfway through the schedule one storage node is lost for good and replaced (after the
  // job's end when it ended first): repair restores the copies it held while the job goes on.
  const int64_t first_fault = o_.quick ? 30 : 60;
  bool running = WaitForStep(Job(), first_fault, &stalled_);
  for (size_t f = 0; running && f < kinds.size(); ++f) {
    if (f == kinds.size() / 2) RETURN_IF_ERROR(ReplaceNode(Draw(0, o_.nodes - 1)));
    ASSIGN_OR_RETURN(running, OneFault(kinds[f]));
    if (running) {
      const int64_t quiet = Draw(o_.fault_steps, 2 * o_.fault_steps);
      running = WaitForStep(Job(), LastStep(Job()) + quiet, &stalled_);
    }
  }
  if (replacements_ == 0) RETURN_IF_ERROR(ReplaceNode(Draw(0, o_.nodes - 1)));
  if (!stalled_) WaitForStep(Job(), o_.steps, &stalled_);
  // Then the launchers exit once their ranks persisted what is left (bounded too).
  for (const Stopwatch ending; !stalled_;) {
    bool all_ended = true;
    for (auto& job : trainers_) all_ended = all_ended && job->Poll() >= 0;
    if (all_ended) break;
    stalled_ = ending.ElapsedSeconds() > kStallSeconds;
    t::SleepMs(50);
  }
  if (stalled_) {
    std::string ranks;
    for (int n = 0; n < kTrainerNodes; ++n) {
      for (pid_t pid : Children(trainers_[n]->pid())) {
        absl::StrAppend(&ranks, " ", pid, " (trainer node ", n, ")");
      }
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "the job made no progress for ", kStallSeconds, " s; ranks still running:", ranks,
        "; logs in ", o_.dir, " (with --keep)"));
  }
  int train_exit = 0;
  for (auto& job : trainers_) train_exit = std::max(train_exit, job->Wait());
  const std::string out = Job().Output();
  phase("job ended");
  ASSIGN_OR_RETURN(const int64_t under_replicated_end, UnderReplicatedAtEnd());
  phase("replicas checked");
  for (int k = 0; k < o_.nodes; ++k) HarvestRepairs(k);

  const std::vector<t::StepLine> lines = t::ParseStepLines(out);
  const t::StepWindow before = t::StepsBetween(lines, kWarmupSteps, first_fault);
  double during_ms = 0, max_stall_ms = 0;
  int during_steps = 0;
  for (const auto& [a, b] : windows_) {
    const t::StepWindow w = t::StepsBetween(lines, a, b);
    during_ms += w.mean_step_ms * w.steps;
    during_steps += w.steps;
    max_stall_ms = std::max(max_stall_ms, w.max_stall_ms);
  }
  // The longest time without a commit, and the machines lost while it lasted (the target is
  // 2 x the lease TTL per lost node).
  const Blocked blocked = LongestWithoutCommit(out);
  int64_t blocked_losses = 0;
  for (const auto& [from_line, to_line] : losses_) {
    blocked_losses += from_line <= blocked.last && to_line + 1 >= blocked.first ? 1 : 0;
  }
  const double during_mean = during_steps > 0 ? during_ms / during_steps : 0;
  const std::vector<int64_t> lost = StepsLost(out);
  double lost_sum = 0;
  for (int64_t l : lost) lost_sum += static_cast<double>(l);

  // What the cluster lists at the end, checked.
  client::ClientOptions co;
  co.etcd = etcd_->Endpoints();
  ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, client::Client::ConnectRemote(co));
  ASSIGN_OR_RETURN(drill::StoreReport store_report, drill::CheckStore(*c, kJob, {}));
  phase("listed checkpoints verified");
  ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> listed, c->List(kJob));
  double recovery_s_max = -1;
  ASSIGN_OR_RETURN(const double recovery_ratio_max, RecoveryRatioMax(out, *c, &recovery_s_max));
  int64_t resume_from = -1;
  for (const client::CheckpointInfo& i : listed) {
    if (i.step < o_.steps && i.kind == storage::CheckpointKind::kFull) resume_from = i.step;
  }
  phase("recoveries measured");
  bool restore_exact = false;
  if (resume_from > 0) {
    const t::RunResult resumed = t::RunCommand(
        absl::StrCat(train, " ", model, " --job=", kJob, " --etcd=", etcd_->Endpoints(),
                     " --resume=", resume_from, " 2>&1"),
        3600);
    restore_exact = resumed.exit_code == 0 &&
                    t::ResumedExactly(reference.out, resumed.out, resume_from).ok();
  }

  phase("resume checked");
  drill::PutCounts(
      {{"faults", static_cast<int64_t>(windows_.size() + recoveries_.size()) + replacements_},
       {"kills", node_kills_ + etcd_kills_ + rank_kills_ + trainer_node_kills_ + replacements_},
       {"node_kills", node_kills_},
       {"partitions", partitions_},
       {"etcd_kills", etcd_kills_},
       {"rank_kills", rank_kills_},
       {"trainer_node_kills", trainer_node_kills_},
       {"node_replacements", replacements_},
       {"restarts", restarts_},
       {"trainer_restarts", static_cast<int64_t>(LinesStarting(out, "restart ").size())},
       {"repairs", repairs_},
       {"under_replicated_end", under_replicated_end},
       {"ckpt_committed", store_report.listed},
       {"train_exit", train_exit},
       {"restore_exact", restore_exact ? 1 : 0},
       {"resume_from", resume_from},
       {"listed_unrestorable",
        store_report.lost_data + store_report.verify_errors + store_report.partial_listed},
       {"partial_listed", store_report.partial_listed},
       {"lost_data", store_report.lost_data},
       {"steps", o_.steps}},
      kv);
  (*kv)["ckpt_failures"] = t::SummaryField(out, "ckpt_failures");
  (*kv)["throughput_ratio"] = absl::StrFormat(
      "%.3f", during_mean > 0 ? before.mean_step_ms / during_mean : 0.0);
  (*kv)["max_step_stall_s"] = absl::StrFormat("%.3f", max_stall_ms / 1000);
  (*kv)["ckpt_blocked_s"] = absl::StrFormat("%.1f", blocked.seconds);
  (*kv)["ckpt_blocked_losses"] = absl::StrCat(blocked_losses);
  (*kv)["steps_lost_mean"] =
      absl::StrFormat("%.2f", lost.empty() ? 0.0 : lost_sum / static_cast<double>(lost.size()));
  (*kv)["steps_lost_max"] =
      absl::StrCat(lost.empty() ? 0 : *std::max_element(lost.begin(), lost.end()));
  (*kv)["recovery_ratio_max"] = absl::StrFormat("%.2f", recovery_ratio_max);
  (*kv)["recovery_s_max"] = absl::StrFormat("%.2f", recovery_s_max);
  (*kv)["params_match"] = absl::StrCat(
      t::SummaryField(out, "params_sha256") == t::SummaryField(reference.out, "params_sha256") &&
              !t::SummaryField(out, "params_sha256").empty()
          ? 1
          : 0);
  // The job and the nodes end before their namespaces go.
  trainers_.clear();
  nodes_.clear();
  etcd_.reset();
  return absl::OkStatus();
}

}  // namespace
}  // namespace gradsnap

int main(int argc, char** argv) {
  gradsnap::bench::InitBenchmark(argc, argv, "chaos_drill",
                                 "[--quick] [--steps N] [--faults N] [--fault_steps N] "
                                 "[--step_delay_ms MS] [--nodes N] [--seed S] "
                                 "[--repair_after D] [--repair_wait_s S] [--work_dir DIR] "
                                 "[--keep] [--check]");
  gradsnap::Options o;
  o.quick = absl::GetFlag(FLAGS_quick);
  o.steps = absl::GetFlag(FLAGS_steps);
  if (o.steps == 0) o.steps = o.quick ? 300 : 2000;
  o.faults = absl::GetFlag(FLAGS_faults);
  if (o.faults < -1 || o.faults > 10000) gradsnap::bench::BadFlag("--faults must be -1..10000");
  if (o.faults == -1) o.faults = o.quick ? 5 : 16;
  o.nodes = absl::GetFlag(FLAGS_nodes);
  o.step_delay_ms = absl::GetFlag(FLAGS_step_delay_ms);
  o.fault_at_step_line = absl::GetFlag(FLAGS_fault_at_step_line);
  o.fault_steps = absl::GetFlag(FLAGS_fault_steps);
  if (o.fault_steps == 0) o.fault_steps = o.quick ? 15 : 40;
  if (o.fault_steps < 1 || o.fault_steps > 100000) {
    gradsnap::bench::BadFlag("--fault_steps must be 0..100000");
  }
  if (o.step_delay_ms < 0 || o.step_delay_ms > 60000) {
    gradsnap::bench::BadFlag("--step_delay_ms must be 0..60000");
  }
  o.seed = absl::GetFlag(FLAGS_seed);
  o.repair_after = absl::GetFlag(FLAGS_repair_after);
  o.repair_wait_s = absl::GetFlag(FLAGS_repair_wait_s);
  if (o.nodes < 4 || o.nodes > 64) gradsnap::bench::BadFlag("--nodes must be 4..64");
  if (o.steps < 100 || o.steps > 1000000) gradsnap::bench::BadFlag("--steps must be 100..1000000");
  if (o.repair_wait_s < 1 || o.repair_wait_s > 86400) {
    gradsnap::bench::BadFlag("--repair_wait_s must be 1..86400");
  }
  if (std::string why = gradsnap::testing::NetnsUnavailable(); !why.empty()) {
    std::fprintf(stderr, "chaos_drill: skipped: network namespaces unavailable: %s\n",
                 why.c_str());
    return 77;
  }
  o.bin_dir = GRADSNAP_BIN_DIR;
  o.dir = absl::StrCat(absl::GetFlag(FLAGS_work_dir), "/gradsnap-chaos-", ::getpid());
  std::error_code ec;
  std::filesystem::create_directories(o.dir, ec);
  std::map<std::string, std::string> kv;
  absl::Status s;
  {
    gradsnap::Drill drill(o);
    s = drill.Run(&kv);
  }
  if (!absl::GetFlag(FLAGS_keep)) std::filesystem::remove_all(o.dir, ec);
  if (!s.ok()) {
    std::fprintf(stderr, "chaos_drill: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("%s\n", gradsnap::drill::FormatKv(kv).c_str());
  if (absl::GetFlag(FLAGS_check)) {
    auto num = [&](const char* k) { return kv[k].empty() ? -1.0 : std::stod(kv[k]); };
    std::vector<std::string> missed;
    auto want = [&](const char* key, bool met) {
      if (!met) missed.push_back(absl::StrCat(key, "=", kv[key]));
    };
    want("train_exit", num("train_exit") == 0);
    want("params_match", num("params_match") == 1);
    want("restore_exact", num("restore_exact") == 1);
    want("listed_unrestorable", num("listed_unrestorable") == 0);
    want("ckpt_committed", num("ckpt_committed") > 0);
    want("under_replicated_end", num("under_replicated_end") == 0);
    want("ckpt_blocked_s", num("ckpt_blocked_s") <= 2 * gradsnap::kLeaseTtlS *
                                                         std::max(1.0, num("ckpt_blocked_losses")));
    if (!missed.empty()) {
      std::fprintf(stderr, "chaos_drill: targets not met: %s\n",
                   absl::StrJoin(missed, " ").c_str());
      return 1;
    }
  }
  return 0;
}
