// The simulated asynchronous device; see sim_device.h.
#include "gpu_snapshot/sim_device.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"
#include "gpu_snapshot/snapshot_mode.h"
#include "gpu_snapshot/worker_stream.h"

namespace gradsnap {
namespace gpu_snapshot {
namespace {

constexpr size_t kAlign = 4096;

thread_local SimGpu* t_current = nullptr;

void* AlignedZeroed(size_t bytes) {
  size_t rounded = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
  void* p = std::aligned_alloc(kAlign, rounded);
  if (p != nullptr) std::memset(p, 0, rounded);
  return p;
}

constexpr EnumName<SimLateCopies> kLateCopies[] = {{SimLateCopies::kNone, "none"},
                                                   {SimLateCopies::kState, "state"},
                                                   {SimLateCopies::kGradient, "grad"}};
}  // namespace

absl::StatusOr<SimLateCopies> ParseSimLateCopies(absl::string_view name) {
  return ParseName(name, kLateCopies, "--sim_late_copies");
}

SimGpu* CurrentSimGpu() { return t_current; }
void SetCurrentSimGpu(SimGpu* gpu) { t_current = gpu; }
SimDeviceGuard::SimDeviceGuard(SimGpu* gpu) : prev_(t_current) { t_current = gpu; }
SimDeviceGuard::~SimDeviceGuard() { t_current = prev_; }

// ---- SimStream ----

SimStream::SimStream(SimGpu* gpu)
    : gpu_(gpu), kernels_([this](Item& item) { return Run(item); }) {}

SimStream::~SimStream() = default;

absl::Status SimStream::Launch(Kernel kernel, std::vector<Range> writes) {
  if (CurrentSimGpu() != gpu_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "launch on a stream of sim:", gpu_->ordinal(), " while ",
        CurrentSimGpu() == nullptr ? std::string("no device")
                                   : absl::StrCat("sim:", CurrentSimGpu()->ordinal()),
        " is current (invalid resource handle)"));
  }
  absl::MutexLock lock(&launch_mu_);
  const uint64_t seq = kernels_.Record() + 1;
  return kernels_.Enqueue({std::move(kernel), std::move(writes), seq});
}

uint64_t SimStream::Record() { return kernels_.Record(); }

absl::Status SimStream::Wait(uint64_t seq) { return kernels_.Wait(seq); }

bool SimStream::Reached(uint64_t seq) { return kernels_.Reached(seq); }

absl::Status SimStream::Synchronize() { return kernels_.Synchronize(); }

int64_t SimStream::IdleNanos() { return kernels_.IdleNanos(); }

absl::Status SimStream::Run(Item& item) {
  SimDeviceGuard guard(gpu_);
  if (gpu_->options().poison && !item.writes.empty()) {
    // The kernel "runs" for poison_hold_ms with its outputs in flux: poisoned bytes.
    std::vector<std::string> saved;
    for (const Range& r : item.writes) {
      saved.emplace_back(static_cast<const char*>(r.p), r.bytes);
      std::memset(r.p, 0xFF, r.bytes);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(gpu_->options().poison_hold_ms));
    for (size_t i = 0; i < item.writes.size(); ++i) {
      std::memcpy(item.writes[i].p, saved[i].data(), saved[i].size());
    }
  }
  absl::Status s = item.kernel();
  if (!s.ok()) return Annotate(s, absl::StrCat("sim:", gpu_->ordinal(), " kernel"));
  if (gpu_->options().late_copies != SimLateCopies::kNone && !item.writes.empty()) {
    gpu_->NoteKernelDone(this, item.seq, item.writes);
  }
  return s;
}

// ---- SimGpu ----

namespace {
absl::Mutex g_registry_mu;
SimGpu* g_registry[kSimDeviceCount] ABSL_GUARDED_BY(g_registry_mu) = {};
}  // namespace

absl::StatusOr<SimGpu*> SimGpu::Open(int ordinal, const SimOptions& options) {
  if (ordinal < 0 || ordinal >= kSimDeviceCount) {
    return absl::InvalidArgumentError(absl::StrCat("simulated device ", ordinal,
                                                   " does not exist (", kSimDeviceCount,
                                                   " present)"));
  }
  if (!(options.copy_gbps > 0)) {
    return absl::InvalidArgumentError("simulated copy bandwidth must be > 0 GB/s");
  }
  absl::MutexLock lock(&g_registry_mu);
  if (g_registry[ordinal] == nullptr) g_registry[ordinal] = new SimGpu(ordinal, options);
  return g_registry[ordinal];  // lives as long as the process
}

absl::StatusOr<SimGpu*> SimGpu::Find(int ordinal) {
  if (ordinal >= 0 && ordinal < kSimDeviceCount) {
    absl::MutexLock lock(&g_registry_mu);
    if (g_registry[ordinal] != nullptr) return g_registry[ordinal];
  }
  return absl::FailedPreconditionError(
      absl::StrCat("simulated device ", ordinal, " was not opened"));
}

absl::StatusOr<void*> SimGpu::Register(bool pinned, size_t bytes, const char* what) {
  void* p = AlignedZeroed(bytes);  // pre-touched
  if (p == nullptr) return absl::ResourceExhaustedError(what);
  absl::MutexLock lock(&mem_mu_);
  (pinned ? pinned_ : device_)[reinterpret_cast<uintptr_t>(p)] = std::max<size_t>(bytes, 1);
  return p;
}

void SimGpu::Unregister(bool pinned, void* p) {
  if (p == nullptr) return;
  {
    absl::MutexLock lock(&mem_mu_);
    (pinned ? pinned_ : device_).erase(reinterpret_cast<uintptr_t>(p));
  }
  std::free(p);
}

absl::StatusOr<void*> SimGpu::Malloc(size_t bytes) {
  return Register(/*pinned=*/false, bytes, "simulated device memory exhausted");
}

void SimGpu::Free(void* p) { Unregister(/*pinned=*/false, p); }

absl::StatusOr<void*> SimGpu::HostAlloc(size_t bytes) {
  return Register(/*pinned=*/true, bytes, "pinned host allocation failed");
}

void SimGpu::HostFree(void* p) { Unregister(/*pinned=*/true, p); }

bool SimGpu::Within(const std::map<uintptr_t, size_t>& m, const void* p, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = m.upper_bound(a);
  if (it == m.begin()) return false;
  --it;
  return a >= it->first && a + n <= it->first + it->second;
}

bool SimGpu::OwnsDevice(const void* p, size_t n) const {
  absl::MutexLock lock(&mem_mu_);
  return Within(device_, p, n);
}

bool SimGpu::OwnsPinned(const void* p, size_t n) const {
  absl::MutexLock lock(&mem_mu_);
  return Within(pinned_, p, n);
}

std::unique_ptr<SimStream> SimGpu::NewStream() {
  return std::unique_ptr<SimStream>(new SimStream(this));
}

void SimGpu::EngineCopy(void* dst, const void* src, size_t n) {
  absl::MutexLock lock(&engine_mu_);
  const int64_t t0 = MonotonicNanos();
  // Slice i is read once the interval's first i / kCopySlices have passed; the copy ends when
  // the whole interval has.
  const int slices = n >= static_cast<size_t>(kCopySlices) * 64 ? kCopySlices : 1;
  const double ns_per_byte = 1.0 / options_.copy_gbps;
  size_t done = 0;
  for (int i = 0; i < slices; ++i) {
    const size_t end_byte = n * static_cast<size_t>(i + 1) / static_cast<size_t>(slices);
    const int64_t at = t0 + static_cast<int64_t>(static_cast<double>(done) * ns_per_byte);
    const int64_t now = MonotonicNanos();
    if (at > now) std::this_thread::sleep_for(std::chrono::nanoseconds(at - now));
    std::memcpy(static_cast<char*>(dst) + done, static_cast<const char*>(src) + done,
                end_byte - done);
    done = end_byte;
    if (options_.after_slice) options_.after_slice(i, slices);
  }
  const int64_t end = t0 + static_cast<int64_t>(static_cast<double>(n) * ns_per_byte);
  const int64_t now = MonotonicNanos();
  if (end > now) std::this_thread::sleep_for(std::chrono::nanoseconds(end - now));
}

namespace {
constexpr size_t kWrittenKept = 1024;  // kernels remembered for late copies

bool Overlaps(const SimStream::Range& r, const void* p, size_t n) {
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(r.p);
  return a < b + r.bytes && b < a + n;
}
}  // namespace

void SimGpu::NoteKernelDone(const SimStream* stream, uint64_t seq,
                            const std::vector<SimStream::Range>& writes) {
  absl::MutexLock lock(&hold_mu_);
  written_.push_back({stream, seq, writes});
  if (written_.size() > kWrittenKept) written_.pop_front();
}

void SimGpu::HoldLateCopy(const CopyStreamState* state, uint64_t copy, const void* src,
                          size_t n) {
  struct Arg {
    SimGpu* gpu;
    const CopyStreamState* state;
    uint64_t copy;
    const void* src;
    size_t n;
  } arg{this, state, copy, src, n};
  absl::MutexLock lock(&hold_mu_);
  hold_mu_.Await(absl::Condition(
      +[](Arg* a) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        if (a->state->demanded >= a->copy) return true;
        for (const Written& w : a->gpu->written_) {
          if (w.stream != a->state->ref_stream || w.seq <= a->state->ref_seq) continue;
          for (const SimStream::Range& r : w.writes) {
            if (Overlaps(r, a->src, a->n)) return true;
          }
        }
        return false;
      },
      &arg));
}

// ---- the snapshot engine's Device ----

namespace {

class SimComputeEvent : public ComputeEvent {
 public:
  SimComputeEvent(SimStream* stream, uint64_t seq) : stream(stream), seq(seq) {}
  SimStream* const stream;
  const uint64_t seq;
};

// A job of a copy stream: a copy, or a wait for a compute event.
struct SimCopy {
  void* dst;
  const void* src;
  size_t n;
  SimComputeEvent* wait;  // a compute-event wait instead of a copy
  uint64_t copy = 0;      // a copy's number on its stream (late_copies)
};

using CopyStreamState = SimGpu::CopyStreamState;

// A copy stream: copies and compute-event waits run in order on one thread.
class SimCopyStream : public WorkerCopyStream<SimCopy> {
 public:
  SimCopyStream(SimGpu* gpu, bool late, std::shared_ptr<CopyStreamState> state)
      : WorkerCopyStream([gpu, late, state](const SimCopy& job) {
          return Run(gpu, late, state.get(), job);
        }),
        gpu_(gpu),
        state_(std::move(state)) {}

  void Demand() override {
    absl::MutexLock lock(gpu_->hold_mu());
    state_->demanded = state_->enqueued;
  }

  absl::Status CopyToHost(void* dst, const void* src, size_t n) override {
    if (!gpu_->OwnsDevice(src, n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "copy source is not device memory of sim:", gpu_->ordinal(),
          " (another device's memory, or host memory)"));
    }
    if (!gpu_->OwnsPinned(dst, n)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "copy destination is not pinned host memory of sim:", gpu_->ordinal()));
    }
    uint64_t copy = 0;
    {
      absl::MutexLock lock(gpu_->hold_mu());
      copy = ++state_->enqueued;
    }
    return jobs_.Enqueue({dst, src, n, nullptr, copy});
  }

  absl::Status WaitForEvent(ComputeEvent* event) override {
    if (event == nullptr || gpu_->options().unordered_copies) return absl::OkStatus();
    auto* e = static_cast<SimComputeEvent*>(event);
    return jobs_.Enqueue({nullptr, nullptr, 0, e});
  }

 private:
  static absl::Status Run(SimGpu* gpu, bool late, CopyStreamState* state, const SimCopy& job) {
    if (job.wait == nullptr) {
      if (late) gpu->HoldLateCopy(state, job.copy, job.src, job.n);
      gpu->EngineCopy(job.dst, job.src, job.n);
      return absl::OkStatus();
    }
    absl::Status s = job.wait->stream->Wait(job.wait->seq);
    {
      absl::MutexLock lock(gpu->hold_mu());
      state->ref_stream = job.wait->stream;
      state->ref_seq = job.wait->seq;
    }
    if (gpu->options().poison) {
      // The copy starts late (two kernels' time), so a copy the host did not wait for before
      // launching the next kernel that writes its source is still running then.
      std::this_thread::sleep_for(std::chrono::milliseconds(2 * gpu->options().poison_hold_ms));
    }
    return s;
  }

  SimGpu* const gpu_;
  const std::shared_ptr<CopyStreamState> state_;  // shared with the run function
};

class SimDevice : public Device {
 public:
  explicit SimDevice(SimGpu* gpu) : gpu_(gpu) {}
  std::string Name() const override { return absl::StrCat("sim:", gpu_->ordinal()); }
  bool IsHost() const override { return false; }
  absl::StatusOr<void*> AllocPinned(size_t bytes) override { return gpu_->HostAlloc(bytes); }
  void FreePinned(void* p, size_t) override { gpu_->HostFree(p); }
  absl::StatusOr<std::unique_ptr<CopyStream>> NewStream(bool high_priority) override {
    const SimLateCopies late = gpu_->options().late_copies;
    const bool is_late = late == (high_priority ? SimLateCopies::kGradient : SimLateCopies::kState);
    return std::unique_ptr<CopyStream>(
        new SimCopyStream(gpu_, is_late, std::make_shared<CopyStreamState>()));
  }
  absl::StatusOr<std::shared_ptr<ComputeEvent>> RecordComputeEvent(void* native_stream) override {
    if (native_stream == nullptr) return std::shared_ptr<ComputeEvent>();
    auto* stream = static_cast<SimStream*>(native_stream);
    if (stream->gpu() != gpu_) {
      return absl::InvalidArgumentError(
          absl::StrCat("compute stream of sim:", stream->gpu()->ordinal(),
                       " used with the snapshot device sim:", gpu_->ordinal()));
    }
    return std::shared_ptr<ComputeEvent>(new SimComputeEvent(stream, stream->Record()));
  }
  absl::StatusOr<void*> AllocDevice(size_t bytes) override { return gpu_->Malloc(bytes); }
  void FreeDevice(void* p) override { gpu_->Free(p); }
  absl::Status CopyToDeviceSync(void* dst, const void* src, size_t n) override {
    if (!gpu_->OwnsDevice(dst, n)) {
      return absl::InvalidArgumentError(Name() + ": destination is not its device memory");
    }
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  }
  absl::Status CopyToHostSync(void* dst, const void* src, size_t n) override {
    if (!gpu_->OwnsDevice(src, n)) {
      return absl::InvalidArgumentError(Name() + ": source is not its device memory");
    }
    std::memcpy(dst, src, n);
    return absl::OkStatus();
  }

 private:
  SimGpu* const gpu_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> NewSimDevice(int ordinal) {
  ASSIGN_OR_RETURN(SimGpu* gpu, SimGpu::Find(ordinal));
  return std::unique_ptr<Device>(new SimDevice(gpu));
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
