#include "gpu_snapshot/trace.h"

#include <cstdio>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status.h"

namespace gradsnap {
namespace gpu_snapshot {
namespace {

void AppendEscaped(std::string* out, const std::string& s) {
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppend(out, "\\u00", (c >> 4) & 1, std::string(1, "0123456789abcdef"[c & 15]));
    } else {
      out->push_back(c);
    }
  }
}

}  // namespace

TraceWriter::TraceWriter(std::string path, size_t max_events)
    : path_(std::move(path)), max_events_(max_events), origin_ns_(MonotonicNanos()) {}

int64_t TraceWriter::NowMicros() const { return (MonotonicNanos() - origin_ns_) / 1000; }

int TraceWriter::TrackId(const std::string& track) {
  auto it = tracks_.find(track);
  if (it != tracks_.end()) return it->second;
  int id = static_cast<int>(tracks_.size()) + 1;
  tracks_[track] = id;
  return id;
}

void TraceWriter::Complete(const std::string& track, const std::string& name, int64_t start_us,
                           int64_t dur_us, const std::string& args_json) {
  absl::MutexLock lock(&mu_);
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  events_.push_back({'X', TrackId(track), name, start_us, dur_us, args_json});
}

void TraceWriter::Instant(const std::string& track, const std::string& name,
                          const std::string& args_json) {
  int64_t now = NowMicros();
  absl::MutexLock lock(&mu_);
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  events_.push_back({'i', TrackId(track), name, now, 0, args_json});
}

void TraceWriter::Counter(const std::string& name, const std::string& args_json,
                          int64_t ts_us) {
  absl::MutexLock lock(&mu_);
  if (events_.size() >= max_events_) {
    ++dropped_;
    return;
  }
  events_.push_back({'C', 0, name, ts_us, 0, args_json});
}

size_t TraceWriter::events() const {
  absl::MutexLock lock(&mu_);
  return events_.size();
}

absl::Status TraceWriter::Flush() {
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  {
    absl::MutexLock lock(&mu_);
    int pid = static_cast<int>(getpid());
    bool first = true;
    for (const auto& [track, tid] : tracks_) {
      absl::StrAppend(&out, first ? "" : ",\n", "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":",
                      pid, ",\"tid\":", tid, ",\"args\":{\"name\":\"");
      AppendEscaped(&out, track);
      out += "\"}}";
      first = false;
    }
    for (const Event& e : events_) {
      absl::StrAppend(&out, first ? "" : ",\n", "{\"ph\":\"", std::string(1, e.phase),
                      "\",\"pid\":", pid, ",\"tid\":", e.tid, ",\"ts\":", e.ts);
      if (e.phase == 'X') absl::StrAppend(&out, ",\"dur\":", e.dur);
      if (e.phase == 'i') out += ",\"s\":\"t\"";
      out += ",\"name\":\"";
      AppendEscaped(&out, e.name);
      out += "\"";
      if (!e.args.empty()) absl::StrAppend(&out, ",\"args\":", e.args);
      out += "}";
      first = false;
    }
    absl::StrAppend(&out, "\n],\"otherData\":{\"dropped_events\":", dropped_, "}}\n");
  }
  std::string tmp = path_ + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) return PosixError("open " + tmp, errno);
  size_t w = std::fwrite(out.data(), 1, out.size(), f);
  int err = errno;
  if (std::fclose(f) != 0 || w != out.size()) return PosixError("write " + tmp, err);
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) return PosixError("rename " + path_, errno);
  return absl::OkStatus();
}

}  // namespace gpu_snapshot
}  // namespace gradsnap
