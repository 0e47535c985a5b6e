// The workload of the real-process crash test (crash_test.cc, crash_child.cc).
#ifndef GRADSNAP_STORAGE_CRASH_WORKLOAD_H_
#define GRADSNAP_STORAGE_CRASH_WORKLOAD_H_

#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/status.h"
#include "storage/engine.h"
#include "storage/test_util.h"

namespace gradsnap {
namespace storage {

constexpr int kCrashRanks = 2;

inline CheckpointSpec CrashCheckpoint(int64_t step) {
  // Every third step is a DELTA on the FULL just before it.
  bool delta = step % 3 == 2 && step > 0;
  return CheckpointSpec{"crash", step, delta ? CheckpointKind::kDelta : CheckpointKind::kFull,
                        delta ? step - 1 : -1, kCrashRanks, "meta"};
}

inline ShardData CrashShard(int64_t step, int32_t rank) {
  return MakeShard("crash", step, rank, static_cast<uint64_t>(step) * 7 + rank,
                   60000 + (step % 5) * 25000);
}

// Writes (or resumes) one shard: half, Flush, the rest, Finish.
inline absl::Status WriteCrashShard(Engine* e, int64_t step, int32_t rank) {
  ShardData d = CrashShard(step, rank);
  ASSIGN_OR_RETURN(std::unique_ptr<ShardWriter> w, e->OpenShardWriter(d.spec));
  std::vector<uint8_t> stream = d.stream();
  uint64_t pos = w->committed_size();
  uint64_t half = stream.size() / 2;
  if (pos < half) {
    RETURN_IF_ERROR(w->Append(stream.data() + pos, half - pos));
    RETURN_IF_ERROR(w->Flush());
    pos = half;
  }
  RETURN_IF_ERROR(w->Append(stream.data() + pos, stream.size() - pos));
  return w->Finish();
}

inline absl::Status WriteCrashCheckpoint(Engine* e, int64_t step) {
  RETURN_IF_ERROR(e->BeginCheckpoint(CrashCheckpoint(step)));
  std::vector<absl::Status> st(kCrashRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kCrashRanks; ++r) {
    threads.emplace_back([&, r] { st[r] = WriteCrashShard(e, step, r); });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : st) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

inline absl::Status RunCrashWorkload(const std::string& dir, int64_t first, bool uring) {
  EngineOptions o;
  o.data_dir = dir;
  o.use_io_uring = uring;
  o.chunk_bytes = 64 << 10;
  o.adapt_compression = false;
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::Open(o));
  ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, e->ListCheckpoints("crash", true));
  for (const CheckpointInfo& c : all) {
    if (c.state == CheckpointState::kPending) RETURN_IF_ERROR(WriteCrashCheckpoint(e.get(), c.step));
  }
  for (int64_t step = first; step < first + 100000; ++step) {
    RETURN_IF_ERROR(WriteCrashCheckpoint(e.get(), step));
    if (step % 4 == 0) RETURN_IF_ERROR(e->Gc("crash", GcPolicy{3, 0}).status());
  }
  return absl::OkStatus();
}

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_CRASH_WORKLOAD_H_
