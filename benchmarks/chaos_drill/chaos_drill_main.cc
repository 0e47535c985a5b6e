// chaos_drill: a training job on a cluster of simulated machines while faults come and go
// (docs/deploy.md, "Cluster", and docs/build.md, "Chaos drill").
//
// Machines are network namespaces on this host, each joined by a veth pair to one bridge the
// drill makes (10.N.0.0/24, private; nothing leaves the host) and removes at the end: 3 etcd
// members and --nodes gradsnap-server nodes (R = 3, W = 2), one machine each. gradsnap-train
// (2 ranks, --etcd, --replicas 3, async checkpoints every 5 steps) runs on the host and reaches
// them over the bridge. A bounded, seeded schedule of faults, one at a time: SIGKILL a node
// (restarted later), cut a node's link (restored later), SIGKILL an etcd member (restarted
// later). Between faults the cluster is whole for a while.
//
// The last line is key=value: faults, node_kills, partitions, etcd_kills, restarts,
// ckpt_committed (checkpoints listed at the end), ckpt_failures (the job's), train_exit,
// throughput_ratio (mean step time before the first fault / during the fault windows),
// max_step_stall_s (the largest stall_ms of a step inside a fault window), params_match (1: the
// job ended with the uninterrupted run's parameters), restore_exact (1: a resume from the
// newest checkpoint committed before the end, run afresh, ends bit-identical with identical
// losses), listed_unrestorable (listed checkpoints that do not verify or miss a shard; target
// 0), partial_listed, lost_data. --check exits 1 unless train_exit=0, params_match=1,
// restore_exact=1, listed_unrestorable=0 and ckpt_committed > 0.
//
// Without the rights to make namespaces it prints why on stderr and exits 77 (ctest: skipped).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "benchmarks/common/bench_util.h"
#include "benchmarks/fault_drill/drill_util.h"
#include "benchmarks/fault_drill/training_util.h"
#include "client/client.h"
#include "common/status.h"
#include "tests/testing/etcd_cluster.h"
#include "tests/testing/netns.h"
#include "tests/testing/process.h"
#include "tests/testing/server_process.h"
#include "tests/testing/trainer.h"
#include "tests/testing/util.h"

ABSL_FLAG(bool, quick, false,
          "CI-sized: 500 steps and 4 faults. Default: false (2000 steps, 16 faults)");
ABSL_FLAG(int, nodes, 4, "Storage nodes, 4..64. Default: 4");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the fault schedule. Default: 1");
ABSL_FLAG(std::string, work_dir, "/tmp", "Parent of the drill's directory. Default: /tmp");
ABSL_FLAG(bool, keep, false, "Keep the drill's directory (logs) at the end. Default: false");
ABSL_FLAG(bool, check, false, "Exit 1 unless the targets are met. Default: false");

namespace gradsnap {
namespace {

namespace t = testing;

constexpr int64_t kWarmupSteps = 10;
const char kModel[] = "--model=tiny --batch=8 --seed=5 --nproc=2 --blas_threads=1";

struct Options {
  bool quick = false;
  int nodes = 4;
  uint64_t seed = 1;
  std::string dir;
  std::string bin_dir;
};

std::vector<std::string> Words(const std::string& text) {
  return absl::StrSplit(text, ' ', absl::SkipEmpty());
}

int64_t LastStep(const t::ChildProcess& job) {
  const std::vector<t::StepLine> lines = t::ParseStepLines(job.Output());
  return lines.empty() ? 0 : lines.back().step;
}

// Waits until the job printed step `step` or ended (false).
bool WaitForStep(t::ChildProcess& job, int64_t step) {
  while (LastStep(job) < step) {
    if (job.Poll() >= 0) return false;
    t::SleepMs(20);
  }
  return true;
}

class Drill {
 public:
  explicit Drill(Options o) : o_(std::move(o)), rng_(o_.seed) {}

  absl::Status Run(std::map<std::string, std::string>* kv);

 private:
  absl::Status MakeMachines();
  std::string NodeAddress(int k) const { return absl::StrCat(Ip(20 + k), ":7070"); }
  std::string Ip(int host) const { return absl::StrCat("10.", net_, ".0.", host); }
  // One fault and its repair, the job stepping on meanwhile; false once the job ended.
  absl::StatusOr<bool> OneFault(int64_t hold_steps);

  const Options o_;
  std::mt19937_64 rng_;
  int net_ = 0;
  std::string tag_;
  std::unique_ptr<t::Bridge> bridge_;
  std::vector<std::unique_ptr<t::NetNamespace>> etcd_ns_, node_ns_;
  std::unique_ptr<t::EtcdCluster> etcd_;
  std::vector<std::unique_ptr<t::ServerProcess>> nodes_;
  std::unique_ptr<t::ChildProcess> job_;
  std::vector<std::pair<int64_t, int64_t>> windows_;  // the steps inside each fault
  int node_kills_ = 0, partitions_ = 0, etcd_kills_ = 0, restarts_ = 0;
};

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
  for (int k = 0; k < o_.nodes; ++k) {
    ASSIGN_OR_RETURN(auto ns, machine(absl::StrCat("n", k), 20 + k));
    auto node = std::make_unique<t::ServerProcess>(o_.bin_dir + "/gradsnap-server");
    node->set_wrap(ns->Wrap({}));
    RETURN_IF_ERROR(node->StartOn(absl::StrCat(o_.dir, "/node", k), NodeAddress(k),
                                  {"--etcd", etcd_->Endpoints(), "--advertise", NodeAddress(k),
                                   "--lease-ttl-s", "3"}));
    node_ns_.push_back(std::move(ns));
    nodes_.push_back(std::move(node));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Drill::OneFault(int64_t hold_steps) {
  const int kind = std::uniform_int_distribution<int>(0, 2)(rng_);
  const int64_t from = LastStep(*job_) + 1;
  if (kind == 2) {  // an etcd member
    const int i = std::uniform_int_distribution<int>(0, 2)(rng_);
    etcd_->Kill(i);
    ++etcd_kills_;
    std::fprintf(stderr, "step %lld: etcd member %d killed\n", static_cast<long long>(from), i);
    WaitForStep(*job_, from + hold_steps);
    RETURN_IF_ERROR(etcd_->Restart(i));
    ++restarts_;
  } else {
    const int k = std::uniform_int_distribution<int>(0, o_.nodes - 1)(rng_);
    const std::string link = absl::StrCat("gc", tag_, "n", k);
    if (kind == 0) {
      nodes_[k]->Kill();
      ++node_kills_;
    } else {
      RETURN_IF_ERROR(node_ns_[k]->SetLinkUp(link, false));
      ++partitions_;
    }
    std::fprintf(stderr, "step %lld: node %d %s\n", static_cast<long long>(from), k,
                 kind == 0 ? "SIGKILLed" : "cut off");
    WaitForStep(*job_, from + hold_steps);
    if (kind == 0) {
      RETURN_IF_ERROR(nodes_[k]->Restart());
      ++restarts_;
    } else {
      RETURN_IF_ERROR(node_ns_[k]->SetLinkUp(link, true));
    }
  }
  windows_.push_back({from, LastStep(*job_)});
  return job_->Poll() < 0;
}

absl::Status Drill::Run(std::map<std::string, std::string>* kv) {
  const int64_t steps = o_.quick ? 500 : 2000;
  const int faults = o_.quick ? 4 : 16;
  const std::string model = absl::StrCat(kModel, " --steps=", steps);
  const std::string train = o_.bin_dir + "/gradsnap-train";
  const t::RunResult reference = t::RunCommand(train + " " + model + " 2>&1", 1200);
  if (reference.exit_code != 0) return absl::InternalError("reference run: " + reference.out);

  RETURN_IF_ERROR(MakeMachines());
  const std::string store = absl::StrCat(" --job=chaos --etcd=", etcd_->Endpoints(),
                                         " --replicas=3 --min-replicas=2 --ckpt_mode=async"
                                         " --ckpt_every=5 --max_restarts=0"
                                         " --ckpt_persist_timeout_ms=1000"
                                         " --test_step_delay_ms=20");
  std::vector<std::string> argv = {train};
  for (const std::string& w : Words(model + store)) argv.push_back(w);
  job_ = std::make_unique<t::ChildProcess>();
  RETURN_IF_ERROR(job_->Start(argv, o_.dir + "/job.log"));

  // Faults spread over the run: each holds for 30..80 steps, then 40..80 quiet steps.
  const int64_t first_fault = 60;
  bool running = WaitForStep(*job_, first_fault);
  for (int f = 0; running && f < faults; ++f) {
    ASSIGN_OR_RETURN(running,
                     OneFault(std::uniform_int_distribution<int64_t>(30, 80)(rng_)));
    if (running) {
      running = WaitForStep(
          *job_, LastStep(*job_) + std::uniform_int_distribution<int64_t>(40, 80)(rng_));
    }
  }
  const int train_exit = job_->Wait();
  const std::string out = job_->Output();

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
  const double during_mean = during_steps > 0 ? during_ms / during_steps : 0;

  // What the cluster lists at the end, checked.
  client::ClientOptions co;
  co.etcd = etcd_->Endpoints();
  ASSIGN_OR_RETURN(std::unique_ptr<client::Client> c, client::Client::ConnectRemote(co));
  ASSIGN_OR_RETURN(drill::StoreReport store_report, drill::CheckStore(*c, "chaos", {}));
  ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> listed, c->List("chaos"));
  int64_t resume_from = -1;
  for (const client::CheckpointInfo& i : listed) {
    if (i.step < steps) resume_from = i.step;
  }
  bool restore_exact = false;
  if (resume_from > 0) {
    const t::RunResult resumed = t::RunCommand(
        absl::StrCat(train, " ", model, " --job=chaos --etcd=", etcd_->Endpoints(),
                     " --resume=", resume_from, " 2>&1"),
        1200);
    restore_exact = resumed.exit_code == 0 &&
                    t::ResumedExactly(reference.out, resumed.out, resume_from).ok();
  }

  drill::PutCounts({{"faults", static_cast<int64_t>(windows_.size())},
                    {"node_kills", node_kills_},
                    {"partitions", partitions_},
                    {"etcd_kills", etcd_kills_},
                    {"restarts", restarts_},
                    {"ckpt_committed", store_report.listed},
                    {"train_exit", train_exit},
                    {"restore_exact", restore_exact ? 1 : 0},
                    {"resume_from", resume_from},
                    {"listed_unrestorable", store_report.lost_data + store_report.verify_errors +
                                                store_report.partial_listed},
                    {"partial_listed", store_report.partial_listed},
                    {"lost_data", store_report.lost_data},
                    {"steps", steps}},
                   kv);
  (*kv)["ckpt_failures"] = t::SummaryField(out, "ckpt_failures");
  (*kv)["throughput_ratio"] = absl::StrFormat(
      "%.3f", during_mean > 0 ? before.mean_step_ms / during_mean : 0.0);
  (*kv)["max_step_stall_s"] = absl::StrFormat("%.3f", max_stall_ms / 1000);
  (*kv)["params_match"] = absl::StrCat(
      t::SummaryField(out, "params_sha256") == t::SummaryField(reference.out, "params_sha256") &&
              !t::SummaryField(out, "params_sha256").empty()
          ? 1
          : 0);
  // The job and the nodes end before their namespaces go.
  nodes_.clear();
  etcd_.reset();
  return absl::OkStatus();
}

}  // namespace
}  // namespace gradsnap

int main(int argc, char** argv) {
  gradsnap::bench::InitBenchmark(argc, argv, "chaos_drill",
                                 "[--quick] [--nodes N] [--seed S] [--work_dir DIR] [--keep] "
                                 "[--check]");
  gradsnap::Options o;
  o.quick = absl::GetFlag(FLAGS_quick);
  o.nodes = absl::GetFlag(FLAGS_nodes);
  o.seed = absl::GetFlag(FLAGS_seed);
  if (o.nodes < 4 || o.nodes > 64) gradsnap::bench::BadFlag("--nodes must be 4..64");
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
    const bool met = num("train_exit") == 0 && num("params_match") == 1 &&
                     num("restore_exact") == 1 && num("listed_unrestorable") == 0 &&
                     num("ckpt_committed") > 0;
    if (!met) {
      std::fprintf(stderr, "chaos_drill: targets not met\n");
      return 1;
    }
  }
  return 0;
}
