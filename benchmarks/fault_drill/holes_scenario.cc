#include "benchmarks/fault_drill/holes_scenario.h"

#include <filesystem>
#include <random>
#include <set>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/remote_placement.h"
#include "common/status.h"
#include "tests/service/service_test_util.h"
#include "tests/testing/process.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace drill {
namespace {

namespace fs = std::filesystem;

const char* const kJob = "holes";

std::vector<std::string> ServerArgs(const std::string& data) {
  return {"--data-dir", data, "--listen", "127.0.0.1:0", "--zstd-level", "0"};
}

// Saves FULLs at `steps` with two ranks of 64 KiB each through `c`, into *written.
absl::Status SaveFulls(client::Client* c, const std::string& job, const std::vector<int64_t>& steps,
                       std::mt19937_64* rng, WrittenShards* written) {
  for (int64_t step : steps) {
    RETURN_IF_ERROR(c->BeginCheckpoint(DrillSpec(job, step, 2)));
    for (int32_t r = 0; r < 2; ++r) {
      DrillShard s = MakeDrillShard(job, step, r, 65536, rng);
      RETURN_IF_ERROR(c->SaveShard(s.spec, s.Refs()));
      (*written)[step].push_back(std::move(s));
    }
  }
  return absl::OkStatus();
}

// Starts a server on `data`, saves FULLs at `steps`, stops it.
absl::Status SaveThroughServer(const DrillOptions& o, const std::string& data,
                               const std::vector<int64_t>& steps, std::mt19937_64* rng,
                               WrittenShards* written) {
  testing::ServerProcess server(o.server_bin);
  RETURN_IF_ERROR(server.Start(ServerArgs(data)));
  ASSIGN_OR_RETURN(auto c, ConnectDrill({server.address()}));
  RETURN_IF_ERROR(SaveFulls(c.get(), kJob, steps, rng, written));
  c.reset();  // close the channel first: the shutdown then does not wait for it
  if (int code = server.Stop(); code != 0) {
    return absl::InternalError(absl::StrCat("gradsnap-server exited ", code, " on SIGTERM"));
  }
  return absl::OkStatus();
}

// --rebuild-catalog on `data`: an error unless it exits 0.
absl::Status RebuildCatalog(const DrillOptions& o, const std::string& data) {
  testing::RunResult r =
      testing::RunProgram(o.server_bin, {"--data-dir", data, "--rebuild-catalog"}, 120);
  if (r.exit_code != 0) {
    return absl::InternalError(absl::StrCat("--rebuild-catalog exited ", r.exit_code, ": ", r.err));
  }
  return absl::OkStatus();
}

// Hole 2: a catalog put back from a backup must make the open refuse, not quarantine.
absl::Status StaleCatalog(const DrillOptions& o, int* quarantined) {
  testing::TempDir tree("drill-stale", o.work_dir, o.keep);
  if (tree.path().empty()) return absl::InternalError("cannot create a temp dir");
  const std::string data = tree.path() + "/data";
  const std::string backup = tree.path() + "/meta.backup";
  std::mt19937_64 rng(o.seed * 31 + 2);
  WrittenShards written;
  RETURN_IF_ERROR(SaveThroughServer(o, data, {10}, &rng, &written));
  fs::copy(data + "/meta", backup, fs::copy_options::recursive);
  RETURN_IF_ERROR(SaveThroughServer(o, data, {20, 30}, &rng, &written));
  fs::remove_all(data + "/meta");
  fs::rename(backup, data + "/meta");
  {
    testing::ServerProcess server(o.server_bin);
    if (server.Start(ServerArgs(data)).ok()) {
      // It opened: whatever of 20 and 30 it does not list, it set aside.
      ASSIGN_OR_RETURN(auto c, ConnectDrill({server.address()}));
      ASSIGN_OR_RETURN(auto listed, c->List(kJob));
      std::set<int64_t> steps;
      for (const auto& info : listed) steps.insert(info.step);
      *quarantined += (steps.count(20) == 0) + (steps.count(30) == 0);
      c.reset();
      server.Stop();
    } else if (!absl::StrContains(server.Log(), "--rebuild-catalog")) {
      return absl::InternalError(
          absl::StrCat("a stale catalog: the server did not start, and did not name "
                       "--rebuild-catalog: ",
                       server.Log()));
    }
  }
  RETURN_IF_ERROR(RebuildCatalog(o, data));
  testing::ServerProcess server(o.server_bin);
  RETURN_IF_ERROR(server.Start(ServerArgs(data)));
  ASSIGN_OR_RETURN(auto c, ConnectDrill({server.address()}));
  *quarantined += ShardsNotRestored(c.get(), written, {10, 20, 30});
  c.reset();
  server.Stop();
  return absl::OkStatus();
}

// Hole 1: gc over two nodes must keep what `restore latest` falls back to.
absl::Status GcOverTwoNodes(const DrillOptions& o, int* lost) {
  testing::TempDir tree("drill-gc2", o.work_dir, o.keep);
  if (tree.path().empty()) return absl::InternalError("cannot create a temp dir");
  const std::string data[2] = {tree.path() + "/a", tree.path() + "/b"};
  testing::ServerProcess node[2] = {testing::ServerProcess(o.server_bin),
                                    testing::ServerProcess(o.server_bin)};
  std::vector<std::string> endpoints;
  for (int i = 0; i < 2; ++i) {
    RETURN_IF_ERROR(node[i].Start(ServerArgs(data[i])));
    endpoints.push_back(node[i].address());
  }
  const std::string job = testing::JobWithRanksApart(endpoints, "gc");
  if (job.empty()) return absl::InternalError("no job name places its two ranks apart");
  std::mt19937_64 rng(o.seed * 31 + 1);
  WrittenShards written;
  ASSIGN_OR_RETURN(auto c, ConnectDrill(endpoints));
  RETURN_IF_ERROR(SaveFulls(c.get(), job, {20, 30}, &rng, &written));
  const size_t holder = testing::PlacementOrder(endpoints, job, 1)[0];
  if (testing::FlipSegmentBytes(data[holder], job, 30, 1) == 0) {
    return absl::InternalError("no segment file of step 30 rank 1 to damage");
  }
  client::GcPolicy keep_one;
  keep_one.keep_last = 1;
  RETURN_IF_ERROR(c->Gc(job, keep_one).status());
  for (const DrillShard& s : written.at(20)) *lost += !RestoresAsWritten(c.get(), s);
  c.reset();
  for (testing::ServerProcess& n : node) n.Stop();
  return absl::OkStatus();
}

// Hole 4: a rebuilt catalog keeps fencing out an older attempt.
absl::Status RebuildFencing(const DrillOptions& o, int* lost) {
  testing::TempDir tree("drill-fence", o.work_dir, o.keep);
  if (tree.path().empty()) return absl::InternalError("cannot create a temp dir");
  const std::string data = tree.path() + "/data";
  std::mt19937_64 rng(o.seed * 31 + 4);
  uint64_t first = 0, second = 0;
  {
    testing::ServerProcess server(o.server_bin);
    RETURN_IF_ERROR(server.Start(ServerArgs(data)));
    ASSIGN_OR_RETURN(auto c, ConnectDrill({server.address()}));
    for (int64_t step : {10, 20}) {  // attempt 1 commits FULL 10, attempt 2 FULL 20
      ASSIGN_OR_RETURN(uint64_t epoch, c->AcquireEpoch(kJob));
      (step == 10 ? first : second) = epoch;
      client::CheckpointSpec spec = DrillSpec(kJob, step, 1);
      spec.epoch = epoch;
      RETURN_IF_ERROR(c->BeginCheckpoint(spec));
      DrillShard s = MakeDrillShard(kJob, step, 0, 4096, &rng);
      s.spec.epoch = epoch;
      RETURN_IF_ERROR(c->SaveShard(s.spec, s.Refs()));
    }
    c.reset();
    server.Stop();
  }
  fs::remove_all(data + "/meta");    // the catalog lost...
  fs::remove_all(data + "/epochs");  // ...and its epoch mirror with it
  RETURN_IF_ERROR(RebuildCatalog(o, data));
  testing::ServerProcess server(o.server_bin);
  RETURN_IF_ERROR(server.Start(ServerArgs(data)));
  ASSIGN_OR_RETURN(auto c, ConnectDrill({server.address()}));
  client::CheckpointSpec zombie = DrillSpec(kJob, 30, 1);
  zombie.epoch = first;
  if (c->BeginCheckpoint(zombie).ok()) {
    ++*lost;
    (void)c->AbortCheckpoint(kJob, 30);
  }
  absl::StatusOr<uint64_t> next = c->AcquireEpoch(kJob);
  *lost += !next.ok() || *next <= second;
  c.reset();
  server.Stop();
  return absl::OkStatus();
}

}  // namespace

absl::Status RunHolesScenario(const DrillOptions& options,
                              std::map<std::string, std::string>* kv) {
  int quarantined = 0, gc_lost = 0, fencing_lost = 0;
  RETURN_IF_ERROR(Annotate(StaleCatalog(options, &quarantined), "stale catalog"));
  RETURN_IF_ERROR(Annotate(GcOverTwoNodes(options, &gc_lost), "gc over two nodes"));
  RETURN_IF_ERROR(Annotate(RebuildFencing(options, &fencing_lost), "fencing after a rebuild"));
  PutCounts({{"stale_catalog_quarantined", quarantined},
             {"gc_lost_fallback", gc_lost},
             {"rebuild_fencing_lost", fencing_lost}},
            kv);
  return absl::OkStatus();
}

}  // namespace drill
}  // namespace gradsnap
