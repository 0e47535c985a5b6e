#include "common/stats.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace gradsnap {

double Histogram::BucketBound(int i) { return 1e-4 * std::pow(2.0, i); }

void Histogram::Observe(double seconds) {
  int i = 0;
  while (i < kBuckets - 1 && seconds > BucketBound(i)) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  sum_nanos_.fetch_add(static_cast<int64_t>(seconds * 1e9), std::memory_order_relaxed);
}

double Histogram::Sum() const { return sum_nanos_.load(std::memory_order_relaxed) * 1e-9; }

Registry* Registry::Global() {
  static Registry* r = new Registry();
  return r;
}

Counter* Registry::GetCounter(const std::string& name, const std::string& help, bool gauge) {
  absl::MutexLock lock(&mu_);
  Entry& e = metrics_[name];
  if (!e.counter) {
    e.counter = std::make_unique<Counter>();
    e.help = help;
    e.gauge = gauge;
  }
  return e.counter.get();
}

Histogram* Registry::GetHistogram(const std::string& name, const std::string& help) {
  absl::MutexLock lock(&mu_);
  Entry& e = metrics_[name];
  if (!e.histogram) {
    e.histogram = std::make_unique<Histogram>();
    e.help = help;
  }
  return e.histogram.get();
}

namespace {
// Splits `name{labels}` into the base name and the label text without braces.
void SplitName(const std::string& full, std::string* base, std::string* labels) {
  size_t brace = full.find('{');
  if (brace == std::string::npos) {
    *base = full;
    labels->clear();
  } else {
    *base = full.substr(0, brace);
    *labels = full.substr(brace + 1, full.size() - brace - 2);
  }
}
}  // namespace

std::string Registry::RenderPrometheus() const {
  absl::MutexLock lock(&mu_);
  std::string out;
  std::string last_base;
  for (const auto& [full, e] : metrics_) {
    std::string base, labels;
    SplitName(full, &base, &labels);
    if (base != last_base) {
      absl::StrAppend(&out, "# HELP ", base, " ", e.help, "\n# TYPE ", base, " ",
                      e.histogram ? "histogram" : (e.gauge ? "gauge" : "counter"), "\n");
      last_base = base;
    }
    if (e.counter) absl::StrAppend(&out, full, " ", e.counter->Value(), "\n");
    if (e.histogram) {
      const Histogram& h = *e.histogram;
      std::string sep = labels.empty() ? "" : ",";
      int64_t cumulative = 0;
      for (int i = 0; i < Histogram::kBuckets; ++i) {
        cumulative += h.BucketCount(i);
        absl::StrAppend(&out, base, "_bucket{", labels, sep, "le=\"",
                        absl::StrFormat("%g", Histogram::BucketBound(i)), "\"} ", cumulative, "\n");
      }
      absl::StrAppend(&out, base, "_bucket{", labels, sep, "le=\"+Inf\"} ", h.Count(), "\n");
      std::string lab = labels.empty() ? "" : absl::StrCat("{", labels, "}");
      absl::StrAppend(&out, base, "_sum", lab, " ", absl::StrFormat("%.6f", h.Sum()), "\n");
      absl::StrAppend(&out, base, "_count", lab, " ", h.Count(), "\n");
    }
  }
  return out;
}

}  // namespace gradsnap
