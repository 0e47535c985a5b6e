#include "trainer/train_state.h"

#include <cmath>
#include <cstring>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace gradsnap {
namespace trainer {

const char* DeviceKindName(DeviceKind d) {
  switch (d) {
    case DeviceKind::kCpu: return "cpu";
    case DeviceKind::kCuda: return "cuda";
    case DeviceKind::kSim: return "sim";
  }
  return "?";
}

std::optional<DeviceKind> ParseDeviceKind(absl::string_view name) {
  for (DeviceKind d : {DeviceKind::kCpu, DeviceKind::kCuda, DeviceKind::kSim}) {
    if (name == DeviceKindName(d)) return d;
  }
  return std::nullopt;
}

namespace {

constexpr absl::string_view kVersionLine = "gradsnap-train-state v1";

std::string FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return absl::StrCat("0x", absl::Hex(u, absl::kZeroPad8));
}

bool ParseFloatBits(absl::string_view s, float* f) {
  uint32_t u;
  if (!absl::ConsumePrefix(&s, "0x") || !absl::SimpleHexAtoi(s, &u)) return false;
  std::memcpy(f, &u, sizeof(u));
  return true;
}

}  // namespace

std::string ReplicatedState::Serialize() const {
  std::string out = absl::StrCat(kVersionLine, "\n");
  auto kv = [&out](absl::string_view k, const auto& v) { absl::StrAppend(&out, k, "=", v, "\n"); };
  kv("step", step);
  kv("opt_t", opt_t);
  kv("skipped_steps", skipped_steps);
  kv("seed", seed);
  kv("loader_seed", loader.seed);
  kv("loader_batch_index", loader.batch_index);
  kv("max_lr", FloatBits(max_lr));
  kv("min_lr", FloatBits(min_lr));
  kv("warmup_steps", warmup_steps);
  kv("total_steps", total_steps);
  kv("grad_clip", FloatBits(grad_clip));
  kv("beta1", FloatBits(adamw.beta1));
  kv("beta2", FloatBits(adamw.beta2));
  kv("eps", FloatBits(adamw.eps));
  kv("weight_decay", FloatBits(adamw.weight_decay));
  kv("model_config", model_config);
  kv("world_size", world_size);
  kv("global_batch", global_batch);
  kv("seq_len", seq_len);
  kv("data_fingerprint", data_fingerprint);
  if (!param_layout.empty()) kv("param_layout", param_layout);
  return out;
}

absl::StatusOr<ReplicatedState> ReplicatedState::Parse(absl::string_view bytes) {
  std::vector<absl::string_view> lines = absl::StrSplit(bytes, '\n', absl::SkipEmpty());
  if (lines.empty() || lines[0] != kVersionLine) {
    return absl::DataLossError("replicated state: missing or unknown version line");
  }
  std::map<std::string, std::string> kv;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::pair<std::string, std::string> p = absl::StrSplit(lines[i], absl::MaxSplits('=', 1));
    kv[p.first] = p.second;
  }
  ReplicatedState s;
  bool ok = true;
  auto get = [&](const char* k) -> std::string {
    auto it = kv.find(k);
    if (it == kv.end()) {
      ok = false;
      return "";
    }
    return it->second;
  };
  auto i64 = [&](const char* k, int64_t* v) { ok = absl::SimpleAtoi(get(k), v) && ok; };
  auto i32 = [&](const char* k, int32_t* v) { ok = absl::SimpleAtoi(get(k), v) && ok; };
  auto u64 = [&](const char* k, uint64_t* v) { ok = absl::SimpleAtoi(get(k), v) && ok; };
  auto f32 = [&](const char* k, float* v) { ok = ParseFloatBits(get(k), v) && ok; };
  i64("step", &s.step);
  i64("opt_t", &s.opt_t);
  i64("skipped_steps", &s.skipped_steps);
  u64("seed", &s.seed);
  u64("loader_seed", &s.loader.seed);
  i64("loader_batch_index", &s.loader.batch_index);
  f32("max_lr", &s.max_lr);
  f32("min_lr", &s.min_lr);
  i64("warmup_steps", &s.warmup_steps);
  i64("total_steps", &s.total_steps);
  f32("grad_clip", &s.grad_clip);
  f32("beta1", &s.adamw.beta1);
  f32("beta2", &s.adamw.beta2);
  f32("eps", &s.adamw.eps);
  f32("weight_decay", &s.adamw.weight_decay);
  s.model_config = get("model_config");
  i32("world_size", &s.world_size);
  i32("global_batch", &s.global_batch);
  i32("seq_len", &s.seq_len);
  s.data_fingerprint = get("data_fingerprint");
  if (auto it = kv.find("param_layout"); it != kv.end()) s.param_layout = it->second;
  if (!ok) return absl::DataLossError("replicated state: a field is missing or malformed");
  return s;
}

float LearningRate(const ReplicatedState& s, int64_t step) {
  const double max_lr = s.max_lr, min_lr = s.min_lr;
  if (s.warmup_steps > 0 && step <= s.warmup_steps) {
    return static_cast<float>(max_lr * static_cast<double>(step) /
                              static_cast<double>(s.warmup_steps));
  }
  if (step >= s.total_steps || s.total_steps <= s.warmup_steps) return static_cast<float>(min_lr);
  const double ratio = static_cast<double>(step - s.warmup_steps) /
                       static_cast<double>(s.total_steps - s.warmup_steps);
  const double coeff = 0.5 * (1.0 + std::cos(M_PI * ratio));
  return static_cast<float>(min_lr + coeff * (max_lr - min_lr));
}

}  // namespace trainer
}  // namespace gradsnap
