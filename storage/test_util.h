// Helpers shared by the storage tests: a unique temporary directory and random tensors.
#ifndef GRADSNAP_STORAGE_TEST_UTIL_H_
#define GRADSNAP_STORAGE_TEST_UTIL_H_

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "storage/types.h"

namespace gradsnap {
namespace storage {

// mkdtemp under $TMPDIR (or /tmp); removed on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/gradsnap-test-XXXXXX";
    path_ = ::mkdtemp(tmpl.data()) != nullptr ? tmpl : "";
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

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

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_TEST_UTIL_H_
