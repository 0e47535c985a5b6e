// Helpers shared by the storage tests: random tensors and shards, and their restore check.
#ifndef GRADSNAP_STORAGE_TEST_UTIL_H_
#define GRADSNAP_STORAGE_TEST_UTIL_H_

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/digest.h"
#include "common/sha256.h"
#include "gtest/gtest.h"
#include "storage/engine.h"
#include "storage/types.h"
#include "tests/testing/temp_dir.h"

namespace gradsnap {
namespace storage {

using ::gradsnap::testing::TempDir;  // tests/testing/temp_dir.h

// Makes system call `nr` fail with `error` in the calling thread and in every thread or child
// it starts from now on (a seccomp filter: it cannot be lifted, so tests call it in a death
// test's child). E.g. __NR_io_uring_setup as in Docker's default profile. False if refused.
inline bool DenySyscall(long nr, int error = EPERM) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (static_cast<uint32_t>(error) & SECCOMP_RET_DATA)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof(filter) / sizeof(filter[0])), filter};
  return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

inline std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t x = rng();
    for (size_t j = 0; j < 8 && i + j < n; ++j) v[i + j] = static_cast<uint8_t>(x >> (8 * j));
  }
  return v;
}

// Floats ~ N(0, 0.02): compressible exponent bytes, like real weights.
inline std::vector<uint8_t> WeightBytes(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.02f);
  std::vector<uint8_t> v(count * 4);
  for (size_t i = 0; i < count; ++i) {
    float f = d(rng);
    std::memcpy(v.data() + 4 * i, &f, 4);
  }
  return v;
}

inline TensorSpec Tensor(const std::string& name, DType dtype, int64_t numel) {
  TensorSpec t;
  t.name = name;
  t.dtype = dtype;
  t.shape = {numel};
  t.byte_length = static_cast<uint64_t>(numel) * DTypeSize(dtype);
  return t;
}

struct ShardData {
  ShardSpec spec;
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<uint8_t> stream() const {
    std::vector<uint8_t> s;
    for (const auto& b : bytes) s.insert(s.end(), b.begin(), b.end());
    return s;
  }
  std::vector<const void*> ptrs() const {
    std::vector<const void*> p;
    for (const auto& b : bytes) p.push_back(b.data());
    return p;
  }
};

inline ShardData MakeShard(const std::string& job, int64_t step, int32_t rank, uint64_t seed,
                           int64_t w_numel = 100000) {
  ShardData d;
  d.spec.job = job;
  d.spec.step = step;
  d.spec.rank = rank;
  d.spec.metadata = "rank-meta";
  d.spec.tensors = {Tensor("w", DType::kF32, w_numel), Tensor("empty", DType::kF32, 0),
                    Tensor("g", DType::kBF16, 33333), Tensor("step", DType::kI64, 1)};
  d.bytes.push_back(WeightBytes(w_numel, seed));
  d.bytes.emplace_back();
  d.bytes.push_back(RandomBytes(33333 * 2, seed + 1));
  d.bytes.push_back(RandomBytes(8, seed + 2));
  return d;
}

inline void ExpectRestores(Engine* e, const ShardData& d) {
  auto r = e->OpenShardReader(d.spec.job, d.spec.step, d.spec.rank);
  ASSERT_TRUE(r.ok()) << r.status();
  const ShardInfo& info = (*r)->info();
  ASSERT_EQ(info.tensors.size(), d.bytes.size());
  EXPECT_EQ(info.metadata, d.spec.metadata);
  std::vector<uint8_t> stream;
  for (size_t i = 0; i < d.bytes.size(); ++i) {
    EXPECT_EQ(info.tensors[i].digest_algo, info.digest_algo);
    EXPECT_EQ(info.tensors[i].digest,
              DigestHex(info.digest_algo, d.bytes[i].data(), d.bytes[i].size()));
    if (info.digest_algo == DigestAlgo::kSha256) {
      EXPECT_EQ(info.tensors[i].spec.sha256, info.tensors[i].digest);
    }
    std::vector<uint8_t> out(d.bytes[i].size());
    ASSERT_TRUE((*r)->ReadTensor(i, out.data(), out.size()).ok());
    EXPECT_EQ(out, d.bytes[i]) << "tensor " << i;
    stream.insert(stream.end(), d.bytes[i].begin(), d.bytes[i].end());
  }
  std::vector<uint8_t> got(stream.size());
  uint64_t pos = 0;
  for (;;) {
    auto n = (*r)->Read(pos, got.data() + pos, std::min<size_t>(7777, got.size() - pos + 1));
    ASSERT_TRUE(n.ok()) << n.status();
    if (*n == 0) break;
    pos += *n;
  }
  EXPECT_EQ(pos, stream.size());
  EXPECT_EQ(got, stream);
}

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_TEST_UTIL_H_
