// restore and export of the state a job would resume from: the recovery point (FULL + DELTA
// chain replayed with the trainer's host replay), re-cut to any world size, or consolidated
// into named weights (docs/cli.md, "restore"). The stored shards are streamed as they are
// (commands_data.cc) whenever nothing needs replaying or re-cutting.
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "client/safetensors.h"
#include "common/json.h"
#include "common/status.h"
#include "recovery/recovery_point.h"
#include "recovery/restore_dir.h"
#include "recovery/restore_state.h"
#include "recovery/state_source.h"
#include "recovery/state_text.h"

namespace gradsnap {
namespace cli {
namespace {

// What the user asked for.
struct Request {
  std::string job;
  bool latest = true;
  int64_t step = -1;
  bool no_replay = false;
  int world_size = 0;  // 0: the checkpoint's
  bool consolidate = false;
  DType dtype = DType::kF32;
  uint64_t max_shard_bytes = 5'000'000'000;  // --max-shard-size; Default: 5GB, as transformers
  int rank = -1;  // --rank: only this rank file
};

// --max-shard-size: bytes, with an optional suffix KB MB GB (powers of 1000, as transformers'
// "5GB") or KiB MiB GiB (powers of 1024).
absl::StatusOr<uint64_t> ParseShardSize(const std::string& v) {
  static const std::pair<const char*, uint64_t> kUnits[] = {
      {"KiB", 1ull << 10}, {"MiB", 1ull << 20}, {"GiB", 1ull << 30},
      {"KB", 1000},        {"MB", 1000000},     {"GB", 1000000000}};
  std::string digits = v;
  uint64_t unit = 1;
  for (const auto& [suffix, mult] : kUnits) {
    if (absl::EndsWith(v, suffix)) {
      digits = v.substr(0, v.size() - std::strlen(suffix));
      unit = mult;
      break;
    }
  }
  uint64_t n = 0;
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(digits, &n) || n == 0 || n > UINT64_MAX / unit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad --max-shard-size '", v, "': want a positive byte count such as 2000000000 or 5GB"));
  }
  return n * unit;
}

absl::StatusOr<Request> ParseRequest(Context& ctx, const std::string& target, bool for_export) {
  Request q;
  q.job = ctx.args.positional[0];
  RETURN_IF_ERROR(CheckJob(q.job));
  if (target != "latest") {
    ASSIGN_OR_RETURN(q.step, ParseInt(target, 0, INT64_MAX, "step"));
    q.latest = false;
  }
  q.no_replay = ctx.args.Has("no-replay");
  if (!for_export) {
    if (ctx.args.Has("world-size")) {
      ASSIGN_OR_RETURN(int64_t m,
                       ParseInt(ctx.args.Get("world-size"), 1, INT32_MAX, "--world-size"));
      q.world_size = static_cast<int>(m);
    }
    q.consolidate = ctx.args.Has("consolidate");
    if (ctx.args.Has("dtype")) {
      const std::string d = ctx.args.Get("dtype");
      if (d != "f32" && d != "bf16") {
        return absl::InvalidArgumentError(absl::StrCat("bad --dtype '", d, "': want f32 or bf16"));
      }
      if (!q.consolidate) return absl::InvalidArgumentError("--dtype needs --consolidate");
      q.dtype = d == "bf16" ? DType::kBF16 : DType::kF32;
    }
    if (ctx.args.Has("max-shard-size")) {
      ASSIGN_OR_RETURN(q.max_shard_bytes, ParseShardSize(ctx.args.Get("max-shard-size")));
      if (!q.consolidate) return absl::InvalidArgumentError("--max-shard-size needs --consolidate");
    }
    if (q.no_replay && (q.world_size > 0 || q.consolidate)) {
      return absl::InvalidArgumentError(
          "--no-replay restores the stored record as it is: it cannot be combined with "
          "--world-size or --consolidate");
    }
    if (q.consolidate && ctx.args.Has("rank")) {
      return absl::InvalidArgumentError("--consolidate writes whole files: drop --rank");
    }
    if (q.consolidate && q.world_size > 0) {
      return absl::InvalidArgumentError(
          "--consolidate writes the whole model by parameter name, for no world size: drop "
          "--world-size");
    }
  }
  return q;
}

absl::Status Foreign(const Request& q, int64_t step, const absl::Status& why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "job ", q.job, " step ", step, " cannot be replayed, resharded or consolidated: ",
      why.message(), "; restore the stored record with --no-replay"));
}

// The state at the requested point, whole, in memory. Damage found on the way to `latest` is
// reported on stderr and skipped (recovery_point.h); for a given step it is an error.
absl::StatusOr<recovery::FullState> RestoreWhole(recovery::StateSource& source, const Request& q,
                                                 const recovery::RecoveryPoint& rp,
                                                 uint64_t total) {
  recovery::FullState s;
  s.job = q.job;
  s.master.resize(total);
  s.m.resize(total);
  s.v.resize(total);
  recovery::RestoredRange r;
  if (q.latest) {
    // From the plan's FULL down: newer ones the plan found damaged are not described again.
    std::vector<std::string> damage;
    ASSIGN_OR_RETURN(
        r, recovery::RestoreRecoveryPoint(source, 0, total, s.master.data(), s.m.data(), s.v.data(),
                                          recovery::RestoreOptions(), &damage, rp.full_step));
    for (const std::string& d : damage) {
      std::fprintf(stderr, "gradsnap: warning: damaged record skipped: %s\n", d.c_str());
    }
    if (r.step < rp.step()) {
      std::fprintf(stderr, "gradsnap: warning: recovery point fell back from step %lld to %lld\n",
                   static_cast<long long>(rp.step()), static_cast<long long>(r.step));
    }
  } else {
    ASSIGN_OR_RETURN(r, recovery::RestoreRange(source, rp, 0, total, s.master.data(), s.m.data(),
                                               s.v.data(), recovery::RestoreOptions()));
    if (r.full_damaged || r.step != rp.step()) {
      return absl::DataLossError(
          absl::StrCat("job ", q.job, " step ", rp.step(), " cannot be restored: ", r.damage));
    }
  }
  s.step = r.step;
  s.state = r.state;
  s.source.full_step = r.full_step;
  for (int i = 0; i < r.deltas; ++i) s.source.delta_steps.push_back(r.full_step + 1 + i);
  return s;
}

std::string FilesJson(const std::vector<recovery::WrittenFile>& files) {
  std::vector<std::string> out;
  for (const recovery::WrittenFile& f : files) {
    out.push_back(absl::StrCat("{", f.rank >= 0 ? absl::StrCat("\"rank\":", f.rank, ",") : "",
                               "\"path\":", JsonQuote(f.path), ",\"bytes\":", f.bytes, "}"));
  }
  return absl::StrJoin(out, ",");
}

void PrintResult(Context& ctx, const recovery::FullState& s, int world_size, bool consolidated,
                 const std::vector<recovery::WrittenFile>& files) {
  if (ctx.json) {
    Print(absl::StrCat("{\"job\":", JsonQuote(s.job), ",\"step\":", s.step,
                       ",\"full_step\":", s.source.full_step,
                       ",\"deltas\":", s.source.delta_steps.size(), ",\"world_size\":", world_size,
                       ",\"consolidated\":", consolidated ? "true" : "false", ",\"files\":[",
                       FilesJson(files), "]}\n"));
    return;
  }
  std::string out = absl::StrCat(
      "job ", s.job, " step ", s.step, " (", s.source.Describe(), ")",
      consolidated ? ", consolidated" : absl::StrCat(", ", world_size, " rank(s)"), "\n");
  for (const recovery::WrittenFile& f : files) {
    absl::StrAppend(&out, f.rank >= 0 ? absl::StrCat("rank ", f.rank, " -> ") : "", f.path, " (",
                    HumanBytes(f.bytes), ")\n");
  }
  Print(out);
}

// Plans the restore: which records, the flat size, the world size. Returns false in *replay
// when the stored shards can be streamed as they are.
struct Plan {
  recovery::RecoveryPoint rp;
  uint64_t total = 0;
  int world_size = 0;
  bool replay = true;
};

absl::StatusOr<Plan> MakePlan(recovery::StateSource& source, const Request& q) {
  Plan p;
  ASSIGN_OR_RETURN(std::vector<storage::CheckpointInfo> list, source.List());
  if (q.latest) {
    p.rp = recovery::FindRecoveryPoint(list);
    if (p.rp.full_step < 0) {
      // No FULL: the newest record as it is (a job of another writer).
      if (list.empty())
        return absl::NotFoundError(absl::StrCat("job ", q.job, " has no committed checkpoint"));
      p.rp.full_step = list.back().step;
      p.replay = false;
      return p;
    }
  } else {
    ASSIGN_OR_RETURN(p.rp, recovery::PlanForStep(list, q.step));
  }
  // `latest` goes past a FULL that cannot even be described (a rank of it no node holds: a
  // node came back with an older copy of its data) to the FULL before it, as the trainer's
  // resume does; a named step is restored or refused.
  const int64_t newest = p.rp.step();
  absl::StatusOr<recovery::CheckpointView> described = source.Describe(p.rp.full_step);
  while (q.latest && absl::IsDataLoss(described.status())) {
    const std::string damage(described.status().message());
    std::fprintf(stderr, "gradsnap: warning: damaged record skipped: %s\n", damage.c_str());
    p.rp = recovery::FindRecoveryPoint(list, p.rp.full_step - 1);
    if (p.rp.full_step < 0) return recovery::NoUndamagedFullError(source, damage);
    described = source.Describe(p.rp.full_step);
  }
  if (!described.ok()) return described.status();
  if (p.rp.step() < newest) {
    std::fprintf(stderr, "gradsnap: warning: recovery point fell back from step %lld to %lld\n",
                 static_cast<long long>(newest), static_cast<long long>(p.rp.step()));
  }
  const recovery::CheckpointView& full = *described;
  absl::StatusOr<uint64_t> total = recovery::FlatTotal(full);
  const bool recut = q.world_size > 0 && q.world_size != full.info.world_size;
  if (!total.ok()) {
    if (!p.rp.delta_steps.empty() || recut || q.consolidate) {
      return Foreign(q, p.rp.full_step, total.status());
    }
    p.replay = false;
    return p;
  }
  p.total = *total;
  p.world_size = q.world_size > 0 ? q.world_size : full.info.world_size;
  if (static_cast<uint64_t>(p.world_size) > p.total) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--world-size ", p.world_size, " exceeds the checkpoint's ", p.total, " elements"));
  }
  if (q.rank >= p.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rank ", q.rank, " is not below the world size ", p.world_size));
  }
  if (q.consolidate) {
    absl::StatusOr<std::map<std::string, std::string>> kv =
        recovery::ParseStateText(full.info.metadata);
    if (!kv.ok() || kv->count(std::string(recovery::kParamLayoutKey)) == 0) {
      return Foreign(q, p.rp.full_step,
                     absl::FailedPreconditionError("it carries no model layout"));
    }
  }
  p.replay = !p.rp.delta_steps.empty() || recut || q.consolidate;
  return p;
}

// After a stored FULL streamed as it is (`raw`) failed: whether `latest` goes on past the
// damage, replaying the previous FULL and its chain (a warning says what was skipped).
bool FallBackPastDamage(const Request& q, const Plan& p, const absl::Status& raw) {
  if (!(q.latest && absl::IsDataLoss(raw) && p.total > 0)) return false;
  std::fprintf(stderr, "gradsnap: warning: damaged record skipped: %s\n",
               std::string(raw.message()).c_str());
  return true;
}

absl::StatusOr<Request> RequestWithRank(Context& ctx, const std::string& target, bool export_) {
  ASSIGN_OR_RETURN(Request q, ParseRequest(ctx, target, export_));
  if (ctx.args.Has("rank")) {
    ASSIGN_OR_RETURN(int64_t r, ParseInt(ctx.args.Get("rank"), 0, 65535, "rank"));
    q.rank = static_cast<int>(r);
  }
  return q;
}

}  // namespace

absl::Status RunRestore(Context& ctx) {
  const std::vector<std::string>& pos = ctx.args.positional;
  if (ctx.args.Get("out").empty()) return absl::InvalidArgumentError("restore needs --out DIR");
  ASSIGN_OR_RETURN(Request q, RequestWithRank(ctx, pos.size() > 1 ? pos[1] : "latest", false));
  ASSIGN_OR_RETURN(client::Client * c, ctx.Connect());
  if (q.no_replay) {
    ASSIGN_OR_RETURN(int64_t step, ResolveStep(ctx, q.job, q.latest ? "latest" : pos[1], true));
    return RestoreRaw(ctx, q.job, step);
  }
  std::unique_ptr<recovery::StateSource> source = recovery::NewClientSource(c, q.job);
  ASSIGN_OR_RETURN(Plan p, MakePlan(*source, q));
  const std::string dir = ctx.args.Get("out");
  RETURN_IF_ERROR(CheckRestoreNames(dir, p.world_size, q.rank, q.consolidate));
  if (!p.replay) {
    absl::Status raw = RestoreRaw(ctx, q.job, p.rp.full_step);
    if (!FallBackPastDamage(q, p, raw)) return raw;
  }
  ASSIGN_OR_RETURN(recovery::FullState s, RestoreWhole(*source, q, p.rp, p.total));
  RETURN_IF_ERROR(CreateDirectories(dir));
  // An earlier restore's manifest.json must not vouch for files this one is replacing.
  std::error_code ec;
  std::filesystem::remove(dir + "/manifest.json", ec);
  if (ec) return PosixError(absl::StrCat("remove ", dir, "/manifest.json"), ec.value());
  std::vector<recovery::WrittenFile> files;
  if (q.consolidate) {
    ASSIGN_OR_RETURN(files, recovery::WriteConsolidated(dir, s, q.dtype, q.max_shard_bytes));
  } else {
    ASSIGN_OR_RETURN(
        files, recovery::WriteRankFiles(
                   s, p.world_size, [&](int r) { return recovery::RankFilePath(dir, r); }, q.rank));
  }
  // Last: a directory with a manifest.json is complete.
  RETURN_IF_ERROR(recovery::WriteRestoreManifest(dir, s, p.world_size, q.consolidate, files));
  PrintResult(ctx, s, p.world_size, q.consolidate, files);
  return absl::OkStatus();
}

absl::Status RunExport(Context& ctx) {
  const std::vector<std::string>& pos = ctx.args.positional;
  std::string format = ctx.args.Get("format", "safetensors");
  if (format != "safetensors") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown --format '", format, "' (supported: safetensors)"));
  }
  if (ctx.args.Get("out").empty()) return absl::InvalidArgumentError("export needs --out FILE");
  ASSIGN_OR_RETURN(Request q, RequestWithRank(ctx, pos[1], true));
  ASSIGN_OR_RETURN(client::Client * c, ctx.Connect());
  if (q.no_replay) {
    ASSIGN_OR_RETURN(int64_t step, ResolveStep(ctx, q.job, pos[1], true));
    return ExportRaw(ctx, q.job, step);
  }
  std::unique_ptr<recovery::StateSource> source = recovery::NewClientSource(c, q.job);
  ASSIGN_OR_RETURN(Plan p, MakePlan(*source, q));
  const std::string file = ctx.args.Get("out");
  if (!p.replay) {
    absl::Status raw = ExportRaw(ctx, q.job, p.rp.full_step);
    if (!FallBackPastDamage(q, p, raw)) return raw;
  }
  RETURN_IF_ERROR(CheckExportNames(file, p.world_size, q.rank));
  ASSIGN_OR_RETURN(recovery::FullState s, RestoreWhole(*source, q, p.rp, p.total));
  ASSIGN_OR_RETURN(std::vector<recovery::WrittenFile> files,
                   recovery::WriteRankFiles(
                       s, p.world_size,
                       [&](int r) { return client::RankFileName(file, r, p.world_size); }, q.rank));
  PrintResult(ctx, s, p.world_size, false, files);
  return absl::OkStatus();
}

}  // namespace cli
}  // namespace gradsnap
