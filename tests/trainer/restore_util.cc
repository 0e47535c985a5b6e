#include "tests/trainer/restore_util.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/safetensors.h"
#include "tests/testing/trainer.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {

std::map<std::string, std::string> ReadRankDir(const std::string& dir, int n) {
  std::map<std::string, std::string> out;
  std::map<std::string, std::map<uint64_t, std::string>> pieces;
  for (int r = 0; r < n; ++r) {
    const std::string path = absl::StrCat(dir, "/rank", r, ".safetensors");
    const std::string blob = ReadFileOrEmpty(path);
    auto header = client::ParseSafetensors(blob, path);
    if (!header.ok()) return {};
    for (const auto& [name, t] : header->tensors) {
      const std::string bytes = blob.substr(header->data_start + t.begin, t.end - t.begin);
      auto slice = header->metadata.find("slice." + name);
      if (slice == header->metadata.end()) {
        if (r == 0) out[name] = bytes;
        continue;
      }
      std::vector<std::string> f3 = absl::StrSplit(slice->second, ':');
      uint64_t off = 0;
      if (f3.size() < 2 || !absl::SimpleAtoi(f3[1], &off)) return {};  // not a slice: no match
      pieces[f3[0]][off] = bytes;
    }
  }
  for (const auto& [flat, by_offset] : pieces) {
    for (const auto& [off, bytes] : by_offset) out[flat] += bytes;
  }
  return out;
}

RunResult TrainTwoRanks(const std::string& args) {
  return RunTrainer(GRADSNAP_TRAIN_BIN, " --model tiny --batch 12 --seed 5 --nproc 2 " + args);
}

std::string SafetensorsMetadata(const std::string& path, const std::string& key) {
  auto header = client::ParseSafetensors(ReadFileOrEmpty(path), path);
  if (!header.ok()) return "";
  auto v = header->metadata.find(key);
  return v == header->metadata.end() ? "" : v->second;
}

std::string WithoutWorldSize(const std::string& state) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(state, '\n')) {
    if (!absl::StartsWith(line, "world_size=")) absl::StrAppend(&out, line, "\n");
  }
  return out;
}

}  // namespace testing
}  // namespace gradsnap
