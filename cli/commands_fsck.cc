// gradsnap fsck [--rebuild]: the catalog of an engine directory against its segments'
// shard footers (storage/rebuild.h, docs/cli.md).
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "common/json.h"
#include "common/status.h"
#include "storage/engine.h"
#include "storage/rebuild.h"

namespace gradsnap {
namespace cli {
namespace {

std::string JsonList(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    absl::StrAppend(&out, i > 0 ? "," : "", JsonQuote(v[i]));
  }
  return out + "]";
}

// "job J step S" of every committed checkpoint the current catalog lists (read-only open).
absl::StatusOr<std::vector<std::string>> CatalogCheckpoints(const std::string& dir) {
  storage::EngineOptions eo;
  eo.data_dir = dir;
  eo.read_only = true;
  ASSIGN_OR_RETURN(std::unique_ptr<storage::Engine> engine, storage::Engine::Open(eo));
  ASSIGN_OR_RETURN(std::vector<std::string> jobs, engine->ListJobs());
  std::vector<std::string> out;
  for (const std::string& job : jobs) {
    ASSIGN_OR_RETURN(auto list, engine->ListCheckpoints(job, false));
    for (const auto& c : list) out.push_back(absl::StrCat("job ", job, " step ", c.step));
  }
  return out;
}

}  // namespace

absl::Status RunFsck(Context& ctx) {
  if (!ctx.options.endpoints.empty() || !ctx.options.etcd.empty()) {
    return absl::InvalidArgumentError("fsck works on an engine directory (--ckpt-dir), not --server or --etcd");
  }
  const std::string& dir = ctx.options.local_dir;
  bool rebuild = ctx.args.Has("rebuild");
  if (ctx.args.Has("force") && !rebuild) return absl::InvalidArgumentError("--force needs --rebuild");
  // The catalog as it is now (before a rebuild replaces it).
  auto listed = CatalogCheckpoints(dir);
  storage::EngineOptions eo;
  eo.data_dir = dir;
  // A readable catalog is replaced only by one that restores all it lists (or with --force): a
  // dry run first. The catalog may still restore what the footers cannot (a damaged footer).
  const bool check_first = rebuild && listed.ok() && !ctx.args.Has("force");
  ASSIGN_OR_RETURN(storage::RebuildReport report,
                   storage::RebuildCatalog(eo, !rebuild || check_first));
  auto lost_of = [&](const storage::RebuildReport& r) {
    std::set<std::string> restorable;
    for (const std::string& x : r.rebuilt) restorable.insert(x.substr(0, x.find(" (")));
    std::vector<std::string> lost;  // listed by the catalog, not restorable from the segments
    for (const std::string& c : listed.ok() ? *listed : std::vector<std::string>()) {
      if (restorable.count(c) == 0) lost.push_back(c);
    }
    return lost;
  };
  std::vector<std::string> lost = lost_of(report);
  bool refused = false;
  if (check_first && lost.empty()) {
    ASSIGN_OR_RETURN(report, storage::RebuildCatalog(eo, /*dry_run=*/false));
    lost = lost_of(report);
  } else if (check_first) {
    refused = true;
    rebuild = false;
  }
  if (ctx.json) {
    Print(absl::StrCat("{\"directory\":", JsonQuote(dir), ",\"rebuilt\":",
                       rebuild ? "true" : "false", ",\"catalog\":",
                       JsonQuote(listed.ok() ? "ok" : std::string(listed.status().message())),
                       ",\"restorable\":", JsonList(report.rebuilt), ",\"skipped\":",
                       JsonList(report.skipped), ",\"epochs\":", JsonList(report.epochs),
                       ",\"from_quarantine\":", JsonList(report.from_quarantine),
                       ",\"not_restorable\":", JsonList(lost),
                       ",\"old_catalog\":", JsonQuote(report.old_catalog), "}\n"));
  } else {
    std::string out;
    if (!listed.ok()) absl::StrAppend(&out, "catalog: ", listed.status().message(), "\n");
    for (const std::string& r : report.from_quarantine) absl::StrAppend(&out, r, "\n");
    for (const std::string& r : report.rebuilt) {
      absl::StrAppend(&out, rebuild ? "rebuilt    " : "restorable ", r, "\n");
    }
    for (const std::string& r : report.skipped) absl::StrAppend(&out, "skipped    ", r, "\n");
    for (const std::string& r : report.epochs) absl::StrAppend(&out, "epoch      ", r, "\n");
    for (const std::string& r : lost) {
      absl::StrAppend(&out, "LOST       ", r, ": listed by the catalog, not restorable from the "
                      "segments\n");
    }
    if (!report.old_catalog.empty()) {
      absl::StrAppend(&out, "previous catalog kept as ", report.old_catalog, "\n");
    }
    absl::StrAppend(&out, rebuild ? "catalog rebuilt: " : "", report.rebuilt.size(),
                    " checkpoints restorable, ", report.skipped.size(), " skipped\n");
    Print(out);
  }
  if (!listed.ok() && !rebuild) {
    // Every other command refuses such a directory; fsck reported it (and what a rebuild
    // would restore) and says so in its status too.
    return absl::FailedPreconditionError(absl::StrCat(
        "the catalog cannot be read (", listed.status().message(),
        "); fsck --rebuild replaces it with the one reported above"));
  }
  if (refused) {
    return absl::DataLossError(absl::StrCat(
        "catalog not rebuilt: ", lost.size(), " checkpoint(s) it lists are not restorable from "
        "the segments' footers (they may still restore through the catalog: try verify); pass "
        "--rebuild --force to rebuild anyway (the old catalog is kept as meta.old-<ms>)"));
  }
  if (!lost.empty()) {
    return absl::DataLossError(absl::StrCat(lost.size(), " checkpoint(s) listed by the catalog "
                                            "are not restorable from the segments"));
  }
  return absl::OkStatus();
}

}  // namespace cli
}  // namespace gradsnap
