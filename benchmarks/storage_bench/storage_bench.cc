// storage_bench: the storage engine against a plain io_uring O_DIRECT writer/reader, side by
// side on the same file system, on realistic training state.
//
// Each of --ranks shards holds fp32 weights ~N(0, 0.02), Adam moments m ~N(0, 1e-3) and
// v ~ (N(0, 1e-3))^2, and a bf16 step-to-step delta (see Fill), cut into tensors of
// --tensor_mib. The same bytes are written (one thread per rank) by:
//   raw       io_uring, O_DIRECT, queue depth 32, 4 MiB writes straight from the buffers
//   engine    Engine::WriteShard with compression off and on, each mode through its own engine
//             (and data directory) kept open for the whole run, as a server keeps it
// and read back, the page cache dropped before every read (`echo 3 > /proc/sys/vm/drop_caches`
// as root, else fdatasync + POSIX_FADV_DONTNEED per file): raw with io_uring O_DIRECT QD32 and
// with buffered pread (what torch.load gets), the engine with ShardReader::ReadTensor (CRCs and
// digests verified). A third run writes one shard of many small tensors (4 KiB-256 KiB, as
// many as --small_tensors or fit in the bytes) raw and through the engine.
// Every path runs --passes times, the paths of a run interleaved in a rotating order
// (Interleave), and each path's figure is its best pass (Series explains why); the lines above
// the last one print every pass.
// Last line: name=value pairs: passes, write_ratio (engine with compression off ÷ raw O_DIRECT
// write), read_ratio (engine ÷ the best raw read), small_write_ratio, write_cpu_s_per_gb and
// read_cpu_s_per_gb (process CPU seconds per GB of the engine runs, compression off, median
// over the passes; *_first: the first pass), compress_ratio_* (what the codec achieves on that
// data, every chunk compressed), stored_ratio_* (raw ÷ stored bytes the adaptive engine
// actually wrote), write_on_off_ratio and read_on_off_ratio (compression on ÷ off), and GB/s
// of raw bytes per second for each run ("effective" throughput for the compressed one).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "benchmarks/common/bench_util.h"
#include "benchmarks/common/passes.h"
#include "common/clock.h"
#include "storage/aligned_buffer.h"
#include "storage/chunk_codec.h"
#include "storage/engine.h"

ABSL_FLAG(std::string, dir, "./storage_bench.tmp",
          "Scratch directory on the file system to measure (removed at the end). "
          "Default: ./storage_bench.tmp");
ABSL_FLAG(double, total_gib, 2.0, "Total GiB of training state over all ranks. Default: 2");
ABSL_FLAG(std::string, bytes, "",
          "Total bytes of training state, with an optional K/M/G suffix (binary), e.g. 256M or "
          "8G; overrides --total_gib. Default: unset");
ABSL_FLAG(int, small_tensors, 20000,
          "Tensors of 4 KiB-256 KiB in the small-tensor run (fewer if they would exceed the "
          "bytes); 0 skips it. Default: 20000");
ABSL_FLAG(int, ranks, 2, "Shards written and read concurrently, one thread each. Default: 2");
ABSL_FLAG(int, tensor_mib, 16, "Size of each tensor in MiB. Default: 16");
ABSL_FLAG(int, zstd_level, 1, "zstd level of the compression-on run. Default: 1");
ABSL_FLAG(int, encode_threads, -1, "EngineOptions::encode_threads (-1: one per core). Default: -1");
ABSL_FLAG(int, queue_depth, 32, "io_uring queue depth (engine and raw). Default: 32");
ABSL_FLAG(int, chunk_mib, 4, "EngineOptions::chunk_bytes in MiB. Default: 4");
ABSL_FLAG(bool, use_io_uring, true, "Engine uses io_uring (false: pwrite). Default: true");

namespace gradsnap {
namespace storage {
namespace {

using bench::CpuSeconds;
using bench::DropPageCache;
using bench::ParseBytes;

constexpr size_t kRawBlock = 4 << 20;

struct RankState {
  ShardSpec spec;
  std::vector<AlignedBuffer> tensors;
  uint64_t fp32_bytes = 0, bf16_bytes = 0;
};

// Fast normal samples (Box-Muller over xorshift); quality is plenty for byte statistics.
struct Gen {
  uint64_t s;
  uint64_t Next() { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; }
  float Normal(float sigma) {
    double u1 = (static_cast<double>(Next() >> 11) + 1.0) / 9007199254740993.0;
    double u2 = static_cast<double>(Next() >> 11) / 9007199254740992.0;
    return static_cast<float>(sigma * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307 * u2));
  }
};

void Fill(AlignedBuffer* buf, size_t bytes, int kind, uint64_t seed) {
  Gen g{seed * 0x9E3779B97F4A7C15ull + 1};
  if (kind == 3) {
    // bf16 delta between two consecutive steps: bf16(w - u) - bf16(w), rounded to bf16, for
    // weights w ~ N(0, 0.02) and Adam-sized updates u ~ N(0, 1e-4). Updates below half a
    // bf16 ulp leave the weight unchanged, so many entries are exactly zero.
    auto bf16 = [](float f) {
      uint32_t u;
      std::memcpy(&u, &f, 4);
      u += 0x7FFF + ((u >> 16) & 1);  // round to nearest even
      return static_cast<uint16_t>(u >> 16);
    };
    auto widen = [](uint16_t h) {
      uint32_t u = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    };
    auto* p = reinterpret_cast<uint16_t*>(buf->data());
    for (size_t i = 0; i < bytes / 2; ++i) {
      float w = g.Normal(0.02f);
      p[i] = bf16(widen(bf16(w - g.Normal(1e-4f))) - widen(bf16(w)));
    }
    return;
  }
  auto* p = reinterpret_cast<float*>(buf->data());
  for (size_t i = 0; i < bytes / 4; ++i) {
    float f = g.Normal(kind == 0 ? 0.02f : 1e-3f);
    p[i] = kind == 2 ? f * f : f;
  }
}

RankState MakeRank(int rank, uint64_t bytes, size_t tensor_bytes) {
  RankState st;
  st.spec.job = "bench";
  st.spec.rank = rank;
  // 7/8 fp32 (weights, m, v in turn), 1/8 bf16 delta.
  uint64_t done = 0;
  for (int i = 0; done < bytes; ++i) {
    int kind = (i % 8 == 7) ? 3 : i % 3;
    size_t len = std::min<uint64_t>(tensor_bytes, bytes - done);
    size_t es = kind == 3 ? 2 : 4;
    len = len / es * es;
    if (len == 0) break;
    TensorSpec t;
    static const char* kNames[] = {"w", "m", "v", "d"};
    t.name = absl::StrFormat("%s%d", kNames[kind], i);
    t.dtype = kind == 3 ? DType::kBF16 : DType::kF32;
    t.shape = {static_cast<int64_t>(len / es)};
    t.byte_length = len;
    st.tensors.emplace_back(len);
    Fill(&st.tensors.back(), len, kind, rank * 100000 + i);
    (kind == 3 ? st.bf16_bytes : st.fp32_bytes) += len;
    st.spec.tensors.push_back(t);
    done += len;
  }
  return st;
}

// Writes or reads every tensor buffer to/from one file with io_uring, O_DIRECT, QD `qd`, in
// kRawBlock requests straight from the buffers.
bool RawIo(const std::string& path, RankState* st, bool write, int qd) {
  std::vector<bench::IoPiece> pieces;
  uint64_t off = 0;
  for (AlignedBuffer& b : st->tensors) {
    size_t len = AlignUp(b.capacity());
    for (size_t o = 0; o < len; o += kRawBlock) {
      pieces.push_back({b.data() + o, std::min(kRawBlock, len - o), off});
      off += pieces.back().n;
    }
  }
  return bench::RawDirectIo(path, pieces, write, qd);
}

// Reads the file RawIo wrote with plain buffered pread in 4 MiB pieces (kernel read-ahead).
bool BufferedRead(const std::string& path, RankState* st) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  uint64_t off = 0;
  bool ok = true;
  for (AlignedBuffer& b : st->tensors) {
    size_t len = AlignUp(b.capacity());
    for (size_t o = 0; o < len && ok; o += kRawBlock) {
      size_t n = std::min(kRawBlock, len - o);
      ok = ::pread(fd, b.data() + o, n, static_cast<off_t>(off)) == static_cast<ssize_t>(n);
      off += n;
    }
  }
  ::close(fd);
  return ok;
}

// One shard of `count` fp32 tensors of 4 KiB-256 KiB (at most `max_bytes` in all).
RankState MakeSmallRank(int count, uint64_t max_bytes) {
  RankState st;
  st.spec.job = "bench";
  st.spec.rank = 0;
  Gen g{12345};
  uint64_t done = 0;
  for (int i = 0; i < count; ++i) {
    size_t len = (4096 + g.Next() % (252 << 10)) / 4 * 4;
    if (done + len > max_bytes) break;
    TensorSpec t;
    t.name = absl::StrFormat("s%d", i);
    t.dtype = DType::kF32;
    t.shape = {static_cast<int64_t>(len / 4)};
    t.byte_length = len;
    st.tensors.emplace_back(len);
    Fill(&st.tensors.back(), len, i % 3, 900000 + i);
    st.fp32_bytes += len;
    st.spec.tensors.push_back(t);
    done += len;
  }
  return st;
}

// The first error of any phase; Run() stops after the phase and main() exits non-zero.
absl::Mutex g_error_mu;
std::string g_error ABSL_GUARDED_BY(g_error_mu);

void Fail(const std::string& what) {
  absl::MutexLock lock(&g_error_mu);
  if (g_error.empty()) g_error = what;
}

bool HasFailed() {
  absl::MutexLock lock(&g_error_mu);
  return !g_error.empty();
}

// Prints the first error (once) and returns whether there is one.
bool Failed() {
  absl::MutexLock lock(&g_error_mu);
  if (!g_error.empty()) std::fprintf(stderr, "storage_bench: %s\n", g_error.c_str());
  return !g_error.empty();
}

// One measured path (raw write, engine read with compression off, ...) over the passes.
//
// Figures come from each path's BEST pass (least wall time), the same statistic for every
// path. This VM's disk swings between 1.2 and 3.7 GB/s from one pass to the next, and what
// other tenants do to it only ever adds time: the least time of a path is the closest
// estimate of what that path costs when the disk is at its speed, and with several
// interleaved passes each path gets its chance at the disk's fast phases. A median would
// still carry the disk's state into each path's figure whenever most passes of one path
// land in a slow phase. CPU seconds are not set by the disk but the first pass pays one-time
// costs (an engine's buffer pool is empty, pages not yet faulted): they are the median over
// the passes, and the first pass's is printed as well.
struct Series {
  Series() = default;
  explicit Series(std::string n) : name(std::move(n)) {}
  std::string name;
  std::vector<double> wall, cpu;

  double BestWall() const { return *std::min_element(wall.begin(), wall.end()); }
  double MedianCpu() const {
    std::vector<double> v = cpu;
    std::sort(v.begin(), v.end());
    return v.size() % 2 == 1 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  }
};

// Runs f(0..n-1) on n threads; returns wall seconds and stores in *cpu the CPU seconds it took.
template <typename F>
double Parallel(int n, F f, double* cpu = nullptr) {
  double cpu0 = CpuSeconds();
  Stopwatch sw;
  std::vector<std::thread> ts;
  for (int i = 0; i < n; ++i) ts.emplace_back(f, i);
  for (auto& t : ts) t.join();
  double wall = sw.ElapsedSeconds();
  if (cpu != nullptr) *cpu = CpuSeconds() - cpu0;
  return wall;
}

// Parallel() for pass `pass` of a path: records wall and CPU seconds in *s and prints them
// with the GB/s of `bytes`.
template <typename F>
void Measure(Series* s, int pass, int passes, uint64_t bytes, int n, F f) {
  double cpu = 0;
  const double wall = Parallel(n, f, &cpu);
  s->wall.push_back(wall);
  s->cpu.push_back(cpu);
  std::printf("  pass %d/%d  %-24s wall %6.2f s  cpu %6.2f s  %6.2f GB/s\n", pass + 1, passes,
              s->name.c_str(), wall, cpu, bytes / wall / 1e9);
}

// Runs every path once per pass. The order rotates by one each pass (pass p starts with path
// p mod the number of paths): no path always runs first or always follows the same one, so
// neither the disk's drift over a run nor the previous path's write-back lands on one path.
void Interleave(int passes, const std::vector<std::function<void(int)>>& paths) {
  for (int p = 0; p < passes && !HasFailed(); ++p) {
    for (size_t k = 0; k < paths.size() && !HasFailed(); ++k) {
      paths[(static_cast<size_t>(p) + k) % paths.size()](p);
    }
  }
}

// One compression mode: its own engine and data directory, open for the whole run as a
// server keeps it (its buffer pool warms up on the first checkpoint), holding the checkpoint
// of its latest write pass only.
struct Mode {
  int zstd_level = 0;
  std::unique_ptr<Engine> engine;
  int64_t kept = 0;  // the step of the latest write pass (0: none)
  Series write, read;
};

absl::Status OpenMode(const EngineOptions& base, const std::string& dir, int level, Mode* m) {
  EngineOptions o = base;
  o.data_dir = dir;
  o.zstd_level = level;
  m->zstd_level = level;
  auto e = Engine::Open(o);
  if (!e.ok()) return e.status();
  m->engine = std::move(*e);
  return absl::OkStatus();
}

// Deletes the mode's previous checkpoint and syncs, outside the timed part: the disk holds at
// most one checkpoint per mode and the next pass does not write behind the deletion's I/O.
absl::Status DropKept(Mode* m) {
  if (m->kept == 0) return absl::OkStatus();
  absl::Status s = m->engine->Delete("bench", m->kept);
  m->kept = 0;
  ::sync();
  return s;
}

// Writes states (one shard per element, one thread each) as checkpoint `step` of `m`.
void WritePass(Mode* m, std::vector<RankState>* states, int64_t step, int pass, int passes,
               uint64_t bytes, Series* series) {
  absl::Status s = DropKept(m);
  if (s.ok()) {
    const int ranks = static_cast<int>(states->size());
    s = m->engine->BeginCheckpoint({"bench", step, CheckpointKind::kFull, -1, ranks, ""});
  }
  if (!s.ok()) return Fail(s.ToString());
  Measure(series, pass, passes, bytes, static_cast<int>(states->size()), [&](int r) {
    RankState& rs = (*states)[r];
    ShardSpec spec = rs.spec;
    spec.step = step;
    std::vector<const void*> data;
    for (auto& t : rs.tensors) data.push_back(t.data());
    absl::Status ws = m->engine->WriteShard(spec, data);
    if (!ws.ok()) Fail(ws.ToString());
  });
  m->kept = step;
}

// Reads the mode's kept checkpoint back into states, after dropping the page cache.
void ReadPass(Mode* m, std::vector<RankState>* states, const std::string& dir, int pass,
              int passes, uint64_t bytes) {
  DropPageCache(dir);
  Measure(&m->read, pass, passes, bytes, static_cast<int>(states->size()), [&](int r) {
    RankState& rs = (*states)[r];
    auto rd = m->engine->OpenShardReader("bench", m->kept, r);
    if (!rd.ok()) return Fail(rd.status().ToString());
    for (size_t i = 0; i < rs.tensors.size(); ++i) {
      absl::Status s = (*rd)->ReadTensor(i, rs.tensors[i].data(), rs.spec.tensors[i].byte_length);
      if (!s.ok()) return Fail(s.ToString());
    }
  });
}

// What the codec itself achieves on each kind of data (every chunk compressed, no bypass).
double CodecRatio(const RankState& st, DType want, int level, size_t chunk_bytes) {
  CodecOptions co;
  co.zstd_level = level;
  co.max_compressed_ratio = 1.0;
  ChunkEncoder enc(co);
  std::vector<uint8_t> rec(MaxRecordSize(chunk_bytes));
  uint64_t raw = 0, stored = 0;
  for (size_t i = 0; i < st.tensors.size() && raw < (256u << 20); ++i) {
    const TensorSpec& t = st.spec.tensors[i];
    if (t.dtype != want) continue;
    for (uint64_t off = 0; off < t.byte_length; off += chunk_bytes) {
      size_t n = std::min<uint64_t>(chunk_bytes, t.byte_length - off);
      stored += enc.Encode(st.tensors[i].data() + off, n, t.dtype, off, true, rec.data())
                    .stored_len;
      raw += n;
    }
  }
  return stored == 0 ? 0.0 : raw / double(stored);
}

// The same bytes as `small`'s tensors packed back to back in kRawBlock buffers.
RankState PackSmall(const RankState& small, uint64_t small_bytes) {
  RankState packed;
  for (uint64_t off = 0; off < small_bytes; off += kRawBlock) {
    packed.tensors.emplace_back(std::min<uint64_t>(kRawBlock, small_bytes - off));
  }
  uint64_t pos = 0;
  for (size_t i = 0; i < small.tensors.size(); ++i) {
    const uint8_t* p = small.tensors[i].data();
    for (uint64_t left = small.spec.tensors[i].byte_length; left > 0;) {
      size_t n = std::min<uint64_t>(left, kRawBlock - pos % kRawBlock);
      std::memcpy(packed.tensors[pos / kRawBlock].data() + pos % kRawBlock, p, n);
      p += n;
      pos += n;
      left -= n;
    }
  }
  return packed;
}

int Run() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int ranks = absl::GetFlag(FLAGS_ranks);
  const int passes = gradsnap::bench::Passes("storage_bench");
  double gib = absl::GetFlag(FLAGS_total_gib);
  if (!absl::GetFlag(FLAGS_bytes).empty()) {
    gib = ParseBytes(absl::GetFlag(FLAGS_bytes)) / double(1ull << 30);
  }
  if (ranks < 1 || ranks > 64 || gib <= 0 || gib > 64 || absl::GetFlag(FLAGS_tensor_mib) < 1) {
    Fail("--ranks must be 1..64, --bytes (or --total_gib) in (0, 64 GiB], --tensor_mib >= 1");
    return Failed();
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir, ec);
  if (ec) Fail("cannot create " + dir + ": " + ec.message());
  if (Failed()) return 1;
  uint64_t per_rank = static_cast<uint64_t>(gib * (1ull << 30) / ranks);
  size_t tensor_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_tensor_mib)) << 20;
  std::vector<RankState> st(ranks);
  Parallel(ranks, [&](int r) { st[r] = MakeRank(r, per_rank, tensor_bytes); });
  uint64_t total = 0, fp32 = 0, bf16 = 0;
  for (auto& s : st) {
    for (auto& t : s.spec.tensors) total += t.byte_length;
    fp32 += s.fp32_bytes;
    bf16 += s.bf16_bytes;
  }
  std::printf("state: %d ranks, %.2f GiB (%zu tensors per rank), %d passes\n", ranks,
              total / double(1ull << 30), st[0].spec.tensors.size(), passes);
  const int qd = absl::GetFlag(FLAGS_queue_depth);

  EngineOptions o;
  o.encode_threads = absl::GetFlag(FLAGS_encode_threads);
  o.queue_depth = qd;
  o.chunk_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_mib)) << 20;
  o.use_io_uring = absl::GetFlag(FLAGS_use_io_uring);
  Mode off, on;
  off.write.name = "engine write (zstd off)";
  on.write.name = "engine write (zstd on)";
  off.read.name = "engine read (zstd off)";
  on.read.name = "engine read (zstd on)";
  for (auto [m, sub, level] : {std::tuple(&off, "/engine-off", 0),
                               std::tuple(&on, "/engine-on", absl::GetFlag(FLAGS_zstd_level))}) {
    absl::Status s = OpenMode(o, dir + sub, level, m);
    if (!s.ok()) Fail(s.ToString());
  }
  if (Failed()) return 1;

  // Writes: raw, engine off, engine on, interleaved (Interleave), step = pass + 1.
  Series raw_w{"raw write"};
  auto raw_path = [&](int r) { return absl::StrFormat("%s/raw%d", dir, r); };
  Interleave(passes, {
      [&](int p) {
        // As for the engine (DropKept): the previous pass's files go first, outside the
        // timed part, so both write into freshly allocated files.
        for (int r = 0; r < ranks; ++r) ::unlink(raw_path(r).c_str());
        ::sync();
        Measure(&raw_w, p, passes, total, ranks, [&](int r) {
          if (!RawIo(raw_path(r), &st[r], true, qd)) Fail("raw write failed");
        });
      },
      [&](int p) { WritePass(&off, &st, p + 1, p, passes, total, &off.write); },
      [&](int p) { WritePass(&on, &st, p + 1, p, passes, total, &on.write); },
  });
  if (Failed()) return 1;

  // Next to what the codec itself achieves: what the adaptive engine chose to store.
  const double codec_fp32 = CodecRatio(st[0], DType::kF32, on.zstd_level, o.chunk_bytes);
  const double codec_bf16 = CodecRatio(st[0], DType::kBF16, on.zstd_level, o.chunk_bytes);
  auto m = on.engine->GetManifest("bench", on.kept);
  if (!m.ok()) Fail(m.status().ToString());
  if (Failed()) return 1;
  uint64_t fp32_stored = 0, bf16_stored = 0;
  for (const ShardInfo& s : m->shards) {
    for (const TensorInfo& t : s.tensors) {
      (t.spec.dtype == DType::kBF16 ? bf16_stored : fp32_stored) += t.stored_bytes;
    }
  }

  // Reads, the page cache dropped before each: raw O_DIRECT, raw buffered, engine off, on.
  Series raw_r_direct{"raw read (O_DIRECT)"}, raw_r_buffered{"raw read (buffered)"};
  Interleave(passes, {
      [&](int p) {
        DropPageCache(dir);
        Measure(&raw_r_direct, p, passes, total, ranks, [&](int r) {
          if (!RawIo(raw_path(r), &st[r], false, qd)) Fail("raw read failed");
        });
      },
      [&](int p) {
        DropPageCache(dir);
        Measure(&raw_r_buffered, p, passes, total, ranks, [&](int r) {
          if (!BufferedRead(raw_path(r), &st[r])) Fail("raw read failed");
        });
      },
      [&](int p) { ReadPass(&off, &st, dir, p, passes, total); },
      [&](int p) { ReadPass(&on, &st, dir, p, passes, total); },
  });
  if (Failed()) return 1;
  on.engine.reset();

  // Many small tensors in one shard: raw (the same bytes packed back to back, written in
  // 4 MiB O_DIRECT blocks: what the disk can do with them) against the engine with
  // compression off, interleaved as above.
  Series small_raw_w{"raw write (small)"}, small_eng_w{"engine write (small)"};
  uint64_t small_bytes = 0;
  size_t small_count = 0;
  if (absl::GetFlag(FLAGS_small_tensors) > 0) {
    st.clear();  // free the big state first
    absl::Status s = DropKept(&off);
    if (!s.ok()) Fail(s.ToString());
    if (Failed()) return 1;
    std::vector<RankState> small(1);
    small[0] = MakeSmallRank(absl::GetFlag(FLAGS_small_tensors), total);
    small_count = small[0].spec.tensors.size();
    for (const auto& t : small[0].spec.tensors) small_bytes += t.byte_length;
    std::printf("small: %zu tensors, %.2f GiB\n", small_count, small_bytes / double(1ull << 30));
    RankState packed = PackSmall(small[0], small_bytes);
    Interleave(passes, {
        [&](int p) {
          ::unlink((dir + "/raw-small").c_str());
          ::sync();
          Measure(&small_raw_w, p, passes, small_bytes, 1, [&](int) {
            if (!RawIo(dir + "/raw-small", &packed, true, qd)) Fail("raw small write failed");
          });
        },
        [&](int p) { WritePass(&off, &small, 1000 + p, p, passes, small_bytes, &small_eng_w); },
    });
    if (Failed()) return 1;
  }
  off.engine.reset();
  std::filesystem::remove_all(dir, ec);

  const double raw_r = std::min(raw_r_direct.BestWall(), raw_r_buffered.BestWall());
  auto gbs = [&](double secs) { return total / secs / 1e9; };
  std::printf("best of %d passes:\n", passes);
  std::printf("write GB/s: raw %.2f, engine off %.2f, engine on %.2f\n", gbs(raw_w.BestWall()),
              gbs(off.write.BestWall()), gbs(on.write.BestWall()));
  std::printf("read  GB/s: raw O_DIRECT %.2f, raw buffered %.2f, engine off %.2f, engine on %.2f\n",
              gbs(raw_r_direct.BestWall()), gbs(raw_r_buffered.BestWall()),
              gbs(off.read.BestWall()), gbs(on.read.BestWall()));
  if (small_bytes > 0) {
    std::printf("small write GB/s: raw %.2f, engine %.2f\n",
                small_bytes / small_raw_w.BestWall() / 1e9,
                small_bytes / small_eng_w.BestWall() / 1e9);
  }
  std::printf("engine CPU-s per GB, compression off, first pass / median: write %.3f / %.3f, "
              "read %.3f / %.3f\n",
              off.write.cpu[0] / (total / 1e9), off.write.MedianCpu() / (total / 1e9),
              off.read.cpu[0] / (total / 1e9), off.read.MedianCpu() / (total / 1e9));
  const double gb = total / 1e9;
  std::printf(
      "bytes=%llu passes=%d write_ratio=%.3f read_ratio=%.3f small_write_ratio=%.3f "
      "small_tensors=%zu write_cpu_s_per_gb=%.3f read_cpu_s_per_gb=%.3f "
      "write_cpu_s_per_gb_first=%.3f read_cpu_s_per_gb_first=%.3f "
      "compress_ratio_fp32=%.3f compress_ratio_bf16_delta=%.3f "
      "stored_ratio_fp32=%.3f stored_ratio_bf16_delta=%.3f "
      "write_on_off_ratio=%.3f read_on_off_ratio=%.3f "
      "engine_write_gbps_on=%.3f engine_write_gbps_off=%.3f engine_read_gbps_on=%.3f "
      "engine_read_gbps_off=%.3f raw_write_gbps=%.3f raw_read_gbps=%.3f "
      "raw_read_direct_gbps=%.3f raw_read_buffered_gbps=%.3f\n",
      static_cast<unsigned long long>(total), passes, raw_w.BestWall() / off.write.BestWall(),
      raw_r / off.read.BestWall(),
      small_bytes > 0 ? small_raw_w.BestWall() / small_eng_w.BestWall() : 0.0, small_count,
      off.write.MedianCpu() / gb, off.read.MedianCpu() / gb, off.write.cpu[0] / gb,
      off.read.cpu[0] / gb, codec_fp32, codec_bf16,
      fp32 / double(std::max<uint64_t>(fp32_stored, 1)),
      bf16 / double(std::max<uint64_t>(bf16_stored, 1)),
      off.write.BestWall() / on.write.BestWall(), off.read.BestWall() / on.read.BestWall(),
      gbs(on.write.BestWall()), gbs(off.write.BestWall()), gbs(on.read.BestWall()),
      gbs(off.read.BestWall()), gbs(raw_w.BestWall()), gbs(raw_r),
      gbs(raw_r_direct.BestWall()), gbs(raw_r_buffered.BestWall()));
  return 0;
}

}  // namespace
}  // namespace storage
}  // namespace gradsnap

int main(int argc, char** argv) {
  gradsnap::bench::InitBenchmark(
      argc, argv,
      "Measures the gradsnap storage engine against raw io_uring O_DIRECT I/O, each path run\n"
      "--passes times, interleaved, figures from each path's best pass (docs/build.md).\n"
      "Usage: storage_bench [--dir DIR] [--bytes N] [--passes N] [--ranks R] ...");
  return gradsnap::storage::Run();
}
