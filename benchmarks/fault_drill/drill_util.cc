#include "benchmarks/fault_drill/drill_util.h"

#include <cstring>

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

std::vector<client::TensorRef> DrillShard::Refs() const {
  std::vector<client::TensorRef> refs;
  for (size_t i = 0; i < data.size(); ++i) refs.push_back({spec.tensors[i], data[i].data()});
  return refs;
}

DrillShard MakeDrillShard(const std::string& job, int64_t step, int32_t rank, uint64_t big,
                          std::mt19937_64* rng) {
  DrillShard s;
  s.spec.job = job;
  s.spec.step = step;
  s.spec.rank = rank;
  s.spec.metadata = absl::StrCat("rank ", rank);
  for (uint64_t bytes : {big / 4 * 4, uint64_t{4096}, uint64_t{8}}) {
    client::TensorSpec t;
    t.name = absl::StrCat("t", s.spec.tensors.size());
    t.dtype = DType::kF32;
    t.shape = {static_cast<int64_t>(bytes / 4)};
    t.byte_length = bytes;
    std::string d(bytes, '\0');
    for (size_t i = 0; i + 8 <= d.size(); i += 8) {
      uint64_t x = (*rng)();
      std::memcpy(d.data() + i, &x, 8);
    }
    s.spec.tensors.push_back(t);
    s.data.push_back(std::move(d));
  }
  return s;
}

client::CheckpointSpec DrillSpec(const std::string& job, int64_t step, int32_t world,
                                 int64_t base) {
  return {job, step, base < 0 ? client::CheckpointKind::kFull : client::CheckpointKind::kDelta,
          base, world, ""};
}

bool RestoresAsWritten(client::Client* c, const DrillShard& s) {
  for (size_t i = 0; i < s.data.size(); ++i) {
    std::string got(s.data[i].size(), '\0');
    if (!c->RestoreTensor(s.spec.job, s.spec.step, s.spec.rank, s.spec.tensors[i].name,
                          got.data(), got.size())
             .ok() ||
        got != s.data[i]) {
      return false;
    }
  }
  return true;
}

int ShardsNotRestored(client::Client* c, const WrittenShards& written,
                      const std::set<int64_t>& steps) {
  int n = 0;
  for (int64_t step : steps) {
    for (const DrillShard& s : written.at(step)) n += !RestoresAsWritten(c, s);
  }
  return n;
}

absl::StatusOr<std::unique_ptr<client::Client>> ConnectDrill(
    const std::vector<std::string>& endpoints) {
  client::ClientOptions o;
  o.endpoints = endpoints;
  o.max_attempts = 2;
  o.rpc_timeout_ms = 20000;
  return client::Client::Connect(o);
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
