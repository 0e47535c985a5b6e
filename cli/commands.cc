// The command table, the connection, and helpers shared by the commands.
#include "cli/commands.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/digest.h"
#include "common/json.h"
#include "common/names.h"
#include "common/status.h"

namespace gradsnap {
namespace cli {

const std::vector<FlagSpec>& GlobalFlags() {
  static const std::vector<FlagSpec> kFlags = {
      {"server", "H:P[,H:P...]", "gradsnap-server endpoints. Default: none (embedded engine)"},
      {"ckpt-dir", "DIR", "embedded engine directory, used without --server. Default: ./checkpoints"},
      {"token", "T", "bearer token of the job (gradsnap token). Default: none"},
      {"token-file", "F", "read the token from file F. Default: none"},
      {"tls-ca", "F", "PEM CA certificate; enables TLS. Default: plaintext"},
      {"tls-cert", "F", "client certificate for mutual TLS. Default: none"},
      {"tls-key", "F", "client private key for mutual TLS. Default: none"},
      {"etcd", "H:P[,H:P...]", "cluster mode: etcd endpoints (nodes, catalog and epochs from etcd). Default: none"},
      {"etcd-ca", "F", "with https:// --etcd endpoints: PEM CA of etcd's certificates. Default: the system's roots"},
      {"etcd-cert", "F", "with https:// --etcd endpoints: PEM client certificate (with --etcd-key). Default: none"},
      {"etcd-key", "F", "private key of --etcd-cert. Default: none"},
      {"etcd-user", "U", "etcd user (etcd's auth enabled); password from --etcd-password-file or $GRADSNAP_ETCD_PASSWORD. Default: none"},
      {"etcd-password-file", "F", "file whose first line is the password of --etcd-user. Default: none"},
      {"replicas", "N", "copies of each shard across servers. Default: 1; 3 with --etcd"},
      {"min-replicas", "W", "with --etcd: copies that must be durable for a save. Default: 2"},
      {"attempts", "N", "tries of a server call that fails with UNAVAILABLE. Default: 5"},
      {"json", "", "print machine-readable JSON on stdout. Default: off"},
  };
  return kFlags;
}

const std::vector<Command>& Commands() {
  static const std::vector<Command> kCommands = {
      {"ls", "ls [JOB] [--all]",
       "list jobs with their checkpoint counts, or the checkpoints of JOB",
       "", {{"all", "", "also list PENDING (uncommitted) checkpoints. Default: off"}}, 0, 1,
       RunLs},
      {"show", "show JOB STEP", "show a checkpoint: shards and tensors with sizes and digests",
       "STEP may be 'latest'.", {}, 2, 2, RunShow},
      {"verify", "verify JOB [STEP|latest|--all]",
       "re-read and check every chunk checksum and tensor digest",
       "Without STEP (or with latest) verifies the recovery point: its FULL and every DELTA of\n"
       "its chain. Exit status 3 when corruption is found.",
       {{"all", "", "verify every committed checkpoint of JOB. Default: off"}}, 1, 2, RunVerify},
      {"restore",
       "restore JOB [STEP|latest] --out DIR [--world-size M | --consolidate [--dtype f32|bf16] "
       "[--max-shard-size N]] [--rank R] [--no-replay]",
       "write the state a job resumes from: DIR/rank<R>.safetensors (or named weights) and "
       "DIR/manifest.json",
       "STEP defaults to latest, the recovery point (newest FULL + its DELTA chain, replayed; a\n"
       "damaged record is skipped with a warning). A DELTA STEP replays its FULL and chain up to\n"
       "it. The files are written whole or not at all; manifest.json last.",
       {{"out", "DIR", "output directory, created if missing. Required"},
        {"rank", "R", "restore only rank R. Default: every rank"},
        {"world-size", "M", "re-cut the state into M rank files. Default: the checkpoint's"},
        {"consolidate", "",
         "write model.safetensors, optimizer.safetensors, trainer_state.json. Default: off"},
        {"dtype", "T",
         "weights in model.safetensors: f32 or bf16 (with --consolidate). Default: f32"},
        {"max-shard-size", "N",
         "with --consolidate: weights over N bytes (suffixes KB MB GB = 10^3.., KiB MiB GiB = "
         "2^10..) go to model-0000i-of-0000n.safetensors files of at most N bytes and "
         "model.safetensors.index.json. Default: 5GB"},
        {"no-replay", "",
         "the stored record of STEP as it is (a DELTA stays a DELTA). Default: off"}},
       1, 2, RunRestore},
      {"export", "export JOB STEP --format safetensors --out FILE [--rank R] [--no-replay]",
       "export a checkpoint as safetensors, one file per rank",
       "world size 1: FILE itself; otherwise FILE with .rank<R> before the extension. STEP may be\n"
       "latest; a DELTA step is replayed on its FULL unless --no-replay.",
       {{"format", "FMT", "output format; only 'safetensors'. Default: safetensors"},
        {"out", "FILE", "output file. Required"},
        {"rank", "R", "export only rank R. Default: every rank"},
        {"no-replay", "", "the stored record of STEP as it is. Default: off"}},
       2, 2, RunExport},
      {"rm", "rm JOB STEP", "delete a checkpoint", "", {}, 2, 2, RunRm},
      {"gc", "gc JOB --keep-last N [--keep-every K]",
       "delete FULL checkpoints outside the retention policy (with their DELTAs)", "",
       {{"keep-last", "N", "keep the newest N FULL checkpoints. Required"},
        {"keep-every", "K",
         "also keep, for every multiple of K, the newest FULL at or before it (one FULL per K "
         "steps). Default: 0 (off)"}},
       1, 1, RunGc},
      {"token", "token JOB --secret-file F", "mint the bearer token of JOB (no server needed)",
       "", {{"secret-file", "F", "the server's --auth-secret-file. Required"}}, 1, 1, RunToken},
      {"health", "health", "check that every server answers (or the embedded engine opens)", "",
       {}, 0, 0, RunHealth},
      {"fsck", "fsck [--rebuild [--force]]",
       "check an engine directory's catalog against the shard footers in its segments",
       "Embedded engine directories only (--ckpt-dir), with no trainer or server using it.\n"
       "Without --rebuild nothing is changed: it reports which checkpoints a rebuild would\n"
       "restore and which it would skip. With --rebuild the catalog (meta/) is rebuilt from the\n"
       "footers (the old one is kept as meta.old-<ms>); a readable catalog that lists a\n"
       "checkpoint the footers cannot restore is kept (nothing changed) unless --force. Exit\n"
       "status 3 when a checkpoint the catalog lists is not restorable from the segments.",
       {{"rebuild", "", "replace the catalog with one rebuilt from the segments. Default: off"},
        {"force", "",
         "with --rebuild: rebuild even when that loses checkpoints the current catalog lists. "
         "Default: off"}},
       0, 0, RunFsck},
  };
  return kCommands;
}

const Command* FindCommand(const std::string& name) {
  for (const Command& c : Commands()) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

absl::StatusOr<client::Client*> Context::Connect() {
  if (client != nullptr) return client.get();
  if (options.endpoints.empty() && options.etcd.empty()) {
    struct stat st;
    if (::stat(options.local_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::NotFoundError(absl::StrCat("no checkpoint directory ", options.local_dir,
                                              " (set --ckpt-dir DIR or --server H:P)"));
    }
  }
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(options);
  if (!c.ok() && options.endpoints.empty() && options.etcd.empty() &&
      absl::StrContains(c.status().message(), "LOCK") &&
      !absl::StrContains(c.status().message(), "Read-only file system")) {
    // RocksDB's lock: a trainer or gradsnap-server has the directory open.
    return absl::UnavailableError(absl::StrCat(
        "checkpoint directory ", options.local_dir,
        " is in use by another process (a running trainer or gradsnap-server; use --server): ",
        c.status().message()));
  }
  if (!c.ok()) return c.status();
  client = *std::move(c);
  return client.get();
}

absl::Status CheckJob(const std::string& job) { return ValidateName(job, "job name"); }

namespace {

// The step "latest" names among the job's checkpoints `list` (ResolveStep).
absl::StatusOr<int64_t> LatestStep(const std::string& job,
                                   const std::vector<client::CheckpointInfo>& list,
                                   const recovery::RecoveryPoint& rp) {
  if (rp.full_step >= 0) return rp.step();
  int64_t best = -1;
  for (const client::CheckpointInfo& info : list) {
    if (info.state == client::CheckpointState::kCommitted) best = std::max(best, info.step);
  }
  if (best < 0) {
    return absl::NotFoundError(absl::StrCat("job ", job, " has no committed checkpoint"));
  }
  return best;
}

}  // namespace

absl::StatusOr<int64_t> ResolveStep(Context& ctx, const std::string& job, const std::string& arg,
                                    bool allow_latest, recovery::RecoveryPoint* rp) {
  if (arg != "latest" || !allow_latest) {
    return ParseInt(arg, 0, INT64_MAX, "step");
  }
  ASSIGN_OR_RETURN(client::Client * c, ctx.Connect());
  ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> list, c->List(job, false));
  recovery::RecoveryPoint found = recovery::FindRecoveryPoint(list);
  if (rp != nullptr) *rp = found;
  return LatestStep(job, list, found);
}

absl::StatusOr<recovery::RecoveryPoint> JobRecoveryPoint(Context& ctx, const std::string& job) {
  ASSIGN_OR_RETURN(client::Client * c, ctx.Connect());
  ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> list, c->List(job, false));
  return recovery::FindRecoveryPoint(list);
}

absl::StatusOr<std::vector<int64_t>> RecoveryPointSteps(Context& ctx, const std::string& job) {
  recovery::RecoveryPoint rp;
  ASSIGN_OR_RETURN(int64_t step, ResolveStep(ctx, job, "latest", true, &rp));
  if (rp.full_step < 0) return std::vector<int64_t>{step};
  std::vector<int64_t> steps = {rp.full_step};
  steps.insert(steps.end(), rp.delta_steps.begin(), rp.delta_steps.end());
  return steps;
}

std::string KindName(client::CheckpointKind k) {
  return k == client::CheckpointKind::kDelta ? "delta" : "full";
}

std::string StateName(client::CheckpointState s) {
  return s == client::CheckpointState::kCommitted ? "committed" : "pending";
}

std::string CheckpointJson(const client::CheckpointInfo& c) {
  return absl::StrCat(
      "{\"job\":", JsonQuote(c.job), ",\"step\":", c.step, ",\"kind\":\"", KindName(c.kind),
      "\",\"base_step\":", c.base_step, ",\"world_size\":", c.world_size, ",\"state\":\"",
      StateName(c.state), "\",\"raw_bytes\":", c.raw_bytes, ",\"stored_bytes\":", c.stored_bytes,
      ",\"created_unix_ms\":", c.created_unix_ms, ",\"committed_unix_ms\":", c.committed_unix_ms,
      ",\"metadata_bytes\":", c.metadata.size(), "}");
}

namespace {

std::string TensorJson(const storage::TensorInfo& t) {
  const client::TensorSpec& s = t.spec;
  std::string out = absl::StrCat(
      "{\"name\":", JsonQuote(s.name), ",\"dtype\":\"", DTypeName(s.dtype), "\",\"shape\":[",
      absl::StrJoin(s.shape, ","), "],\"byte_length\":", s.byte_length,
      ",\"stored_bytes\":", t.stored_bytes, ",\"chunks\":", t.chunks,
      ",\"digest\":", JsonQuote(t.digest), ",\"sha256\":", JsonQuote(s.sha256));
  if (!s.flat_name.empty()) {
    absl::StrAppend(&out, ",\"flat_name\":", JsonQuote(s.flat_name),
                    ",\"flat_offset\":", s.flat_offset, ",\"flat_total\":", s.flat_total);
  }
  return out + "}";
}

}  // namespace

std::string ManifestJson(const client::Manifest& m) {
  std::string out = CheckpointJson(m.info);
  out.pop_back();  // reopen the object to append the shards
  out += ",\"shards\":[";
  for (size_t i = 0; i < m.shards.size(); ++i) {
    const client::ShardInfo& s = m.shards[i];
    if (i > 0) out += ",";
    absl::StrAppend(&out, "{\"rank\":", s.rank, ",\"committed\":", s.committed ? "true" : "false",
                    ",\"raw_bytes\":", s.raw_bytes, ",\"stored_bytes\":", s.stored_bytes,
                    ",\"metadata_bytes\":", s.metadata.size(), ",\"digest_algorithm\":\"",
                    DigestAlgoName(s.digest_algo), "\",\"tensors\":[");
    for (size_t j = 0; j < s.tensors.size(); ++j) {
      if (j > 0) out += ",";
      out += TensorJson(s.tensors[j]);
    }
    out += "]}";
  }
  return out + "]}";
}

void Print(const std::string& text) {
  std::fwrite(text.data(), 1, text.size(), stdout);
}

}  // namespace cli
}  // namespace gradsnap
