// A small statistics facility, after RocksDB's tickers and histograms.
//
// Counters and histograms are registered by name in a Registry and updated lock-free from any
// thread; `RenderPrometheus()` writes them in the Prometheus text exposition format
// (the service's --metrics-listen endpoint). Labels are part of the name given at registration,
// e.g. `gradsnap_errors_total{code="DATA_LOSS"}`.
//
//   static Counter* bytes_in = Registry::Global()->GetCounter("gradsnap_bytes_in_total", "...");
//   bytes_in->Add(n);
//   { ScopedLatency t(Registry::Global()->GetHistogram("gradsnap_commit_seconds", "...")); ... }
#ifndef GRADSNAP_COMMON_STATS_H_
#define GRADSNAP_COMMON_STATS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace gradsnap {

class Counter {
 public:
  void Add(int64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  void Set(int64_t v) { value_.store(v, std::memory_order_relaxed); }  // for gauges
  int64_t Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

// Latency histogram in seconds with fixed exponential buckets from 100 us to ~100 s.
class Histogram {
 public:
  static constexpr int kBuckets = 21;
  static double BucketBound(int i);  // upper bound of bucket i, seconds
  void Observe(double seconds);
  int64_t Count() const { return count_.load(std::memory_order_relaxed); }
  double Sum() const;
  int64_t BucketCount(int i) const { return buckets_[i].load(std::memory_order_relaxed); }

 private:
  std::array<std::atomic<int64_t>, kBuckets> buckets_{};
  std::atomic<int64_t> count_{0};
  std::atomic<int64_t> sum_nanos_{0};
};

class ScopedLatency {
 public:
  explicit ScopedLatency(Histogram* h) : h_(h) {}
  ~ScopedLatency() { h_->Observe(watch_.ElapsedSeconds()); }

 private:
  Histogram* h_;
  Stopwatch watch_;
};

class Registry {
 public:
  static Registry* Global();
  // Returns the metric with this full name (labels included), creating it on first use.
  // The pointer stays valid for the registry's lifetime. `kind` in the output is "counter"
  // unless `gauge` is true.
  Counter* GetCounter(const std::string& name, const std::string& help, bool gauge = false);
  Histogram* GetHistogram(const std::string& name, const std::string& help);
  std::string RenderPrometheus() const;

 private:
  struct Entry {
    std::string help;
    bool gauge = false;
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Histogram> histogram;
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Entry> metrics_ ABSL_GUARDED_BY(mu_);
};

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_STATS_H_
