#include "client/test_util.h"

#include <future>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "common/status.h"

namespace gradsnap {
namespace client {
namespace testing {
namespace {

TestTensor Make(const std::string& name, DType dtype, std::vector<int64_t> shape,
                std::mt19937_64& rng, bool compressible) {
  TestTensor t;
  t.spec.name = name;
  t.spec.dtype = dtype;
  t.spec.shape = std::move(shape);
  uint64_t numel = 1;
  for (int64_t d : t.spec.shape) numel *= static_cast<uint64_t>(d);
  t.spec.byte_length = numel * DTypeSize(dtype);
  t.data.resize(t.spec.byte_length);
  for (size_t i = 0; i < t.data.size(); i += 8) {
    uint64_t v = rng();
    if (compressible) v &= 0x0000ffff0000ffffull;  // half the bytes zero
    for (size_t j = 0; j < 8 && i + j < t.data.size(); ++j) t.data[i + j] = static_cast<char>(v >> (8 * j));
  }
  return t;
}

}  // namespace

std::string TestShard::Payload() const {
  std::string out;
  for (const TestTensor& t : tensors) out += t.data;
  return out;
}

std::vector<TensorRef> TestShard::Refs() const {
  std::vector<TensorRef> refs;
  for (const TestTensor& t : tensors) refs.push_back(TensorRef{t.spec, t.data.data()});
  return refs;
}

TestShard MakeShard(uint64_t seed, int32_t rank, uint64_t big_bytes) {
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(rank));
  TestShard s;
  s.rank = rank;
  s.metadata = absl::StrCat("shard-meta rank=", rank, " seed=", seed);
  s.tensors.push_back(Make("params.f32", DType::kF32, {17, 33}, rng, false));
  s.tensors.push_back(Make("grad.bf16", DType::kBF16, {64, 9}, rng, true));
  s.tensors.push_back(Make("act.f16", DType::kF16, {5}, rng, false));
  s.tensors.push_back(Make("stats.f64", DType::kF64, {3, 3}, rng, false));
  s.tensors.push_back(Make("index.i32", DType::kI32, {100}, rng, true));
  s.tensors.push_back(Make("counter.i64", DType::kI64, {7}, rng, false));
  s.tensors.push_back(Make("rng_state.u8", DType::kU8, {1000}, rng, false));
  s.tensors.push_back(Make("step", DType::kI64, {}, rng, false));
  TestTensor slice = Make("adam.m", DType::kF32, {256}, rng, true);
  slice.spec.flat_name = "adam_m_flat";
  slice.spec.flat_offset = 256 * static_cast<uint64_t>(rank);
  slice.spec.flat_total = 256 * 64;
  s.tensors.push_back(std::move(slice));
  if (big_bytes >= 4) {
    s.tensors.push_back(Make("big.f32", DType::kF32, {static_cast<int64_t>(big_bytes / 4)}, rng,
                             rank % 2 == 1));
  }
  return s;
}

absl::StatusOr<std::unique_ptr<Client>> ConnectLocal(const std::string& dir) {
  ClientOptions o;
  o.local_dir = dir;
  return Client::Connect(o);
}

absl::StatusOr<TestCheckpoint> SaveTestCheckpoint(Client& client, const std::string& job,
                                                  int64_t step, int32_t world_size, uint64_t seed,
                                                  uint64_t big_bytes) {
  TestCheckpoint c;
  c.spec.job = job;
  c.spec.step = step;
  c.spec.world_size = world_size;
  c.spec.metadata = absl::StrCat("ckpt-meta step=", step);
  for (int32_t r = 0; r < world_size; ++r) c.shards.push_back(MakeShard(seed + step, r, big_bytes));
  RETURN_IF_ERROR(client.BeginCheckpoint(c.spec));
  std::vector<std::future<absl::Status>> futures;
  for (const TestShard& s : c.shards) {
    ShardSpec spec;
    spec.job = job;
    spec.step = step;
    spec.rank = s.rank;
    spec.metadata = s.metadata;
    futures.push_back(client.SaveShardAsync(spec, s.Refs()));
  }
  absl::Status first;
  for (auto& f : futures) {
    absl::Status st = f.get();
    if (first.ok()) first = st;
  }
  RETURN_IF_ERROR(first);
  return c;
}

}  // namespace testing
}  // namespace client
}  // namespace gradsnap
