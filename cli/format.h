// Human-friendly output of the gradsnap CLI: sizes, ages, ratios, aligned tables and a progress
// bar drawn on stderr only when it is a terminal. Not thread-safe (the CLI is single-threaded
// apart from callbacks it serializes).
#ifndef GRADSNAP_CLI_FORMAT_H_
#define GRADSNAP_CLI_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

namespace gradsnap {
namespace cli {

// "512 B", "4.0 KiB", "12.3 MiB", "1.20 GiB", "3.50 TiB".
std::string HumanBytes(uint64_t n);
// Age of `then_ms` at `now_ms`: "just now", "42s ago", "3m ago", "5h ago", "12d ago"; "-" when
// then_ms is 0 (unknown).
std::string HumanAge(int64_t now_ms, int64_t then_ms);
// raw / stored as "3.61x"; "-" when stored is 0.
std::string Ratio(uint64_t raw, uint64_t stored);

// A text table: the first row is the header; columns whose header is listed in `right` are
// right-aligned. Two spaces between columns, no trailing spaces.
std::string RenderTable(const std::vector<std::vector<std::string>>& rows,
                        const std::vector<std::string>& right);

// A one-line progress bar on stderr, redrawn at most 10 times a second, cleared by Finish() or
// the destructor. Does nothing unless enabled (the CLI enables it when isatty(2) and not --json).
class ProgressBar {
 public:
  ProgressBar(std::string label, bool enabled);
  ~ProgressBar();
  void Update(uint64_t done, uint64_t total);
  void Finish();

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  int64_t last_draw_ns_ = 0;
  int64_t start_ns_;
};

}  // namespace cli
}  // namespace gradsnap

#endif  // GRADSNAP_CLI_FORMAT_H_
