#include "benchmarks/fault_drill/storage_scenario.h"

#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "benchmarks/fault_drill/holes_scenario.h"
#include "client/client.h"
#include "common/status.h"
#include "storage/damage_util.h"
#include "tests/testing/process.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace drill {
namespace {

namespace fs = std::filesystem;
using client::CheckpointInfo;
using client::CheckpointKind;
using client::CheckpointSpec;
using client::CheckpointState;

const char* const kJob = "drill";

using Shard = DrillShard;

Shard MakeShard(int64_t step, int32_t rank, uint64_t big, std::mt19937_64* rng) {
  return MakeDrillShard(kJob, step, rank, big, rng);
}

CheckpointSpec Spec(int64_t step, int32_t world, int64_t base = -1) {
  return DrillSpec(kJob, step, world, base);
}

absl::StatusOr<std::unique_ptr<client::Client>> Connect(const std::string& address) {
  return ConnectDrill({address});
}

// Committed DELTAs listed without their committed base FULL.
int Orphans(const std::vector<CheckpointInfo>& list) {
  std::set<int64_t> fulls;
  for (const auto& c : list) {
    if (c.kind == CheckpointKind::kFull && c.state == CheckpointState::kCommitted) {
      fulls.insert(c.step);
    }
  }
  int n = 0;
  for (const auto& c : list) {
    if (c.kind == CheckpointKind::kDelta && c.state == CheckpointState::kCommitted &&
        fulls.count(c.base_step) == 0) {
      ++n;
    }
  }
  return n;
}

std::set<int64_t> Committed(const std::vector<CheckpointInfo>& list) {
  std::set<int64_t> out;
  for (const auto& c : list) {
    if (c.state == CheckpointState::kCommitted) out.insert(c.step);
  }
  return out;
}

// Damages the catalog of `data` in the way of `mode`.
absl::Status Damage(const std::string& data, int mode) {
  const std::string meta = data + "/meta";
  std::error_code ec;
  switch (mode % 4) {
    case 0:
      fs::remove_all(meta, ec);
      break;
    case 1:
      for (const auto& e : fs::directory_iterator(meta)) fs::remove_all(e.path(), ec);
      break;
    case 2:
      fs::remove(meta + "/CURRENT", ec);
      break;
    default: {
      if (storage::CorruptSstFiles(meta) == 0) fs::remove(meta + "/CURRENT", ec);  // no SST yet: still unreadable
    }
  }
  return ec ? absl::InternalError(absl::StrCat("damaging ", meta, ": ", ec.message()))
            : absl::OkStatus();
}

struct Totals {
  int deleted = 0, aborts = 0, orphans = 0, refusals_missed = 0, lost = 0, rebuilt = 0;
  int listed = 0, verified = 0, rebuild_failures = 0;
  int restart_lost = 0, bytes_mismatched = 0, chain_holes = 0, resave_damage_missed = 0;
  int kills = 0;  // rounds that got as far as the SIGKILL and through the rebuild
  int second_refused = -1;
  double rebuild_seconds = 0;  // --rebuild-catalog runs (process start to exit), summed
};

// Committed DELTAs listed whose chain has a hole: above base + 1, the DELTA before it on the same
// FULL is not listed committed (restorable up to the hole only; docs/format.md).
int ChainHoles(const std::vector<CheckpointInfo>& list) {
  std::map<int64_t, int64_t> deltas;  // committed DELTA step -> its base
  for (const auto& c : list) {
    if (c.kind == CheckpointKind::kDelta && c.state == CheckpointState::kCommitted) {
      deltas[c.step] = c.base_step;
    }
  }
  int n = 0;
  for (const auto& [step, base] : deltas) {
    auto before = deltas.find(step - 1);
    n += step > base + 1 && (before == deltas.end() || before->second != base);
  }
  return n;
}

// What the round wrote of each committed checkpoint, by step and rank, to compare restores with.
using Written = WrittenShards;

// Segment files of the data directory `data`, those set aside in quarantine/ included.
int StoredFiles(const std::string& data) {
  return testing::CountFiles(data + "/segments") + testing::CountFiles(data + "/quarantine");
}

// A server exit we did not cause with SIGKILL or SIGTERM is an abort.
void CountExit(int code, bool killed, Totals* t) {
  if (killed ? code != 128 + SIGKILL : code != 0) ++t->aborts;
}

absl::Status Round(const DrillOptions& o, int round, Totals* t) {
  testing::TempDir tree("drill-storage", o.work_dir, o.keep);
  if (tree.path().empty()) return absl::InternalError("cannot create a temp dir");
  const std::string data = tree.path() + "/data";
  const std::vector<std::string> args = {"--data-dir", data, "--listen", "127.0.0.1:0",
                                         "--zstd-level", "0"};
  std::mt19937_64 rng(o.seed * 1000 + static_cast<uint64_t>(round));
  Written written;
  // The baseline, known before the kill: what was committed must survive the kill, the restart
  // and the rebuild (62, damaged on purpose, and 63 after it excepted from the last).
  const std::set<int64_t> before = {10, 11, 20, 60, 61, 62, 63};
  const std::set<int64_t> survive_rebuild = {10, 11, 20, 60, 61};
  {
    testing::ServerProcess server(o.server_bin);
    RETURN_IF_ERROR(server.Start(args));
    ASSIGN_OR_RETURN(auto c, Connect(server.address()));
    RETURN_IF_ERROR(c->BeginCheckpoint(Spec(10, 2)));
    RETURN_IF_ERROR(c->BeginCheckpoint(Spec(11, 2, 10)));
    RETURN_IF_ERROR(c->BeginCheckpoint(Spec(20, 2)));
    for (int64_t step : {11, 10, 20}) {  // the DELTA first: it must wait for its base
      for (int32_t r = 0; r < 2; ++r) {
        Shard s = MakeShard(step, r, o.shard_bytes, &rng);
        RETURN_IF_ERROR(c->SaveShard(s.spec, s.Refs()));
        written[step].push_back(std::move(s));
      }
    }
    // A chain FULL 60 + DELTAs 61, 62, 63 (small): 62 is damaged before the rebuild below, which
    // must then bring back neither 62 nor 63 (a chain with a hole).
    RETURN_IF_ERROR(c->BeginCheckpoint(Spec(60, 2)));
    for (int64_t step : {60, 61, 62, 63}) {
      if (step > 60) RETURN_IF_ERROR(c->BeginCheckpoint(Spec(step, 2, 60)));
      for (int32_t r = 0; r < 2; ++r) {
        Shard s = MakeShard(step, r, 4096, &rng);
        RETURN_IF_ERROR(c->SaveShard(s.spec, s.Refs()));
        written[step].push_back(std::move(s));
      }
    }
    // A rank saved, damaged on disk, and saved again inside a PENDING checkpoint: the second
    // save must read the stored copy back and refuse it (DATA_LOSS), not count it saved.
    RETURN_IF_ERROR(c->BeginCheckpoint(Spec(70, 2)));
    Shard twice = MakeShard(70, 0, 65536, &rng);
    RETURN_IF_ERROR(c->SaveShard(twice.spec, twice.Refs()));
    if (testing::FlipSegmentBytes(data, kJob, 70, 0) == 0) {
      return absl::InternalError("no segment file of step 70 rank 0 to damage");
    }
    t->resave_damage_missed += !absl::IsDataLoss(c->SaveShard(twice.spec, twice.Refs()));
    RETURN_IF_ERROR(c->AbortCheckpoint(kJob, 70));
    // Begin FULL 30, Begin + Write DELTA 31 on it, Abort 30.
    RETURN_IF_ERROR(c->BeginCheckpoint(Spec(30, 1)));
    RETURN_IF_ERROR(c->BeginCheckpoint(Spec(31, 1, 30)));
    Shard d = MakeShard(31, 0, 4096, &rng);
    RETURN_IF_ERROR(c->SaveShard(d.spec, d.Refs()));
    RETURN_IF_ERROR(c->AbortCheckpoint(kJob, 30));
    // A checkpoint left half written.
    RETURN_IF_ERROR(c->BeginCheckpoint(Spec(40, 2)));
    Shard h = MakeShard(40, 0, o.shard_bytes, &rng);
    RETURN_IF_ERROR(c->SaveShard(h.spec, h.Refs()));
    ASSIGN_OR_RETURN(auto listed, c->List(kJob, true));
    t->orphans += Orphans(listed);
    if (round == 0) {
      testing::RunResult second = testing::RunProgram(
          o.server_bin, {"--data-dir", tree.path() + "/other", "--listen", server.address()}, 20);
      t->second_refused = second.exit_code == 1 && absl::StrContains(second.err, "cannot listen");
    }
    // SIGKILL in the middle of an upload.
    RETURN_IF_ERROR(c->BeginCheckpoint(Spec(50, 1)));
    Shard big = MakeShard(50, 0, o.shard_bytes * 16, &rng);
    auto save = c->SaveShardAsync(big.spec, big.Refs());
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 25));
    server.Signal(SIGKILL);
    CountExit(server.Wait(), /*killed=*/true, t);
    save.wait();
  }
  {
    // A restart: recovery also flushes RocksDB's WAL into an SST.
    testing::ServerProcess server(o.server_bin);
    RETURN_IF_ERROR(server.Start(args));
    ASSIGN_OR_RETURN(auto c, Connect(server.address()));
    ASSIGN_OR_RETURN(auto listed, c->List(kJob, false));
    const std::set<int64_t> after_kill = Committed(listed);
    for (int64_t step : before) t->restart_lost += after_kill.count(step) == 0;
    t->orphans += Orphans(listed);
    c.reset();  // close the channel first: the server's shutdown then does not wait for it
    server.Signal(SIGTERM);
    CountExit(server.Wait(), /*killed=*/false, t);
  }
  // Files before the damage, quarantine included (the restart's recovery may have moved some).
  const int segments = StoredFiles(data);
  if (testing::FlipSegmentBytes(data, kJob, 62, 0) == 0) {
    return absl::InternalError("no segment file of step 62 rank 0 to damage");
  }
  RETURN_IF_ERROR(Damage(data, round));
  testing::RunResult refused = testing::RunProgram(o.server_bin, args, 20);
  if (refused.exit_code != 1 || !absl::StrContains(refused.err, "--rebuild-catalog")) {
    ++t->refusals_missed;
  }
  t->deleted += std::max(0, segments - StoredFiles(data));
  auto rebuild_start = std::chrono::steady_clock::now();
  testing::RunResult rebuilt =
      testing::RunProgram(o.server_bin, {"--data-dir", data, "--rebuild-catalog"}, 120);
  t->rebuild_seconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - rebuild_start).count();
  if (rebuilt.exit_code != 0) {
    // Counted, and the round goes on: a server without the flag (an older build) is measured
    // by the same drill.
    ++t->rebuild_failures;
  }
  size_t at = rebuilt.out.find("catalog rebuilt: ");
  int n = 0;
  if (at != std::string::npos) {
    std::string rest = rebuilt.out.substr(at + 17);
    (void)absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &n);
  }
  t->rebuilt += n;
  {
    testing::ServerProcess server(o.server_bin);
    if (!server.Start(args).ok()) {
      // Still no usable store after the rebuild: everything committed before is lost.
      ++t->rebuild_failures;
      t->lost += static_cast<int>(survive_rebuild.size());
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(auto c, Connect(server.address()));
    ASSIGN_OR_RETURN(auto listed, c->List(kJob, true));
    t->orphans += Orphans(listed);
    t->chain_holes += ChainHoles(listed);
    std::set<int64_t> after = Committed(listed);
    for (int64_t step : survive_rebuild) t->lost += after.count(step) == 0;
    t->bytes_mismatched += ShardsNotRestored(c.get(), written, survive_rebuild);
    for (int64_t step : after) {
      ++t->listed;
      t->verified += c->Verify(kJob, step).ok();
    }
    c.reset();  // close the channel first: the server's shutdown then does not wait for it
    server.Signal(SIGTERM);
    CountExit(server.Wait(), /*killed=*/false, t);
  }
  t->deleted += std::max(0, segments - StoredFiles(data));
  ++t->kills;
  return absl::OkStatus();
}

// A real full file system (a 64 MiB tmpfs, where this process may mount one): the writer gets
// RESOURCE_EXHAUSTED, reads go on, SIGTERM exits 0, and a restart on the full disk starts
// refusing writes (its ready line says so) and serves reads. Returns "ran" or "skipped".
absl::StatusOr<std::string> FullDisk(const DrillOptions& o, Totals* t, int* exhausted,
                                     int* reads) {
  testing::TempDir tree("drill-full", o.work_dir, o.keep);
  const std::string mnt = tree.path() + "/mnt";
  testing::Tmpfs tmpfs(mnt);
  if (!tmpfs.mounted()) return std::string("skipped");
  const std::string data = mnt + "/data";
  const std::vector<std::string> args = {"--data-dir", data, "--listen", "127.0.0.1:0"};
  std::mt19937_64 rng(o.seed);
  {
    testing::ServerProcess server(o.server_bin);
    RETURN_IF_ERROR(server.Start(args));
    ASSIGN_OR_RETURN(auto c, Connect(server.address()));
    RETURN_IF_ERROR(c->BeginCheckpoint(Spec(1, 1)));
    Shard old = MakeShard(1, 0, 1 << 20, &rng);
    RETURN_IF_ERROR(c->SaveShard(old.spec, old.Refs()));
    testing::FillUp(mnt + "/fill");
    absl::Status s = c->BeginCheckpoint(Spec(2, 1));
    Shard fresh = MakeShard(2, 0, 8 << 20, &rng);
    if (s.ok()) s = c->SaveShard(fresh.spec, fresh.Refs());
    *exhausted = absl::IsResourceExhausted(s);
    *reads = c->Verify(kJob, 1).ok();
    c.reset();
    server.Signal(SIGTERM);
    CountExit(server.Wait(), /*killed=*/false, t);
  }
  testing::ServerProcess restart(o.server_bin);
  if (!restart.Start(args).ok() ||
      restart.ready_line().find("writes refused") == std::string::npos) {
    ++t->aborts;  // a full node must come back (docs/protocol.md, "Full disk")
    return std::string("ran");
  }
  ASSIGN_OR_RETURN(auto c, Connect(restart.address()));
  *reads = *reads && c->Verify(kJob, 1).ok();
  c.reset();
  restart.Signal(SIGTERM);
  CountExit(restart.Wait(), /*killed=*/false, t);
  return std::string("ran");
}

}  // namespace

absl::Status RunStorageScenario(const DrillOptions& options,
                                std::map<std::string, std::string>* kv) {
  auto start = std::chrono::steady_clock::now();
  Totals t;
  for (int r = 0; r < options.rounds; ++r) {
    RETURN_IF_ERROR(Annotate(Round(options, r, &t), absl::StrCat("storage round ", r)));
  }
  int exhausted = 0, reads = 0;
  ASSIGN_OR_RETURN(std::string full_disk, FullDisk(options, &t, &exhausted, &reads));
  (*kv)["full_disk_drill"] = full_disk;
  if (full_disk == "ran") {
    (*kv)["full_disk_resource_exhausted"] = absl::StrCat(exhausted);
    (*kv)["full_disk_reads_served"] = absl::StrCat(reads);
  }
  RETURN_IF_ERROR(RunHolesScenario(options, kv));
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  PutCounts({{"segments_deleted_without_catalog", t.deleted}, {"server_aborts", t.aborts},
             {"orphan_deltas_listed", t.orphans}, {"refusals_missed", t.refusals_missed},
             {"rebuild_lost_checkpoints", t.lost}, {"restart_lost_checkpoints", t.restart_lost},
             {"rebuilt_bytes_mismatched", t.bytes_mismatched},
             {"rebuild_chain_holes", t.chain_holes},
             {"resave_damage_missed", t.resave_damage_missed},
             {"storage_rounds_completed", t.kills}, {"rebuilt_checkpoints", t.rebuilt},
             {"rebuild_failures", t.rebuild_failures}, {"second_server_refused", t.second_refused},
             {"storage_rounds", options.rounds}},
            kv);
  (*kv)["rebuild_seconds"] = absl::StrFormat("%.2f", t.rebuild_seconds);
  (*kv)["rebuild_verified_ratio"] =
      absl::StrFormat("%.3f", t.listed == 0 ? 0.0 : static_cast<double>(t.verified) / t.listed);
  (*kv)["storage_seconds"] = absl::StrFormat("%.1f", seconds);
  return absl::OkStatus();
}

bool StorageTargetsMet(const std::map<std::string, std::string>& kv, std::string* why) {
  const std::map<std::string, std::string> targets = {
      {"segments_deleted_without_catalog", "0"}, {"server_aborts", "0"},
      {"orphan_deltas_listed", "0"},             {"refusals_missed", "0"},
      {"rebuild_lost_checkpoints", "0"},         {"rebuild_verified_ratio", "1.000"},
      {"rebuild_failures", "0"},
      {"second_server_refused", "1"},            {"restart_lost_checkpoints", "0"},
      {"rebuilt_bytes_mismatched", "0"},         {"rebuild_chain_holes", "0"},
      {"resave_damage_missed", "0"},             {"full_disk_drill", "ran"},
      {"stale_catalog_quarantined", "0"},        {"gc_lost_fallback", "0"},
      {"rebuild_fencing_lost", "0"}};
  bool ok = true;
  for (const auto& [k, want] : targets) {
    auto it = kv.find(k);
    if (it == kv.end() || it->second != want) {
      absl::StrAppend(why, " ", k, "=", it == kv.end() ? "missing" : it->second, " (target ",
                      want, ")");
      ok = false;
    }
  }
  if (kv.count("storage_rounds_completed") == 0 ||
      kv.at("storage_rounds_completed") != kv.at("storage_rounds")) {
    absl::StrAppend(why, " storage_rounds_completed (target storage_rounds)");
    ok = false;
  }
  for (const char* k : {"full_disk_resource_exhausted", "full_disk_reads_served"}) {
    if (kv.count(k) == 0 || kv.at(k) != "1") {
      absl::StrAppend(why, " ", k, "=", kv.at(k), " (target 1)");
      ok = false;
    }
  }
  if (kv.count("rebuilt_checkpoints") != 0 && kv.at("rebuilt_checkpoints") == "0") {
    absl::StrAppend(why, " rebuilt_checkpoints=0");
    ok = false;
  }
  return ok;
}

}  // namespace drill
}  // namespace gradsnap
