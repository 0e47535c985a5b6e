#include "benchmarks/fault_drill/drill_util.h"

#include "absl/strings/str_cat.h"

namespace gradsnap {
namespace drill {

DrillOptions TestDrillOptions(const std::string& bin_dir, const std::string& work_dir,
                              uint64_t seed, bool quick) {
  DrillOptions o;
  o.server_bin = bin_dir + "/gradsnap-server";
  o.train_bin = bin_dir + "/gradsnap-train";
  o.work_dir = work_dir;
  o.seed = seed;
  o.quick = quick;
  return o;
}

void PutCounts(std::initializer_list<std::pair<const char*, int64_t>> counts,
               std::map<std::string, std::string>* kv) {
  for (const auto& [key, count] : counts) (*kv)[key] = absl::StrCat(count);
}

std::string FormatKv(const std::map<std::string, std::string>& kv) {
  std::string out;
  for (const auto& [k, v] : kv) absl::StrAppend(&out, out.empty() ? "" : " ", k, "=", v);
  return out;
}

}  // namespace drill
}  // namespace gradsnap
