// The RAM tier (--cache-bytes): recent shard payloads kept in memory so a restore after a rank
// failure is served without touching the disk (DESIGN.md section 5).
//
// Entries are whole shard payloads keyed by (job, step, rank). Uploads stage the bytes as they
// stream through the server (Stage/Append/Publish) so the cache is filled at commit time, not on
// first read. What stays is each job's recovery point: the newest committed checkpoint and, when
// it is a DELTA, its base FULL and the committed DELTAs between (GoCkpt with --grad-log commits
// a DELTA every step; a restore of `latest` reads the FULL and replays the chain, so all of it
// must be here for the restore not to touch the disk). When a checkpoint commits, entries of
// the job below its chain's base (its own step for a FULL) are dropped. Bounded by the byte
// budget, evicting least recently used jobs first. Staged (not yet published) bytes count
// against the budget too, so the cache never holds more than `budget` bytes.
//
// Thread-safe. A returned payload is immutable and stays valid while the caller holds it, even
// if the entry is evicted meanwhile (it then no longer counts against the budget).
#ifndef GRADSNAP_SERVICE_SHARD_CACHE_H_
#define GRADSNAP_SERVICE_SHARD_CACHE_H_

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "common/stats.h"
#include "grpcpp/support/slice.h"
#include "storage/types.h"

namespace gradsnap {
namespace service {

// One block of RAM-tier memory, mapped anonymously rather than taken from malloc: an evicted
// entry's memory goes back to the system at once (not to a malloc arena), and running out of
// memory is an error to handle (the upload is then not cached), not an exception. Transparent
// huge pages are not requested: on this project's VMs zeroing fresh huge pages cost 2-6x the
// 4 KiB page faults they save (service_bench, cached save). Move-only.
class CacheBlock {
 public:
  // Maps `capacity` bytes (rounded up to whole pages); ok() is false when the mapping failed.
  explicit CacheBlock(size_t capacity);

  bool ok() const { return map_ != nullptr; }
  const char* data() const { return map_.get(); }
  size_t size() const { return size_; }
  size_t room() const { return ok() ? map_.get_deleter().bytes - size_ : 0; }
  // Copies n <= room() bytes to the end.
  void Append(const char* p, size_t n);

 private:
  struct Unmap {
    size_t bytes;  // no initializer: default-constructible while CacheBlock is incomplete
    void operator()(char* p) const;
  };
  std::unique_ptr<char, Unmap> map_;
  size_t size_ = 0;
};

// One cached shard: its manifest entry and its whole payload, copied out of the upload's
// receive buffers into blocks the RAM tier owns (holding gRPC's buffers instead would count
// against the server's gRPC memory quota, which bounds uploads in flight).
struct CachedShard {
  static constexpr size_t kBlockBytes = 4u << 20;
  storage::ShardInfo info;
  std::vector<CacheBlock> pieces;  // blocks of kBlockBytes, the last one sized to what is left
  uint64_t size = 0;               // payload bytes
  // Appends n bytes; expected_total (the payload's final size) sizes the last block. False,
  // appending nothing, when the bytes would pass expected_total; false when a block could not
  // be mapped (out of memory), the shard then incomplete.
  [[nodiscard]] bool Append(const void* p, size_t n, uint64_t expected_total);
};
using Payload = std::shared_ptr<const CachedShard>;

// Appends slices over payload [offset, offset + n) of `payload` to out (the range must lie
// inside the payload): the RAM tier's memory itself, kept alive by each slice until gRPC
// releases it, even if the entry is evicted meanwhile. Returns the bytes referenced.
uint64_t PayloadSlices(const Payload& payload, uint64_t offset, uint64_t n,
                       std::vector<grpc::Slice>* out);

class ShardCache {
 public:
  explicit ShardCache(uint64_t budget);

  // Reserves `size` bytes for staging a shard of (job, step) whose chain starts at `base` (the
  // step itself for a FULL, the base FULL's for a DELTA). Evicts, until it fits: the job's
  // entries below `base` (superseded once the step commits), then other jobs' least recently
  // used first, then the job's own older steps. False when it cannot fit (the upload then
  // simply is not cached).
  [[nodiscard]] bool Reserve(const std::string& job, int64_t step, int64_t base, uint64_t size);
  bool Reserve(const std::string& job, int64_t step, uint64_t size) {  // a FULL
    return Reserve(job, step, step, size);
  }
  // Returns a reservation that was not published (failed upload).
  void Unreserve(uint64_t size);
  // Publishes a staged shard (its reservation becomes the entry).
  void Publish(const std::string& job, int64_t step, int32_t rank, CachedShard shard);
  // The checkpoint (job, step) committed, its chain starting at `base` (as for Reserve): its
  // entries become readable. When it is the job's newest committed step, entries and committed
  // steps of the job below `base` are dropped. With `shards` (the committed manifest's), an
  // entry of the step whose tensors (names, sizes, digests) are not those of its rank's shard
  // is dropped too: one staged for an earlier checkpoint saved under the same step (deleted or
  // aborted since, its entry missed) is never served as this one.
  void Committed(const std::string& job, int64_t step, int64_t base,
                 const std::vector<storage::ShardInfo>* shards = nullptr);
  void Committed(const std::string& job, int64_t step,  // a FULL
                 const std::vector<storage::ShardInfo>* shards = nullptr) {
    Committed(job, step, step, shards);
  }
  // Drops every entry of (job, step) (delete, abort).
  void Drop(const std::string& job, int64_t step);
  // Drops every entry of the job (a Gc that failed part-way).
  void DropJob(const std::string& job);
  // The shard if cached and its checkpoint committed (any step of the job's kept chain), else
  // null. Counts hits and misses.
  Payload Lookup(const std::string& job, int64_t step, int32_t rank);

  uint64_t budget() const { return budget_; }
  uint64_t used() const;

 private:
  using Key = std::tuple<std::string, int64_t, int32_t>;
  // Evicts until `need` more bytes fit (see Reserve), never touching (job, >= step).
  bool MakeRoom(uint64_t need, const std::string& job, int64_t step, int64_t base)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void TouchJob(const std::string& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseIf(const std::string& job,
               absl::FunctionRef<bool(int64_t step, int32_t rank, const CachedShard& shard)> pred)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateGauge() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t budget_;
  Counter* hits_;
  Counter* misses_;
  Counter* bytes_gauge_;

  mutable absl::Mutex mu_;
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;  // entries + reservations
  std::map<Key, Payload> entries_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // jobs, most recent first
  std::map<std::string, std::list<std::string>::iterator> lru_pos_ ABSL_GUARDED_BY(mu_);
  // Per job: the committed steps kept (the newest one's chain, from its base on).
  struct Chain {
    int64_t newest = -1;  // the newest committed step
    int64_t base = -1;    // its chain's base FULL (itself for a FULL)
    std::set<int64_t> committed;
  };
  std::map<std::string, Chain> chains_ ABSL_GUARDED_BY(mu_);
};

}  // namespace service
}  // namespace gradsnap

#endif  // GRADSNAP_SERVICE_SHARD_CACHE_H_
