// client_bench: save and restore of one large shard through the embedded client, measured in
// the same run against the storage engine used directly, plus a safetensors export.
//
//   build/bin/client_bench [--bytes N] [--dir DIR] [--export_dir DIR] [--passes N]
//                          [--compressible] [--keep]
//
// An export reads every byte from the store and writes it to a file. It runs twice per pass:
//   - to --export_dir (default /dev/shm, a tmpfs): a destination that does not compete with the
//     store's disk, so export ÷ restore measures gradsnap's own cost (the header, the copy into
//     the file writer's buffers, the writes) against a restore into memory: export_ratio.
//     A tmpfs costs CPU instead of disk time (the kernel allocates and fills a page per 4 KiB:
//     export_dir_writer_gbps), which a machine short of cores charges to the export; and it
//     holds the file in memory, beside the bench's two --bytes buffers: for shards near the
//     machine's memory pass a directory on a second disk;
//   - to --dir, the store's own disk: what a user exporting next to the store gets, where reads
//     and writes share the disk: export_same_disk_ratio, next to export_bound_ratio, the disk's
//     own limit for it (raw O_DIRECT reads alone ÷ the same reads while as many bytes are
//     written; on a disk whose reads and writes share its bandwidth it stays below 1).
// The restore, both exports (their order alternating), the export's two halves alone and the
// raw bound run once per pass, --passes times interleaved, so a disk whose speed drifts between
// passes (a VM's virtual disk) moves them together; every figure is the median over the passes,
// each ratio the median of its per-pass ratios. Saves and the engine restore run once.
//
// Last line (GB = 1e9 bytes): bytes= passes= engine_save_gbps= client_save_gbps= save_ratio=
// engine_restore_gbps= client_restore_gbps= restore_ratio= export_gbps= export_ratio= (export to
// --export_dir ÷ client restore) save_cpu_s_per_gb= restore_cpu_s_per_gb= export_cpu_s_per_gb=
// (process CPU seconds per GB of the client save, restore, export to --export_dir)
// raw_read_gbps= raw_read_while_writing_gbps= export_bound_ratio= export_same_disk_gbps=
// export_same_disk_ratio= (export to --dir ÷ client restore) export_same_disk_of_bound=
// (export_same_disk_ratio ÷ export_bound_ratio: how close the same-disk export comes to what
// the disk allows) export_dir_writer_gbps= (the file writer alone, from memory to
// --export_dir: that destination's own speed; on tmpfs the kernel's page allocation and copy,
// CPU an export shares with the restore it runs) export_dir_bound_ratio= (client restore ÷ the
// slower of the export's halves alone, streaming restore and writer to --export_dir: what
// export_ratio reaches if the two overlap fully; on a machine short of cores it cannot)
// restore_user_cpu_s_per_gb= export_user_cpu_s_per_gb= (user CPU seconds per GB alone, without
// the kernel's: gradsnap's own work in a restore and in an export, whatever the destination).
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "benchmarks/common/bench_util.h"
#include "benchmarks/common/passes.h"
#include "client/client.h"
#include "client/direct_file_writer.h"
#include "client/safetensors.h"
#include "common/clock.h"
#include "common/status.h"
#include "storage/aligned_buffer.h"
#include "storage/engine.h"

ABSL_FLAG(std::string, bytes, "1G",
          "Shard size: bytes, or with a K/M/G/T suffix (binary). Default: 1G.");
ABSL_FLAG(std::string, dir, "/tmp",
          "Scratch directory on the disk under test: the store and the same-disk export "
          "(removed afterwards). Default: /tmp.");
ABSL_FLAG(std::string, export_dir, "/dev/shm",
          "Destination of the export that does not compete with --dir's disk (export_ratio); "
          "needs --bytes free. Default: /dev/shm (a tmpfs: memory, no disk).");
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

// Times of one pass (seconds), CPU seconds of the timed client calls.
struct Pass {
  double restore = 0, export_sep = 0, export_same = 0, stream = 0, writer = 0, sep_writer = 0;
  double restore_cpu = 0, export_cpu = 0, restore_user = 0, export_user = 0;
  RawBound raw;
};

// Exports shard 0 of `m` to `path`, timed; removes the file afterwards (it only takes space).
bool TimedExport(client::Client& c, const client::Manifest& m, const std::string& path,
                 double* secs, double* cpu, double* user) {
  double cpu0 = CpuSeconds(), user0 = bench::UserCpuSeconds();
  Stopwatch w;
  absl::Status s = client::ExportShardSafetensors(c, m, 0, path);
  *secs = w.ElapsedSeconds();
  *cpu = CpuSeconds() - cpu0;
  *user = bench::UserCpuSeconds() - user0;
  if (!s.ok()) {
    Fail(s, "export");
    return false;
  }
  return true;
}

// The file writer alone: `bytes` from memory to `path`, 4 MiB appends, as an export hands them.
absl::Status TimedWriter(const std::string& path, const char* src, uint64_t bytes, double* secs) {
  Stopwatch w;  // the file's creation included, as in an export
  auto writer = client::DirectFileWriter::Create(path, storage::FileSystem::Default(), bytes);
  if (!writer.ok()) return writer.status();
  for (uint64_t off = 0; off < bytes; off += 4u << 20) {
    RETURN_IF_ERROR((*writer)->Append(src + off, std::min<uint64_t>(4u << 20, bytes - off)));
  }
  RETURN_IF_ERROR((*writer)->Finish());
  *secs = w.ElapsedSeconds();
  return absl::OkStatus();
}

// One pass: restore, both exports (same-disk first on even passes), the export's halves alone,
// the disk's bound. `root` is on --dir, `sep` names the export file under --export_dir.
bool RunPass(int index, client::Client& c, const client::Manifest& m, const std::string& root,
             const std::string& sep, const std::vector<uint32_t>& src, std::vector<char>* out,
             Pass* p) {
  const uint64_t bytes = out->size();
  double cpu0 = CpuSeconds(), user0 = bench::UserCpuSeconds();
  Stopwatch w;
  if (auto s = c.RestoreTensor("bench", 1, 0, "w", out->data(), out->size()); !s.ok()) {
    Fail(s, "client restore");
    return false;
  }
  p->restore = w.ElapsedSeconds();
  p->restore_cpu = CpuSeconds() - cpu0;
  p->restore_user = bench::UserCpuSeconds() - user0;
  if (std::memcmp(out->data(), src.data(), bytes) != 0) {
    Fail(absl::DataLossError("restored bytes differ"), "client restore");
    return false;
  }
  const std::string same = root + "/w.safetensors";
  double unused_cpu = 0, unused_user = 0;
  auto to_same = [&] {
    return TimedExport(c, m, same, &p->export_same, &unused_cpu, &unused_user);
  };
  auto to_sep = [&] {
    return TimedExport(c, m, sep, &p->export_sep, &p->export_cpu, &p->export_user);
  };
  bool ok = index % 2 == 0 ? to_same() && to_sep() : to_sep() && to_same();
  std::filesystem::remove(sep);
  if (!ok) return false;
  w.Restart();
  auto discard = [](const void*, size_t) { return absl::OkStatus(); };
  if (auto s = c.RestoreShard("bench", 1, 0, discard); !s.ok()) {
    Fail(s, "stream restore");
    return false;
  }
  p->stream = w.ElapsedSeconds();
  const char* raw = reinterpret_cast<const char*>(src.data());
  absl::Status ws = TimedWriter(root + "/raw.bin", raw, bytes, &p->writer);
  if (ws.ok()) ws = TimedWriter(sep + ".raw", raw, bytes, &p->sep_writer);
  std::filesystem::remove(sep + ".raw");
  if (!ws.ok()) {
    Fail(ws, "file writer");
    return false;
  }
  if (!MeasureRawBound(root, same, bytes, &p->raw)) {
    Fail(absl::InternalError("raw io_uring O_DIRECT I/O failed"), "disk bound");
    return false;
  }
  std::filesystem::remove(same);
  return true;
}

// DIR exists and has room for an export of `bytes` (a tmpfs default needs the memory).
bool CheckExportDir(const std::string& dir, uint64_t bytes) {
  struct statvfs st;
  if (::statvfs(dir.c_str(), &st) != 0) {
    std::fprintf(stderr, "client_bench: --export_dir %s: %s\n", dir.c_str(), std::strerror(errno));
    return false;
  }
  uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  if (free_bytes < bytes + (64u << 20)) {
    std::fprintf(stderr,
                 "client_bench: --export_dir %s has %llu bytes free, an export needs %llu; "
                 "pass --export_dir on another disk (or a larger tmpfs)\n",
                 dir.c_str(), static_cast<unsigned long long>(free_bytes),
                 static_cast<unsigned long long>(bytes));
    return false;
  }
  return true;
}

int Run() {
  const uint64_t bytes = bench::ParseBytes(absl::GetFlag(FLAGS_bytes)) / 4 * 4;
  const int passes = bench::Passes("client_bench");
  const std::string export_dir = absl::GetFlag(FLAGS_export_dir);
  if (bytes == 0) {
    std::fprintf(stderr, "client_bench: --bytes must be positive\n");
    return 2;
  }
  if (!CheckExportDir(export_dir, bytes)) return 2;
  const std::string root = absl::StrCat(absl::GetFlag(FLAGS_dir), "/client_bench-", getpid());
  const std::string sep = absl::StrCat(export_dir, "/client_bench-", getpid(), ".safetensors");
  std::vector<uint32_t> src(bytes / 4);
  std::mt19937_64 rng(1);
  const bool comp = absl::GetFlag(FLAGS_compressible);
  for (auto& v : src) v = static_cast<uint32_t>(rng()) & (comp ? 0x0000ffffu : 0xffffffffu);
  storage::TensorSpec t{"w", DType::kF32, {static_cast<int64_t>(bytes / 4)}, bytes, "", 0, 0, ""};
  CheckpointSpec cs{"bench", 1, storage::CheckpointKind::kFull, -1, 1, ""};
  ShardSpec ss{"bench", 1, 0, {t}, ""};
  std::vector<char> out(bytes);
  std::memset(out.data(), 1, out.size());  // pre-touch the restore buffer
  double engine_save = 0, engine_restore = 0, client_save = 0, save_cpu = 0;
  std::vector<Pass> runs(static_cast<size_t>(passes));
  {
    storage::EngineOptions eo;
    eo.data_dir = root + "/engine";
    auto engine = storage::Engine::Open(eo);
    if (!engine.ok()) return Fail(engine.status(), "open engine");
    if (auto s = (*engine)->BeginCheckpoint(cs); !s.ok()) return Fail(s, "begin");
    Stopwatch w;
    if (auto s = (*engine)->WriteShard(ss, {src.data()}); !s.ok()) return Fail(s, "engine save");
    engine_save = w.ElapsedSeconds();
    auto reader = (*engine)->OpenShardReader("bench", 1, 0);
    if (!reader.ok()) return Fail(reader.status(), "engine reader");
    w.Restart();
    if (auto s = (*reader)->ReadTensor(0, out.data(), out.size()); !s.ok()) return Fail(s, "engine restore");
    engine_restore = w.ElapsedSeconds();
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
    client_save = w.ElapsedSeconds();
    save_cpu = CpuSeconds() - cpu0;
    auto m = (*c)->Show("bench", 1);
    if (!m.ok()) return Fail(m.status(), "show");
    for (int i = 0; i < passes; ++i) {
      if (!RunPass(i, **c, *m, root, sep, src, &out, &runs[static_cast<size_t>(i)])) return 1;
    }
  }
  if (absl::GetFlag(FLAGS_keep)) {
    std::printf("kept %s\n", root.c_str());
  } else {
    std::filesystem::remove_all(root);
  }
  auto gbps = [&](double s) { return bytes / s / 1e9; };
  auto med_gbps = [&](double Pass::*f) {
    return bench::MedianOver(runs, [&](const Pass& p) { return gbps(p.*f); });
  };
  const double restore = med_gbps(&Pass::restore), export_sep = med_gbps(&Pass::export_sep);
  const double export_same = med_gbps(&Pass::export_same);
  const double export_ratio = bench::MedianOver(runs, [](const Pass& p) { return p.restore / p.export_sep; });
  const double same_ratio = bench::MedianOver(runs, [](const Pass& p) { return p.restore / p.export_same; });
  const double bound = bench::MedianOver(runs, [](const Pass& p) { return p.raw.read_s / p.raw.read_write_s; });
  const double of_bound = bench::MedianOver(runs, [](const Pass& p) {
    return (p.restore / p.export_same) / (p.raw.read_s / p.raw.read_write_s);
  });
  // An export to --export_dir is the streaming restore and the writer to --export_dir at once:
  // at best they overlap fully (the slower one alone sets the time); where they share too few
  // cores (a tmpfs destination costs kernel CPU) they add up.
  const double dir_bound = bench::MedianOver(runs, [](const Pass& p) {
    return p.restore / std::max(p.stream, p.sep_writer);
  });
  const double raw_read = bench::MedianOver(runs, [&](const Pass& p) { return gbps(p.raw.read_s); });
  const double raw_rw = bench::MedianOver(runs, [&](const Pass& p) { return gbps(p.raw.read_write_s); });
  const double gb = bytes / 1e9;
  const double restore_cpu = bench::MedianOver(runs, [&](const Pass& p) { return p.restore_cpu / gb; });
  const double export_cpu = bench::MedianOver(runs, [&](const Pass& p) { return p.export_cpu / gb; });
  const double restore_user = bench::MedianOver(runs, [&](const Pass& p) { return p.restore_user / gb; });
  const double export_user = bench::MedianOver(runs, [&](const Pass& p) { return p.export_user / gb; });
  std::printf("shard %.2f GiB %s, %d passes (medians; ranges min-max)\n", bytes / double(1ull << 30),
              comp ? "compressible" : "random", passes);
  std::printf("save:    engine %.3f s (%.2f GB/s), client %.3f s (%.2f GB/s)\n", engine_save,
              gbps(engine_save), client_save, gbps(client_save));
  auto range = [&](double Pass::*f) {
    std::vector<double> v;
    for (const Pass& p : runs) v.push_back(gbps(p.*f));
    std::sort(v.begin(), v.end());
    return absl::StrFormat("%.2f GB/s (%.2f-%.2f)", bench::Median(v), v.front(), v.back());
  };
  std::printf("restore: engine %.3f s (%.2f GB/s), client %s\n", engine_restore,
              gbps(engine_restore), range(&Pass::restore).c_str());
  std::printf("export to %s (not the store's disk): %s -> export_ratio %.3f (gradsnap's own "
              "cost)\n",
              export_dir.c_str(), range(&Pass::export_sep).c_str(), export_ratio);
  std::printf("export to %s (the store's disk): %s -> export_same_disk_ratio %.3f\n",
              absl::GetFlag(FLAGS_dir).c_str(), range(&Pass::export_same).c_str(), same_ratio);
  std::printf("alone:   streaming restore %s; file writer from memory to the store's disk %s, "
              "to %s %s\n",
              range(&Pass::stream).c_str(), range(&Pass::writer).c_str(), export_dir.c_str(),
              range(&Pass::sep_writer).c_str());
  std::printf("cpu:     s per GB, user+kernel (user only): restore %.3f (%.3f), export to %s "
              "%.3f (%.3f)\n",
              restore_cpu, restore_user, export_dir.c_str(), export_cpu, export_user);
  std::printf("bound:   export to %s with its halves fully overlapped: export_ratio %.2f at "
              "best (export_dir_bound_ratio)\n",
              export_dir.c_str(), dir_bound);
  std::printf("disk:    raw read %.2f GB/s alone, %.2f GB/s while writing as much (io_uring "
              "O_DIRECT): a same-disk export can reach ratio %.2f at best; it reached %.2f of "
              "that\n",
              raw_read, raw_rw, bound, of_bound);
  std::printf("bytes=%llu passes=%d engine_save_gbps=%.3f client_save_gbps=%.3f save_ratio=%.3f "
              "engine_restore_gbps=%.3f client_restore_gbps=%.3f restore_ratio=%.3f "
              "export_gbps=%.3f export_ratio=%.3f save_cpu_s_per_gb=%.3f "
              "restore_cpu_s_per_gb=%.3f export_cpu_s_per_gb=%.3f raw_read_gbps=%.3f "
              "raw_read_while_writing_gbps=%.3f export_bound_ratio=%.3f "
              "export_same_disk_gbps=%.3f export_same_disk_ratio=%.3f "
              "export_same_disk_of_bound=%.3f export_dir_writer_gbps=%.3f "
              "export_dir_bound_ratio=%.3f restore_user_cpu_s_per_gb=%.3f "
              "export_user_cpu_s_per_gb=%.3f\n",
              static_cast<unsigned long long>(bytes), passes, gbps(engine_save),
              gbps(client_save), engine_save / client_save, gbps(engine_restore), restore,
              gbps(engine_restore) / restore, export_sep, export_ratio, save_cpu / gb,
              restore_cpu, export_cpu, raw_read, raw_rw, bound, export_same, same_ratio,
              of_bound, med_gbps(&Pass::sep_writer), dir_bound, restore_user, export_user);
  return 0;
}

}  // namespace
}  // namespace gradsnap

int main(int argc, char** argv) {
  gradsnap::bench::InitBenchmark(argc, argv,
                                 "client_bench [--bytes N] [--dir DIR] [--export_dir DIR] "
                                 "[--passes N] [--compressible] [--keep]\n"
                                 "Figures are medians over the passes.");
  return gradsnap::Run();
}
