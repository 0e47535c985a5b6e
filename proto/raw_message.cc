#include "proto/raw_message.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"

namespace gradsnap {
namespace proto {
namespace {

constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutKey(std::string* out, uint32_t field, uint32_t wire_type) {
  PutVarint(out, (static_cast<uint64_t>(field) << 3) | wire_type);
}

// Reads protobuf wire format across a ByteBuffer's slices.
class SliceCursor {
 public:
  explicit SliceCursor(std::vector<grpc::Slice> slices) : slices_(std::move(slices)) { Skip0(); }
  bool AtEnd() const { return i_ >= slices_.size(); }
  bool ReadVarint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && !AtEnd(); shift += 7) {
      uint8_t b = slices_[i_].begin()[off_];
      Advance(1);
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) return true;
    }
    return false;
  }
  // Appends references to the next n bytes to out (or just skips them when out is null);
  // false if fewer remain.
  bool Take(uint64_t n, std::vector<grpc::Slice>* out) {
    while (n > 0) {
      if (AtEnd()) return false;
      size_t take = static_cast<size_t>(std::min<uint64_t>(slices_[i_].size() - off_, n));
      if (out != nullptr) out->push_back(slices_[i_].sub(off_, off_ + take));
      Advance(take);
      n -= take;
    }
    return true;
  }

 private:
  void Advance(size_t n) {
    off_ += n;
    Skip0();
  }
  void Skip0() {
    while (i_ < slices_.size() && off_ >= slices_[i_].size()) {
      ++i_;
      off_ = 0;
    }
  }
  const std::vector<grpc::Slice> slices_;
  size_t i_ = 0;
  size_t off_ = 0;
};

std::atomic<int64_t> g_outstanding{0};

struct Release {
  std::function<void()> fn;
};

void RunRelease(void* p) {
  std::unique_ptr<Release> r(static_cast<Release*>(p));
  r->fn();
  g_outstanding.fetch_sub(1, std::memory_order_relaxed);
}

}  // namespace

void RawMessageBuilder::AddVarint(uint32_t field, uint64_t value) {
  if (value == 0) return;
  PutKey(&header_, field, kVarint);
  PutVarint(&header_, value);
}

void RawMessageBuilder::AddBytes(uint32_t field, absl::string_view bytes) {
  PutKey(&header_, field, kLengthDelimited);
  PutVarint(&header_, bytes.size());
  header_.append(bytes.data(), bytes.size());
}

void RawMessageBuilder::AddSlices(uint32_t field, std::vector<grpc::Slice> pieces,
                                  uint64_t size) {
  if (size == 0) return;
  PutKey(&header_, field, kLengthDelimited);
  PutVarint(&header_, size);
  FlushHeader();
  for (grpc::Slice& s : pieces) slices_.push_back(std::move(s));
}

void RawMessageBuilder::FlushHeader() {
  if (header_.empty()) return;
  slices_.emplace_back(header_);  // copied: a few bytes
  header_.clear();
}

grpc::ByteBuffer RawMessageBuilder::Finish() {
  FlushHeader();
  grpc::ByteBuffer bb(slices_.data(), slices_.size());
  slices_.clear();
  return bb;
}

std::string RawField::Flatten() const {
  std::string out;
  out.reserve(size);
  for (const grpc::Slice& s : pieces) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

absl::Status ForEachField(const grpc::ByteBuffer& bb, absl::string_view what,
                          absl::StatusCode code,
                          const std::function<absl::Status(RawField&)>& fn) {
  const auto malformed = [&] { return absl::Status(code, absl::StrCat("malformed ", what)); };
  std::vector<grpc::Slice> slices;
  if (bb.Length() > 0 && !bb.Dump(&slices).ok()) return malformed();
  SliceCursor c(std::move(slices));
  while (!c.AtEnd()) {
    uint64_t key = 0;
    if (!c.ReadVarint(&key) || (key >> 3) == 0 || (key >> 3) > UINT32_MAX) return malformed();
    RawField f;
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire_type = static_cast<uint32_t>(key & 7);
    switch (f.wire_type) {
      case kVarint:
        if (!c.ReadVarint(&f.varint)) return malformed();
        break;
      case kLengthDelimited:
        if (!c.ReadVarint(&f.size) || !c.Take(f.size, &f.pieces)) return malformed();
        break;
      case kFixed64:
      case kFixed32:
        if (!c.Take(f.wire_type == kFixed64 ? 8 : 4, nullptr)) return malformed();
        continue;
      default:
        return malformed();
    }
    absl::Status s = fn(f);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

grpc::Slice OwnedSlice(void* buf, size_t len, std::function<void()> release) {
  g_outstanding.fetch_add(1, std::memory_order_relaxed);
  auto* r = new Release{std::move(release)};
  return grpc::Slice(buf, len, &RunRelease, r);
}

std::shared_ptr<BufferPool> BufferPool::Create(size_t buffer_bytes, size_t keep) {
  return std::shared_ptr<BufferPool>(new BufferPool(buffer_bytes, keep));
}

grpc::Slice BufferPool::Take(size_t n, char** data) {
  std::unique_ptr<char[]> buf;
  {
    absl::MutexLock lock(&mu_);
    if (!free_.empty()) {
      buf = std::move(free_.back());
      free_.pop_back();
    }
  }
  if (buf == nullptr) buf.reset(new char[buffer_bytes_]);
  char* p = buf.release();
  *data = p;
  std::weak_ptr<BufferPool> self = weak_from_this();
  return OwnedSlice(p, std::min(n, buffer_bytes_), [self, p] {
    std::unique_ptr<char[]> owned(p);
    if (auto pool = self.lock()) pool->Give(std::move(owned));
  });
}

void BufferPool::Give(std::unique_ptr<char[]> buf) {
  absl::MutexLock lock(&mu_);
  if (free_.size() < keep_) free_.push_back(std::move(buf));
}

int64_t OutstandingOwnedSlices() { return g_outstanding.load(std::memory_order_relaxed); }

}  // namespace proto
}  // namespace gradsnap
