#include "service/shard_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "proto/convert.h"
#include "proto/raw_message.h"

namespace gradsnap {
namespace service {

CacheBlock::CacheBlock(size_t capacity) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  capacity = (std::max<size_t>(capacity, 1) + page - 1) / page * page;
  void* map = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                     -1, 0);
  if (map != MAP_FAILED) map_ = std::unique_ptr<char, Unmap>(static_cast<char*>(map), {capacity});
}

void CacheBlock::Unmap::operator()(char* p) const { ::munmap(p, bytes); }

void CacheBlock::Append(const char* p, size_t n) {
  std::memcpy(map_.get() + size_, p, n);
  size_ += n;
}

bool CachedShard::Append(const void* p, size_t n, uint64_t expected_total) {
  if (size > expected_total || n > expected_total - size) return false;  // the tail is sized
  const char* src = static_cast<const char*>(p);
  while (n > 0) {
    if (pieces.empty() || pieces.back().size() == kBlockBytes) {
      // Every block but the last holds exactly kBlockBytes (PayloadSlices relies on it).
      pieces.emplace_back(static_cast<size_t>(
          std::clamp<uint64_t>(expected_total > size ? expected_total - size : n, 1, kBlockBytes)));
      if (!pieces.back().ok()) {
        pieces.pop_back();
        return false;
      }
    }
    CacheBlock& last = pieces.back();
    const size_t take = std::min({n, kBlockBytes - last.size(), last.room()});
    last.Append(src, take);
    src += take;
    n -= take;
    size += take;
  }
  return true;
}

uint64_t PayloadSlices(const Payload& payload, uint64_t offset, uint64_t n,
                       std::vector<grpc::Slice>* out) {
  constexpr uint64_t kBlock = CachedShard::kBlockBytes;
  uint64_t done = 0;
  for (size_t i = static_cast<size_t>(offset / kBlock); done < n && i < payload->pieces.size();
       ++i) {
    const CacheBlock& piece = payload->pieces[i];
    const uint64_t in_piece = offset + done - i * kBlock;
    const uint64_t take = std::min<uint64_t>(piece.size() - in_piece, n - done);
    Payload keep = payload;
    out->push_back(proto::OwnedSlice(const_cast<char*>(piece.data() + in_piece),
                                     static_cast<size_t>(take), [keep] {}));
    done += take;
  }
  return done;
}

ShardCache::ShardCache(uint64_t budget) : budget_(budget) {
  Registry* r = Registry::Global();
  hits_ = r->GetCounter("gradsnap_cache_hits_total", "Shard reads served from the RAM tier");
  misses_ = r->GetCounter("gradsnap_cache_misses_total", "Shard reads that went to disk");
  bytes_gauge_ = r->GetCounter("gradsnap_cache_bytes", "Bytes held by the RAM tier", true);
}

void ShardCache::UpdateGauge() { bytes_gauge_->Set(static_cast<int64_t>(used_)); }

void ShardCache::TouchJob(const std::string& job) {
  auto it = lru_pos_.find(job);
  if (it != lru_pos_.end()) lru_.erase(it->second);
  lru_.push_front(job);
  lru_pos_[job] = lru_.begin();
}

void ShardCache::EraseIf(
    const std::string& job,
    absl::FunctionRef<bool(int64_t step, int32_t rank, const CachedShard& shard)> pred) {
  auto it = entries_.lower_bound(Key(job, INT64_MIN, INT32_MIN));
  while (it != entries_.end() && std::get<0>(it->first) == job) {
    if (pred(std::get<1>(it->first), std::get<2>(it->first), *it->second)) {
      used_ -= it->second->size;
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  auto first = entries_.lower_bound(Key(job, INT64_MIN, INT32_MIN));
  bool job_empty = first == entries_.end() || std::get<0>(first->first) != job;
  auto pos = lru_pos_.find(job);
  if (job_empty && pos != lru_pos_.end()) {
    lru_.erase(pos->second);
    lru_pos_.erase(pos);
  }
  UpdateGauge();
}

bool ShardCache::MakeRoom(uint64_t need, const std::string& job, int64_t step, int64_t base) {
  if (need > budget_) return false;
  if (used_ + need <= budget_) return true;
  // The job's entries below the chain being written: superseded once it commits.
  EraseIf(job, [&](int64_t s, int32_t, const CachedShard&) { return s < base; });
  // Then whole jobs, least recently used first.
  std::vector<std::string> victims(lru_.rbegin(), lru_.rend());
  for (const std::string& other : victims) {
    if (used_ + need <= budget_) break;
    if (other == job) continue;
    EraseIf(other, [](int64_t, int32_t, const CachedShard&) { return true; });
  }
  // Last, the job's own older steps (its chain so far).
  if (used_ + need > budget_) {
    EraseIf(job, [&](int64_t s, int32_t, const CachedShard&) { return s < step; });
  }
  return used_ + need <= budget_;
}

bool ShardCache::Reserve(const std::string& job, int64_t step, int64_t base, uint64_t size) {
  if (budget_ == 0) return false;
  absl::MutexLock lock(&mu_);
  if (!MakeRoom(size, job, step, base)) return false;
  used_ += size;
  UpdateGauge();
  return true;
}

void ShardCache::Unreserve(uint64_t size) {
  absl::MutexLock lock(&mu_);
  used_ -= size;
  UpdateGauge();
}

void ShardCache::Publish(const std::string& job, int64_t step, int32_t rank,
                         CachedShard shard) {
  auto p = std::make_shared<const CachedShard>(std::move(shard));
  absl::MutexLock lock(&mu_);
  Payload& slot = entries_[Key(job, step, rank)];
  if (slot != nullptr) used_ -= slot->size;  // a re-upload replaces the old copy
  slot = std::move(p);
  TouchJob(job);
  UpdateGauge();
}

void ShardCache::Committed(const std::string& job, int64_t step, int64_t base,
                           const std::vector<storage::ShardInfo>* shards) {
  absl::MutexLock lock(&mu_);
  Chain& c = chains_[job];
  c.committed.insert(step);
  if (step >= c.newest) {
    c.newest = step;
    c.base = std::min(base, step);
  }
  c.committed.erase(c.committed.begin(), c.committed.lower_bound(c.base));
  EraseIf(job, [&](int64_t s, int32_t rank, const CachedShard& cached) {
    if (s < c.base) return true;
    if (s != step || shards == nullptr) return false;
    for (const storage::ShardInfo& info : *shards) {
      if (info.rank == rank) return !proto::SameTensorContent(cached.info, info);
    }
    return true;  // no such rank in the committed checkpoint
  });
}

void ShardCache::Drop(const std::string& job, int64_t step) {
  absl::MutexLock lock(&mu_);
  auto c = chains_.find(job);
  if (c != chains_.end()) c->second.committed.erase(step);
  EraseIf(job, [&](int64_t s, int32_t, const CachedShard&) { return s == step; });
}

void ShardCache::DropJob(const std::string& job) {
  absl::MutexLock lock(&mu_);
  chains_.erase(job);
  EraseIf(job, [](int64_t, int32_t, const CachedShard&) { return true; });
}

Payload ShardCache::Lookup(const std::string& job, int64_t step, int32_t rank) {
  if (budget_ == 0) {
    misses_->Add();
    return nullptr;
  }
  absl::MutexLock lock(&mu_);
  auto c = chains_.find(job);
  auto it = entries_.find(Key(job, step, rank));
  if (it == entries_.end() || c == chains_.end() || c->second.committed.count(step) == 0) {
    misses_->Add();
    return nullptr;
  }
  hits_->Add();
  TouchJob(job);
  return it->second;
}

uint64_t ShardCache::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

}  // namespace service
}  // namespace gradsnap
