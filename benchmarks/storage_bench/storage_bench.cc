// storage_bench: the storage engine against a plain io_uring O_DIRECT writer/reader, side by
// side on the same file system, on realistic training state.
//
// Each of --ranks shards holds fp32 weights ~N(0, 0.02), Adam moments m ~N(0, 1e-3) and
// v ~ (N(0, 1e-3))^2, and a bf16 step-to-step delta (see Fill), cut into tensors of
// --tensor_mib. The
// same bytes are written (one thread per rank) by:
//   raw       io_uring, O_DIRECT, queue depth 32, 4 MiB writes straight from the buffers
//   engine    Engine::WriteShard with compression off and on, in the order off, on, on, off
//             (each mode's figure is the mean of its two passes, so drift over a run is shared)
// and read back, the page cache dropped before every read (`echo 3 > /proc/sys/vm/drop_caches`
// as root, else fdatasync + POSIX_FADV_DONTNEED per file): raw with io_uring O_DIRECT QD32 and
// with buffered pread (what torch.load gets), the engine with ShardReader::ReadTensor (CRCs and
// digests verified; off, on, on, off as for the writes). A third run writes one shard of many small tensors (4 KiB-256 KiB, as
// many as --small_tensors or fit in the bytes) raw and through the engine.
// Last line: name=value pairs: write_ratio (engine with compression off ÷ raw O_DIRECT write),
// read_ratio (engine ÷ the best raw read), small_write_ratio, write_cpu_s_per_gb and
// read_cpu_s_per_gb (process CPU seconds per GB of the engine runs, compression off),
// compress_ratio_* (what the codec achieves on that data, every chunk compressed),
// stored_ratio_* (raw ÷ stored bytes the adaptive engine actually wrote), and GB/s of raw
// bytes per second for each run ("effective" throughput for the compressed one).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "benchmarks/common/bench_util.h"
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

// Runs f(0..n-1) on n threads; returns wall seconds and prints (and stores in *cpu) the CPU
// seconds it took.
template <typename F>
double Parallel(int n, F f, const char* what = nullptr, double* cpu = nullptr) {
  double cpu0 = CpuSeconds();
  Stopwatch sw;
  std::vector<std::thread> ts;
  for (int i = 0; i < n; ++i) ts.emplace_back(f, i);
  for (auto& t : ts) t.join();
  double wall = sw.ElapsedSeconds();
  double used = CpuSeconds() - cpu0;
  if (cpu != nullptr) *cpu = used;
  if (what != nullptr) std::printf("  %-24s wall %6.2f s  cpu %6.2f s\n", what, wall, used);
  return wall;
}

// The first error of any phase; Run() stops after the phase and main() exits non-zero.
absl::Mutex g_error_mu;
std::string g_error ABSL_GUARDED_BY(g_error_mu);

void Fail(const std::string& what) {
  absl::MutexLock lock(&g_error_mu);
  if (g_error.empty()) g_error = what;
}

bool Failed() {
  absl::MutexLock lock(&g_error_mu);
  if (!g_error.empty()) std::fprintf(stderr, "storage_bench: %s\n", g_error.c_str());
  return !g_error.empty();
}

int Run() {
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const int ranks = absl::GetFlag(FLAGS_ranks);
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
  std::printf("state: %d ranks, %.2f GiB (%zu tensors per rank)\n", ranks, total / double(1ull << 30),
              st[0].spec.tensors.size());
  const int qd = absl::GetFlag(FLAGS_queue_depth);

  double raw_w = Parallel(ranks, [&](int r) {
    if (!RawIo(absl::StrFormat("%s/raw%d", dir, r), &st[r], true, qd)) Fail("raw write failed");
  }, "raw write");
  if (Failed()) return 1;

  EngineOptions o;
  o.data_dir = dir + "/engine";
  o.encode_threads = absl::GetFlag(FLAGS_encode_threads);
  o.queue_depth = qd;
  o.chunk_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_chunk_mib)) << 20;
  o.use_io_uring = absl::GetFlag(FLAGS_use_io_uring);
  double write_cpu = 0, read_cpu = 0;
  auto write_ckpt = [&](Engine* e, int64_t step, int level) {
    absl::Status s = e->BeginCheckpoint({"bench", step, CheckpointKind::kFull, -1, ranks, ""});
    if (!s.ok()) {
      Fail(s.ToString());
      return 1.0;
    }
    return Parallel(ranks, [&](int r) {
      ShardSpec spec = st[r].spec;
      spec.step = step;
      std::vector<const void*> data;
      for (auto& t : st[r].tensors) data.push_back(t.data());
      absl::Status ws = e->WriteShard(spec, data);
      if (!ws.ok()) Fail(ws.ToString());
    }, level == 0 ? "engine write (zstd off)" : "engine write (zstd on)",
    level == 0 ? &write_cpu : nullptr);
  };
  // Compression off and on, each through its own engine instance on the same directory, in
  // the order off, on, on, off: this VM's disk slows down as a run goes on, so a fixed order
  // would charge the drift to whichever mode runs second. Each mode's time is the mean of its
  // two passes; the repeated passes (steps 3 and 4) are deleted at once to bound the space.
  const int on_level = absl::GetFlag(FLAGS_zstd_level);
  auto write_pass = [&](int64_t step, int level, bool keep) {
    o.zstd_level = level;
    auto engine = Engine::Open(o);
    if (!engine.ok()) {
      Fail(engine.status().ToString());
      return 1.0;
    }
    const double wall = write_ckpt(engine->get(), step, level);
    if (!keep && !Failed()) {
      absl::Status d = (*engine)->Delete("bench", step);
      if (!d.ok()) Fail(d.ToString());
    }
    return wall;
  };
  double eng_w_off = write_pass(1, 0, true);
  if (Failed()) return 1;
  double eng_w_on = write_pass(2, on_level, true);
  if (Failed()) return 1;
  eng_w_on = (eng_w_on + write_pass(3, on_level, false)) / 2;
  if (Failed()) return 1;
  eng_w_off = (eng_w_off + write_pass(4, 0, false)) / 2;
  if (Failed()) return 1;
  o.zstd_level = on_level;
  auto on_engine = Engine::Open(o);
  if (!on_engine.ok()) Fail(on_engine.status().ToString());
  if (Failed()) return 1;
  Engine* e = on_engine->get();

  // What the codec itself achieves on each kind of data (every chunk compressed, no bypass),
  // next to what the adaptive engine chose to store.
  auto codec_ratio = [&](DType want) {
    CodecOptions co;
    co.zstd_level = o.zstd_level;
    co.max_compressed_ratio = 1.0;
    ChunkEncoder enc(co);
    std::vector<uint8_t> rec(MaxRecordSize(o.chunk_bytes));
    uint64_t raw = 0, stored = 0;
    for (size_t i = 0; i < st[0].tensors.size() && raw < (256u << 20); ++i) {
      const TensorSpec& t = st[0].spec.tensors[i];
      if (t.dtype != want) continue;
      for (uint64_t off = 0; off < t.byte_length; off += o.chunk_bytes) {
        size_t n = std::min<uint64_t>(o.chunk_bytes, t.byte_length - off);
        stored += enc.Encode(st[0].tensors[i].data() + off, n, t.dtype, off, true, rec.data())
                      .stored_len;
        raw += n;
      }
    }
    return stored == 0 ? 0.0 : raw / double(stored);
  };
  double codec_fp32 = codec_ratio(DType::kF32), codec_bf16 = codec_ratio(DType::kBF16);

  auto m = e->GetManifest("bench", 2);
  if (!m.ok()) Fail(m.status().ToString());
  if (Failed()) return 1;
  uint64_t fp32_stored = 0, bf16_stored = 0;
  for (const ShardInfo& s : m->shards) {
    for (const TensorInfo& t : s.tensors) {
      (t.spec.dtype == DType::kBF16 ? bf16_stored : fp32_stored) += t.stored_bytes;
    }
  }

  DropPageCache(dir);
  double raw_r_direct = Parallel(ranks, [&](int r) {
    if (!RawIo(absl::StrFormat("%s/raw%d", dir, r), &st[r], false, qd)) Fail("raw read failed");
  }, "raw read (O_DIRECT)");
  DropPageCache(dir);
  double raw_r_buffered = Parallel(ranks, [&](int r) {
    if (!BufferedRead(absl::StrFormat("%s/raw%d", dir, r), &st[r])) Fail("raw read failed");
  }, "raw read (buffered)");
  if (Failed()) return 1;
  const double raw_r = std::min(raw_r_direct, raw_r_buffered);
  auto read_ckpt = [&](int64_t step) {
    DropPageCache(dir);
    return Parallel(ranks, [&](int r) {
      auto rd = e->OpenShardReader("bench", step, r);
      if (!rd.ok()) {
        Fail(rd.status().ToString());
        return;
      }
      for (size_t i = 0; i < st[r].tensors.size(); ++i) {
        absl::Status s = (*rd)->ReadTensor(i, st[r].tensors[i].data(),
                                           st[r].spec.tensors[i].byte_length);
        if (!s.ok()) {
          Fail(s.ToString());
          return;
        }
      }
    }, step == 1 ? "engine read (zstd off)" : "engine read (zstd on)",
    step == 1 ? &read_cpu : nullptr);
  };
  // The same off, on, on, off order as the writes; each mode's time is the mean of two reads.
  double eng_r_off = read_ckpt(1);
  double eng_r_on = read_ckpt(2);
  eng_r_on = (eng_r_on + read_ckpt(2)) / 2;
  eng_r_off = (eng_r_off + read_ckpt(1)) / 2;
  if (Failed()) return 1;
  on_engine->reset();

  // Many small tensors in one shard: raw (the same bytes packed back to back, written in
  // 4 MiB O_DIRECT blocks: what the disk can do with them) against the engine with
  // compression off.
  double small_raw_w = 0, small_eng_w = 0;
  uint64_t small_bytes = 0;
  size_t small_count = 0;
  if (absl::GetFlag(FLAGS_small_tensors) > 0) {
    st.clear();  // free the big state first
    RankState small = MakeSmallRank(absl::GetFlag(FLAGS_small_tensors), total);
    small_count = small.spec.tensors.size();
    for (const auto& t : small.spec.tensors) small_bytes += t.byte_length;
    std::printf("small: %zu tensors, %.2f GiB\n", small_count, small_bytes / double(1ull << 30));
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
    small_raw_w = Parallel(1, [&](int) {
      if (!RawIo(dir + "/raw-small", &packed, true, qd)) Fail("raw small write failed");
    }, "raw write (small)");
    o.zstd_level = 0;
    auto se = Engine::Open(o);
    if (!se.ok()) Fail(se.status().ToString());
    if (Failed()) return 1;
    absl::Status s = (*se)->BeginCheckpoint({"bench", 3, CheckpointKind::kFull, -1, 1, ""});
    if (!s.ok()) Fail(s.ToString());
    if (Failed()) return 1;
    small.spec.step = 3;
    small_eng_w = Parallel(1, [&](int) {
      std::vector<const void*> data;
      for (auto& t : small.tensors) data.push_back(t.data());
      absl::Status ws = (*se)->WriteShard(small.spec, data);
      if (!ws.ok()) Fail(ws.ToString());
    }, "engine write (small)");
    if (Failed()) return 1;
  }
  std::filesystem::remove_all(dir, ec);

  auto gbs = [&](double secs) { return total / secs / 1e9; };
  std::printf("write GB/s: raw %.2f, engine off %.2f, engine on %.2f\n", gbs(raw_w),
              gbs(eng_w_off), gbs(eng_w_on));
  std::printf("read  GB/s: raw O_DIRECT %.2f, raw buffered %.2f, engine off %.2f, engine on %.2f\n",
              gbs(raw_r_direct), gbs(raw_r_buffered), gbs(eng_r_off), gbs(eng_r_on));
  const double gb = total / 1e9;
  std::printf(
      "bytes=%llu write_ratio=%.3f read_ratio=%.3f small_write_ratio=%.3f small_tensors=%zu "
      "write_cpu_s_per_gb=%.3f read_cpu_s_per_gb=%.3f "
      "compress_ratio_fp32=%.3f compress_ratio_bf16_delta=%.3f "
      "stored_ratio_fp32=%.3f stored_ratio_bf16_delta=%.3f "
      "engine_write_gbps_on=%.3f engine_write_gbps_off=%.3f engine_read_gbps_on=%.3f "
      "engine_read_gbps_off=%.3f raw_write_gbps=%.3f raw_read_gbps=%.3f "
      "raw_read_direct_gbps=%.3f raw_read_buffered_gbps=%.3f\n",
      static_cast<unsigned long long>(total), raw_w / eng_w_off, raw_r / eng_r_off,
      small_eng_w > 0 ? small_raw_w / small_eng_w : 0.0, small_count, write_cpu / gb,
      read_cpu / gb, codec_fp32, codec_bf16, fp32 / double(std::max<uint64_t>(fp32_stored, 1)),
      bf16 / double(std::max<uint64_t>(bf16_stored, 1)), gbs(eng_w_on), gbs(eng_w_off),
      gbs(eng_r_on), gbs(eng_r_off), gbs(raw_w), gbs(raw_r), gbs(raw_r_direct),
      gbs(raw_r_buffered));
  return 0;
}

}  // namespace
}  // namespace storage
}  // namespace gradsnap

int main(int argc, char** argv) {
  gradsnap::bench::InitBenchmark(
      argc, argv,
      "Measures the gradsnap storage engine against raw io_uring O_DIRECT I/O.\n"
      "Usage: storage_bench [--dir DIR] [--total_gib N] [--ranks R] ...");
  return gradsnap::storage::Run();
}
