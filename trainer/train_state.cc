#include "trainer/train_state.h"

#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/key_value_text.h"
#include "common/status.h"

namespace gradsnap {
namespace trainer {

namespace {

constexpr absl::string_view kVersionLine = "gradsnap-train-state v1";

// Floats as the hex bit pattern: exact, and the same text on every machine.
std::string FieldText(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return absl::StrCat("0x", absl::Hex(u, absl::kZeroPad8));
}
template <typename T>
std::string FieldText(const T& v) {
  return absl::StrCat(v);
}

bool ParseField(absl::string_view s, float* f) {
  uint32_t u;
  if (!absl::ConsumePrefix(&s, "0x") || !absl::SimpleHexAtoi(s, &u)) return false;
  std::memcpy(f, &u, sizeof(u));
  return true;
}
bool ParseField(absl::string_view s, std::string* v) {
  *v = std::string(s);
  return true;
}
template <typename Int>
bool ParseField(absl::string_view s, Int* v) {
  return absl::SimpleAtoi(s, v);
}

// The required fields in file order, as fn(key, field): the one list Serialize writes and Parse
// reads. `State` is ReplicatedState or const ReplicatedState.
template <typename State, typename Fn>
void ForEachField(State& s, Fn&& fn) {
  fn("step", s.step);
  fn("opt_t", s.opt_t);
  fn("skipped_steps", s.skipped_steps);
  fn("seed", s.seed);
  fn("loader_seed", s.loader.seed);
  fn("loader_batch_index", s.loader.batch_index);
  fn("max_lr", s.max_lr);
  fn("min_lr", s.min_lr);
  fn("warmup_steps", s.warmup_steps);
  fn("total_steps", s.total_steps);
  fn("grad_clip", s.grad_clip);
  fn("beta1", s.adamw.beta1);
  fn("beta2", s.adamw.beta2);
  fn("eps", s.adamw.eps);
  fn("weight_decay", s.adamw.weight_decay);
  fn("model_config", s.model_config);
  fn("world_size", s.world_size);
  fn("global_batch", s.global_batch);
  fn("seq_len", s.seq_len);
  fn("data_fingerprint", s.data_fingerprint);
}

}  // namespace

std::string ReplicatedState::Serialize() const {
  std::string out = absl::StrCat(kVersionLine, "\n");
  ForEachField(*this, [&out](absl::string_view key, const auto& value) {
    absl::StrAppend(&out, key, "=", FieldText(value), "\n");
  });
  if (!param_layout.empty()) absl::StrAppend(&out, "param_layout=", param_layout, "\n");
  return out;
}

absl::StatusOr<ReplicatedState> ReplicatedState::Parse(absl::string_view bytes) {
  absl::StatusOr<std::map<std::string, std::string>> kv = ParseKeyValueText(bytes, kVersionLine);
  if (!kv.ok()) return Annotate(kv.status(), "replicated state");
  ReplicatedState s;
  bool ok = true;
  ForEachField(s, [&](absl::string_view key, auto& value) {
    auto it = kv->find(std::string(key));
    ok = ok && it != kv->end() && ParseField(it->second, &value);
  });
  if (auto it = kv->find("param_layout"); it != kv->end()) s.param_layout = it->second;
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
