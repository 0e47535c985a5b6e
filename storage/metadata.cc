#include "storage/metadata.h"

#include <sys/statvfs.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <type_traits>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"
#include "common/status.h"
#include "storage/record_coding.h"

namespace gradsnap {
namespace storage {
namespace {

// Version bytes (docs/format.md, "Metadata"). A ShardRecord of version 1 has SHA-256 digests
// and no algorithm field; version 2 appends the digest algorithm ("Digests"); version 3 then
// the writer epoch (written only when it is not 0, so unfenced stores stay readable by older
// versions). A ChunkRecord of version 2 is a packed chunk (format 3) and appends where each
// tensor lies in it.
enum : uint8_t {
  kRecordVersion = 1,             // CheckpointRecord; ChunkRecord of one tensor
  kShardRecordVersionSha256 = 1,
  kShardRecordVersionAlgo = 2,
  kShardRecordVersion = 3,
  kPackedChunkRecordVersion = 2,
};

// Encoding and decoding share one description of each record: a Fields() template hands the
// fields in order to an Out (writes them) or an In (reads them back), so the two cannot drift
// apart. A field's wire width is its C++ width (integers and enums fixed-width, little-endian;
// bool one byte; std::string as str), checked below for the fields whose type could change.
static_assert(sizeof(CheckpointSpec::world_size) == 4 && sizeof(ShardSpec::rank) == 4 &&
              sizeof(CheckpointKind) == 1 && sizeof(CheckpointState) == 1 &&
              sizeof(DType) == 1 && sizeof(ChunkCodec) == 1 && sizeof(ChunkFilter) == 1);

using internal::In;
using internal::Out;

// The record's version byte when it is 1..newest, else 0.
uint8_t ReadVersion(In& in, uint8_t newest) {
  uint8_t version = 0;
  in(version);
  return version <= newest ? version : 0;
}

// R is the record type, const for Out.
template <class IO, class R>
void CheckpointFields(IO& io, R& r) {
  io(r.spec.job, r.spec.step, r.spec.kind, r.spec.base_step, r.spec.world_size,
     r.spec.metadata, r.state, r.created_unix_ms, r.committed_unix_ms, r.committed_shards,
     r.raw_bytes, r.stored_bytes);
}

template <class IO, class R>
void ShardFields(IO& io, R& r, size_t limit) {
  io(r.spec.job, r.spec.step, r.spec.rank, r.spec.metadata);
  io.count(r.spec.tensors, limit);
  for (auto& t : r.spec.tensors) {
    io(t.name, t.dtype);
    io.count(t.shape, 64);
    for (auto& d : t.shape) io(d);
    io(t.byte_length, t.flat_name, t.flat_offset, t.flat_total, t.sha256);
  }
  io(r.committed, r.committed_size, r.chunk_count, r.stored_bytes);
  io.count(r.segments, limit);
  for (auto& s : r.segments) io(s.seq, s.durable_end);
  io.count(r.tensor_digests, r.spec.tensors.size());
  for (auto& h : r.tensor_digests) io(h);
}

template <class IO, class R>
void ChunkFields(IO& io, R& r) {
  auto& h = r.header;  // const for Out
  io(h.codec, h.filter, h.element_size, h.raw_len, h.stored_len, h.stream_offset, h.crc_raw,
     h.crc_stored, r.tensor, r.segment, r.offset);
}

template <class IO, class R>
void MemberFields(IO& io, R& r, size_t limit) {
  io.count(r.members, limit);
  for (auto& m : r.members) io(m.tensor, m.offset, m.length);
}

absl::Status Malformed(const char* what) {
  return absl::DataLossError(absl::StrFormat("malformed %s metadata record", what));
}

absl::Status FromRocks(const rocksdb::Status& s, const char* what) {
  if (s.ok()) return absl::OkStatus();
  std::string msg = absl::StrFormat("rocksdb %s: %s", what, s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(msg);
  if (s.IsIOError() && s.ToString().find("No space") != std::string::npos) {
    return absl::ResourceExhaustedError(msg);
  }
  if (s.IsBusy() || s.IsTryAgain()) return absl::UnavailableError(msg);
  if (s.IsIOError() && s.ToString().find("Read-only file system") != std::string::npos) {
    return absl::FailedPreconditionError(
        msg + " (the file system is read-only: only reading commands such as ls, verify and "
              "restore work)");
  }
  if (s.IsIOError() && s.ToString().find("lock") != std::string::npos) {
    return absl::FailedPreconditionError(msg + " (is another process using this data_dir?)");
  }
  return absl::InternalError(msg);
}

}  // namespace

std::string CheckpointPrefix(const std::string& job) { return absl::StrFormat("c/%s/", job); }
std::string CheckpointKey(const std::string& job, int64_t step) {
  return absl::StrFormat("c/%s/%020d", job, step);
}
std::string ShardPrefix(const std::string& job, int64_t step) {
  return absl::StrFormat("s/%s/%020d/", job, step);
}
std::string ShardKey(const std::string& job, int64_t step, int32_t rank) {
  return absl::StrFormat("s/%s/%020d/%010d", job, step, rank);
}
std::string ChunkStepPrefix(const std::string& job, int64_t step) {
  return absl::StrFormat("k/%s/%020d/", job, step);
}

std::string SegmentFileName(int32_t rank, uint32_t seq) {
  return absl::StrFormat("r%010d-%06u.seg", rank, seq);
}

bool ParseSegmentName(const std::string& name, int32_t* rank, uint32_t* seq) {
  int r = 0;
  unsigned s = 0;
  char tail = 0;
  if (name.size() != 22 || std::sscanf(name.c_str(), "r%10d-%6u.se%c", &r, &s, &tail) != 3 ||
      tail != 'g') {
    return false;
  }
  *rank = r;
  *seq = s;
  return true;
}
MetaStore::Batch MetaStore::DeleteCheckpointBatch(const std::string& job, int64_t step) {
  Batch b;
  b.deletes.push_back(CheckpointKey(job, step));
  b.delete_prefixes.push_back(ShardPrefix(job, step));
  b.delete_prefixes.push_back(ChunkStepPrefix(job, step));
  return b;
}
std::string ChunkPrefix(const std::string& job, int64_t step, int32_t rank) {
  return absl::StrFormat("k/%s/%020d/%010d/", job, step, rank);
}
std::string ChunkKey(const std::string& job, int64_t step, int32_t rank, uint32_t idx) {
  return absl::StrFormat("k/%s/%020d/%010d/%010u", job, step, rank, idx);
}

std::string EncodeCheckpoint(const CheckpointRecord& r) {
  Out o;
  o(kRecordVersion);
  CheckpointFields(o, r);
  return o.Take();
}

absl::Status DecodeCheckpoint(const std::string& v, CheckpointRecord* r) {
  In in(v);
  if (ReadVersion(in, kRecordVersion) == 0) return Malformed("checkpoint");
  CheckpointFields(in, *r);
  if (!in.done()) return Malformed("checkpoint");
  return absl::OkStatus();
}

std::string EncodeShard(const ShardRecord& r) {
  Out o;
  o(r.epoch == 0 ? kShardRecordVersionAlgo : kShardRecordVersion);
  ShardFields(o, r, 0);
  o(r.digest_algo);  // version 2
  if (r.epoch != 0) o(r.epoch);  // version 3
  return o.Take();
}

absl::Status DecodeShard(const std::string& v, ShardRecord* r) {
  In in(v);
  const uint8_t version = ReadVersion(in, kShardRecordVersion);
  if (version == 0) return Malformed("shard");
  ShardFields(in, *r, v.size());
  r->digest_algo = DigestAlgo::kSha256;
  r->epoch = 0;
  if (version >= kShardRecordVersionAlgo) {
    uint8_t algo = 0;
    in(algo);
    if (!in.ok() || !IsKnownDigestAlgo(algo)) return Malformed("shard");
    r->digest_algo = static_cast<DigestAlgo>(algo);
  }
  if (version >= kShardRecordVersion) {
    in(r->epoch);
    if (!in.ok() || r->epoch == 0) return Malformed("shard");
  }
  if (!in.done()) return Malformed("shard");
  return absl::OkStatus();
}

std::string EncodeChunk(const ChunkRecord& r) {
  Out o;
  o(r.members.empty() ? kRecordVersion : kPackedChunkRecordVersion);
  ChunkFields(o, r);
  if (!r.members.empty()) MemberFields(o, r, 0);
  return o.Take();
}

absl::Status DecodeChunk(const std::string& v, ChunkRecord* r) {
  In in(v);
  const uint8_t version = ReadVersion(in, kPackedChunkRecordVersion);
  if (version == 0) return Malformed("chunk");
  ChunkFields(in, *r);
  r->members.clear();
  if (version == kPackedChunkRecordVersion) {
    MemberFields(in, *r, v.size());
    if (r->members.size() < 2) return Malformed("chunk");  // packed: at least two tensors
  }
  if (!in.done()) return Malformed("chunk");
  return absl::OkStatus();
}

absl::Status CheckChunkPlacement(const std::vector<uint64_t>& tensor_start,
                                 const ChunkRecord& c) {
  const size_t tensors = tensor_start.empty() ? 0 : tensor_start.size() - 1;
  const uint64_t begin = c.header.stream_offset;
  const uint64_t end = begin + c.header.raw_len;
  // [lo, hi) of the stream must lie within tensor t.
  auto inside = [&](uint32_t t, uint64_t lo, uint64_t hi) {
    return t < tensors && lo < hi && tensor_start[t] <= lo && hi <= tensor_start[t + 1];
  };
  auto misplaced = [&] {
    return absl::DataLossError(absl::StrFormat(
        "chunk at stream offset %d (%d bytes) does not lie where its tensor records say",
        begin, c.header.raw_len));
  };
  if (c.members.empty()) return inside(c.tensor, begin, end) ? absl::OkStatus() : misplaced();
  if (c.members.front().tensor != c.tensor) return misplaced();
  uint64_t at = 0;  // members tile the chunk in stream order, each within its tensor
  for (size_t i = 0; i < c.members.size(); ++i) {
    const ChunkMember& m = c.members[i];
    if (m.offset != at || (i > 0 && m.tensor <= c.members[i - 1].tensor) ||
        !inside(m.tensor, begin + at, begin + at + m.length)) {
      return misplaced();
    }
    at += m.length;
  }
  return at == c.header.raw_len ? absl::OkStatus() : misplaced();
}

namespace {

// RocksDB's info log, discarded: a read-only open must not create or rotate LOG files (the
// directory may be read-only, or a full file system).
class NullLogger : public rocksdb::Logger {
 public:
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    (void)format;
    (void)ap;
  }
};

// RocksDB's info log for read-write opens: appended to <dir>/LOG with stdio, every error
// ignored. RocksDB's own file logger goes through its WritableFileWriter, which on a full disk
// records the ENOSPC and later trips the library's assertion (sync_without_flush_called_) when
// the database is closed: a full disk would abort the process. A LOG over 16 MiB at open is
// moved to LOG.old.
class StdioLogger : public rocksdb::Logger {
 public:
  explicit StdioLogger(const std::string& dir) {
    const std::string path = dir + "/LOG";
    std::error_code ec;
    uintmax_t size = std::filesystem::file_size(path, ec);
    if (!ec && size > (16u << 20)) std::filesystem::rename(path, path + ".old", ec);
    f_ = std::fopen(path.c_str(), "ae");
  }
  ~StdioLogger() override {
    if (f_ != nullptr) std::fclose(f_);
  }
  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    if (f_ == nullptr) return;
    char line[2048];
    std::vsnprintf(line, sizeof(line), format, ap);
    absl::MutexLock lock(&mu_);
    std::fprintf(f_, "%s\n", line);
    std::fflush(f_);
  }

 private:
  absl::Mutex mu_;
  std::FILE* f_ = nullptr;
};

}  // namespace

uint64_t FreeBytes(const std::string& path) {
  std::filesystem::path p(path);
  for (int depth = 0; depth < 4096; ++depth) {
    struct statvfs st;
    if (::statvfs(p.c_str(), &st) == 0) {
      return static_cast<uint64_t>(st.f_bavail) * static_cast<uint64_t>(st.f_frsize);
    }
    if (!p.has_parent_path() || p.parent_path() == p) break;
    p = p.parent_path();
  }
  return UINT64_MAX;
}

absl::Status CheckRoomToAdd(const std::string& dir, uint64_t reserve_bytes) {
  if (reserve_bytes == 0) return absl::OkStatus();
  const uint64_t free = FreeBytes(dir);
  if (free >= reserve_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "out of disk space: %d bytes free under %s, below the catalog's reserve of %d bytes; "
      "writes are refused until space is freed (reads, rm and gc still work)",
      free, dir, reserve_bytes));
}

absl::StatusOr<std::unique_ptr<MetaStore>> MetaStore::Open(const std::string& dir, Mode mode,
                                                           bool low_space) {
  rocksdb::Options options;
  // Below the reserve, what the WAL holds stays in memory at open rather than becoming a new
  // table file on a disk that may not hold it, and no file is preallocated (the MANIFEST's
  // 4 MiB, the WAL's): on some file systems a preallocation that fails keeps what it got.
  options.avoid_flush_during_recovery = low_space;
  options.allow_fallocate = !low_space;
  options.create_if_missing = mode == Mode::kCreate;
  options.paranoid_checks = true;
  options.keep_log_file_num = 4;
  options.max_manifest_file_size = 64 << 20;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s;
  if (mode == Mode::kReadOnly) {
    options.info_log = std::make_shared<NullLogger>();
    s = rocksdb::DB::OpenForReadOnly(options, dir, &db);
  } else {
    std::error_code ec;
    if (mode == Mode::kCreate) std::filesystem::create_directories(dir, ec);
    options.info_log = std::make_shared<StdioLogger>(dir);
    s = rocksdb::DB::Open(options, dir, &db);
  }
  if (!s.ok()) return FromRocks(s, "open");
  return std::unique_ptr<MetaStore>(new MetaStore(db, mode == Mode::kReadOnly, dir));
}

MetaStore::~MetaStore() {
  db_->Close().PermitUncheckedError();
  delete db_;
}

absl::StatusOr<std::string> MetaStore::Get(const std::string& key) {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), key, &value);
  if (!s.ok()) return FromRocks(s, "get");
  return value;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> MetaStore::Scan(
    const std::string& prefix) {
  std::vector<std::pair<std::string, std::string>> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(prefix); it->Valid() && it->key().starts_with(prefix); it->Next()) {
    out.emplace_back(it->key().ToString(), it->value().ToString());
  }
  if (!it->status().ok()) return FromRocks(it->status(), "scan");
  return out;
}

absl::Status MetaStore::Commit(const Batch& batch) {
  if (read_only_) {
    return absl::FailedPreconditionError("the checkpoint store is open read-only");
  }
  // Batches that only delete still need a little room for their WAL record (a failed WAL write
  // has the same consequence as one that adds).
  const uint64_t need = batch.puts.empty()
                            ? std::min<uint64_t>(reserve_bytes_, kMinFreeForDeletes)
                            : reserve_bytes_;
  RETURN_IF_ERROR(CheckRoomToAdd(dir_, need));
  rocksdb::WriteBatch wb;
  for (const auto& [k, v] : batch.puts) wb.Put(k, v);
  for (const std::string& k : batch.deletes) wb.Delete(k);
  for (const std::string& p : batch.delete_prefixes) {
    std::string end = p;
    end.back() = static_cast<char>(end.back() + 1);  // prefixes end in '/', so '/'+1 = '0'
    wb.DeleteRange(p, end);
  }
  rocksdb::WriteOptions wo;
  wo.sync = true;
  return FromRocks(db_->Write(wo, &wb), "write");
}

}  // namespace storage
}  // namespace gradsnap
