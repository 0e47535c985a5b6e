// Commands that stream checkpoint data: verify, restore, export.
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <filesystem>
#include <functional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "client/safetensors.h"
#include "common/json.h"
#include "common/status.h"
#include "recovery/restore_dir.h"

namespace gradsnap {
namespace cli {
namespace {

// Ranks selected by --rank (all ranks of the checkpoint by default).
absl::StatusOr<std::vector<int32_t>> SelectRanks(const Context& ctx, const client::Manifest& m) {
  if (m.info.state != client::CheckpointState::kCommitted) {
    return absl::FailedPreconditionError(absl::StrCat("job ", m.info.job, " step ", m.info.step,
                                                      " is not committed"));
  }
  std::vector<int32_t> ranks;
  if (ctx.args.Has("rank")) {
    ASSIGN_OR_RETURN(int64_t r, ParseInt(ctx.args.Get("rank"), 0, m.info.world_size - 1, "rank"));
    ranks.push_back(static_cast<int32_t>(r));
  } else {
    for (int32_t r = 0; r < m.info.world_size; ++r) ranks.push_back(r);
  }
  return ranks;
}

uint64_t RankBytes(const client::Manifest& m, int32_t rank) {
  for (const client::ShardInfo& s : m.shards) {
    if (s.rank == rank) return s.raw_bytes;
  }
  return 0;
}

// Exports the selected ranks to file_of(rank); prints the files written. `before_rename` runs
// once every file is staged, before the first is renamed into place (a failure there leaves
// every file as it was).
template <typename FileOf>
absl::Status WriteRanks(Context& ctx, client::Client* c, const client::Manifest& m,
                        const std::vector<int32_t>& ranks, const std::string& verb,
                        FileOf file_of,
                        const std::function<absl::Status()>& before_rename = nullptr) {
  uint64_t total = 0;
  for (int32_t r : ranks) total += RankBytes(m, r);
  ProgressBar bar(absl::StrCat(verb, " step ", m.info.step), ctx.progress);
  uint64_t base = 0;
  std::vector<std::string> json, lines;
  // Every rank's file is written complete and synced under a temporary name first; only then
  // are they renamed into place, together: a failure on any rank leaves every earlier file of
  // these names as it was, never a set mixing two checkpoints.
  recovery::StagedFiles staged;
  for (int32_t r : ranks) {
    std::string path = file_of(r);
    auto progress = [&](uint64_t done, uint64_t) { bar.Update(base + done, total); };
    std::string tmp;
    RETURN_IF_ERROR(client::ExportShardSafetensors(
        *c, m, r, path, ctx.progress ? progress : client::ProgressFn(), &tmp));
    staged.Add(tmp, path);
    uint64_t n = RankBytes(m, r);
    base += n;
    json.push_back(absl::StrCat("{\"rank\":", r, ",\"path\":", JsonQuote(path),
                                ",\"bytes\":", n, "}"));
    lines.push_back(absl::StrCat("rank ", r, " -> ", path, " (", HumanBytes(n), ")\n"));
  }
  bar.Finish();
  if (before_rename) RETURN_IF_ERROR(before_rename());
  RETURN_IF_ERROR(staged.Commit());
  if (ctx.json) {
    Print(absl::StrCat("{\"job\":", JsonQuote(m.info.job), ",\"step\":", m.info.step,
                       ",\"files\":[", absl::StrJoin(json, ","), "]}\n"));
  } else {
    Print(absl::StrJoin(lines, ""));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CreateDirectories(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!ec) return absl::OkStatus();
  // std::filesystem reports the system's errno values (generic category).
  return PosixError(absl::StrCat("create directory ", dir), ec.value());
}

absl::Status CheckExportNames(const std::string& file, int32_t world_size, int rank) {
  RETURN_IF_ERROR(client::CheckOutputFile(file));
  for (int32_t r = 0; r < world_size; ++r) {
    if (rank < 0 || r == rank) {
      RETURN_IF_ERROR(client::CheckOutputFile(client::RankFileName(file, r, world_size)));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckRestoreNames(const std::string& dir, int32_t world_size, int rank,
                               bool consolidated) {
  std::vector<std::string> names;
  if (consolidated) {
    names = {"model.safetensors", "optimizer.safetensors", "trainer_state.json"};
  } else {
    for (int32_t r = 0; r < world_size; ++r) {
      if (rank < 0 || r == rank) names.push_back(absl::StrCat("rank", r, ".safetensors"));
    }
  }
  names.push_back("manifest.json");
  for (const std::string& n : names) RETURN_IF_ERROR(client::CheckOutputFile(dir + "/" + n));
  return absl::OkStatus();
}

absl::Status RunVerify(Context& ctx) {
  const std::vector<std::string>& pos = ctx.args.positional;
  const std::string& job = pos[0];
  RETURN_IF_ERROR(CheckJob(job));
  bool all = ctx.args.Has("all");
  if (all && pos.size() > 1) return absl::InvalidArgumentError("give STEP or --all, not both");
  ASSIGN_OR_RETURN(client::Client * c, ctx.Connect());
  std::vector<client::CheckpointInfo> targets;
  if (all) {
    ASSIGN_OR_RETURN(targets, c->List(job, false));
    if (targets.empty()) return absl::NotFoundError(absl::StrCat("job ", job, " has no checkpoints"));
  } else if (pos.size() < 2 || pos[1] == "latest") {
    // The recovery point: its FULL and every DELTA of its chain.
    ASSIGN_OR_RETURN(std::vector<int64_t> steps, RecoveryPointSteps(ctx, job));
    for (int64_t step : steps) {
      ASSIGN_OR_RETURN(client::Manifest m, c->Show(job, step));
      targets.push_back(m.info);
    }
  } else {
    ASSIGN_OR_RETURN(int64_t step, ResolveStep(ctx, job, pos[1], true));
    ASSIGN_OR_RETURN(client::Manifest m, c->Show(job, step));
    targets.push_back(m.info);
  }
  absl::Status first_error;
  int failed = 0;
  std::vector<std::string> json;
  for (const client::CheckpointInfo& i : targets) {
    ProgressBar bar(absl::StrCat("verify step ", i.step), ctx.progress);
    auto progress = [&](uint64_t done, uint64_t total) { bar.Update(done, total); };
    absl::Status st = c->Verify(job, i.step, ctx.progress ? progress : client::ProgressFn());
    bar.Finish();
    std::string err = st.ok() ? "" : absl::StrCat(absl::StatusCodeToString(st.code()), ": ",
                                                  st.message());
    if (!st.ok() && failed++ == 0) first_error = st;
    json.push_back(absl::StrCat("{\"step\":", i.step, ",\"ok\":", st.ok() ? "true" : "false",
                                ",\"raw_bytes\":", i.raw_bytes,
                                st.ok() ? "" : absl::StrCat(",\"error\":", JsonQuote(err)), "}"));
    if (!ctx.json) {
      Print(absl::StrCat("step ", i.step, "  ", st.ok() ? "ok" : "FAILED", "  ",
                         HumanBytes(i.raw_bytes), st.ok() ? "" : "  " + err, "\n"));
    }
  }
  if (ctx.json) {
    Print(absl::StrCat("{\"job\":", JsonQuote(job), ",\"ok\":", failed == 0 ? "true" : "false",
                       ",\"results\":[", absl::StrJoin(json, ","), "]}\n"));
  }
  if (failed == 0) return absl::OkStatus();
  if (targets.size() == 1) return first_error;
  return absl::Status(first_error.code(),
                      absl::StrCat(failed, " of ", targets.size(),
                                   " checkpoints failed verification; first: ",
                                   first_error.message()));
}

absl::Status RestoreRaw(Context& ctx, const std::string& job, int64_t step) {
  const std::string dir = ctx.args.Get("out");
  ASSIGN_OR_RETURN(client::Client * c, ctx.Connect());
  ASSIGN_OR_RETURN(client::Manifest m, c->Show(job, step));
  ASSIGN_OR_RETURN(std::vector<int32_t> ranks, SelectRanks(ctx, m));
  RETURN_IF_ERROR(CheckRestoreNames(dir, m.info.world_size, ranks.size() == 1 ? ranks[0] : -1,
                                    false));
  std::error_code ec;
  const bool existed = std::filesystem::exists(dir, ec);
  RETURN_IF_ERROR(CreateDirectories(dir));
  // Every rank's file is staged first (WriteRanks): a failure leaves an earlier restore in
  // DIR, its files and manifest.json, as it was (and a DIR this restore created is removed
  // again: it is empty then). Once all are staged the earlier manifest goes (it must not
  // vouch for files this restore is replacing), then the files are renamed in.
  absl::Status staged = WriteRanks(
      ctx, c, m, ranks, "restore",
      [&](int32_t r) { return absl::StrCat(dir, "/rank", r, ".safetensors"); },
      [&]() -> absl::Status {
        std::error_code rm;
        std::filesystem::remove(dir + "/manifest.json", rm);
        if (rm) return PosixError(absl::StrCat("remove ", dir, "/manifest.json"), rm.value());
        return absl::OkStatus();
      });
  if (!staged.ok()) {
    if (!existed) std::filesystem::remove(dir, ec);  // only if empty: never anything else
    return staged;
  }
  // Last, so a manifest.json only ever sits beside complete, verified shard files: the ones
  // this restore wrote (with --rank, that rank's only; other files in DIR are not vouched for).
  client::Manifest written = m;
  written.shards.clear();
  for (const client::ShardInfo& s : m.shards) {
    if (std::find(ranks.begin(), ranks.end(), s.rank) != ranks.end()) written.shards.push_back(s);
  }
  const std::string json = ManifestJson(written) + "\n";
  return recovery::WriteFileAtomically(dir + "/manifest.json", {{json.data(), json.size()}});
}

absl::Status ExportRaw(Context& ctx, const std::string& job, int64_t step) {
  const std::string file = ctx.args.Get("out");
  ASSIGN_OR_RETURN(client::Client * c, ctx.Connect());
  ASSIGN_OR_RETURN(client::Manifest m, c->Show(job, step));
  ASSIGN_OR_RETURN(std::vector<int32_t> ranks, SelectRanks(ctx, m));
  RETURN_IF_ERROR(CheckExportNames(file, m.info.world_size, ranks.size() == 1 ? ranks[0] : -1));
  return WriteRanks(ctx, c, m, ranks, "export", [&](int32_t r) {
    return client::RankFileName(file, r, m.info.world_size);
  });
}

}  // namespace cli
}  // namespace gradsnap
