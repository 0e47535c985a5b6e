#include "recovery/layout.h"

#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace gradsnap {
namespace recovery {

uint64_t ParamEntry::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

std::string EncodeLayout(const std::vector<ParamEntry>& entries) {
  std::vector<std::string> parts;
  for (const ParamEntry& e : entries) {
    parts.push_back(absl::StrCat(e.name, ":", absl::StrJoin(e.shape, "x"), ":", e.offset));
  }
  return absl::StrJoin(parts, ";");
}

absl::StatusOr<std::vector<ParamEntry>> DecodeLayout(absl::string_view text) {
  std::vector<ParamEntry> out;
  std::set<std::string> names;
  uint64_t next = 0;
  for (absl::string_view part : absl::StrSplit(text, ';', absl::SkipEmpty())) {
    std::vector<absl::string_view> f = absl::StrSplit(part, ':');
    ParamEntry e;
    bool ok = f.size() == 3 && !f[0].empty() && absl::SimpleAtoi(f[2], &e.offset);
    if (ok && !f[1].empty()) {
      for (absl::string_view d : absl::StrSplit(f[1], 'x')) {
        int64_t v = 0;
        ok = ok && absl::SimpleAtoi(d, &v) && v > 0;
        e.shape.push_back(v);
      }
    }
    if (!ok) return absl::DataLossError(absl::StrCat("model layout: bad entry '", part, "'"));
    e.name = std::string(f[0]);
    if (e.offset != next || !names.insert(e.name).second) {
      return absl::DataLossError(
          absl::StrCat("model layout: entry ", e.name, " at ", e.offset, ", expected ", next));
    }
    next = e.offset + e.numel();
    out.push_back(std::move(e));
  }
  if (out.empty()) return absl::DataLossError("model layout: empty");
  return out;
}

uint64_t LayoutTotal(const std::vector<ParamEntry>& entries) {
  return entries.empty() ? 0 : entries.back().offset + entries.back().numel();
}

}  // namespace recovery
}  // namespace gradsnap
