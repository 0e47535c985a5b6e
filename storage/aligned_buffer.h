// Page-aligned heap buffers for O_DIRECT I/O, and a pool that reuses them.
//
// O_DIRECT needs the buffer address, the file offset and the length to be multiples of the
// logical block size; kIoAlignment (4 KiB) covers every device we target. Freshly faulted pages
// copy at a fraction of memcpy speed, so writers take buffers from a BufferPool and give them
// back, and the pages stay touched.
//
// Buffers of kHugePageBytes or more get a mapping of their own that starts on a 2 MiB boundary
// and is advised MADV_HUGEPAGE (transparent huge pages). A 4 KiB-page buffer is physically
// scattered: the block layer needs one segment per page, and a virtio disk taking at most 254
// segments per request cuts a 4 MiB O_DIRECT I/O into 1 MiB requests. A buffer on 2 MiB pages
// goes out as one 4 MiB request; measured on this project's VM, 1 GiB with io_uring O_DIRECT QD32
// in 4 MiB I/Os: reads 1.1-2.3 GB/s on 4 KiB pages, 2.1-3.8 GB/s on 2 MiB pages; writes
// 0.9-3.4 vs 5.5-6.1 GB/s. Faulting one 2 MiB page instead of 512 small ones also costs
// less CPU. Where the kernel has no huge pages to give, the buffer uses 4 KiB pages as before.
//
// THREAD SAFETY: an AlignedBuffer is owned by one thread at a time. BufferPool is thread-safe.
#ifndef GRADSNAP_STORAGE_ALIGNED_BUFFER_H_
#define GRADSNAP_STORAGE_ALIGNED_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/huge_map.h"

namespace gradsnap {
namespace storage {

constexpr size_t kIoAlignment = 4096;
// A transparent huge page (x86-64, arm64 with 4 KiB base pages).
constexpr size_t kHugePageBytes = kHugePageSize;

inline constexpr uint64_t AlignUp(uint64_t v, uint64_t a = kIoAlignment) {
  return (v + a - 1) / a * a;
}

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Capacity is rounded up to kIoAlignment.
  explicit AlignedBuffer(size_t capacity);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  // Unique to this allocation in the process, never reused (0: no memory): what an io_uring
  // fixed-buffer table is keyed by, since a freed buffer's address may come back for another.
  uint64_t id() const { return id_; }
  // Faults every page in (common/huge_map.h, FaultIn), so the kernel maps (and zeroes) them
  // now instead of in the first copy into the buffer (copies into freshly faulted pages run at
  // a fraction of memcpy speed). Cheap on a buffer whose pages are already mapped.
  void Prefault();

 private:
  void Release();

  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
  uint64_t id_ = 0;
};

// Hands out buffers of one fixed capacity; keeps up to `max_cached` returned ones, and besides
// them the buffers set aside for a Reservation.
class BufferPool {
 public:
  class Reservation;

  BufferPool(size_t buffer_capacity, size_t max_cached);
  size_t buffer_capacity() const { return capacity_; }
  std::unique_ptr<AlignedBuffer> Get();
  // A cached buffer, or null when none is (never a freshly allocated one).
  std::unique_ptr<AlignedBuffer> TryGet();
  // `n` buffers (Get), each faulted in (AlignedBuffer::Prefault): the page faults of new ones
  // are paid here, not in the copy that fills them later.
  std::vector<std::unique_ptr<AlignedBuffer>> GetFaulted(size_t n);
  void Put(std::unique_ptr<AlignedBuffer> buf);
  // Buffers waiting in the pool now for any caller (not those set aside for a Reservation).
  size_t cached();

 private:
  const size_t capacity_;
  const size_t max_cached_;
  absl::Mutex mu_;
  // The buffers waiting; `set_aside_` of them are the Reservations', no other caller's (the
  // buffers are alike, so which ones is not tracked, only how many).
  std::vector<std::unique_ptr<AlignedBuffer>> free_ ABSL_GUARDED_BY(mu_);
  size_t set_aside_ ABSL_GUARDED_BY(mu_) = 0;  // sum of the Reservations' kept_
};

// Buffers of a pool held for one owner (a shard writer) for its lifetime. Reserve(n) takes n
// buffers, faulted in, and sets them aside in the pool: Get hands them out before new ones,
// Put keeps up to n back for the owner, and no other caller's Get or TryGet takes them. So an
// owner never waits for, or allocates in its copy, a buffer it reserved, while another owner
// opening meanwhile takes its own. The pool's own cache (max_cached) stays as it was: buffers
// past the reservation go back to it by BufferPool::Put's rule, and Release (or the destructor)
// gives the kept ones back the same way.
//
// THREAD SAFETY: thread-safe; its counts are guarded by the pool's mutex. The pool must
// outlive it.
class BufferPool::Reservation {
 public:
  explicit Reservation(BufferPool* pool) : pool_(pool) {}
  ~Reservation() { Release(); }
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;

  // Takes `n` more buffers from the pool (BufferPool::GetFaulted) and sets them aside.
  void Reserve(size_t n);
  // A buffer set aside, else the pool's (BufferPool::Get): never blocks on another owner.
  std::unique_ptr<AlignedBuffer> Get();
  // Sets `buf` aside again while fewer than the reserved number are, else BufferPool::Put.
  void Put(std::unique_ptr<AlignedBuffer> buf);
  // Gives the buffers set aside back to the pool (kept up to its max_cached) and ends the
  // reservation.
  void Release();
  // Buffers set aside now (reserved and not handed out).
  size_t kept();

 private:
  BufferPool* const pool_;
  size_t reserved_ ABSL_GUARDED_BY(pool_->mu_) = 0;  // taken by Reserve
  size_t kept_ ABSL_GUARDED_BY(pool_->mu_) = 0;      // of them, set aside in the pool now
};

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_ALIGNED_BUFFER_H_
