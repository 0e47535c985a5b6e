// restore_bench: recovery time and resharding read amplification of a 2-rank job of the `small`
// model (DESIGN.md section 7), through an in-process gradsnap server, from disk and from the RAM
// tier, in one run.
//
// The job's state (params, m, v: 12 bytes per parameter, random normal values) is saved by
// --ranks writer ranks as a FULL plus --deltas DELTA records (disk phase) or as a FULL alone (RAM
// phase: the RAM tier keeps the newest checkpoint). Then:
//   source bandwidth   every shard of the recovery point streamed whole (RestoreShard) into
//                      memory, ranks in parallel: the source's read bandwidth for these bytes
//                      (reported; the RAM tier's ratio uses it);
//   raw read           the disk phase's segment files of the recovery point read with io_uring
//                      and O_DIRECT by this process, without the engine (bench_util.h
//                      RawDirectIo), page cache dropped, one thread per file, best of --repeat:
//                      the disk's time for the bytes the restore reads;
//   trainer start      gradsnap-train's real start (--train_bin, --ranks ranks, --model, no
//                      checkpointing): the time to its "step 1" line less that step's step_ms,
//                      best of 3 (spawn, rendezvous, model and state set-up);
//   recovery           every rank of the same world size restores its slice of the recovery
//                      point at once (recovery/restore_state.h: ranged reads in parallel, DELTA
//                      replay), recovery_s = trainer start + that time;
//   resharding         every rank of --to ranks restores its slice at once; the bytes the server
//                      read from disk (/proc/self/io read_bytes; the engine uses O_DIRECT) and the
//                      bytes it sent (its gradsnap_bytes_out_total counter, scraped from its
//                      metrics endpoint), each divided by the bytes needed.
// recovery_ratio = recovery_s / (raw read + trainer start) on disk; the RAM tier, whose source
// is memory, divides by (state bytes / source bandwidth + trainer start). restore_to_raw_ratio is
// the disk restore alone / the raw read: the same comparison without the start term.
// Last line: name=value pairs (reshard_read_amplification, recovery_s, recovery_ratio for the
// disk phase, and the same with _ram for the RAM tier).
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "benchmarks/common/bench_util.h"
#include "common/rank_slice.h"
#include "client/backends.h"
#include "client/client.h"
#include "common/clock.h"
#include "common/status.h"
#include "gpu_snapshot/grad_log.h"
#include "recovery/recovery_point.h"
#include "recovery/restore_dir.h"
#include "recovery/restore_state.h"
#include "recovery/state_source.h"
#include "service/server.h"
#include "storage/aligned_buffer.h"
#include "tests/service/service_test_util.h"
#include "trainer/model_config.h"

ABSL_FLAG(std::string, model, "small", "Model whose state is restored. Default: small");
ABSL_FLAG(int, ranks, 2, "Ranks that wrote the checkpoint. Default: 2");
ABSL_FLAG(int, to, 3, "Ranks of the resharded restore. Default: 3");
ABSL_FLAG(int, deltas, 2, "DELTA records on the FULL (disk phase). Default: 2");
ABSL_FLAG(std::string, dir, "/tmp", "Directory for the data directories. Default: /tmp");
ABSL_FLAG(int, repeat, 3, "Restores of each kind; the best is reported. Default: 3");
ABSL_FLAG(int, range_mib, 256,
          "Ranged reads of at most this many MiB (RestoreOptions::range_bytes). Default: 256");
ABSL_FLAG(std::string, train_bin, GRADSNAP_TRAIN_BIN,
          "gradsnap-train, whose start-up is the recovery's start term. Default: the build's");

namespace gs = gradsnap;
namespace {

using gs::bench::DropPageCache;

constexpr const char* kJob = "bench";

uint64_t DiskReadBytes() {
  std::ifstream f("/proc/self/io");
  std::string key;
  uint64_t v = 0;
  while (f >> key >> v) {
    if (key == "read_bytes:") return v;
  }
  return 0;
}

// gradsnap-train's start-up: from its spawn to its "step 1" line, less that step's step_ms.
// Best of 3; an error when it does not print the line.
absl::StatusOr<double> TrainerStartSeconds(const std::string& model, int ranks) {
  const std::string cmd =
      absl::StrCat(absl::GetFlag(FLAGS_train_bin), " --model=", model, " --steps=1 --nproc=",
                   ranks, " --batch=", ranks, " --seq=16 --blas_threads=1 2>&1");
  double best = 1e9;
  for (int i = 0; i < 3; ++i) {
    gs::Stopwatch sw;
    FILE* f = ::popen(cmd.c_str(), "r");
    if (f == nullptr) return absl::InternalError("cannot run " + cmd);
    double at = -1, step_ms = -1;
    char line[4096];
    while (std::fgets(line, sizeof(line), f) != nullptr) {
      if (at < 0 && std::strncmp(line, "step 1 ", 7) == 0) {
        at = sw.ElapsedMillis() / 1000.0;
        const char* ms = std::strstr(line, " step_ms ");
        if (ms != nullptr) step_ms = std::atof(ms + 9);
      }
    }
    const int st = ::pclose(f);
    if (at < 0 || step_ms < 0 || st != 0) {
      return absl::InternalError(absl::StrCat(cmd, ": no 'step 1 ... step_ms' line (exit ", st,
                                              ")"));
    }
    best = std::min(best, at - step_ms / 1000.0);
  }
  return best;
}

// The stored bytes of the recovery point read raw: every segment file of its steps under
// data_dir, io_uring O_DIRECT in 4 MiB pieces (8 in flight), one thread per file. Seconds.
absl::StatusOr<double> RawReadSeconds(const std::string& data_dir,
                                      const gs::recovery::RecoveryPoint& rp, uint64_t* bytes) {
  std::vector<int64_t> steps = {rp.full_step};
  steps.insert(steps.end(), rp.delta_steps.begin(), rp.delta_steps.end());
  std::vector<std::string> files;
  *bytes = 0;
  for (int64_t step : steps) {
    const std::string dir =
        absl::StrFormat("%s/segments/%s/%020d", data_dir, kJob, static_cast<long long>(step));
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      files.push_back(e.path().string());
      *bytes += e.file_size();
    }
    if (ec) return absl::InternalError(absl::StrCat("listing ", dir, ": ", ec.message()));
  }
  constexpr size_t kPiece = 4 << 20;
  constexpr int kDepth = 8;
  std::vector<int> ok(files.size(), 0);
  std::vector<std::thread> threads;
  DropPageCache(data_dir);
  gs::Stopwatch sw;
  for (size_t i = 0; i < files.size(); ++i) {
    threads.emplace_back([&, i] {
      gs::storage::AlignedBuffer buf(kPiece * kDepth);
      const uint64_t size = std::filesystem::file_size(files[i]);
      std::vector<gs::bench::IoPiece> pieces;
      for (uint64_t off = 0; off < size; off += kPiece) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(kPiece, (size - off + 4095) & ~4095ull));
        pieces.push_back({buf.data() + (pieces.size() % kDepth) * kPiece, n, off});
      }
      ok[i] = gs::bench::RawDirectIo(files[i], pieces, /*write=*/false, kDepth);
    });
  }
  for (auto& t : threads) t.join();
  const double s = sw.ElapsedMillis() / 1000.0;
  for (size_t i = 0; i < files.size(); ++i) {
    if (!ok[i]) return absl::InternalError("raw O_DIRECT read of " + files[i] + " failed");
  }
  return s;
}

// The server's gradsnap_bytes_out_total (payload bytes sent), from its metrics endpoint.
absl::StatusOr<double> BytesOut(int metrics_port) {
  ASSIGN_OR_RETURN(std::string body, gs::testing::HttpGet(metrics_port));
  const double v = gs::testing::MetricValue(body, "gradsnap_bytes_out_total");
  if (v < 0) return absl::NotFoundError("no gradsnap_bytes_out_total in the server's metrics");
  return v;
}

std::string StateText(int64_t step, int world) {
  return absl::StrCat("gradsnap-train-state v1\nstep=", step, "\nworld_size=", world, "\n");
}

gs::storage::TensorSpec Spec(const char* name, gs::DType dt, uint64_t n, uint64_t lo,
                             uint64_t total, bool flat) {
  gs::storage::TensorSpec t;
  t.name = name;
  t.dtype = dt;
  t.shape = {static_cast<int64_t>(n)};
  t.byte_length = n * gs::DTypeSize(dt);
  if (flat) {
    t.flat_name = name;
    t.flat_offset = lo;
    t.flat_total = total;
  }
  return t;
}

// Saves FULL 10 and DELTAs 11.. of `deltas` records, written by `ranks` ranks.
absl::Status SaveJob(gs::client::Client& c, uint64_t total, int ranks, int deltas) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> pattern(1 << 20);
  for (float& f : pattern) f = normal(rng);
  auto fill = [&](std::vector<float>* v, uint64_t n, size_t shift) {
    v->resize(n);
    for (uint64_t i = 0; i < n; ++i) (*v)[i] = pattern[(i * 7 + shift) % pattern.size()];
  };
  std::vector<float> p, m, v;
  fill(&p, total, 1);
  fill(&m, total, 2);
  fill(&v, total, 3);
  for (float& x : v) x = std::abs(x);
  for (int k = 0; k <= deltas; ++k) {
    const int64_t step = 10 + k;
    const std::string text = StateText(step, ranks);
    gs::storage::CheckpointSpec cs{
        kJob,
        step,
        k == 0 ? gs::storage::CheckpointKind::kFull : gs::storage::CheckpointKind::kDelta,
        k == 0 ? -1 : 10,
        ranks,
        text};
    RETURN_IF_ERROR(c.BeginCheckpoint(cs));
    std::vector<float> g;
    if (k > 0) fill(&g, total, 10 + k);
    std::vector<std::future<absl::Status>> saves;
    std::vector<std::string> headers(ranks);
    for (int r = 0; r < ranks; ++r) {
      const auto [lo, hi] = gs::SliceOfRank(total, r, ranks);
      gs::storage::ShardSpec ss{kJob, step, r, {}, text};
      std::vector<gs::client::TensorRef> refs;
      if (k == 0) {
        refs = {{Spec("params", gs::DType::kF32, hi - lo, lo, total, true), p.data() + lo},
                {Spec("adam_m", gs::DType::kF32, hi - lo, lo, total, true), m.data() + lo},
                {Spec("adam_v", gs::DType::kF32, hi - lo, lo, total, true), v.data() + lo}};
      } else {
        gs::gpu_snapshot::DeltaHeader h;
        h.step = step;
        h.base_step = 10;
        h.update.adamw.lr = 1e-4f;
        h.update.adamw.grad_scale = 1.0f;
        h.update.adamw.config.beta1 = 0.9f;
        h.update.adamw.config.beta2 = 0.95f;
        h.update.adamw.config.eps = 1e-8f;
        h.update.adamw.config.weight_decay = 0.0f;
        h.update.adamw.bias_correction1 = 0.5f;
        h.update.adamw.bias_correction2 = 0.1f;
        h.numel = hi - lo;
        h.elem_offset = lo;
        headers[r] = gs::gpu_snapshot::EncodeDeltaHeader(h);
        refs = {{Spec("delta_header", gs::DType::kU8, headers[r].size(), 0, 0, false),
                 headers[r].data()},
                {Spec("grad", gs::DType::kF32, hi - lo, lo, total, true), g.data() + lo}};
      }
      refs.push_back(
          {Spec("replicated_state", gs::DType::kU8, text.size(), 0, 0, false), text.data()});
      saves.push_back(c.SaveShardAsync(ss, refs));
    }
    for (auto& f : saves) RETURN_IF_ERROR(f.get());
  }
  return absl::OkStatus();
}

// Every rank of `world` restores its slice at once; returns the wall time.
absl::StatusOr<double> RestoreAll(gs::client::Client& c, const gs::recovery::RecoveryPoint& rp,
                                  uint64_t total, int world) {
  std::vector<absl::Status> st(world);
  // The ranks' state buffers, touched before the clock starts (a trainer's are).
  std::vector<std::vector<float>> bufs(3 * world);
  for (int r = 0; r < world; ++r) {
    const auto [lo, hi] = gs::SliceOfRank(total, r, world);
    for (int i = 0; i < 3; ++i) bufs[3 * r + i].assign(hi - lo, 0.0f);
  }
  std::vector<std::thread> threads;
  gs::Stopwatch sw;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      const auto [lo, hi] = gs::SliceOfRank(total, r, world);
      float* p = bufs[3 * r].data();
      float* m = bufs[3 * r + 1].data();
      float* v = bufs[3 * r + 2].data();
      auto source = gs::recovery::NewClientSource(&c, kJob);
      gs::recovery::RestoreOptions ro;
      ro.range_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_range_mib)) << 20;
      auto got = gs::recovery::RestoreRange(*source, rp, lo, hi, p, m, v, ro);
      if (!got.ok()) {
        st[r] = got.status();
        return;
      }
      if (got->step != rp.step() || !got->damage.empty()) {
        st[r] = absl::DataLossError(absl::StrCat("restored step ", got->step, ": ", got->damage));
      }
    });
  }
  for (auto& t : threads) t.join();
  const double s = sw.ElapsedMillis() / 1000.0;
  for (const absl::Status& x : st) RETURN_IF_ERROR(x);
  return s;
}

// Streams every shard of the recovery point whole, ranks in parallel: the source's bandwidth.
absl::StatusOr<double> StreamAll(gs::client::Client& c, const gs::recovery::RecoveryPoint& rp,
                                 int ranks, uint64_t total, uint64_t* bytes) {
  std::vector<int64_t> steps = {rp.full_step};
  steps.insert(steps.end(), rp.delta_steps.begin(), rp.delta_steps.end());
  std::vector<absl::Status> st(ranks);
  std::vector<uint64_t> got(ranks, 0);
  // Each rank's bytes land in memory, as a restore's do (buffers touched before the clock).
  std::vector<std::vector<char>> bufs(ranks);
  for (int r = 0; r < ranks; ++r) {
    const auto [lo, hi] = gs::SliceOfRank(total, r, ranks);
    bufs[r].assign(((hi - lo) * sizeof(float) + (1u << 20)) * steps.size() * 3, 0);
  }
  std::vector<std::thread> threads;
  gs::Stopwatch sw;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      for (int64_t step : steps) {
        absl::Status s = c.RestoreShard(kJob, step, r, [&](const void* p, size_t n) {
          if (got[r] + n > bufs[r].size()) return absl::DataLossError("shard larger than expected");
          std::memcpy(bufs[r].data() + got[r], p, n);
          got[r] += n;
          return absl::OkStatus();
        });
        if (!s.ok()) st[r] = s;
      }
    });
  }
  for (auto& t : threads) t.join();
  const double s = sw.ElapsedMillis() / 1000.0;
  for (const absl::Status& x : st) RETURN_IF_ERROR(x);
  *bytes = 0;
  for (uint64_t g : got) *bytes += g;
  return s;
}

struct PhaseResult {
  double bw = 0;          // bytes/s of the source
  double recovery_s = 0;  // process start + restore
  double ratio = 0;
  double amplification = 0;       // disk bytes read / bytes needed
  double wire_amplification = 0;  // bytes the server sent / bytes needed
  uint64_t bytes = 0;
  double raw_s = 0;  // disk: the raw O_DIRECT read of the stored bytes
  double restore_s = 0;  // the restore alone, without the start term
};

absl::StatusOr<PhaseResult> RunPhase(const std::string& dir, uint64_t total, bool ram,
                                     double start_s) {
  const int ranks = absl::GetFlag(FLAGS_ranks), to = absl::GetFlag(FLAGS_to);
  const int deltas = ram ? 0 : absl::GetFlag(FLAGS_deltas);
  gs::service::ServerOptions so;
  so.engine.data_dir = dir;
  so.cache_bytes = ram ? (total * 16 + (64u << 20)) : 0;
  so.max_inflight_bytes = 1ull << 30;
  so.metrics_listen = "127.0.0.1:0";
  ASSIGN_OR_RETURN(auto server, gs::service::Server::Start(so));
  gs::client::ClientOptions co;
  co.endpoints = {server->address()};
  ASSIGN_OR_RETURN(auto client, gs::client::NewRemoteClient(co));
  RETURN_IF_ERROR(SaveJob(*client, total, ranks, deltas));
  ASSIGN_OR_RETURN(std::vector<gs::storage::CheckpointInfo> list, client->List(kJob, false));
  const gs::recovery::RecoveryPoint rp = gs::recovery::FindRecoveryPoint(list);
  PhaseResult out;
  const uint64_t needed = (3 + rp.delta_steps.size()) * total * sizeof(float);
  double stream_s = 1e9, restore_s = 1e9;
  out.raw_s = 1e9;
  uint64_t stored = 0;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_repeat)); ++i) {
    if (!ram) {
      ASSIGN_OR_RETURN(double raw, RawReadSeconds(dir, rp, &stored));
      out.raw_s = std::min(out.raw_s, raw);
    }
    DropPageCache(dir);
    ASSIGN_OR_RETURN(double s, StreamAll(*client, rp, ranks, total, &out.bytes));
    stream_s = std::min(stream_s, s);
    DropPageCache(dir);
    ASSIGN_OR_RETURN(double r, RestoreAll(*client, rp, total, ranks));
    restore_s = std::min(restore_s, r);
  }
  DropPageCache(dir);
  const uint64_t disk0 = DiskReadBytes();
  ASSIGN_OR_RETURN(const double out0, BytesOut(server->metrics_port()));
  ASSIGN_OR_RETURN(double reshard_s, RestoreAll(*client, rp, total, to));
  ASSIGN_OR_RETURN(const double out1, BytesOut(server->metrics_port()));
  out.amplification = static_cast<double>(DiskReadBytes() - disk0) / static_cast<double>(needed);
  out.wire_amplification = (out1 - out0) / static_cast<double>(needed);
  out.bw = static_cast<double>(out.bytes) / stream_s;
  out.recovery_s = start_s + restore_s;
  out.restore_s = restore_s;
  out.ratio = out.recovery_s / ((ram ? static_cast<double>(needed) / out.bw : out.raw_s) + start_s);
  std::printf(
      "%s: %.1f MiB needed, source %.2f GiB/s (stream %.3f s), %s, restore %d ranks %.3f s, "
      "reshard to %d ranks %.3f s, disk read %.3f x needed, sent %.3f x needed\n",
      ram ? "ram tier" : "disk", needed / 1048576.0, out.bw / (1u << 30), stream_s,
      ram ? "no raw read"
          : absl::StrFormat("raw O_DIRECT %.1f MiB %.3f s", stored / 1048576.0, out.raw_s).c_str(),
      ranks, restore_s, to, reshard_s, out.amplification, out.wire_amplification);
  server->Shutdown(absl::Seconds(5));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  gs::bench::InitBenchmark(argc, argv,
                           "restore_bench [--model small] [--ranks 2] [--to 3] [--dir D]");
  auto config = gs::trainer::ModelConfigByName(absl::GetFlag(FLAGS_model));
  if (!config.ok()) {
    std::fprintf(stderr, "restore_bench: %s\n", config.status().ToString().c_str());
    return 2;
  }
  const uint64_t total = gs::trainer::ParamLayout(*config).total();
  const std::string root = absl::StrCat(absl::GetFlag(FLAGS_dir), "/restore-bench-", getpid());
  std::error_code ec;
  std::filesystem::create_directories(root, ec);
  auto started = TrainerStartSeconds(config->name, absl::GetFlag(FLAGS_ranks));
  if (!started.ok()) {
    std::fprintf(stderr, "restore_bench: %s\n", started.status().ToString().c_str());
    return 1;
  }
  const double start_s = *started;
  std::printf("model %s: %llu parameters, state %.1f MiB; gradsnap-train start %.1f ms\n",
              config->name.c_str(), static_cast<unsigned long long>(total), total * 12 / 1048576.0,
              start_s * 1000);
  auto disk = RunPhase(root + "/disk", total, false, start_s);
  auto ram = disk.ok() ? RunPhase(root + "/ram", total, true, start_s) : disk;
  std::filesystem::remove_all(root, ec);
  if (!ram.ok()) {
    std::fprintf(stderr, "restore_bench: %s\n", ram.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "reshard_read_amplification=%.3f reshard_wire_amplification=%.3f recovery_s=%.3f "
      "recovery_ratio=%.3f read_bw_gibps=%.2f recovery_s_ram=%.3f recovery_ratio_ram=%.3f "
      "read_bw_ram_gibps=%.2f trainer_start_s=%.4f raw_read_s=%.3f restore_to_raw_ratio=%.3f\n",
      disk->amplification, disk->wire_amplification, disk->recovery_s, disk->ratio,
      disk->bw / (1u << 30), ram->recovery_s, ram->ratio, ram->bw / (1u << 30), start_s,
      disk->raw_s, disk->restore_s / disk->raw_s);
  return 0;
}
