#include "benchmarks/fault_drill/drill_util.h"

#include "absl/strings/str_cat.h"

namespace gradsnap {
namespace drill {

std::string FormatKv(const std::map<std::string, std::string>& kv) {
  std::string out;
  for (const auto& [k, v] : kv) absl::StrAppend(&out, out.empty() ? "" : " ", k, "=", v);
  return out;
}

}  // namespace drill
}  // namespace gradsnap
