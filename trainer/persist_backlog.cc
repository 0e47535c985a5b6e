// PersistBacklog; see persist_backlog.h.
#include "trainer/persist_backlog.h"

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace gradsnap {
namespace trainer {

absl::StatusOr<uint64_t> ParseBacklogBytes(absl::string_view value) {
  if (value == "auto") return 0;
  const auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ckpt_backlog_bytes must be auto or a positive byte count (e.g. 67108864 or 64M), "
        "not '", value, "'"));
  };
  absl::string_view digits = value;
  int shift = 0;
  if (!digits.empty()) {
    switch (absl::ascii_toupper(digits.back())) {
      case 'K': shift = 10; break;
      case 'M': shift = 20; break;
      case 'G': shift = 30; break;
      default: break;
    }
    if (shift != 0) digits.remove_suffix(1);
  }
  uint64_t n = 0;
  if (digits.empty() || digits.find_first_not_of("0123456789") != absl::string_view::npos ||
      !absl::SimpleAtoi(digits, &n) || n == 0 ||
      n > (std::numeric_limits<uint64_t>::max() >> shift)) {
    return bad();
  }
  return n << shift;
}

uint64_t AutoBacklogBytes(uint64_t full_bytes, uint64_t delta_bytes, bool grad_log) {
  return std::max(kBacklogAutoMinBytes,
                  full_bytes + (grad_log ? kBacklogAutoDeltas * delta_bytes : 0));
}

bool PersistBacklog::TryReserve(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (bytes > budget_ || usage_.used > budget_ - bytes) return false;
  usage_.used += bytes;
  usage_.peak = std::max(usage_.peak, usage_.used);
  return true;
}

void PersistBacklog::Release(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  usage_.used -= std::min(usage_.used, bytes);
}

PersistBacklog::Usage PersistBacklog::usage() const {
  absl::MutexLock lock(&mu_);
  return usage_;
}

}  // namespace trainer
}  // namespace gradsnap
