// client_bench: save and restore of one large shard through the embedded client, measured in
// the same run against the storage engine used directly, plus a safetensors export.
//
//   build/bin/client_bench [--bytes N] [--dir DIR] [--compressible] [--keep]
//
// Last line: engine_save_gbps= client_save_gbps= save_ratio= engine_restore_gbps=
// client_restore_gbps= restore_ratio= export_gbps= export_ratio= (safetensors export ÷ client
// restore throughput) save_cpu_s_per_gb= restore_cpu_s_per_gb= (process CPU seconds per GB of
// the client save and restore) raw_read_gbps= raw_read_while_writing_gbps= export_bound_ratio=
// (the disk's own limit for an export: raw io_uring O_DIRECT reads of the exported file alone ÷
// the same reads while as many bytes are written; on a disk whose reads and writes share its
// bandwidth an export, which reads and writes every byte, stays below 1) (GB = 1e9 bytes).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "benchmarks/common/bench_util.h"
#include "client/client.h"
#include "client/direct_file_writer.h"
#include "client/safetensors.h"
#include "common/clock.h"
#include "storage/aligned_buffer.h"
#include "storage/engine.h"

ABSL_FLAG(uint64_t, bytes, 1ull << 30, "Shard size in bytes. Default: 1 GiB.");
ABSL_FLAG(std::string, dir, "/tmp", "Scratch directory (removed afterwards). Default: /tmp.");
ABSL_FLAG(bool, compressible, false, "Half-zero data instead of random. Default: false.");
ABSL_FLAG(bool, keep, false,
          "Keep the scratch directory (DIR/client_bench-PID; its client/ subdirectory is a "
          "--ckpt-dir for the gradsnap CLI). Default: false.");

namespace gradsnap {
namespace {

using storage::CheckpointSpec;
using storage::ShardSpec;

int Fail(const absl::Status& s, const char* what) {
  std::fprintf(stderr, "client_bench: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

using bench::CpuSeconds;

// What the disk allows an export: the shard's bytes read alone, and read while as many are
// written (an export does both on one disk; where reads and writes share its bandwidth, an
// export cannot reach the restore's speed). io_uring, O_DIRECT, 32 x 4 MiB in flight.
struct RawBound {
  double read_s = 0;       // read alone
  double read_write_s = 0;  // read and write at once
};

bool MeasureRawBound(const std::string& dir, const std::string& file, uint64_t bytes,
                     RawBound* out) {
  constexpr size_t kPiece = 4u << 20;
  constexpr int kDepth = 32;
  storage::AlignedBuffer rbuf(kPiece * kDepth), wbuf(kPiece * kDepth);
  std::memset(wbuf.data(), 0x5a, wbuf.capacity());
  std::vector<bench::IoPiece> reads, writes;
  for (uint64_t off = 0; off + kPiece <= bytes; off += kPiece) {
    size_t slot = (off / kPiece) % kDepth;
    reads.push_back({rbuf.data() + slot * kPiece, kPiece, off});
    writes.push_back({wbuf.data() + slot * kPiece, kPiece, off});
  }
  bench::DropPageCache(dir);
  Stopwatch w;
  if (!bench::RawDirectIo(file, reads, false, kDepth)) return false;
  out->read_s = w.ElapsedSeconds();
  bench::DropPageCache(dir);
  w.Restart();
  bool read_ok = true;
  std::thread reader([&] { read_ok = bench::RawDirectIo(file, reads, false, kDepth); });
  bool write_ok = bench::RawDirectIo(dir + "/raw-rw.bin", writes, true, kDepth);
  reader.join();
  out->read_write_s = w.ElapsedSeconds();
  return read_ok && write_ok;
}

int Run() {
  const uint64_t bytes = absl::GetFlag(FLAGS_bytes) / 4 * 4;
  const std::string root = absl::StrCat(absl::GetFlag(FLAGS_dir), "/client_bench-", getpid());
  std::vector<uint32_t> src(bytes / 4);
  std::mt19937_64 rng(1);
  const bool comp = absl::GetFlag(FLAGS_compressible);
  for (auto& v : src) v = static_cast<uint32_t>(rng()) & (comp ? 0x0000ffffu : 0xffffffffu);
  storage::TensorSpec t{"w", DType::kF32, {static_cast<int64_t>(bytes / 4)}, bytes, "", 0, 0, ""};
  CheckpointSpec cs{"bench", 1, storage::CheckpointKind::kFull, -1, 1, ""};
  ShardSpec ss{"bench", 1, 0, {t}, ""};
  std::vector<char> out(bytes);
  std::memset(out.data(), 1, out.size());  // pre-touch the restore buffer
  // engine save, client save, engine restore, client restore, export, and the two halves of
  // an export alone: the streaming restore into a discarding sink, the file writer from memory.
  double secs[7] = {0, 0, 0, 0, 0, 0, 0};
  RawBound raw;
  double save_cpu = 0, restore_cpu = 0;
  {
    storage::EngineOptions eo;
    eo.data_dir = root + "/engine";
    auto engine = storage::Engine::Open(eo);
    if (!engine.ok()) return Fail(engine.status(), "open engine");
    if (auto s = (*engine)->BeginCheckpoint(cs); !s.ok()) return Fail(s, "begin");
    Stopwatch w;
    if (auto s = (*engine)->WriteShard(ss, {src.data()}); !s.ok()) return Fail(s, "engine save");
    secs[0] = w.ElapsedSeconds();
    auto reader = (*engine)->OpenShardReader("bench", 1, 0);
    if (!reader.ok()) return Fail(reader.status(), "engine reader");
    w.Restart();
    if (auto s = (*reader)->ReadTensor(0, out.data(), out.size()); !s.ok()) return Fail(s, "engine restore");
    secs[2] = w.ElapsedSeconds();
  }
  {
    client::ClientOptions o;
    o.local_dir = root + "/client";
    auto c = client::Client::Connect(o);
    if (!c.ok()) return Fail(c.status(), "connect");
    if (auto s = (*c)->BeginCheckpoint(cs); !s.ok()) return Fail(s, "begin");
    ShardSpec spec{"bench", 1, 0, {}, ""};
    double cpu0 = CpuSeconds();
    Stopwatch w;
    if (auto s = (*c)->SaveShard(spec, {{t, src.data()}}); !s.ok()) return Fail(s, "client save");
    secs[1] = w.ElapsedSeconds();
    save_cpu = CpuSeconds() - cpu0;
    cpu0 = CpuSeconds();
    w.Restart();
    if (auto s = (*c)->RestoreTensor("bench", 1, 0, "w", out.data(), out.size()); !s.ok()) {
      return Fail(s, "client restore");
    }
    secs[3] = w.ElapsedSeconds();
    restore_cpu = CpuSeconds() - cpu0;
    if (std::memcmp(out.data(), src.data(), bytes) != 0) {
      return Fail(absl::DataLossError("restored bytes differ"), "client restore");
    }
    auto m = (*c)->Show("bench", 1);
    if (!m.ok()) return Fail(m.status(), "show");
    w.Restart();
    if (auto s = client::ExportShardSafetensors(**c, *m, 0, root + "/w.safetensors"); !s.ok()) {
      return Fail(s, "export");
    }
    secs[4] = w.ElapsedSeconds();
    w.Restart();
    auto discard = [](const void*, size_t) { return absl::OkStatus(); };
    if (auto s = (*c)->RestoreShard("bench", 1, 0, discard); !s.ok()) {
      return Fail(s, "stream restore");
    }
    secs[5] = w.ElapsedSeconds();
    auto writer = client::DirectFileWriter::Create(root + "/raw.bin");
    if (!writer.ok()) return Fail(writer.status(), "file writer");
    w.Restart();
    absl::Status ws;
    for (uint64_t off = 0; ws.ok() && off < bytes; off += 4u << 20) {
      ws = (*writer)->Append(reinterpret_cast<const char*>(src.data()) + off,
                             std::min<uint64_t>(4u << 20, bytes - off));
    }
    if (ws.ok()) ws = (*writer)->Finish();
    if (!ws.ok()) return Fail(ws, "file writer");
    secs[6] = w.ElapsedSeconds();
    if (!MeasureRawBound(root, root + "/w.safetensors", bytes, &raw)) {
      return Fail(absl::InternalError("raw io_uring O_DIRECT I/O failed"), "disk bound");
    }
  }
  if (absl::GetFlag(FLAGS_keep)) {
    std::printf("kept %s\n", root.c_str());
  } else {
    std::filesystem::remove_all(root);
  }
  auto gbps = [&](double s) { return bytes / s / 1e9; };
  std::printf("shard %.2f GiB %s\n", bytes / double(1ull << 30), comp ? "compressible" : "random");
  std::printf("save:    engine %.3f s (%.2f GB/s), client %.3f s (%.2f GB/s)\n", secs[0],
              gbps(secs[0]), secs[1], gbps(secs[1]));
  std::printf("restore: engine %.3f s (%.2f GB/s), client %.3f s (%.2f GB/s)\n", secs[2],
              gbps(secs[2]), secs[3], gbps(secs[3]));
  std::printf("export:  %.3f s (%.2f GB/s); alone: streaming restore %.2f GB/s, file writer "
              "%.2f GB/s\n",
              secs[4], gbps(secs[4]), gbps(secs[5]), gbps(secs[6]));
  std::printf("disk:    raw read %.2f GB/s alone, %.2f GB/s while writing as much (io_uring "
              "O_DIRECT): an export can reach export_ratio %.2f at best\n",
              gbps(raw.read_s), gbps(raw.read_write_s), raw.read_s / raw.read_write_s);
  std::printf("bytes=%llu engine_save_gbps=%.3f client_save_gbps=%.3f save_ratio=%.3f "
              "engine_restore_gbps=%.3f client_restore_gbps=%.3f restore_ratio=%.3f "
              "export_gbps=%.3f export_ratio=%.3f save_cpu_s_per_gb=%.3f "
              "restore_cpu_s_per_gb=%.3f raw_read_gbps=%.3f raw_read_while_writing_gbps=%.3f "
              "export_bound_ratio=%.3f\n",
              static_cast<unsigned long long>(bytes), gbps(secs[0]), gbps(secs[1]),
              secs[0] / secs[1], gbps(secs[2]), gbps(secs[3]), secs[2] / secs[3], gbps(secs[4]),
              secs[3] / secs[4], save_cpu / (bytes / 1e9), restore_cpu / (bytes / 1e9),
              gbps(raw.read_s), gbps(raw.read_write_s), raw.read_s / raw.read_write_s);
  return 0;
}

}  // namespace
}  // namespace gradsnap

int main(int argc, char** argv) {
  gradsnap::bench::InitBenchmark(
      argc, argv, "client_bench [--bytes N] [--dir DIR] [--compressible] [--keep]");
  return gradsnap::Run();
}
