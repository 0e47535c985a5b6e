#include "storage/footer.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status.h"
#include "storage/aligned_buffer.h"

namespace gradsnap {
namespace storage {
namespace {

constexpr uint8_t kFooterVersion = 1;

void PutU32(std::string* s, uint32_t v) { s->append(reinterpret_cast<const char*>(&v), 4); }
void PutU64(std::string* s, uint64_t v) { s->append(reinterpret_cast<const char*>(&v), 8); }
void PutStr(std::string* s, const std::string& v) {
  PutU32(s, static_cast<uint32_t>(v.size()));
  s->append(v);
}

std::string Payload(const ShardFooter& f) {
  std::string p;
  p.push_back(static_cast<char>(kFooterVersion));
  PutStr(&p, EncodeCheckpoint(f.checkpoint));
  PutStr(&p, EncodeShard(f.shard));
  PutU32(&p, static_cast<uint32_t>(f.chunks.size()));
  for (const ChunkRecord& c : f.chunks) PutStr(&p, EncodeChunk(c));
  return p;
}

class Reader {
 public:
  explicit Reader(const std::string& s) : s_(s) {}
  bool ok() const { return ok_; }
  bool done() const { return ok_ && pos_ == s_.size(); }
  uint8_t U8() {
    if (pos_ + 1 > s_.size()) { ok_ = false; return 0; }
    return static_cast<uint8_t>(s_[pos_++]);
  }
  uint32_t U32() {
    uint32_t v = 0;
    if (pos_ + 4 > s_.size()) { ok_ = false; return 0; }
    std::memcpy(&v, s_.data() + pos_, 4);
    pos_ += 4;
    return v;
  }
  std::string Str() {
    uint32_t n = U32();
    if (!ok_ || n > s_.size() - pos_) { ok_ = false; return {}; }
    std::string v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }

 private:
  const std::string& s_;
  size_t pos_ = 0;
  bool ok_ = true;
};

}  // namespace

size_t FooterSize(const ShardFooter& f) {
  return AlignUp(Payload(f).size() + kFooterTrailerSize);
}

std::string EncodeFooter(const ShardFooter& f) {
  std::string out = Payload(f);
  const uint64_t payload_len = out.size();
  const uint32_t crc = Crc32c(out.data(), out.size());
  out.resize(AlignUp(payload_len + kFooterTrailerSize) - kFooterTrailerSize, '\0');
  std::string t;
  PutU64(&t, kFooterMagic);
  PutU64(&t, payload_len);
  PutU64(&t, static_cast<uint64_t>(f.written_unix_ms));
  PutU32(&t, crc);
  PutU32(&t, Crc32c(t.data(), t.size()));
  out += t;
  return out;
}

absl::StatusOr<ShardFooter> ReadFooter(FileSystem* fs, const std::string& path) {
  OpenOptions oo;
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, fs->Open(path, oo));
  ASSIGN_OR_RETURN(uint64_t size, file->Size());
  auto none = [&path](const char* why) {
    return absl::NotFoundError(absl::StrCat(path, ": no shard footer (", why, ")"));
  };
  if (size < 4096 || size % 4096 != 0) return none("size is not a whole number of blocks");
  char t[kFooterTrailerSize];
  ASSIGN_OR_RETURN(size_t got, file->Read(size - kFooterTrailerSize, t, sizeof(t)));
  if (got != sizeof(t)) return none("short read");
  uint64_t magic, payload_len, written;
  uint32_t crc, tcrc;
  std::memcpy(&magic, t, 8);
  std::memcpy(&payload_len, t + 8, 8);
  std::memcpy(&written, t + 16, 8);
  std::memcpy(&crc, t + 24, 4);
  std::memcpy(&tcrc, t + 28, 4);
  if (magic != kFooterMagic || tcrc != Crc32c(t, 28)) return none("no trailer");
  uint64_t footer_len = AlignUp(payload_len + kFooterTrailerSize);
  if (footer_len > size) return absl::DataLossError(absl::StrCat(path, ": footer longer than file"));
  std::string payload(payload_len, '\0');
  ASSIGN_OR_RETURN(got, file->Read(size - footer_len, payload.data(), payload.size()));
  if (got != payload.size() || Crc32c(payload.data(), payload.size()) != crc) {
    return absl::DataLossError(absl::StrCat(path, ": shard footer checksum mismatch"));
  }
  ShardFooter f;
  f.written_unix_ms = static_cast<int64_t>(written);
  Reader r(payload);
  if (r.U8() != kFooterVersion) {
    return absl::DataLossError(absl::StrCat(path, ": unknown shard footer version"));
  }
  RETURN_IF_ERROR(Annotate(DecodeCheckpoint(r.Str(), &f.checkpoint), path));
  RETURN_IF_ERROR(Annotate(DecodeShard(r.Str(), &f.shard), path));
  uint32_t n = r.U32();
  if (!r.ok() || n > payload.size()) {
    return absl::DataLossError(absl::StrCat(path, ": malformed shard footer"));
  }
  f.chunks.resize(n);
  for (ChunkRecord& c : f.chunks) RETURN_IF_ERROR(Annotate(DecodeChunk(r.Str(), &c), path));
  if (!r.done()) return absl::DataLossError(absl::StrCat(path, ": malformed shard footer"));
  return f;
}

}  // namespace storage
}  // namespace gradsnap
