// The simulated asynchronous device (`--device sim`, DESIGN.md section 4, docs/gockpt.md): a GPU
// in every ordering respect, made of host threads, so the GPU schedule of the snapshot engine
// (copies overlapped with compute, events, -O, one device per rank) is tested on every commit.
//
// OVERVIEW
//   SimGpu is one simulated device of this process, found by ordinal (SimGpu::Open). It has
//     - device memory: separate allocations registered with the device (Malloc); copies check
//       that their source is this device's memory and their destination pinned host memory
//       allocated by this device, so a rank that copies another device's memory fails;
//     - compute streams (SimStream): an in-order queue of kernels (host closures) run by one
//       thread; Launch returns at once, like a CUDA launch; Record/Wait are events;
//     - a copy engine shared by the device's copy streams (the engine's NewSimDevice streams),
//       throttled to SimOptions::copy_gbps; copy streams run on their own threads and honour
//       compute events (a copy waits for the event before it reads a byte). A copy reads its
//       source slice by slice across its throttled interval (kCopySlices slices, each read at
//       its share of the interval), as a GPU's DMA does: a kernel that writes the source while
//       the copy is in flight changes the bytes of the slices not yet read;
//     - a current device per host thread (SimDeviceGuard), checked by every launch, so code that
//       leaves another device current fails like CUDA does ("invalid resource handle").
//   Test mode `poison`: a kernel that declares the device ranges it writes first fills them with
//   0xFF (a NaN pattern), holds them so for poison_hold_ms, then restores them and runs; and a
//   copy starts 2 * poison_hold_ms after the compute event it waits for. So a copy that is not
//   ordered after the kernel that produced its data, or that the host did not wait for before
//   launching the next kernel that writes its source (a block copy racing the next update, a
//   gradient copy racing the next reduction), reads poison or later bytes, and the checkpoint
//   differs from a stop-the-world one. Test hook `unordered_copies`: copy streams ignore compute events (deliberately broken
//   ordering, to show that the poison catches it).
//   Test mode `late_copies` (state or grad): the copies of the low-priority (state) or the
//   high-priority (gradient) copy streams start as late as a GPU may start them: a copy reads
//   nothing until the host demands it (CopyStream::Demand: the host is about to block on it) or
//   until a kernel that writes its source, launched after the compute event the copy waited
//   for, has completed. So a copy that the host forgot to wait for before launching the kernel
//   that overwrites its source always reads the overwritten bytes: the race always loses,
//   whatever the timing (the tests of the engine's test_drop_wait hooks). Without a missing
//   wait every copy is demanded before its source is overwritten, and the results are exact.
//
// WHAT IT DOES NOT MODEL: real kernel timing or concurrency between kernels (one compute
//   thread per stream, kernels are the CPU back end's), PCIe/NVLink topology, copy-engine
//   contention between processes (each rank's process has its own engine), host-to-device copy
//   throttling, device memory limits, or errors of real hardware.
//
// THREAD SAFETY
//   SimGpu and SimStream are thread-safe. A SimStream must outlive the events recorded on it.
#ifndef GRADSNAP_GPU_SNAPSHOT_SIM_DEVICE_H_
#define GRADSNAP_GPU_SNAPSHOT_SIM_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/ordered_worker.h"
#include "gpu_snapshot/device.h"

namespace gradsnap {
namespace gpu_snapshot {

// Simulated devices per process (ordinals 0..kSimDeviceCount-1), like an 8-GPU node.
inline constexpr int kSimDeviceCount = 8;

// A copy of this many bytes or more is read in kCopySlices slices across its interval.
inline constexpr int kCopySlices = 16;

// SimOptions::late_copies: which copy streams start their copies as late as possible.
enum class SimLateCopies { kNone, kState, kGradient };
// --sim_late_copies: "none", "state" or "grad"; INVALID_ARGUMENT "unknown --sim_late_copies 'X'
// (known: none, state, grad)" for any other string.
absl::StatusOr<SimLateCopies> ParseSimLateCopies(absl::string_view name);

struct SimOptions {
  // Device-to-host copy bandwidth of the copy engine, GB/s (1e9 bytes per second); > 0.
  // Default: 0.4 (the `small` model's state, 130 MB, takes 0.33 s: about 1.7 unloaded training
  // steps of snapshot_bench's configuration, an H200's proportions at about 9K tokens per GPU per
  // step; docs/gockpt.md, "The default --sim-copy-gbps").
  double copy_gbps = 0.4;
  // Test mode: kernels poison the ranges they write while they run (see above). Default: false
  bool poison = false;
  int poison_hold_ms = 20;  // Default: 20
  // Test hook: copy streams ignore compute events (broken ordering). Default: false
  bool unordered_copies = false;
  // Test mode: copies of these streams start as late as a GPU may start them (above).
  // Default: kNone
  SimLateCopies late_copies = SimLateCopies::kNone;
  // Test hook: called by the copy engine after each slice it read (slice index, slices), on
  // the copy stream's thread. Default: none
  std::function<void(int, int)> after_slice;
};

class SimGpu;

// Makes `gpu` the calling thread's current simulated device; restores the previous on exit.
class SimDeviceGuard {
 public:
  explicit SimDeviceGuard(SimGpu* gpu);
  ~SimDeviceGuard();
  SimDeviceGuard(const SimDeviceGuard&) = delete;
  SimDeviceGuard& operator=(const SimDeviceGuard&) = delete;

 private:
  SimGpu* prev_;
};
// The calling thread's current simulated device (null: none set).
SimGpu* CurrentSimGpu();
// Sets it without restoring (like cudaSetDevice).
void SetCurrentSimGpu(SimGpu* gpu);

// A compute stream: kernels run in order on one thread.
class SimStream {
 public:
  using Kernel = std::function<absl::Status()>;
  struct Range {
    void* p;
    size_t bytes;
  };
  ~SimStream();  // waits for every launched kernel

  // Enqueues `kernel`, writing device `writes`; returns at once. FAILED_PRECONDITION when this
  // stream's device is not the thread's current one; the stream's first kernel error otherwise.
  absl::Status Launch(Kernel kernel, std::vector<Range> writes = {});
  // An event after the kernels launched so far (their count).
  uint64_t Record();
  // Blocks until the first `seq` kernels completed; returns the stream's first kernel error.
  absl::Status Wait(uint64_t seq);
  // Whether the first `seq` kernels completed (cudaEventQuery); does not block.
  bool Reached(uint64_t seq);
  absl::Status Synchronize();
  // Nanoseconds (MonotonicNanos clock) since every launched kernel completed; 0 while busy.
  int64_t IdleNanos();
  SimGpu* gpu() const { return gpu_; }

 private:
  friend class SimGpu;
  explicit SimStream(SimGpu* gpu);
  struct Item {
    Kernel kernel;
    std::vector<Range> writes;
    uint64_t seq = 0;  // the kernel's event number on this stream
  };
  absl::Status Run(Item& item);

  SimGpu* const gpu_;
  absl::Mutex launch_mu_;  // numbers the kernels in launch order
  OrderedWorker<Item> kernels_;  // last: runs Run, which uses gpu_
};

class SimGpu {
 public:
  // The process's simulated device `ordinal`, created with `options` on first use (later
  // calls return it as created). INVALID_ARGUMENT for an ordinal outside [0, kSimDeviceCount)
  // or copy_gbps <= 0.
  static absl::StatusOr<SimGpu*> Open(int ordinal, const SimOptions& options);
  // The device if it was opened, else FAILED_PRECONDITION.
  static absl::StatusOr<SimGpu*> Find(int ordinal);

  int ordinal() const { return ordinal_; }
  const SimOptions& options() const { return options_; }

  // Device memory, zeroed; registered with this device.
  absl::StatusOr<void*> Malloc(size_t bytes);
  void Free(void* p);
  // Pinned host memory of this device (staging), pre-touched.
  absl::StatusOr<void*> HostAlloc(size_t bytes);
  void HostFree(void* p);
  bool OwnsDevice(const void* p, size_t n) const;
  bool OwnsPinned(const void* p, size_t n) const;

  std::unique_ptr<SimStream> NewStream();

  // The copy engine: copies n bytes, taking n / copy_gbps seconds (copies of all streams of
  // the device are served one at a time), reading the source slice by slice across that time.
  void EngineCopy(void* dst, const void* src, size_t n);

  // late_copies bookkeeping (see above), guarded by hold_mu().
  // A copy stream's demand state: copies are numbered on their stream as they are enqueued.
  struct CopyStreamState {
    uint64_t enqueued = 0;          // copies enqueued so far
    uint64_t demanded = 0;          // copies 1..demanded are demanded by the host
    const SimStream* ref_stream = nullptr;  // the compute event the stream last waited for
    uint64_t ref_seq = 0;
  };
  absl::Mutex* hold_mu() { return &hold_mu_; }
  // Blocks a late copy (number `copy` of the stream with `state`, source [src, src + n)) until
  // it is demanded or a kernel launched after the stream's last compute event wrote its source.
  void HoldLateCopy(const CopyStreamState* state, uint64_t copy, const void* src, size_t n)
      ABSL_LOCKS_EXCLUDED(hold_mu_);
  // A kernel of `stream` with event number `seq` that wrote `writes` completed.
  void NoteKernelDone(const SimStream* stream, uint64_t seq,
                      const std::vector<SimStream::Range>& writes) ABSL_LOCKS_EXCLUDED(hold_mu_);

 private:
  SimGpu(int ordinal, const SimOptions& options) : ordinal_(ordinal), options_(options) {}
  static bool Within(const std::map<uintptr_t, size_t>& m, const void* p, size_t n);
  // Zeroed memory of `bytes`, registered as device memory or pinned host memory (device_ or
  // pinned_); RESOURCE_EXHAUSTED `what` when the allocation fails. Unregistering frees it.
  absl::StatusOr<void*> Register(bool pinned, size_t bytes, const char* what)
      ABSL_LOCKS_EXCLUDED(mem_mu_);
  void Unregister(bool pinned, void* p) ABSL_LOCKS_EXCLUDED(mem_mu_);

  const int ordinal_;
  const SimOptions options_;
  mutable absl::Mutex mem_mu_;
  std::map<uintptr_t, size_t> device_ ABSL_GUARDED_BY(mem_mu_);  // base -> bytes
  std::map<uintptr_t, size_t> pinned_ ABSL_GUARDED_BY(mem_mu_);
  absl::Mutex engine_mu_;  // held while a copy runs: one copy at a time
  struct Written {
    const SimStream* stream;
    uint64_t seq;
    std::vector<SimStream::Range> writes;
  };
  absl::Mutex hold_mu_;
  std::deque<Written> written_ ABSL_GUARDED_BY(hold_mu_);  // the last kernels (late_copies)
};

// The snapshot engine's view of simulated device `ordinal` (opened by the trainer's sim back
// end, or by a test with SimGpu::Open). FAILED_PRECONDITION when it was not opened.
absl::StatusOr<std::unique_ptr<Device>> NewSimDevice(int ordinal);

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_SIM_DEVICE_H_
