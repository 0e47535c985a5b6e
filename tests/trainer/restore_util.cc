#include "tests/trainer/restore_util.h"

#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/json.h"
#include "tests/testing/trainer.h"
#include "tests/testing/util.h"

namespace gradsnap {
namespace testing {

namespace {

// The JSON header of safetensors bytes `blob`; *data_start: where its data section begins.
absl::StatusOr<recovery::JsonValue> SafetensorsHeader(const std::string& blob,
                                                      uint64_t* data_start) {
  if (blob.size() < 8) return absl::DataLossError("shorter than a safetensors header");
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(blob[i]);
  if (len > blob.size() - 8) return absl::DataLossError("header length past the end");
  *data_start = 8 + len;
  return recovery::ParseJson(absl::string_view(blob).substr(8, len), "header");
}

}  // namespace

std::map<std::string, std::string> ReadRankDir(const std::string& dir, int n) {
  std::map<std::string, std::string> out;
  std::map<std::string, std::map<uint64_t, std::string>> pieces;
  for (int r = 0; r < n; ++r) {
    const std::string blob = ReadFileOrEmpty(absl::StrCat(dir, "/rank", r, ".safetensors"));
    uint64_t data_start = 0;
    auto header = SafetensorsHeader(blob, &data_start);
    if (!header.ok()) return {};
    const std::string data = blob.substr(data_start);
    const recovery::JsonValue* meta = header->Find("__metadata__");
    for (const auto& [name, e] : header->object) {
      if (name == "__metadata__") continue;
      uint64_t b = 0, en = 0;
      e.Find("data_offsets")->array[0].AsUint(&b);
      e.Find("data_offsets")->array[1].AsUint(&en);
      const std::string bytes = data.substr(b, en - b);
      const recovery::JsonValue* slice = meta->Find("slice." + name);
      if (slice == nullptr) {
        if (r == 0) out[name] = bytes;
        continue;
      }
      std::vector<std::string> f3 = absl::StrSplit(slice->text, ':');
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
  uint64_t data_start = 0;
  auto header = SafetensorsHeader(ReadFileOrEmpty(path), &data_start);
  if (!header.ok()) return "";
  const recovery::JsonValue* meta = header->Find("__metadata__");
  const recovery::JsonValue* v = meta == nullptr ? nullptr : meta->Find(key);
  return v == nullptr ? "" : v->text;
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
