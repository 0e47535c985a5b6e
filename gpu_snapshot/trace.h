// A Chrome / Perfetto trace-event writer (the JSON "traceEvents" format), for --trace FILE:
// compute phases, copies, replay, compression and persist per step on named tracks, so the
// overlap of checkpointing with training is visible in chrome://tracing or ui.perfetto.dev.
//
// Events are kept in memory (bounded: past max_events further events are counted and dropped)
// and written by Flush(). Timestamps are microseconds from the writer's creation.
//
// THREAD SAFETY
//   All methods are thread-safe. A null TraceWriter* is accepted by TraceScope (no-op), so
//   callers need not branch on whether tracing is on.
#ifndef GRADSNAP_GPU_SNAPSHOT_TRACE_H_
#define GRADSNAP_GPU_SNAPSHOT_TRACE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace gradsnap {
namespace gpu_snapshot {

class TraceWriter {
 public:
  // max_events Default: 1,000,000.
  explicit TraceWriter(std::string path, size_t max_events = 1000000);
  // Microseconds since construction.
  int64_t NowMicros() const;
  // A complete ("X") event on `track` (a named row, e.g. "train", "copy", "replay", "persist").
  void Complete(const std::string& track, const std::string& name, int64_t start_us,
                int64_t dur_us, const std::string& args_json = "");
  // An instant ("i") event.
  void Instant(const std::string& track, const std::string& name,
               const std::string& args_json = "");
  // A counter ("C") event at `ts_us`: each numeric member of `args_json` is one series of the
  // counter track `name` (Perfetto draws them stacked).
  void Counter(const std::string& name, const std::string& args_json, int64_t ts_us);
  // Writes the JSON file (rewrites it whole; may be called more than once).
  absl::Status Flush();
  size_t events() const;
  const std::string& path() const { return path_; }

 private:
  struct Event {
    char phase;
    int tid;
    std::string name;
    int64_t ts;
    int64_t dur;
    std::string args;
  };
  int TrackId(const std::string& track) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const size_t max_events_;
  const int64_t origin_ns_;
  mutable absl::Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> tracks_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

// A complete event begun at construction and recorded by End, for work that ends elsewhere (a
// callback): copyable. A null writer records nothing.
class TraceSpan {
 public:
  explicit TraceSpan(TraceWriter* w) : w_(w), start_(w ? w->NowMicros() : 0) {}
  void End(const std::string& track, const std::string& name) const {
    if (w_) w_->Complete(track, name, start_, w_->NowMicros() - start_);
  }

 private:
  TraceWriter* w_;
  int64_t start_;
};

// Records a complete event from construction to destruction.
class TraceScope {
 public:
  TraceScope(TraceWriter* w, std::string track, std::string name, std::string args = "")
      : w_(w), track_(std::move(track)), name_(std::move(name)), args_(std::move(args)),
        start_(w ? w->NowMicros() : 0) {}
  ~TraceScope() {
    if (w_) w_->Complete(track_, name_, start_, w_->NowMicros() - start_, args_);
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  TraceWriter* w_;
  std::string track_, name_, args_;
  int64_t start_;
};

}  // namespace gpu_snapshot
}  // namespace gradsnap

#endif  // GRADSNAP_GPU_SNAPSHOT_TRACE_H_
