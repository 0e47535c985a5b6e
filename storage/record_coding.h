// Field coding of the storage records (docs/format.md, "Metadata", "Shard footer"): Out
// appends fields, In reads them back in the same order. A field's wire width is its C++ width
// (integers and enums fixed-width, little-endian; bool one byte; std::string as str = u32
// length + bytes). metadata.cc describes each record once for both; footer.cc frames its
// payload and trailer with them.
//
// THREAD SAFETY: one object per thread.
#ifndef GRADSNAP_STORAGE_RECORD_CODING_H_
#define GRADSNAP_STORAGE_RECORD_CODING_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

namespace gradsnap {
namespace storage {
namespace internal {

template <class T>
constexpr bool kFixedWidth = std::is_arithmetic_v<T> || std::is_enum_v<T>;

class Out {
 public:
  template <class... T> void operator()(const T&... v) { (Put(v), ...); }
  // A vector's element count; the elements follow.
  template <class V> void count(const V& v, size_t /*limit*/) {
    Put(static_cast<uint32_t>(v.size()));
  }
  const std::string& bytes() const { return s_; }
  std::string Take() { return std::move(s_); }

 private:
  void Put(const std::string& v) {
    Put(static_cast<uint32_t>(v.size()));
    s_.append(v);
  }
  void Put(bool v) { Put(static_cast<uint8_t>(v ? 1 : 0)); }
  template <class T> void Put(const T& v) {
    static_assert(kFixedWidth<T>);
    s_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  std::string s_;
};

// Reads fields from a string that outlives it; any overrun sets !ok() and yields zeros.
class In {
 public:
  explicit In(const std::string& s) : p_(s.data()), left_(s.size()) {}
  bool ok() const { return ok_; }
  bool done() const { return ok_ && left_ == 0; }
  template <class... T> void operator()(T&... v) { (Get(v), ...); }
  // Reads an element count and sizes `v`; a count over `limit` (or past the value) fails.
  template <class V> void count(V& v, size_t limit) {
    uint32_t n = 0;
    Get(n);
    if (!ok_ || n > limit || n > left_) { ok_ = false; n = 0; }
    v.resize(n);
  }

 private:
  void Get(std::string& v) {
    uint32_t n = 0;
    Get(n);
    if (!ok_ || n > left_) { ok_ = false; v.clear(); return; }
    v.assign(p_, n);
    p_ += n;
    left_ -= n;
  }
  void Get(bool& v) {
    uint8_t b = 0;
    Get(b);
    v = b != 0;
  }
  template <class T> void Get(T& v) {
    static_assert(kFixedWidth<T>);
    if (!ok_ || sizeof(v) > left_) { ok_ = false; v = T{}; return; }
    std::memcpy(&v, p_, sizeof(v));
    p_ += sizeof(v);
    left_ -= sizeof(v);
  }
  const char* p_;
  size_t left_;
  bool ok_ = true;
};

}  // namespace internal
}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_RECORD_CODING_H_
