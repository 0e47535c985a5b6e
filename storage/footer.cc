#include "storage/footer.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/status.h"
#include "storage/aligned_buffer.h"
#include "storage/record_coding.h"

namespace gradsnap {
namespace storage {
namespace {

constexpr uint8_t kFooterVersionNoEpoch = 1;
constexpr uint8_t kFooterVersion = 2;  // + job epoch

using internal::In;
using internal::Out;

std::string Payload(const ShardFooter& f) {
  Out p;
  p(kFooterVersion, EncodeCheckpoint(f.checkpoint), EncodeShard(f.shard), f.job_epoch);
  p.count(f.chunks, 0);
  for (const ChunkRecord& c : f.chunks) p(EncodeChunk(c));
  return p.Take();
}

}  // namespace

size_t FooterSize(const ShardFooter& f) {
  return AlignUp(Payload(f).size() + kFooterTrailerSize);
}

std::string EncodeFooter(const ShardFooter& f) {
  std::string out = Payload(f);
  const uint64_t payload_len = out.size();
  const uint32_t crc = Crc32c(out.data(), out.size());
  out.resize(AlignUp(payload_len + kFooterTrailerSize) - kFooterTrailerSize, '\0');
  Out t;
  t(kFooterMagic, payload_len, f.written_unix_ms, crc);
  t(Crc32c(t.bytes().data(), t.bytes().size()));
  out += t.bytes();
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
  uint64_t magic = 0, payload_len = 0;
  int64_t written = 0;
  uint32_t crc = 0, tcrc = 0;
  const std::string trailer_bytes(t, sizeof(t));
  In trailer(trailer_bytes);
  trailer(magic, payload_len, written, crc, tcrc);
  if (magic != kFooterMagic || tcrc != Crc32c(t, 28)) return none("no trailer");
  // Checked before any arithmetic on it: a length near 2^64 would wrap the aligned size
  // (and then ask for a buffer of that many bytes).
  if (payload_len > size - kFooterTrailerSize) {
    return absl::DataLossError(absl::StrCat(path, ": footer longer than file"));
  }
  uint64_t footer_len = AlignUp(payload_len + kFooterTrailerSize);
  if (footer_len > size) return absl::DataLossError(absl::StrCat(path, ": footer longer than file"));
  std::string payload(payload_len, '\0');
  ASSIGN_OR_RETURN(got, file->Read(size - footer_len, payload.data(), payload.size()));
  if (got != payload.size() || Crc32c(payload.data(), payload.size()) != crc) {
    return absl::DataLossError(absl::StrCat(path, ": shard footer checksum mismatch"));
  }
  ShardFooter f;
  f.written_unix_ms = written;
  In in(payload);
  uint8_t version = 0;
  in(version);
  if (version != kFooterVersion && version != kFooterVersionNoEpoch) {
    return absl::DataLossError(absl::StrCat(path, ": unknown shard footer version"));
  }
  std::string record;
  in(record);
  RETURN_IF_ERROR(Annotate(DecodeCheckpoint(record, &f.checkpoint), path));
  in(record);
  RETURN_IF_ERROR(Annotate(DecodeShard(record, &f.shard), path));
  if (version >= kFooterVersion) in(f.job_epoch);
  in.count(f.chunks, payload.size());
  if (!in.ok()) return absl::DataLossError(absl::StrCat(path, ": malformed shard footer"));
  for (ChunkRecord& c : f.chunks) {
    in(record);
    RETURN_IF_ERROR(Annotate(DecodeChunk(record, &c), path));
  }
  if (!in.done()) return absl::DataLossError(absl::StrCat(path, ": malformed shard footer"));
  return f;
}

}  // namespace storage
}  // namespace gradsnap
