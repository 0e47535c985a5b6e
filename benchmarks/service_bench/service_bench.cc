// service_bench: save and restore through client -> loopback gRPC -> a real gradsnap-server
// process -> engine, against the same engine used directly and against a bare gRPC transfer of
// the same bytes, in one run (DESIGN.md section 7).
//
// Every pass runs these phases, each on its own fresh data directory, with the same data
// (random fp32 tensors, --ranks shards saved and restored concurrently):
//   engine:   Engine::WriteShard per rank; restore with ShardReader::Read into a buffer.
//   service:  a gradsnap-server child (--server_bin; RAM tier off) + the remote client in this
//             process: SaveShard per rank, then RestoreShard per rank (each over --read_streams
//             Read streams) from disk, the page cache dropped first.
//   cached:   the same with --cache-bytes holding the checkpoint: save, restore from RAM.
//   bare:     a bare gRPC server child (this binary with --bare_server) that implements only
//             Write (counts the received bytes, stores nothing) and Read (sends the same bytes
//             from memory as slices, no copy), with the transport settings of gradsnap
//             (proto/transport.h) and the client's channels; --ranks concurrent streams over
//             the client's connections (ClientOptions::connections_per_node, taken in turn as
//             the remote client does) upload (client-streaming, the data lent to gRPC uncopied) and
//             download (server-streaming, copied into the restore buffers as RestoreShard's
//             caller does). The physical limit of any gRPC path on this machine.
// Passes alternate the phase order (engine, service, cached, bare; then the reverse) because the
// disk's speed drifts during a run; each figure is the median over --passes, each ratio the
// median of the per-pass ratios (both sides of a ratio come from the same pass).
//
// Last line (key=value):
//   save_ratio, restore_ratio: service / engine save and disk-restore throughput.
//   restore_cache_ratio: RAM-tier restore / bare gRPC download (the issue-11 target).
//   restore_cache_speedup: RAM-tier restore / disk restore (both through the service).
//   save_ratio_with_cache: service save with the RAM tier on / engine save.
//   save_bound_ratio = bare upload / engine save, restore_bound_ratio = bare download / engine
//     restore: the most save_ratio / restore_ratio can reach through gRPC here (when below 1,
//     gRPC on loopback alone is slower than the engine's disk). Optimistic: the service path
//     also runs the engine, on the same cores as both gRPC ends.
//   save_cpu_s_per_gb, restore_cpu_s_per_gb: client + server CPU seconds per GB (1e9 bytes) of
//     the service save and disk restore; *_client_cpu_s_per_gb and *_server_cpu_s_per_gb split
//     them; cached_* the same for the RAM-tier phase; bare_cpu_s_per_gb_{up,down} client +
//     server of the bare transfer; engine_{save,restore}_cpu_s_per_gb for the engine alone.
//   bare_grpc_gibps (download), bare_upload_gibps: the bare transfers.
// This process (engine and client) runs with the malloc settings of the gradsnap CLI, the bare
// server with those of gradsnap-server (common/malloc_tuning.h).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "benchmarks/common/bench_util.h"
#include "benchmarks/common/passes.h"
#include "client/backends.h"
#include "client/client.h"
#include "client/remote_rpc.h"
#include "common/clock.h"
#include "common/malloc_tuning.h"
#include "common/status.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/rpc_method.h"
#include "grpcpp/impl/codegen/sync_stream.h"
#include "grpcpp/support/method_handler.h"
#include "proto/convert.h"
#include "proto/gradsnap.grpc.pb.h"
#include "proto/raw_message.h"
#include "proto/transport.h"
#include "storage/engine.h"
#include "tests/testing/server_process.h"

ABSL_FLAG(std::string, bytes, "1G",
          "Total checkpoint bytes, with an optional K/M/G suffix (binary), e.g. 256M or 8G. "
          "Default: 1G");
ABSL_FLAG(int, ranks, 4, "Shards saved and restored concurrently. Default: 4.");
ABSL_FLAG(std::string, dir, "/tmp", "Directory for the data directories. Default: /tmp.");
ABSL_FLAG(int, zstd_level, 1, "Engine zstd level for both paths. Default: 1.");
ABSL_FLAG(int, read_streams, gradsnap::client::ClientOptions().read_streams,
          "Parallel Read streams per shard restore (ClientOptions.read_streams). Default: the "
          "client's.");
ABSL_FLAG(std::string, server_bin, GRADSNAP_SERVER_BIN,
          "gradsnap-server binary. Default: the build's.");
ABSL_FLAG(bool, bare_server, false,
          "Internal: run as the bare gRPC server child (same --bytes and --ranks).");

namespace gs = gradsnap;
namespace {

using gs::bench::CpuSeconds;
using gs::bench::CpuSecondsOf;
using gs::bench::DropPageCache;

struct Data {
  std::vector<gs::storage::ShardSpec> specs;   // per rank
  std::vector<std::vector<std::string>> bufs;  // per rank, per tensor
  std::vector<std::string> restore;            // per rank, pre-touched
  uint64_t total = 0;
};

// Deterministic: the bare server child builds the same bytes from the same flags.
Data MakeData(uint64_t bytes, int ranks, bool restore_buffers) {
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
    if (restore_buffers) d.restore.push_back(std::string(bytes / ranks, '\1'));
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

absl::Status CheckRestored(const Data& d, const char* what) {
  for (size_t r = 0; r < d.bufs.size(); ++r) {
    uint64_t off = 0;
    for (const auto& b : d.bufs[r]) {
      if (std::memcmp(d.restore[r].data() + off, b.data(), b.size()) != 0) {
        return absl::DataLossError(absl::StrCat(what, " restore differs in rank ", r));
      }
      off += b.size();
    }
  }
  return absl::OkStatus();
}

// One timed transfer: wall seconds and the CPU seconds of this process (the client, or the
// engine) and of the server process.
struct Side {
  double secs = 0, client_cpu = 0, server_cpu = 0;
};

// Times fn() as a Side; server_pid 0: no server process.
absl::StatusOr<Side> Timed(int server_pid, const std::function<absl::StatusOr<double>()>& fn) {
  const double c0 = CpuSeconds();
  const double s0 = server_pid > 0 ? CpuSecondsOf(server_pid) : 0;
  Side side;
  ASSIGN_OR_RETURN(side.secs, fn());
  side.client_cpu = CpuSeconds() - c0;
  side.server_cpu = server_pid > 0 ? CpuSecondsOf(server_pid) - s0 : 0;
  return side;
}

struct SaveRestore {
  Side save, restore;
};

// ---- the bare gRPC server (child process) ----

// Calls send(message) for every piece of at most kMaxDataBytes of bufs, in order: a message
// with the piece's payload offset in field offset_field and the piece itself, lent to gRPC
// uncopied, in data_field (the bytes stay alive for the whole run). False as soon as send is.
bool SendPieces(const std::vector<std::string>& bufs, uint32_t offset_field, uint32_t data_field,
                const std::function<bool(grpc::ByteBuffer)>& send) {
  uint64_t offset = 0;
  for (const std::string& b : bufs) {
    for (size_t pos = 0; pos < b.size(); pos += gs::proto::kMaxDataBytes) {
      const size_t n = std::min<size_t>(gs::proto::kMaxDataBytes, b.size() - pos);
      std::vector<grpc::Slice> data;
      data.push_back(gs::proto::OwnedSlice(const_cast<char*>(b.data() + pos), n, [] {}));
      gs::proto::RawMessageBuilder msg;
      msg.AddVarint(offset_field, offset);
      msg.AddSlices(data_field, std::move(data), n);
      if (!send(msg.Finish())) return false;
      offset += n;
    }
  }
  return true;
}

// Write and Read only, as raw methods like gradsnap-server's (service/storage_service.h):
// Write counts what arrives, Read sends rank r's bytes as slices over the memory holding them.
class BareService final : public gs::v1::Storage::Service {
 public:
  explicit BareService(const Data* d) : d_(d) {
    MarkMethodStreamed(
        gs::proto::method::kWrite,
        new grpc::internal::BidiStreamingHandler<BareService, grpc::ByteBuffer,
                                                 gs::v1::WriteResponse>(
            [](BareService*, grpc::ServerContext*,
               grpc::ServerReaderWriter<gs::v1::WriteResponse, grpc::ByteBuffer>* stream) {
              return BareWrite(stream);
            },
            this));
    MarkMethodStreamed(
        gs::proto::method::kRead,
        new grpc::internal::SplitServerStreamingHandler<gs::v1::ReadRequest, grpc::ByteBuffer>(
            [this](grpc::ServerContext*,
                   grpc::ServerSplitStreamer<gs::v1::ReadRequest, grpc::ByteBuffer>* stream) {
              return BareRead(stream);
            }));
  }

 private:
  static grpc::Status BareWrite(
      grpc::ServerReaderWriter<gs::v1::WriteResponse, grpc::ByteBuffer>* stream) {
    grpc::ByteBuffer bb;
    uint64_t received = 0;
    while (stream->Read(&bb)) received += bb.Length();
    gs::v1::WriteResponse resp;
    resp.set_committed_size(received);
    stream->Write(resp);
    return grpc::Status::OK;
  }

  grpc::Status BareRead(grpc::ServerSplitStreamer<gs::v1::ReadRequest, grpc::ByteBuffer>* stream) {
    gs::v1::ReadRequest req;
    if (!stream->Read(&req) || req.rank() < 0 ||
        req.rank() >= static_cast<int>(d_->bufs.size())) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "rank");
    }
    const bool sent = SendPieces(d_->bufs[req.rank()], gs::proto::field::kReadOffset,
                                 gs::proto::field::kReadData,
                                 [&](grpc::ByteBuffer bb) { return stream->Write(bb); });
    if (!sent) return grpc::Status(grpc::StatusCode::CANCELLED, "gone");
    return grpc::Status::OK;
  }

  const Data* d_;
};

// The child: serves until killed. Prints the readiness line ServerProcess waits for.
int RunBareServer(uint64_t bytes, int ranks) {
  const Data d = MakeData(bytes, ranks, /*restore_buffers=*/false);
  BareService service(&d);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(static_cast<int>(gs::proto::kMaxMessageBytes));
  builder.SetMaxSendMessageSize(static_cast<int>(gs::proto::kMaxMessageBytes));
  for (const auto& [name, value] : gs::proto::TransportArgs()) {
    builder.AddChannelArgument(name, value);
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    std::fprintf(stderr, "service_bench: bare server did not start\n");
    return 1;
  }
  std::printf("gradsnap-server listening on 127.0.0.1:%d\n", port);
  std::fflush(stdout);
  server->Wait();  // SIGTERM ends the process
  return 0;
}

// ---- the phases ----

absl::StatusOr<SaveRestore> RunBare(const Data& d, int ranks) {
  char self[4096];
  const ssize_t len = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return absl::InternalError("cannot find /proc/self/exe");
  self[len] = '\0';
  gs::testing::ServerProcess server(self);
  RETURN_IF_ERROR(server.Start({"--bare_server", absl::StrCat("--bytes=", absl::GetFlag(FLAGS_bytes)),
                                absl::StrCat("--ranks=", ranks)}));
  // The remote client's channels: its connections to a node, taken in turn by the ranks'
  // streams (ClientOptions::connections_per_node).
  const int connections = gs::client::ClientOptions().connections_per_node;
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < connections; ++i) {
    channels.push_back(gs::client::remote::MakeChannel(server.address(),
                                                       grpc::InsecureChannelCredentials()));
  }
  SaveRestore out;
  ASSIGN_OR_RETURN(out.save, Timed(server.pid(), [&] {
    return Parallel(ranks, [&](int r) -> absl::Status {
      const auto& channel = channels[static_cast<size_t>(r % connections)];
      grpc::ClientContext ctx;
      gs::v1::WriteResponse resp;
      const grpc::internal::RpcMethod method("/gradsnap.v1.Storage/Write",
                                             grpc::internal::RpcMethod::CLIENT_STREAMING,
                                             channel);
      std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> stream(
          grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel.get(), method,
                                                                       &ctx, &resp));
      if (!SendPieces(d.bufs[r], gs::proto::field::kWriteOffset, gs::proto::field::kWriteData,
                      [&](grpc::ByteBuffer bb) { return stream->Write(bb); })) {
        return absl::UnavailableError("bare upload broke");
      }
      stream->WritesDone();
      grpc::Status st = stream->Finish();
      if (!st.ok()) return absl::UnavailableError(st.error_message());
      if (resp.committed_size() < d.total / d.bufs.size()) {
        return absl::DataLossError("bare upload lost bytes");
      }
      return absl::OkStatus();
    });
  }));
  Data& m = const_cast<Data&>(d);
  ASSIGN_OR_RETURN(out.restore, Timed(server.pid(), [&] {
    return Parallel(ranks, [&](int r) -> absl::Status {
      const auto& channel = channels[static_cast<size_t>(r % connections)];
      grpc::ClientContext ctx;
      gs::v1::ReadRequest req;
      req.set_rank(r);
      const grpc::internal::RpcMethod method("/gradsnap.v1.Storage/Read",
                                             grpc::internal::RpcMethod::SERVER_STREAMING,
                                             channel);
      std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> stream(
          grpc::internal::ClientReaderFactory<grpc::ByteBuffer>::Create(channel.get(), method,
                                                                       &ctx, req));
      grpc::ByteBuffer bb;
      uint64_t off = 0;
      absl::Status status;
      while (status.ok() && stream->Read(&bb)) {
        status = gs::proto::ForEachField(
            bb, "Read message", absl::StatusCode::kDataLoss,
            [&](gs::proto::RawField& f) -> absl::Status {
              if (f.number != gs::proto::field::kReadData) return absl::OkStatus();
              for (const grpc::Slice& piece : f.pieces) {
                if (piece.size() > m.restore[r].size() - off) {
                  return absl::DataLossError("too many bytes");
                }
                std::memcpy(m.restore[r].data() + off, piece.begin(), piece.size());
                off += piece.size();
              }
              return absl::OkStatus();
            });
      }
      if (!status.ok()) ctx.TryCancel();
      grpc::Status st = stream->Finish();
      RETURN_IF_ERROR(status);
      if (!st.ok()) return absl::UnavailableError(st.error_message());
      return absl::OkStatus();
    });
  }));
  RETURN_IF_ERROR(CheckRestored(d, "bare"));
  return out;
}

absl::Status ReadShard(gs::storage::Engine* engine, int r, std::string* out) {
  ASSIGN_OR_RETURN(auto reader, engine->OpenShardReader("bench", 1, r));
  uint64_t off = 0;
  for (;;) {
    size_t want = std::min<uint64_t>(4 << 20, out->size() - off);
    if (want == 0) break;
    ASSIGN_OR_RETURN(size_t got, reader->Read(off, out->data() + off, want));
    if (got == 0) break;
    off += got;
  }
  return absl::OkStatus();
}

absl::StatusOr<SaveRestore> RunEngine(const Data& d, gs::storage::EngineOptions eo, int ranks) {
  ASSIGN_OR_RETURN(auto engine, gs::storage::Engine::Open(eo));
  RETURN_IF_ERROR(engine->BeginCheckpoint(Spec(1, ranks)));
  SaveRestore t;
  ASSIGN_OR_RETURN(t.save, Timed(0, [&] {
    return Parallel(ranks, [&](int r) {
      std::vector<const void*> ptrs;
      for (const auto& b : d.bufs[r]) ptrs.push_back(b.data());
      return engine->WriteShard(d.specs[r], ptrs);
    });
  }));
  DropPageCache(eo.data_dir);
  Data& m = const_cast<Data&>(d);
  ASSIGN_OR_RETURN(t.restore, Timed(0, [&] {
    return Parallel(ranks, [&](int r) { return ReadShard(engine.get(), r, &m.restore[r]); });
  }));
  RETURN_IF_ERROR(CheckRestored(d, "engine"));
  return t;
}

absl::StatusOr<SaveRestore> RunService(const Data& d, const std::string& data_dir, int ranks,
                                       uint64_t cache_bytes) {
  gs::testing::ServerProcess server(absl::GetFlag(FLAGS_server_bin));
  RETURN_IF_ERROR(server.StartOn(data_dir, "127.0.0.1:0",
                                 {absl::StrCat("--cache-bytes=", cache_bytes),
                                  absl::StrCat("--max-inflight-bytes=", 1ull << 30),
                                  absl::StrCat("--zstd-level=", absl::GetFlag(FLAGS_zstd_level))}));
  gs::client::ClientOptions co;
  co.endpoints = {server.address()};
  co.read_streams = absl::GetFlag(FLAGS_read_streams);
  ASSIGN_OR_RETURN(auto client, gs::client::NewRemoteClient(co));
  RETURN_IF_ERROR(client->BeginCheckpoint(Spec(1, ranks)));
  SaveRestore t;
  ASSIGN_OR_RETURN(t.save, Timed(server.pid(), [&] {
    return Parallel(ranks, [&](int r) {
      std::vector<gs::client::TensorRef> refs;
      const gs::storage::ShardSpec& spec = d.specs[r];
      for (size_t i = 0; i < spec.tensors.size(); ++i) {
        refs.push_back({spec.tensors[i], d.bufs[r][i].data()});
      }
      return client->SaveShard(spec, refs);
    });
  }));
  DropPageCache(data_dir);
  Data& m = const_cast<Data&>(d);
  ASSIGN_OR_RETURN(t.restore, Timed(server.pid(), [&] {
    return Parallel(ranks, [&](int r) -> absl::Status {
      uint64_t off = 0;
      return client->RestoreShard("bench", 1, r, [&](const void* p, size_t n) {
        if (n > m.restore[r].size() - off) return absl::DataLossError("too many bytes");
        std::memcpy(m.restore[r].data() + off, p, n);
        off += n;
        return absl::OkStatus();
      });
    });
  }));
  RETURN_IF_ERROR(CheckRestored(d, cache_bytes > 0 ? "cached" : "service"));
  return t;
}

// ---- one pass, and the medians ----

struct Pass {
  SaveRestore engine, service, cached, bare;
};

absl::StatusOr<Pass> RunPass(const Data& d, const std::string& root, int pass, int ranks) {
  auto dir = [&](const char* name) { return absl::StrCat(root, "/", name, pass); };
  Pass p;
  std::vector<std::function<absl::Status()>> phases = {
      [&]() -> absl::Status {
        gs::storage::EngineOptions eo;
        eo.data_dir = dir("engine");
        eo.zstd_level = absl::GetFlag(FLAGS_zstd_level);
        ASSIGN_OR_RETURN(p.engine, RunEngine(d, eo, ranks));
        return absl::OkStatus();
      },
      [&]() -> absl::Status {
        ASSIGN_OR_RETURN(p.service, RunService(d, dir("service"), ranks, 0));
        return absl::OkStatus();
      },
      [&]() -> absl::Status {
        // The budget holds the checkpoint with room to spare.
        ASSIGN_OR_RETURN(p.cached, RunService(d, dir("cached"), ranks, d.total + (64u << 20)));
        return absl::OkStatus();
      },
      [&]() -> absl::Status {
        ASSIGN_OR_RETURN(p.bare, RunBare(d, ranks));
        return absl::OkStatus();
      },
  };
  if (pass % 2 == 1) std::reverse(phases.begin(), phases.end());
  absl::Status s;
  for (auto& phase : phases) {
    if (s.ok()) s = phase();
  }
  std::error_code ec;
  for (const char* name : {"engine", "service", "cached"}) std::filesystem::remove_all(dir(name), ec);
  if (!s.ok()) return s;
  return p;
}


}  // namespace

int main(int argc, char** argv) {
  gs::bench::InitBenchmark(
      argc, argv, "service_bench",
      "[--bytes N] [--ranks R] [--passes P] [--read_streams S] [--dir D] [--server_bin PATH]\n"
      "Figures are medians over the passes (phase order alternating).");
  const uint64_t bytes = gs::bench::ParseBytes(absl::GetFlag(FLAGS_bytes));
  if (bytes == 0) gs::bench::BadFlag("--bytes must be a positive size such as 256M or 8G");
  const int ranks = std::max(1, absl::GetFlag(FLAGS_ranks));
  const int npasses = gs::bench::Passes("service_bench");
  // The allocator settings of gradsnap-server for the bare server, of the gradsnap CLI for
  // this process (the client), so that both paths pay the same for their receive buffers.
  gs::TuneMallocForStreaming(/*few_arenas=*/absl::GetFlag(FLAGS_bare_server));
  if (absl::GetFlag(FLAGS_bare_server)) return RunBareServer(bytes, ranks);
  signal(SIGPIPE, SIG_IGN);
  char tmpl[4096];
  std::snprintf(tmpl, sizeof(tmpl), "%s/service-bench-XXXXXX", absl::GetFlag(FLAGS_dir).c_str());
  if (mkdtemp(tmpl) == nullptr) {
    std::fprintf(stderr, "service_bench: cannot create a directory in %s\n",
                 absl::GetFlag(FLAGS_dir).c_str());
    return 1;
  }
  const std::string root = tmpl;
  const Data d = MakeData(bytes, ranks, /*restore_buffers=*/true);
  const double gib = d.total / double(1ull << 30);
  const double gb = d.total / 1e9;
  std::printf("data: %.2f GiB in %d shards, zstd level %d, %d passes\n", gib, ranks,
              absl::GetFlag(FLAGS_zstd_level), npasses);
  std::vector<Pass> passes;
  for (int pass = 0; pass < npasses; ++pass) {
    absl::StatusOr<Pass> p = RunPass(d, root, pass, ranks);
    if (!p.ok()) {
      std::fprintf(stderr, "service_bench: %s\n", p.status().ToString().c_str());
      std::error_code ec;
      std::filesystem::remove_all(root, ec);
      return 1;
    }
    auto cpu = [&](const Side& s) { return (s.client_cpu + s.server_cpu) / gb; };
    std::printf(
        "pass %d: GiB/s engine save %.2f restore %.2f | service save %.2f restore(disk) %.2f | "
        "cached save %.2f restore(RAM) %.2f | bare gRPC upload %.2f download %.2f\n",
        pass, gib / p->engine.save.secs, gib / p->engine.restore.secs,
        gib / p->service.save.secs, gib / p->service.restore.secs, gib / p->cached.save.secs,
        gib / p->cached.restore.secs, gib / p->bare.save.secs, gib / p->bare.restore.secs);
    std::printf(
        "pass %d: CPU-s/GB client+server: engine save %.2f restore %.2f | service save "
        "%.2f+%.2f restore %.2f+%.2f | cached save %.2f+%.2f restore %.2f+%.2f | bare up %.2f "
        "down %.2f\n",
        pass, cpu(p->engine.save), cpu(p->engine.restore), p->service.save.client_cpu / gb,
        p->service.save.server_cpu / gb, p->service.restore.client_cpu / gb,
        p->service.restore.server_cpu / gb, p->cached.save.client_cpu / gb,
        p->cached.save.server_cpu / gb, p->cached.restore.client_cpu / gb,
        p->cached.restore.server_cpu / gb, cpu(p->bare.save), cpu(p->bare.restore));
    std::fflush(stdout);
    passes.push_back(*std::move(p));
  }
  std::error_code ec;
  std::filesystem::remove_all(root, ec);
  // name -> median over passes; ratios are medians of per-pass ratios.
  std::vector<std::pair<std::string, double>> keys;
  auto add = [&](const std::string& name, const std::function<double(const Pass&)>& f) {
    keys.emplace_back(name, gs::bench::MedianOver(passes, f));
  };
  add("save_ratio", [](const Pass& p) { return p.engine.save.secs / p.service.save.secs; });
  add("restore_ratio",
      [](const Pass& p) { return p.engine.restore.secs / p.service.restore.secs; });
  add("restore_cache_ratio",
      [](const Pass& p) { return p.bare.restore.secs / p.cached.restore.secs; });
  add("restore_cache_speedup",
      [](const Pass& p) { return p.service.restore.secs / p.cached.restore.secs; });
  add("save_ratio_with_cache",
      [](const Pass& p) { return p.engine.save.secs / p.cached.save.secs; });
  add("save_bound_ratio", [](const Pass& p) { return p.engine.save.secs / p.bare.save.secs; });
  add("restore_bound_ratio",
      [](const Pass& p) { return p.engine.restore.secs / p.bare.restore.secs; });
  auto per_gb = [gb](double s) { return s / gb; };
  add("save_cpu_s_per_gb", [&](const Pass& p) {
    return per_gb(p.service.save.client_cpu + p.service.save.server_cpu);
  });
  add("restore_cpu_s_per_gb", [&](const Pass& p) {
    return per_gb(p.service.restore.client_cpu + p.service.restore.server_cpu);
  });
  // Client and server CPU apart, through the server and through the RAM tier:
  // {,cached_}{save,restore}_{client,server}_cpu_s_per_gb.
  struct Named {
    const char* name;
    SaveRestore Pass::*run;
  };
  for (const Named& mode : {Named{"", &Pass::service}, Named{"cached_", &Pass::cached}}) {
    for (const bool save : {true, false}) {
      for (const bool client : {true, false}) {
        add(absl::StrCat(mode.name, save ? "save" : "restore", client ? "_client" : "_server",
                         "_cpu_s_per_gb"),
            [&, mode, save, client](const Pass& p) {
              const Side& side = save ? (p.*mode.run).save : (p.*mode.run).restore;
              return per_gb(client ? side.client_cpu : side.server_cpu);
            });
      }
    }
  }
  add("engine_save_cpu_s_per_gb", [&](const Pass& p) { return per_gb(p.engine.save.client_cpu); });
  add("engine_restore_cpu_s_per_gb",
      [&](const Pass& p) { return per_gb(p.engine.restore.client_cpu); });
  add("bare_cpu_s_per_gb_up",
      [&](const Pass& p) { return per_gb(p.bare.save.client_cpu + p.bare.save.server_cpu); });
  add("bare_cpu_s_per_gb_down", [&](const Pass& p) {
    return per_gb(p.bare.restore.client_cpu + p.bare.restore.server_cpu);
  });
  add("bare_grpc_gibps", [gib](const Pass& p) { return gib / p.bare.restore.secs; });
  add("bare_upload_gibps", [gib](const Pass& p) { return gib / p.bare.save.secs; });
  std::string line = absl::StrCat("bytes=", d.total);
  for (const auto& [name, value] : keys) {
    char v[32];
    std::snprintf(v, sizeof(v), "%.3f", value);
    absl::StrAppend(&line, " ", name, "=", v);
  }
  std::printf("%s\n", line.c_str());
  return 0;
}
