// Read-only commands: ls, show, health.
#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "cli/cluster_view.h"
#include "cli/commands.h"
#include "cli/format.h"
#include "common/clock.h"
#include "common/digest.h"
#include "common/json.h"
#include "common/status.h"

namespace gradsnap {
namespace cli {
namespace {

std::string WhenText(int64_t now_ms, int64_t ms) {
  if (ms <= 0) return "-";
  return absl::StrCat(absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(ms),
                                       absl::UTCTimeZone()),
                      " (", HumanAge(now_ms, ms), ")");
}

absl::Status ListJobs(Context& ctx, client::Client* c) {
  ASSIGN_OR_RETURN(std::vector<std::string> jobs, c->ListJobs());
  std::sort(jobs.begin(), jobs.end());
  const int64_t now = UnixMillis();
  std::vector<std::vector<std::string>> rows = {
      {"JOB", "CHECKPOINTS", "LATEST", "RECOVERY", "STORED", "RAW", "RATIO", "AGE"}};
  std::vector<std::string> json;
  for (const std::string& job : jobs) {
    ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> list, c->List(job, false));
    uint64_t raw = 0, stored = 0;
    const client::CheckpointInfo* latest = nullptr;
    for (const client::CheckpointInfo& i : list) {
      raw += i.raw_bytes;
      stored += i.stored_bytes;
      if (latest == nullptr || i.step > latest->step) latest = &i;
    }
    const recovery::RecoveryPoint rp = recovery::FindRecoveryPoint(list);
    rows.push_back({job, absl::StrCat(list.size()), latest ? absl::StrCat(latest->step) : "-",
                    rp.full_step >= 0 ? absl::StrCat(rp.step()) : "-",
                    HumanBytes(stored), HumanBytes(raw), Ratio(raw, stored),
                    latest ? HumanAge(now, latest->committed_unix_ms) : "-"});
    json.push_back(absl::StrCat("{\"job\":", JsonQuote(job), ",\"checkpoints\":", list.size(),
                                ",\"latest_step\":", latest ? absl::StrCat(latest->step) : "null",
                                ",\"recovery_step\":",
                                rp.full_step >= 0 ? absl::StrCat(rp.step()) : "null",
                                ",\"raw_bytes\":", raw, ",\"stored_bytes\":", stored, "}"));
  }
  if (ctx.json) {
    Print(absl::StrCat("{\"jobs\":[", absl::StrJoin(json, ","), "]}\n"));
  } else if (jobs.empty()) {
    Print("no jobs\n");
  } else {
    Print(RenderTable(rows, {"CHECKPOINTS", "LATEST", "RECOVERY", "STORED", "RAW", "RATIO"}));
  }
  return absl::OkStatus();
}

absl::Status ListCheckpoints(Context& ctx, client::Client* c, const std::string& job) {
  ASSIGN_OR_RETURN(std::vector<client::CheckpointInfo> list, c->List(job, ctx.args.Has("all")));
  std::sort(list.begin(), list.end(),
            [](const auto& a, const auto& b) { return a.step < b.step; });
  const recovery::RecoveryPoint rp = recovery::FindRecoveryPoint(list);
  if (ctx.json) {
    std::vector<std::string> items;
    for (const auto& i : list) items.push_back(CheckpointJson(i));
    std::string rp_json = "null";
    if (rp.full_step >= 0) {
      rp_json = absl::StrCat("{\"full_step\":", rp.full_step, ",\"deltas\":",
                             rp.delta_steps.size(), ",\"step\":", rp.step(), "}");
    }
    Print(absl::StrCat("{\"job\":", JsonQuote(job), ",\"checkpoints\":[",
                       absl::StrJoin(items, ","), "],\"recovery_point\":", rp_json, "}\n"));
    return absl::OkStatus();
  }
  if (list.empty()) {
    Print(absl::StrCat("job ", job, ": no checkpoints\n"));
    return absl::OkStatus();
  }
  const int64_t now = UnixMillis();
  std::vector<std::vector<std::string>> rows = {
      {"STEP", "KIND", "BASE", "RANKS", "STATE", "STORED", "RAW", "RATIO", "AGE", "RECOVERY"}};
  // The RECOVERY column marks the recovery point's FULL, its chain and the point itself.
  auto role = [&](int64_t step) -> std::string {
    if (rp.full_step < 0) return "";
    if (step == rp.step()) return "<- recovery point";
    if (step == rp.full_step) return "base";
    if (step > rp.full_step && step < rp.step()) return "chain";
    return "";
  };
  for (const auto& i : list) {
    rows.push_back({absl::StrCat(i.step), KindName(i.kind),
                    i.base_step >= 0 ? absl::StrCat(i.base_step) : "-",
                    absl::StrCat(i.world_size), StateName(i.state), HumanBytes(i.stored_bytes),
                    HumanBytes(i.raw_bytes), Ratio(i.raw_bytes, i.stored_bytes),
                    HumanAge(now, i.committed_unix_ms > 0 ? i.committed_unix_ms
                                                          : i.created_unix_ms),
                    i.state == client::CheckpointState::kCommitted ? role(i.step) : ""});
  }
  Print(RenderTable(rows, {"STEP", "BASE", "RANKS", "STORED", "RAW", "RATIO"}));
  if (rp.full_step >= 0) Print(absl::StrCat("recovery point: ", rp.Describe(), "\n"));
  return absl::OkStatus();
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

}  // namespace

absl::Status RunLs(Context& ctx) {
  if (!ctx.args.positional.empty()) RETURN_IF_ERROR(CheckJob(ctx.args.positional[0]));
  ASSIGN_OR_RETURN(client::Client * c, ctx.Connect());
  if (ctx.args.positional.empty()) return ListJobs(ctx, c);
  return ListCheckpoints(ctx, c, ctx.args.positional[0]);
}

absl::Status RunShow(Context& ctx) {
  const std::string& job = ctx.args.positional[0];
  RETURN_IF_ERROR(CheckJob(job));
  const bool latest = ctx.args.positional[1] == "latest";
  recovery::RecoveryPoint rp;  // listed by ResolveStep for "latest"
  ASSIGN_OR_RETURN(int64_t step, ResolveStep(ctx, job, ctx.args.positional[1], true, &rp));
  ASSIGN_OR_RETURN(client::Client * c, ctx.Connect());
  ASSIGN_OR_RETURN(client::Manifest m, c->Show(job, step));
  std::string recovery_line;
  if (latest || m.info.kind == client::CheckpointKind::kDelta) {
    if (!latest) {
      ASSIGN_OR_RETURN(rp, JobRecoveryPoint(ctx, job));
    }
    if (rp.full_step >= 0 && rp.step() == step) {
      recovery_line = absl::StrCat("recovery    ", rp.Describe(), " (the recovery point)\n");
    } else if (m.info.kind == client::CheckpointKind::kDelta) {
      recovery_line = absl::StrCat("recovery    restores as full ", m.info.base_step, " + ",
                                   step - m.info.base_step, " deltas -> step ", step, "\n");
    }
  }
  std::map<int32_t, std::vector<std::string>> replicas;  // cluster mode: each rank's nodes
  if (!ctx.options.etcd.empty()) {
    ASSIGN_OR_RETURN(replicas, ReadReplicas(ctx.options, job, step));
  }
  if (ctx.json) {
    std::string json = ManifestJson(m);
    if (!ctx.options.etcd.empty() && !json.empty() && json.back() == '}') {
      std::vector<std::string> ranks;
      for (const auto& [rank, nodes] : replicas) {
        std::vector<std::string> quoted;
        for (const std::string& n : nodes) quoted.push_back(JsonQuote(n));
        ranks.push_back(absl::StrCat("\"", rank, "\":[", absl::StrJoin(quoted, ","), "]"));
      }
      json.pop_back();
      absl::StrAppend(&json, ",\"replicas\":{", absl::StrJoin(ranks, ","), "}}");
    }
    Print(json + "\n");
    return absl::OkStatus();
  }
  const client::CheckpointInfo& i = m.info;
  const int64_t now = UnixMillis();
  std::vector<std::string> algos;  // distinct digest algorithms of the shards, in rank order
  for (const client::ShardInfo& s : m.shards) {
    const std::string name = DigestAlgoName(s.digest_algo);
    if (std::find(algos.begin(), algos.end(), name) == algos.end()) algos.push_back(name);
  }
  std::string head = absl::StrCat(
      "job         ", i.job, "\nstep        ", i.step, " (", KindName(i.kind),
      i.base_step >= 0 ? absl::StrCat(" on ", i.base_step) : "", ")\nstate       ",
      StateName(i.state), "\nworld size  ", i.world_size, "\nstored      ",
      HumanBytes(i.stored_bytes), " of ", HumanBytes(i.raw_bytes), " raw (",
      Ratio(i.raw_bytes, i.stored_bytes), ")\ncreated     ", WhenText(now, i.created_unix_ms),
      "\ncommitted   ", WhenText(now, i.committed_unix_ms), "\nmetadata    ",
      HumanBytes(i.metadata.size()), "\ndigest      ",
      algos.empty() ? "-" : absl::StrJoin(algos, ", "), "\n", recovery_line, "\n");
  std::vector<std::vector<std::string>> rows = {
      {"RANK", "TENSOR", "DTYPE", "SHAPE", "SIZE", "STORED", "RATIO", "CHUNKS", "DIGEST"}};
  for (const client::ShardInfo& s : m.shards) {
    for (const storage::TensorInfo& t : s.tensors) {
      rows.push_back({absl::StrCat(s.rank), t.spec.name, DTypeName(t.spec.dtype),
                      ShapeText(t.spec.shape), HumanBytes(t.spec.byte_length),
                      HumanBytes(t.stored_bytes), Ratio(t.spec.byte_length, t.stored_bytes),
                      absl::StrCat(t.chunks), t.digest.substr(0, 16)});
    }
    if (!s.committed) {
      rows.push_back({absl::StrCat(s.rank), "(shard not committed)", "", "", "", "", "", "", ""});
    }
  }
  Print(head + RenderTable(rows, {"RANK", "SIZE", "STORED", "RATIO", "CHUNKS"}));
  if (!replicas.empty()) {
    std::vector<std::vector<std::string>> where = {{"RANK", "REPLICAS"}};
    for (const auto& [rank, nodes] : replicas) {
      where.push_back({absl::StrCat(rank), absl::StrJoin(nodes, ", ")});
    }
    Print(absl::StrCat("\n", RenderTable(where, {"RANK"})));
  }
  return absl::OkStatus();
}

absl::Status RunHealth(Context& ctx) {
  ASSIGN_OR_RETURN(client::Client * c, ctx.Connect());
  std::vector<std::string> notes;  // nodes refusing writes for want of space
  RETURN_IF_ERROR(c->HealthNotes(&notes));
  const bool cluster = !ctx.options.etcd.empty();
  bool remote = !ctx.options.endpoints.empty() || cluster;
  std::string where = cluster  ? ctx.options.etcd
                      : remote ? absl::StrJoin(ctx.options.endpoints, ",")
                               : ctx.options.local_dir;
  ClusterView view;  // cluster mode: the nodes, the repairer, the repair backlog
  if (cluster) {
    ASSIGN_OR_RETURN(view, ReadClusterView(ctx.options));
  }
  if (ctx.json) {
    std::vector<std::string> quoted;
    for (const std::string& n : notes) quoted.push_back(JsonQuote(n));
    std::string nodes;
    if (cluster) {
      std::vector<std::string> items;
      for (const ClusterNodeView& n : view.nodes) {
        items.push_back(absl::StrCat(
            "{\"id\":", JsonQuote(n.id), ",\"address\":", JsonQuote(n.address),
            ",\"alive\":", n.alive ? "true" : "false", ",\"capacity_bytes\":", n.capacity_bytes,
            ",\"free_bytes\":", n.free_bytes, ",\"shards\":", n.shards, "}"));
      }
      nodes = absl::StrCat(",\"nodes\":[", absl::StrJoin(items, ","), "],\"repairer\":",
                           JsonQuote(view.repairer), ",\"under_replicated\":",
                           view.under_replicated);
    }
    Print(absl::StrCat("{\"ok\":true,\"backend\":\"",
                       cluster ? "cluster" : remote ? "remote" : "embedded",
                       "\",\"target\":", JsonQuote(where), ",\"writes_refused\":[",
                       absl::StrJoin(quoted, ","), "]", nodes, "}\n"));
  } else {
    Print(absl::StrCat("ok: ", cluster ? "cluster on etcd " : remote ? "servers " : "embedded engine in ", where, "\n"));
    for (const std::string& n : notes) Print(absl::StrCat("warning: ", n, "\n"));
    if (cluster) {
      std::vector<std::vector<std::string>> rows = {
          {"NODE", "ADDRESS", "ALIVE", "CAPACITY", "FREE", "SHARDS"}};
      for (const ClusterNodeView& n : view.nodes) {
        rows.push_back({n.id, n.address.empty() ? "-" : n.address, n.alive ? "yes" : "no",
                        n.alive ? HumanBytes(n.capacity_bytes) : "-",
                        n.alive ? HumanBytes(n.free_bytes) : "-", absl::StrCat(n.shards)});
      }
      Print(RenderTable(rows, {"CAPACITY", "FREE", "SHARDS"}));
      Print(absl::StrCat("repairer: ", view.repairer.empty() ? "none" : view.repairer,
                         "\nunder-replicated shards: ", view.under_replicated, "\n"));
    }
  }
  return absl::OkStatus();
}

}  // namespace cli
}  // namespace gradsnap
