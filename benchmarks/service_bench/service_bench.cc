// service_bench: save and restore through client -> loopback gRPC -> gradsnap server -> engine,
// against the same engine used directly, in one run (DESIGN.md section 7).
//
// Phases, each on its own fresh data directory, with the same data (random fp32 tensors,
// --ranks shards saved concurrently):
//   engine:   Engine::WriteShard per rank; restore with ShardReader::Read into a buffer.
//   service:  in-process Server (RAM tier off) + remote Client: SaveShardAsync per rank, then
//             RestoreShard per rank (each over --read_streams parallel Read streams) from disk (segment files dropped from the page cache with
//             posix_fadvise DONTNEED; the engine reads with O_DIRECT anyway).
//   cached:   Server with --cache-bytes holding the checkpoint: save again, restore from RAM.
//   bare:     a bare gRPC server (the generated Storage service with only Read, streaming the
//             same bytes from memory in 1 MiB messages) read by --ranks concurrent streams
//             over the same loopback: the physical limit of the restore-from-RAM path.
// Last line: save_ratio=service/engine save throughput, restore_ratio=service/engine restore
// throughput, restore_cache_ratio=RAM-tier restore / bare gRPC transfer,
// restore_cache_speedup=RAM-tier restore / disk restore (both through the service), and the
// process CPU seconds per GB of the service save and disk restore (server and client are in
// this process): save_cpu_s_per_gb, restore_cpu_s_per_gb.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "benchmarks/common/bench_util.h"
#include "client/backends.h"
#include "client/client.h"
#include "common/clock.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#include "proto/convert.h"
#include "proto/gradsnap.grpc.pb.h"
#include "service/server.h"
#include "storage/engine.h"

ABSL_FLAG(uint64_t, bytes, 1ull << 30, "Total checkpoint bytes. Default: 1 GiB.");
ABSL_FLAG(int, ranks, 4, "Shards saved and restored concurrently. Default: 4.");
ABSL_FLAG(std::string, dir, "/tmp", "Directory for the data directories. Default: /tmp.");
ABSL_FLAG(int, zstd_level, 1, "Engine zstd level for both paths. Default: 1.");
ABSL_FLAG(int, read_streams, gradsnap::client::ClientOptions().read_streams,
          "Parallel Read streams per shard restore (ClientOptions.read_streams). Default: 1.");
ABSL_FLAG(int, repeat, 1, "Runs of each phase; the best is reported. Default: 1.");

namespace gs = gradsnap;
namespace {

using gs::bench::CpuSeconds;
using gs::bench::DropPageCache;

struct Data {
  std::vector<gs::storage::ShardSpec> specs;   // per rank
  std::vector<std::vector<std::string>> bufs;  // per rank, per tensor
  std::vector<std::string> restore;            // per rank, pre-touched
  uint64_t total = 0;
};

Data MakeData(uint64_t bytes, int ranks) {
  Data d;
  constexpr uint64_t kTensor = 64ull << 20;
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> pattern(1 << 20);
  for (float& f : pattern) f = normal(rng);
  for (int r = 0; r < ranks; ++r) {
    gs::storage::ShardSpec s;
    s.job = "bench";
    s.step = 1;
    s.rank = r;
    std::vector<std::string> bufs;
    uint64_t left = bytes / ranks / 4 * 4;
    for (int i = 0; left > 0; ++i) {
      uint64_t n = std::min(left, kTensor);
      gs::storage::TensorSpec t;
      t.name = absl::StrCat("t", i);
      t.dtype = gs::DType::kF32;
      t.shape = {static_cast<int64_t>(n / 4)};
      t.byte_length = n;
      std::string b(n, '\0');
      for (uint64_t off = 0; off < n; off += pattern.size() * 4) {
        size_t take = std::min<uint64_t>(pattern.size() * 4, n - off);
        std::memcpy(b.data() + off, pattern.data(), take);
        // Vary every block so no two chunks are identical.
        reinterpret_cast<float*>(b.data() + off)[0] = static_cast<float>(off + r * 7 + i);
      }
      s.tensors.push_back(t);
      bufs.push_back(std::move(b));
      left -= n;
      d.total += n;
    }
    d.restore.push_back(std::string(bytes / ranks, '\1'));
    d.specs.push_back(std::move(s));
    d.bufs.push_back(std::move(bufs));
  }
  return d;
}

// Runs fn(rank) on every rank concurrently; seconds, or a failure.
absl::StatusOr<double> Parallel(int ranks, const std::function<absl::Status(int)>& fn) {
  gs::Stopwatch w;
  std::vector<std::future<absl::Status>> fs;
  for (int r = 0; r < ranks; ++r) fs.push_back(std::async(std::launch::async, fn, r));
  absl::Status first;
  for (auto& f : fs) {
    absl::Status s = f.get();
    if (first.ok()) first = s;
  }
  if (!first.ok()) return first;
  return w.ElapsedSeconds();
}

gs::storage::CheckpointSpec Spec(int64_t step, int ranks) {
  gs::storage::CheckpointSpec c;
  c.job = "bench";
  c.step = step;
  c.world_size = ranks;
  return c;
}

bool Same(const Data& d, int r) {
  uint64_t off = 0;
  for (const auto& b : d.bufs[r]) {
    if (std::memcmp(d.restore[r].data() + off, b.data(), b.size()) != 0) return false;
    off += b.size();
  }
  return true;
}

struct Times {
  double save = 0, restore = 0;
  double save_cpu = 0, restore_cpu = 0;
};

// The bare transfer: Read streams rank r's bytes from memory, nothing else.
class BareService final : public gs::v1::Storage::Service {
 public:
  explicit BareService(const Data* d) : d_(d) {}
  grpc::Status Read(grpc::ServerContext*, const gs::v1::ReadRequest* req,
                    grpc::ServerWriter<gs::v1::ReadResponse>* writer) override {
    if (req->rank() < 0 || req->rank() >= static_cast<int>(d_->bufs.size())) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "rank");
    }
    gs::v1::ReadResponse resp;
    uint64_t offset = 0;
    for (const std::string& b : d_->bufs[req->rank()]) {
      for (size_t pos = 0; pos < b.size(); pos += gs::proto::kMaxDataBytes) {
        size_t n = std::min<size_t>(gs::proto::kMaxDataBytes, b.size() - pos);
        resp.set_data(b.data() + pos, n);
        resp.set_offset(offset);
        if (!writer->Write(resp)) return grpc::Status(grpc::StatusCode::CANCELLED, "gone");
        offset += n;
      }
    }
    return grpc::Status::OK;
  }

 private:
  const Data* d_;
};

absl::StatusOr<double> RunBare(const Data& d, int ranks) {
  BareService service(&d);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxSendMessageSize(static_cast<int>(gs::proto::kMaxMessageBytes));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) return absl::InternalError("bare server did not start");
  // One connection carrying every rank's stream, as the remote client has per node.
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(gs::proto::kMaxMessageBytes));
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto stub = gs::v1::Storage::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args));
  Data& m = const_cast<Data&>(d);
  auto secs = Parallel(ranks, [&](int r) -> absl::Status {
    grpc::ClientContext ctx;
    gs::v1::ReadRequest req;
    req.set_rank(r);
    auto reader = stub->Read(&ctx, req);
    gs::v1::ReadResponse resp;
    uint64_t off = 0;
    while (reader->Read(&resp)) {
      if (resp.data().size() > m.restore[r].size() - off) {
        return absl::DataLossError("too many bytes");
      }
      std::memcpy(m.restore[r].data() + off, resp.data().data(), resp.data().size());
      off += resp.data().size();
    }
    grpc::Status st = reader->Finish();
    if (!st.ok()) return absl::UnavailableError(st.error_message());
    return absl::OkStatus();
  });
  server->Shutdown();
  if (!secs.ok()) return secs.status();
  for (int r = 0; r < ranks; ++r) {
    if (!Same(d, r)) return absl::DataLossError("bare restore differs");
  }
  return *secs;
}

absl::StatusOr<Times> RunEngine(const Data& d, gs::storage::EngineOptions eo, int ranks) {
  ASSIGN_OR_RETURN(auto engine, gs::storage::Engine::Open(eo));
  RETURN_IF_ERROR(engine->BeginCheckpoint(Spec(1, ranks)));
  Times t;
  ASSIGN_OR_RETURN(t.save, Parallel(ranks, [&](int r) {
    std::vector<const void*> ptrs;
    for (const auto& b : d.bufs[r]) ptrs.push_back(b.data());
    return engine->WriteShard(d.specs[r], ptrs);
  }));
  DropPageCache(eo.data_dir);
  Data& m = const_cast<Data&>(d);
  ASSIGN_OR_RETURN(t.restore, Parallel(ranks, [&](int r) -> absl::Status {
    ASSIGN_OR_RETURN(auto reader, engine->OpenShardReader("bench", 1, r));
    uint64_t off = 0;
    for (;;) {
      size_t want = std::min<uint64_t>(4 << 20, m.restore[r].size() - off);
      if (want == 0) break;
      ASSIGN_OR_RETURN(size_t got, reader->Read(off, m.restore[r].data() + off, want));
      if (got == 0) break;
      off += got;
    }
    return absl::OkStatus();
  }));
  for (int r = 0; r < ranks; ++r) {
    if (!Same(d, r)) return absl::DataLossError("engine restore differs");
  }
  return t;
}

absl::StatusOr<Times> RunService(const Data& d, gs::storage::EngineOptions eo, int ranks,
                                 uint64_t cache_bytes, int64_t step) {
  gs::service::ServerOptions so;
  so.engine = eo;
  so.engine.queue_depth = gs::service::ServerOptions::kUploadQueueDepth;  // as gradsnap-server
  so.cache_bytes = cache_bytes;
  so.max_inflight_bytes = 1ull << 30;
  ASSIGN_OR_RETURN(auto server, gs::service::Server::Start(so));
  gs::client::ClientOptions co;
  co.endpoints = {server->address()};
  co.read_streams = absl::GetFlag(FLAGS_read_streams);
  ASSIGN_OR_RETURN(auto client, gs::client::NewRemoteClient(co));
  RETURN_IF_ERROR(client->BeginCheckpoint(Spec(step, ranks)));
  Times t;
  double cpu0 = CpuSeconds();
  ASSIGN_OR_RETURN(t.save, Parallel(ranks, [&](int r) {
    std::vector<gs::client::TensorRef> refs;
    gs::storage::ShardSpec spec = d.specs[r];
    spec.step = step;
    for (size_t i = 0; i < spec.tensors.size(); ++i) {
      refs.push_back({spec.tensors[i], d.bufs[r][i].data()});
    }
    return client->SaveShard(spec, refs);
  }));
  t.save_cpu = CpuSeconds() - cpu0;
  DropPageCache(eo.data_dir);
  Data& m = const_cast<Data&>(d);
  cpu0 = CpuSeconds();
  ASSIGN_OR_RETURN(t.restore, Parallel(ranks, [&](int r) -> absl::Status {
    uint64_t off = 0;
    return client->RestoreShard("bench", step, r, [&](const void* p, size_t n) {
      if (n > m.restore[r].size() - off) return absl::DataLossError("too many bytes");
      std::memcpy(m.restore[r].data() + off, p, n);
      off += n;
      return absl::OkStatus();
    });
  }));
  t.restore_cpu = CpuSeconds() - cpu0;
  for (int r = 0; r < ranks; ++r) {
    if (!Same(d, r)) return absl::DataLossError("service restore differs");
  }
  server->Shutdown(absl::Seconds(5));
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  gs::bench::InitBenchmark(argc, argv, "service_bench [--bytes N] [--ranks R] [--dir D]");
  const uint64_t bytes = absl::GetFlag(FLAGS_bytes);
  const int ranks = std::max(1, absl::GetFlag(FLAGS_ranks));
  char tmpl[4096];
  std::snprintf(tmpl, sizeof(tmpl), "%s/service-bench-XXXXXX", absl::GetFlag(FLAGS_dir).c_str());
  if (mkdtemp(tmpl) == nullptr) {
    std::fprintf(stderr, "service_bench: cannot create a directory in %s\n", absl::GetFlag(FLAGS_dir).c_str());
    return 1;
  }
  const std::string root = tmpl;
  Data d = MakeData(bytes, ranks);
  const double gib = d.total / double(1ull << 30);
  std::printf("data: %.2f GiB in %d shards, zstd level %d\n", gib, ranks,
              absl::GetFlag(FLAGS_zstd_level));
  Times best_e{1e9, 1e9}, best_s{1e9, 1e9}, best_c{1e9, 1e9};
  double best_bare = 1e9;
  for (int rep = 0; rep < std::max(1, absl::GetFlag(FLAGS_repeat)); ++rep) {
    auto opts = [&](const char* name) {
      gs::storage::EngineOptions eo;
      eo.data_dir = absl::StrCat(root, "/", name, rep);
      eo.zstd_level = absl::GetFlag(FLAGS_zstd_level);
      return eo;
    };
    auto e = RunEngine(d, opts("engine"), ranks);
    auto s = e.ok() ? RunService(d, opts("service"), ranks, 0, 1) : e;
    auto c = s.ok() ? RunService(d, opts("cached"), ranks, bytes + (64u << 20), 1) : s;
    auto bare = c.ok() ? RunBare(d, ranks) : c.status();
    if (c.ok() && !bare.ok()) c = bare.status();
    std::error_code ec;
    std::filesystem::remove_all(root + "/engine" + std::to_string(rep), ec);
    std::filesystem::remove_all(root + "/service" + std::to_string(rep), ec);
    std::filesystem::remove_all(root + "/cached" + std::to_string(rep), ec);
    if (!c.ok()) {
      std::fprintf(stderr, "service_bench: %s\n", c.status().ToString().c_str());
      std::filesystem::remove_all(root, ec);
      return 1;
    }
    std::printf("run %d: engine save %.2f GiB/s restore %.2f GiB/s | service save %.2f GiB/s "
                "restore(disk) %.2f GiB/s | cached save %.2f GiB/s restore(RAM) %.2f GiB/s\n",
                rep, gib / e->save, gib / e->restore, gib / s->save, gib / s->restore,
                gib / c->save, gib / c->restore);
    std::printf(
        "run %d: bare gRPC streaming %.2f GiB/s; service cpu: save %.2f s, restore %.2f s\n",
        rep, gib / *bare, s->save_cpu, s->restore_cpu);
    if (s->save < best_s.save) best_s.save_cpu = s->save_cpu;
    if (s->restore < best_s.restore) best_s.restore_cpu = s->restore_cpu;
    best_bare = std::min(best_bare, *bare);
    best_e = {std::min(best_e.save, e->save), std::min(best_e.restore, e->restore)};
    best_s.save = std::min(best_s.save, s->save);
    best_s.restore = std::min(best_s.restore, s->restore);
    best_c = {std::min(best_c.save, c->save), std::min(best_c.restore, c->restore)};
  }
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
  const double gb = d.total / 1e9;
  std::printf("bytes=%llu save_ratio=%.3f restore_ratio=%.3f restore_cache_ratio=%.3f "
              "restore_cache_speedup=%.3f save_ratio_with_cache=%.3f save_cpu_s_per_gb=%.3f "
              "restore_cpu_s_per_gb=%.3f bare_grpc_gibps=%.3f\n",
              static_cast<unsigned long long>(d.total), best_e.save / best_s.save,
              best_e.restore / best_s.restore, best_bare / best_c.restore,
              best_s.restore / best_c.restore, best_e.save / best_c.save, best_s.save_cpu / gb,
              best_s.restore_cpu / gb, gib / best_bare);
  return 0;
}
