#include "cli/format.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"

namespace gradsnap {
namespace cli {

std::string HumanBytes(uint64_t n) {
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  if (n < 1024) return absl::StrCat(n, " B");
  double v = static_cast<double>(n) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  // Two calls: absl checks a format string at compile time (under clang), so it is a literal.
  return v < 10 ? absl::StrFormat("%.2f %s", v, kUnits[u])
                : absl::StrFormat("%.1f %s", v, kUnits[u]);
}

std::string HumanAge(int64_t now_ms, int64_t then_ms) {
  if (then_ms <= 0) return "-";
  int64_t s = std::max<int64_t>(0, (now_ms - then_ms) / 1000);
  if (s < 5) return "just now";
  if (s < 60) return absl::StrCat(s, "s ago");
  if (s < 3600) return absl::StrCat(s / 60, "m ago");
  if (s < 86400) return absl::StrCat(s / 3600, "h ago");
  return absl::StrCat(s / 86400, "d ago");
}

std::string Ratio(uint64_t raw, uint64_t stored) {
  if (stored == 0) return "-";
  return absl::StrFormat("%.2fx", static_cast<double>(raw) / static_cast<double>(stored));
}

std::string RenderTable(const std::vector<std::vector<std::string>>& rows,
                        const std::vector<std::string>& right) {
  if (rows.empty()) return "";
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows) {
    for (size_t c = 0; c < r.size() && c < width.size(); ++c) width[c] = std::max(width[c], r[c].size());
  }
  std::vector<bool> align_right(width.size(), false);
  for (size_t c = 0; c < width.size(); ++c) {
    align_right[c] = std::find(right.begin(), right.end(), rows[0][c]) != right.end();
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size() && c < width.size(); ++c) {
      if (c > 0) line += "  ";
      std::string pad(width[c] - r[c].size(), ' ');
      line += align_right[c] ? pad + r[c] : r[c] + pad;
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

ProgressBar::ProgressBar(std::string label, bool enabled)
    : label_(std::move(label)), enabled_(enabled), start_ns_(MonotonicNanos()) {}

ProgressBar::~ProgressBar() { Finish(); }

void ProgressBar::Update(uint64_t done, uint64_t total) {
  if (!enabled_) return;
  int64_t now = MonotonicNanos();
  if (drawn_ && now - last_draw_ns_ < 100'000'000 && done < total) return;
  last_draw_ns_ = now;
  constexpr int kWidth = 30;
  double frac = total == 0 ? 1.0 : std::min(1.0, static_cast<double>(done) / total);
  int fill = static_cast<int>(frac * kWidth);
  double secs = std::max(1e-9, (now - start_ns_) * 1e-9);
  std::string line = absl::StrFormat(
      "\r%s [%s%s] %3d%% %s / %s  %s/s\033[K", label_, std::string(fill, '#'),
      std::string(kWidth - fill, '.'), static_cast<int>(frac * 100), HumanBytes(done),
      HumanBytes(total), HumanBytes(static_cast<uint64_t>(done / secs)));
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (!enabled_ || !drawn_) return;
  static const char kClear[] = "\r\033[K";
  ssize_t ignored = ::write(STDERR_FILENO, kClear, sizeof(kClear) - 1);
  (void)ignored;
  drawn_ = false;
}

}  // namespace cli
}  // namespace gradsnap
