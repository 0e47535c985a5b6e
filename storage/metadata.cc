#include "storage/metadata.h"

#include <sys/statvfs.h>

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "rocksdb/db.h"
#include "rocksdb/options.h"
#include "rocksdb/write_batch.h"

namespace gradsnap {
namespace storage {
namespace {

constexpr uint8_t kRecordVersion = 1;
// ShardRecord versions: 1 has SHA-256 digests and no algorithm field; 2 appends the digest
// algorithm (u8) after the digests (docs/format.md, "Digests").
constexpr uint8_t kShardRecordVersionSha256 = 1;
constexpr uint8_t kShardRecordVersion = 2;

class Out {
 public:
  void U8(uint8_t v) { s_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) { s_.append(reinterpret_cast<const char*>(&v), 4); }
  void U64(uint64_t v) { s_.append(reinterpret_cast<const char*>(&v), 8); }
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void Str(const std::string& v) { U32(static_cast<uint32_t>(v.size())); s_.append(v); }
  std::string Take() { return std::move(s_); }

 private:
  std::string s_;
};

// Reads fields; any overrun sets !ok() and yields zeros.
class In {
 public:
  explicit In(const std::string& s) : p_(s.data()), left_(s.size()) {}
  bool ok() const { return ok_; }
  bool done() const { return ok_ && left_ == 0; }
  uint8_t U8() { uint8_t v = 0; Raw(&v, 1); return v; }
  uint32_t U32() { uint32_t v = 0; Raw(&v, 4); return v; }
  uint64_t U64() { uint64_t v = 0; Raw(&v, 8); return v; }
  int64_t I64() { return static_cast<int64_t>(U64()); }
  std::string Str() {
    uint32_t n = U32();
    if (!ok_ || n > left_) { ok_ = false; return {}; }
    std::string v(p_, n);
    p_ += n;
    left_ -= n;
    return v;
  }

 private:
  void Raw(void* out, size_t n) {
    if (!ok_ || n > left_) { ok_ = false; return; }
    std::memcpy(out, p_, n);
    p_ += n;
    left_ -= n;
  }
  const char* p_;
  size_t left_;
  bool ok_ = true;
};

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
std::string ChunkPrefix(const std::string& job, int64_t step, int32_t rank) {
  return absl::StrFormat("k/%s/%020d/%010d/", job, step, rank);
}
std::string ChunkKey(const std::string& job, int64_t step, int32_t rank, uint32_t idx) {
  return absl::StrFormat("k/%s/%020d/%010d/%010u", job, step, rank, idx);
}

std::string EncodeCheckpoint(const CheckpointRecord& r) {
  Out o;
  o.U8(kRecordVersion);
  o.Str(r.spec.job);
  o.I64(r.spec.step);
  o.U8(static_cast<uint8_t>(r.spec.kind));
  o.I64(r.spec.base_step);
  o.U32(static_cast<uint32_t>(r.spec.world_size));
  o.Str(r.spec.metadata);
  o.U8(static_cast<uint8_t>(r.state));
  o.I64(r.created_unix_ms);
  o.I64(r.committed_unix_ms);
  o.U32(static_cast<uint32_t>(r.committed_shards));
  o.U64(r.raw_bytes);
  o.U64(r.stored_bytes);
  return o.Take();
}

absl::Status DecodeCheckpoint(const std::string& v, CheckpointRecord* r) {
  In in(v);
  if (in.U8() != kRecordVersion) return Malformed("checkpoint");
  r->spec.job = in.Str();
  r->spec.step = in.I64();
  r->spec.kind = static_cast<CheckpointKind>(in.U8());
  r->spec.base_step = in.I64();
  r->spec.world_size = static_cast<int32_t>(in.U32());
  r->spec.metadata = in.Str();
  r->state = static_cast<CheckpointState>(in.U8());
  r->created_unix_ms = in.I64();
  r->committed_unix_ms = in.I64();
  r->committed_shards = static_cast<int32_t>(in.U32());
  r->raw_bytes = in.U64();
  r->stored_bytes = in.U64();
  if (!in.done()) return Malformed("checkpoint");
  return absl::OkStatus();
}

std::string EncodeShard(const ShardRecord& r) {
  Out o;
  o.U8(kShardRecordVersion);
  o.Str(r.spec.job);
  o.I64(r.spec.step);
  o.U32(static_cast<uint32_t>(r.spec.rank));
  o.Str(r.spec.metadata);
  o.U32(static_cast<uint32_t>(r.spec.tensors.size()));
  for (const TensorSpec& t : r.spec.tensors) {
    o.Str(t.name);
    o.U8(static_cast<uint8_t>(t.dtype));
    o.U32(static_cast<uint32_t>(t.shape.size()));
    for (int64_t d : t.shape) o.I64(d);
    o.U64(t.byte_length);
    o.Str(t.flat_name);
    o.U64(t.flat_offset);
    o.U64(t.flat_total);
    o.Str(t.sha256);
  }
  o.U8(r.committed ? 1 : 0);
  o.U64(r.committed_size);
  o.U32(r.chunk_count);
  o.U64(r.stored_bytes);
  o.U32(static_cast<uint32_t>(r.segments.size()));
  for (const SegmentRef& s : r.segments) {
    o.U32(s.seq);
    o.U64(s.durable_end);
  }
  o.U32(static_cast<uint32_t>(r.tensor_digests.size()));
  for (const std::string& h : r.tensor_digests) o.Str(h);
  o.U8(static_cast<uint8_t>(r.digest_algo));  // version 2
  return o.Take();
}

absl::Status DecodeShard(const std::string& v, ShardRecord* r) {
  In in(v);
  const uint8_t version = in.U8();
  if (version != kShardRecordVersionSha256 && version != kShardRecordVersion) {
    return Malformed("shard");
  }
  r->spec.job = in.Str();
  r->spec.step = in.I64();
  r->spec.rank = static_cast<int32_t>(in.U32());
  r->spec.metadata = in.Str();
  uint32_t n = in.U32();
  if (!in.ok() || n > v.size()) return Malformed("shard");
  r->spec.tensors.resize(n);
  for (TensorSpec& t : r->spec.tensors) {
    t.name = in.Str();
    t.dtype = static_cast<DType>(in.U8());
    uint32_t rank = in.U32();
    if (!in.ok() || rank > 64) return Malformed("shard");
    t.shape.resize(rank);
    for (int64_t& d : t.shape) d = in.I64();
    t.byte_length = in.U64();
    t.flat_name = in.Str();
    t.flat_offset = in.U64();
    t.flat_total = in.U64();
    t.sha256 = in.Str();
  }
  r->committed = in.U8() != 0;
  r->committed_size = in.U64();
  r->chunk_count = in.U32();
  r->stored_bytes = in.U64();
  uint32_t segs = in.U32();
  if (!in.ok() || segs > v.size()) return Malformed("shard");
  r->segments.resize(segs);
  for (SegmentRef& s : r->segments) {
    s.seq = in.U32();
    s.durable_end = in.U64();
  }
  uint32_t hashes = in.U32();
  if (!in.ok() || hashes > n) return Malformed("shard");
  r->tensor_digests.resize(hashes);
  for (std::string& h : r->tensor_digests) h = in.Str();
  r->digest_algo = DigestAlgo::kSha256;
  if (version == kShardRecordVersion) {
    uint8_t algo = in.U8();
    if (!in.ok() || !IsKnownDigestAlgo(algo)) return Malformed("shard");
    r->digest_algo = static_cast<DigestAlgo>(algo);
  }
  if (!in.done()) return Malformed("shard");
  return absl::OkStatus();
}

std::string EncodeChunk(const ChunkRecord& r) {
  Out o;
  o.U8(kRecordVersion);
  o.U8(static_cast<uint8_t>(r.header.codec));
  o.U8(static_cast<uint8_t>(r.header.filter));
  o.U8(r.header.element_size);
  o.U32(r.header.raw_len);
  o.U32(r.header.stored_len);
  o.U64(r.header.stream_offset);
  o.U32(r.header.crc_raw);
  o.U32(r.header.crc_stored);
  o.U32(r.tensor);
  o.U32(r.segment);
  o.U64(r.offset);
  return o.Take();
}

absl::Status DecodeChunk(const std::string& v, ChunkRecord* r) {
  In in(v);
  if (in.U8() != kRecordVersion) return Malformed("chunk");
  r->header.codec = static_cast<ChunkCodec>(in.U8());
  r->header.filter = static_cast<ChunkFilter>(in.U8());
  r->header.element_size = in.U8();
  r->header.raw_len = in.U32();
  r->header.stored_len = in.U32();
  r->header.stream_offset = in.U64();
  r->header.crc_raw = in.U32();
  r->header.crc_stored = in.U32();
  r->tensor = in.U32();
  r->segment = in.U32();
  r->offset = in.U64();
  if (!in.done()) return Malformed("chunk");
  return absl::OkStatus();
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

// Batches that only delete still need a little room for their WAL record (a failed WAL write
// has the same consequence as above).
constexpr uint64_t kMinFreeForDeletes = 1 << 20;

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

absl::StatusOr<std::unique_ptr<MetaStore>> MetaStore::Open(const std::string& dir, Mode mode) {
  rocksdb::Options options;
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
  if (reserve_bytes_ > 0) {
    uint64_t need = batch.puts.empty() ? std::min<uint64_t>(reserve_bytes_, kMinFreeForDeletes)
                                       : reserve_bytes_;
    uint64_t free = FreeBytes(dir_);
    if (free < need) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "out of disk space: %d bytes free under %s, below the catalog's reserve of %d bytes",
          free, dir_, need));
    }
  }
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
