// EngineImpl: checkpoint lifecycle, metadata commits, recovery, listing, delete and GC.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/status.h"
#include "storage/engine_impl.h"
#include "storage/epoch.h"
#include "storage/quarantine.h"
#include "storage/rebuild.h"

namespace gradsnap {
namespace storage {
namespace {

constexpr size_t kMaxMetadataBytes = 1 << 20;
constexpr size_t kMaxTensors = 100000;

CheckpointInfo ToInfo(const CheckpointRecord& r) {
  CheckpointInfo i;
  i.job = r.spec.job;
  i.step = r.spec.step;
  i.kind = r.spec.kind;
  i.base_step = r.spec.base_step;
  i.world_size = r.spec.world_size;
  i.state = r.state;
  i.raw_bytes = r.raw_bytes;
  i.stored_bytes = r.stored_bytes;
  i.created_unix_ms = r.created_unix_ms;
  i.committed_unix_ms = r.committed_unix_ms;
  i.metadata = r.spec.metadata;
  return i;
}

bool SameCheckpointSpec(const CheckpointSpec& a, const CheckpointSpec& b) {
  return a.job == b.job && a.step == b.step && a.kind == b.kind && a.base_step == b.base_step &&
         a.world_size == b.world_size && a.metadata == b.metadata;
}

// The options an EngineImpl keeps: the real clock where none was given, so every use reads
// options_.clock without a null check.
EngineOptions WithClock(EngineOptions o) {
  o.clock = ClockOrReal(o.clock);
  return o;
}

// A catalog Open may use: one RocksDB can scan the checkpoint keys, and lists at least one
// when segment data exists. Otherwise the refusal that leaves the directory as found.
absl::Status CheckCatalogScans(
    MetaStore* meta, const std::string& dir,
    const std::function<const absl::StatusOr<uint64_t>&()>& segment_files) {
  auto checkpoints = meta->Scan("c/");
  if (!checkpoints.ok()) {
    return CatalogRefusal(dir, absl::StrCat("its catalog is unreadable (",
                                            checkpoints.status().message(), ")"));
  }
  if (!checkpoints->empty()) return absl::OkStatus();
  const absl::StatusOr<uint64_t>& files = segment_files();
  if (!files.ok()) {  // an empty catalog is only trusted beside segments/ seen to be empty
    return CatalogRefusal(dir, absl::StrCat("its catalog lists no checkpoint and ",
                                            files.status().message()));
  }
  if (*files > 0) {
    return CatalogRefusal(dir, absl::StrCat("its catalog lists no checkpoint but segments/ "
                                            "holds ", *files, " files"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string Where(const std::string& job, int64_t step, int32_t rank, const std::string& tensor) {
  std::string s = absl::StrCat("job ", job, " step ", step, " rank ", rank);
  if (!tensor.empty()) absl::StrAppend(&s, " tensor ", tensor);
  return s;
}

absl::Status ValidateCheckpointSpec(const CheckpointSpec& s) {
  RETURN_IF_ERROR(ValidateName(s.job, "job name"));
  if (s.step < 0) return absl::InvalidArgumentError(absl::StrCat("negative step ", s.step));
  if (s.world_size < 1 || s.world_size > 65536) {
    return absl::InvalidArgumentError(absl::StrCat("world_size ", s.world_size,
                                                   " outside 1..65536"));
  }
  if (s.kind != CheckpointKind::kFull && s.kind != CheckpointKind::kDelta) {
    return absl::InvalidArgumentError("unknown checkpoint kind");
  }
  if (s.kind == CheckpointKind::kFull && s.base_step != -1) {
    return absl::InvalidArgumentError("a FULL checkpoint has base_step -1");
  }
  if (s.kind == CheckpointKind::kDelta && (s.base_step < 0 || s.base_step >= s.step)) {
    return absl::InvalidArgumentError(absl::StrCat("DELTA base_step ", s.base_step,
                                                   " must be in [0, step)"));
  }
  if (s.metadata.size() > kMaxMetadataBytes) {
    return absl::InvalidArgumentError("checkpoint metadata larger than 1 MiB");
  }
  return absl::OkStatus();
}

std::vector<uint64_t> TensorStarts(const ShardSpec& spec) {
  std::vector<uint64_t> starts;
  starts.reserve(spec.tensors.size() + 1);
  uint64_t pos = 0;
  for (const TensorSpec& t : spec.tensors) {
    starts.push_back(pos);
    pos += t.byte_length;
  }
  starts.push_back(pos);
  return starts;
}

// The largest shard payload (sum of its tensors' byte_length): 2^56 bytes, so offsets and sums
// of a shard never overflow 64 bits.
constexpr uint64_t kMaxShardPayloadBytes = uint64_t{1} << 56;

absl::Status ValidateShardSpec(const ShardSpec& s, const CheckpointRecord& ckpt) {
  if (s.rank < 0 || s.rank >= ckpt.spec.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", s.rank, " outside world_size ",
                                                   ckpt.spec.world_size));
  }
  if (s.metadata.size() > kMaxMetadataBytes) {
    return absl::InvalidArgumentError("shard metadata larger than 1 MiB");
  }
  if (s.tensors.size() > kMaxTensors) {
    return absl::InvalidArgumentError("more than 100000 tensors in a shard");
  }
  std::set<std::string> names;
  unsigned __int128 payload = 0;
  for (const TensorSpec& t : s.tensors) {
    RETURN_IF_ERROR(ValidateName(t.name, "tensor name"));
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name ", t.name));
    }
    size_t es = DTypeSize(t.dtype);
    if (es == 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": unknown dtype ",
                                                     static_cast<int>(t.dtype)));
    }
    if (t.shape.size() > 64) return absl::InvalidArgumentError("more than 64 dimensions");
    unsigned __int128 numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name,
                                                                ": negative dimension"));
      numel *= static_cast<uint64_t>(d);
      if (numel > (uint64_t{1} << 50)) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name, ": too large"));
      }
    }
    if (numel * es != t.byte_length) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor ", t.name, ": byte_length ", t.byte_length, " != product(shape) * ", es));
    }
    if (!t.flat_name.empty()) {
      RETURN_IF_ERROR(ValidateName(t.flat_name, "flat buffer name"));
      if (t.flat_offset > t.flat_total ||
          static_cast<uint64_t>(numel) > t.flat_total - t.flat_offset) {
        return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name,
                                                       ": slice outside its flat buffer"));
      }
    }
    payload += t.byte_length;
    if (payload > kMaxShardPayloadBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shard payload over ", kMaxShardPayloadBytes, " bytes (at tensor ", t.name, ")"));
    }
    if (!t.sha256.empty()) {
      bool hex = t.sha256.size() == 64 &&
                 std::all_of(t.sha256.begin(), t.sha256.end(), [](char c) {
                   return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
                 });
      if (!hex) return absl::InvalidArgumentError(absl::StrCat("tensor ", t.name,
                                                               ": sha256 is not lower-case hex"));
    }
  }
  return absl::OkStatus();
}

bool SameShardSpec(const ShardSpec& a, const ShardSpec& b) {
  if (a.job != b.job || a.step != b.step || a.rank != b.rank || a.metadata != b.metadata ||
      a.tensors.size() != b.tensors.size()) {
    return false;
  }
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const TensorSpec& x = a.tensors[i];
    const TensorSpec& y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape ||
        x.byte_length != y.byte_length || x.flat_name != y.flat_name ||
        x.flat_offset != y.flat_offset || x.flat_total != y.flat_total || x.sha256 != y.sha256) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(const EngineOptions& options) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("data_dir is required");
  if (options.chunk_bytes < 4096 || options.chunk_bytes > kMaxChunkRawBytes) {
    return absl::InvalidArgumentError("chunk_bytes outside [4 KiB, 64 MiB]");
  }
  if (options.zstd_level < 0 || options.zstd_level > 22) {
    return absl::InvalidArgumentError("zstd_level outside 0..22");
  }
  if (!(options.max_compressed_ratio > 0 && options.max_compressed_ratio <= 1)) {  // NaN too
    return absl::InvalidArgumentError(absl::StrCat("max_compressed_ratio ",
                                                   options.max_compressed_ratio,
                                                   " outside (0, 1]"));
  }
  if (options.queue_depth < 1 || options.queue_depth > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("queue_depth ", options.queue_depth, " outside 1..4096"));
  }
  if (options.encode_threads < -1 || options.encode_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("encode_threads ", options.encode_threads, " outside -1..256"));
  }
  if (options.segment_bytes < (1u << 20)) {
    return absl::InvalidArgumentError(
        absl::StrCat("segment_bytes ", options.segment_bytes, " below 1 MiB"));
  }
  if (!IsKnownDigestAlgo(static_cast<uint8_t>(options.digest))) {
    return absl::InvalidArgumentError("unknown digest algorithm");
  }
  FileSystem* fs = options.fs != nullptr ? options.fs : FileSystem::Default();
  const std::string& dir = options.data_dir;
  // The catalog guard (docs/format.md, "Catalog guard"): decide everything before touching the
  // disk, so a refused open leaves the directory exactly as it was.
  CatalogState catalog = InspectCatalog(dir);
  // Walked (once) only where the guard needs it: a broken, missing or empty catalog. A store
  // whose catalog lists checkpoints opens without a walk over every segment file.
  std::optional<absl::StatusOr<uint64_t>> counted;
  auto count_segments = [&]() -> const absl::StatusOr<uint64_t>& {
    if (!counted.has_value()) counted = CountSegmentFiles(dir);
    return *counted;
  };
  // The guard takes segments/ as holding no data only after seeing every file in it.
  if (catalog != CatalogState::kPresent && !count_segments().ok()) {
    return CatalogRefusal(dir, absl::StrCat("its catalog meta/ is missing or unreadable and ",
                                            count_segments().status().message()));
  }
  auto segment_files = [&]() -> uint64_t { return *count_segments(); };
  if (catalog == CatalogState::kBroken) {
    if (options.read_only || segment_files() > 0) {
      return CatalogRefusal(dir, "its catalog meta/ has files but no CURRENT (unreadable)");
    }
    // No segment data: such a catalog (e.g. from an older version killed while creating it)
    // can describe nothing. It is kept aside, never deleted, and a new store is made.
    const std::string aside = absl::StrFormat("%s/meta.broken-%013d", dir,
                                               ClockOrReal(options.clock)->NowUnixMillis());
    RETURN_IF_ERROR(fs->Rename(dir + "/meta", aside));
    GS_LOG(WARNING) << "storage: " << dir << "/meta had no CURRENT and there is no segment "
                    << "data; kept it as " << aside << " and made a new catalog";
    catalog = CatalogState::kAbsent;
  }
  if (catalog == CatalogState::kAbsent && segment_files() > 0) {
    return CatalogRefusal(dir, absl::StrCat("its catalog meta/ is missing or empty but "
                                            "segments/ holds ", segment_files(), " files"));
  }
  if (options.read_only && catalog == CatalogState::kAbsent) {
    return absl::NotFoundError(absl::StrCat("no gradsnap checkpoint store in ", dir));
  }
  MetaStore::Mode mode = options.read_only ? MetaStore::Mode::kReadOnly
                         : catalog == CatalogState::kAbsent ? MetaStore::Mode::kCreate
                                                            : MetaStore::Mode::kExisting;
  if (mode != MetaStore::Mode::kReadOnly && options.catalog_reserve_bytes > 0) {
    uint64_t free = FreeBytes(dir);
    if (free < options.catalog_reserve_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "not enough free space to open ", dir, " for writing: ", free,
          " bytes free, the catalog needs ", options.catalog_reserve_bytes,
          " (read-only commands such as ls, verify and restore still work)"));
    }
  }
  // Held while a new store is created (below), released at the end of Open.
  struct DirLock {
    int fd = -1;
    ~DirLock() {
      if (fd >= 0) ::close(fd);  // releases the flock
    }
  } dir_lock;
  if (mode == MetaStore::Mode::kCreate) {
    // A new store. The catalog is created whole in meta.new/ and renamed to meta/, so a kill
    // at any instant leaves either no catalog (the next open starts over; meta.new/ is this
    // step's own scratch space) or a complete, empty one. If creating fails, what this open
    // created is removed again.
    std::error_code ec;
    const bool had_dir = std::filesystem::exists(dir, ec);
    // Two processes creating one store at once (two servers started together on a new
    // --data-dir) take turns: each holds an flock on the directory while it creates, and the
    // later one, finding the catalog made, opens it as existing (and is then refused by
    // RocksDB's lock as "in use"). Without it they removed each other's meta.new/ and could
    // leave a catalog without segments/.
    RETURN_IF_ERROR(fs->CreateDirs(dir));
    dir_lock.fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_lock.fd < 0) return PosixError(absl::StrCat("open ", dir), errno);
    while (::flock(dir_lock.fd, LOCK_EX) != 0) {
      if (errno != EINTR) return PosixError(absl::StrCat("lock ", dir), errno);
    }
    if (std::filesystem::exists(dir + "/meta/CURRENT", ec)) {
      mode = MetaStore::Mode::kExisting;  // made meanwhile by the process that held the lock
    }
    if (mode == MetaStore::Mode::kCreate) {
      const bool had_segments = std::filesystem::exists(dir + "/segments", ec);
      const std::string fresh = dir + "/meta.new";
      auto undo = [&]() {
        std::error_code e;
        std::filesystem::remove_all(fresh, e);
        if (!had_segments) std::filesystem::remove(dir + "/segments", e);
        if (!had_dir) std::filesystem::remove(dir, e);
      };
      absl::Status created = fs->CreateDirs(dir + "/segments");
      if (created.ok()) created = fs->RemoveAll(fresh);
      if (created.ok()) created = MetaStore::Open(fresh, mode).status();  // closed again here
      if (created.ok()) created = fs->Rename(fresh, dir + "/meta");
      if (created.ok()) created = fs->SyncDir(dir);
      if (!created.ok()) {
        undo();
        return created;
      }
      mode = MetaStore::Mode::kExisting;
    }
  }
  const bool probe_first = mode == MetaStore::Mode::kExisting;
  if (probe_first) {
    // Look before writing: a read-only open changes no file, so a catalog that is unreadable
    // or empty while segment data exists is refused with the directory exactly as found.
    auto probe = MetaStore::Open(dir + "/meta", MetaStore::Mode::kReadOnly);
    if (!probe.ok()) {
      return CatalogRefusal(dir, absl::StrCat("its catalog is unreadable (",
                                              probe.status().message(), ")"));
    }
    RETURN_IF_ERROR(CheckCatalogScans(probe->get(), dir, count_segments));
  }
  auto meta = MetaStore::Open(dir + "/meta", mode);
  if (!meta.ok()) {
    if (absl::IsFailedPrecondition(meta.status()) || absl::IsResourceExhausted(meta.status())) {
      return meta.status();  // another process holds it, or no space
    }
    return CatalogRefusal(dir, absl::StrCat("its catalog is unreadable (",
                                            meta.status().message(), ")"));
  }
  (*meta)->set_reserve_bytes(options.catalog_reserve_bytes);
  auto engine = std::make_unique<EngineImpl>(options, fs, *std::move(meta));
  // The probe above checked the same catalog already.
  if (!probe_first) RETURN_IF_ERROR(CheckCatalogScans(engine->meta(), dir, count_segments));
  if (!options.read_only) RETURN_IF_ERROR(engine->Recover());
  engine->PrefaultRecordBuffers();  // a read-only engine takes only read-ahead buffers
  return std::unique_ptr<Engine>(std::move(engine));
}

EngineImpl::EngineImpl(const EngineOptions& options, FileSystem* fs,
                       std::unique_ptr<MetaStore> meta)
    : options_(WithClock(options)),
      fs_(fs),
      meta_(std::move(meta)),
      record_pool_(std::make_shared<BufferPool>(MaxRecordSize(options.chunk_bytes),
                                                kRecordPoolBuffers)),
      small_record_pool_(MaxRecordSize(kSmallChunkBytes), 256),
      shared_records_(options.share_edge_records) {
  struct stat st;
  if (::stat(options_.data_dir.c_str(), &st) == 0) {
    data_dev_ = static_cast<uint64_t>(st.st_dev);
    data_ino_ = static_cast<uint64_t>(st.st_ino);
  }
}

void EngineImpl::PrefaultRecordBuffers() {
  const size_t writers = options_.read_only ? 0
                        : static_cast<size_t>(std::max(0, options_.prefault_writers)) *
                              ShardWriterReservedBuffers(options_);
  const size_t readers = options_.prefault_read_ahead ? kReaderFreshBuffers : 0;
  const size_t n = std::min<size_t>(writers + readers, kRecordPoolBuffers);
  if (n == 0) return;
  for (auto& b : record_pool_->GetFaulted(n)) record_pool_->Put(std::move(b));
}

std::string EngineImpl::CheckpointDir(const std::string& job, int64_t step) const {
  return absl::StrFormat("%s/segments/%s/%020d", options_.data_dir, job, step);
}

std::string EngineImpl::SegmentPath(const std::string& job, int64_t step, int32_t rank,
                                    uint32_t seq) const {
  return absl::StrCat(CheckpointDir(job, step), "/", SegmentFileName(rank, seq));
}

absl::StatusOr<CheckpointRecord> EngineImpl::LoadCheckpoint(const std::string& job,
                                                            int64_t step) {
  auto v = meta_->Get(CheckpointKey(job, step));
  if (absl::IsNotFound(v.status())) {
    return absl::NotFoundError(absl::StrCat("no checkpoint job ", job, " step ", step));
  }
  if (!v.ok()) return v.status();
  CheckpointRecord r;
  RETURN_IF_ERROR(DecodeCheckpoint(*v, &r));
  return r;
}

absl::StatusOr<std::vector<ChunkRecord>> EngineImpl::LoadChunks(const std::string& job,
                                                                int64_t step, int32_t rank,
                                                                uint32_t count) {
  ASSIGN_OR_RETURN(auto kvs, meta_->Scan(ChunkPrefix(job, step, rank)));
  std::vector<ChunkRecord> out;
  for (const auto& [k, v] : kvs) {
    ChunkRecord c;
    RETURN_IF_ERROR(Annotate(DecodeChunk(v, &c), Where(job, step, rank)));
    out.push_back(c);
  }
  if (out.size() < count) {
    return absl::DataLossError(absl::StrCat(Where(job, step, rank), ": ", count - out.size(),
                                            " chunk records missing"));
  }
  out.resize(count);  // keys past chunk_count are never written, but be strict
  return out;
}

absl::Status EngineImpl::BeginCheckpoint(const CheckpointSpec& spec) {
  RETURN_IF_ERROR(ValidateCheckpointSpec(spec));
  RETURN_IF_ERROR(CheckWritable());
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckJobEpoch(meta_.get(), spec.job, spec.epoch));
  auto existing = LoadCheckpoint(spec.job, spec.step);
  if (existing.ok()) {
    if (!SameCheckpointSpec(existing->spec, spec)) {
      return absl::AlreadyExistsError(absl::StrCat("checkpoint job ", spec.job, " step ",
                                                   spec.step, " exists with another spec"));
    }
    return absl::OkStatus();
  }
  if (!absl::IsNotFound(existing.status())) return existing.status();
  if (spec.kind == CheckpointKind::kDelta) {
    auto base = LoadCheckpoint(spec.job, spec.base_step);
    if (!base.ok() || base->spec.kind != CheckpointKind::kFull) {
      return absl::FailedPreconditionError(absl::StrCat(
          "DELTA step ", spec.step, " of job ", spec.job, " needs a FULL checkpoint at step ",
          spec.base_step));
    }
    // A DELTA replays on every DELTA of its chain before it, so the one before must be here
    // (pending or committed). Without this check, a DELTA deleted (`rm`) while its trainer
    // wrote on would leave every later DELTA of the chain listed as committed and none of
    // them restorable. Delete refuses the other order (a DELTA with later ones on its FULL).
    if (spec.step > spec.base_step + 1) {
      auto prev = LoadCheckpoint(spec.job, spec.step - 1);
      if (!prev.ok() && !absl::IsNotFound(prev.status())) return prev.status();
      if (!prev.ok() || prev->spec.kind != CheckpointKind::kDelta ||
          prev->spec.base_step != spec.base_step) {
        return absl::FailedPreconditionError(absl::StrCat(
            "DELTA step ", spec.step, " of job ", spec.job, " on FULL ", spec.base_step,
            " needs DELTA step ", spec.step - 1, " of its chain, which this store does not "
            "hold (deleted?): the chain is cut; the next FULL starts a new one"));
      }
    }
  }
  CheckpointRecord r;
  r.spec = spec;
  r.created_unix_ms = options_.clock->NowUnixMillis();
  MetaStore::Batch b;
  b.puts.emplace_back(CheckpointKey(spec.job, spec.step), EncodeCheckpoint(r));
  RETURN_IF_ERROR(fs_->BeforeMetadataCommit());
  return meta_->Commit(b);
}

absl::StatusOr<std::unique_ptr<ShardWriter>> EngineImpl::OpenShardWriter(const ShardSpec& spec) {
  RETURN_IF_ERROR(ValidateName(spec.job, "job name"));
  RETURN_IF_ERROR(CheckWritable());
  // The same shard saved again (a run resumed from an older step persists the steps after it
  // once more; a retry after a lost answer) is a writer with nothing to do, but only if what
  // is stored still reads back: a damaged one must not be reported saved (the trainer would
  // count a recovery point it cannot restore). Read outside the lock: a whole shard.
  bool committed_same = false;
  {
    absl::MutexLock lock(&mu_);
    auto v = meta_->Get(ShardKey(spec.job, spec.step, spec.rank));
    ShardRecord old;
    committed_same = v.ok() && DecodeShard(*v, &old).ok() && old.committed &&
                     SameShardSpec(old.spec, spec);
  }
  if (committed_same) RETURN_IF_ERROR(SavedShardReadsBack(spec.job, spec.step, spec.rank));
  ShardRecord rec;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(rec, ReserveWriterLocked(spec));
  }
  // Outside mu_: a writer whose Init() fails is destroyed inside NewShardWriter, and its
  // destructor gives the reservation back through ReleaseWriter, which takes mu_.
  return NewShardWriter(this, std::move(rec));
}

absl::Status EngineImpl::CheckWritable() const {
  if (options_.read_only) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint store ", options_.data_dir,
                                                      " is open read-only"));
  }
  struct stat st;
  if (data_ino_ != 0 && (::stat(options_.data_dir.c_str(), &st) != 0 ||
                         static_cast<uint64_t>(st.st_dev) != data_dev_ ||
                         static_cast<uint64_t>(st.st_ino) != data_ino_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint store ", options_.data_dir, " was removed or replaced while open: nothing "
        "more is written to it; restart (with --rebuild-catalog if its catalog is gone)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ShardRecord> EngineImpl::ReserveWriterLocked(const ShardSpec& spec) {
  RETURN_IF_ERROR(CheckJobEpoch(meta_.get(), spec.job, spec.epoch));
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpoint(spec.job, spec.step));
  RETURN_IF_ERROR(ValidateShardSpec(spec, ckpt));
  std::string key = ShardKey(spec.job, spec.step, spec.rank);
  if (HasWriter(key)) {
    return absl::UnavailableError(absl::StrCat(Where(spec.job, spec.step, spec.rank),
                                               " is being written by another writer"));
  }
  ShardRecord rec;
  auto v = meta_->Get(key);
  bool fresh = absl::IsNotFound(v.status());
  if (!fresh) {
    if (!v.ok()) return v.status();
    RETURN_IF_ERROR(DecodeShard(*v, &rec));
    // Durable bytes of an older attempt are not this attempt's to resume (they may differ from
    // what it writes, its spec too): the shard starts over. Its old segment files are truncated
    // as the new writer reuses their numbers; any left over are unreferenced and quarantined at
    // an Open.
    if (!rec.committed && rec.committed_size > 0 && spec.epoch > rec.epoch) {
      GS_LOG(WARNING) << Where(spec.job, spec.step, spec.rank) << ": the " << rec.committed_size
                      << " durable bytes of attempt " << rec.epoch << " are dropped; attempt "
                      << spec.epoch << " writes the shard anew";
      fresh = true;
    }
  }
  if (!fresh) {
    if (!SameShardSpec(rec.spec, spec)) {
      if (rec.committed || rec.committed_size > 0) {
        return absl::AlreadyExistsError(absl::StrCat(
            Where(spec.job, spec.step, spec.rank), " exists with another spec"));
      }
      fresh = true;
    }
  }
  if (!fresh && rec.committed) {
    // Already committed with this spec: a writer with nothing left to do.
  } else if (ckpt.state == CheckpointState::kCommitted) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint job ", spec.job, " step ",
                                                 spec.step, " is already committed"));
  }
  if (fresh) {
    rec = ShardRecord();
    rec.spec = spec;
    rec.tensor_digests.resize(spec.tensors.size());
    rec.digest_algo = options_.digest;
    rec.epoch = spec.epoch;
    MetaStore::Batch b;
    b.puts.emplace_back(key, EncodeShard(rec));
    b.delete_prefixes.push_back(ChunkPrefix(spec.job, spec.step, spec.rank));
    RETURN_IF_ERROR(fs_->BeforeMetadataCommit());
    RETURN_IF_ERROR(meta_->Commit(b));
  }
  absl::MutexLock lock(&writers_mu_);
  active_writers_.insert(key);
  rec.spec.epoch = spec.epoch;  // checked again when the writer commits
  rec.epoch = std::max(rec.epoch, spec.epoch);  // stored with the writer's next commit
  return rec;
}

bool EngineImpl::HasWriter(const std::string& key) {
  absl::MutexLock lock(&writers_mu_);
  return active_writers_.count(key) != 0;
}

// Called by a writer's destructor: takes only writers_mu_, never mu_, so a writer may be
// destroyed anywhere, even inside an engine critical section.
void EngineImpl::ReleaseWriter(const std::string& shard_key) {
  absl::MutexLock lock(&writers_mu_);
  active_writers_.erase(shard_key);
}

absl::Status EngineImpl::CommitShardProgress(const ShardRecord& shard,
                                             const std::vector<ChunkRecord>& new_chunks,
                                             bool finish) {
  const ShardSpec& s = shard.spec;
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckJobEpoch(meta_.get(), s.job, s.epoch));
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpoint(s.job, s.step));
  MetaStore::Batch b;
  uint32_t idx = shard.chunk_count - static_cast<uint32_t>(new_chunks.size());
  for (const ChunkRecord& c : new_chunks) {
    b.puts.emplace_back(ChunkKey(s.job, s.step, s.rank, idx++), EncodeChunk(c));
  }
  b.puts.emplace_back(ShardKey(s.job, s.step, s.rank), EncodeShard(shard));
  if (finish) {
    // A shard is counted once, even if a second writer races to finish it.
    auto prev = meta_->Get(ShardKey(s.job, s.step, s.rank));
    if (!prev.ok() && !absl::IsNotFound(prev.status())) return prev.status();
    ShardRecord old;
    if (prev.ok() && DecodeShard(*prev, &old).ok() && old.committed) {
      return absl::OkStatus();
    }
    if (ckpt.state == CheckpointState::kCommitted) {
      return absl::FailedPreconditionError(absl::StrCat("checkpoint job ", s.job, " step ",
                                                        s.step, " is already committed"));
    }
    ckpt.committed_shards += 1;
    ckpt.raw_bytes += shard.committed_size;
    ckpt.stored_bytes += shard.stored_bytes;
    if (ckpt.committed_shards == ckpt.spec.world_size) {
      RETURN_IF_ERROR(CommitCheckpointLocked(&ckpt, &b));
    }
    b.puts.emplace_back(CheckpointKey(s.job, s.step), EncodeCheckpoint(ckpt));
  }
  RETURN_IF_ERROR(fs_->BeforeMetadataCommit());
  return meta_->Commit(b);
}

absl::Status EngineImpl::CommitCheckpointLocked(CheckpointRecord* ckpt, MetaStore::Batch* b) {
  const std::string& job = ckpt->spec.job;
  if (ckpt->spec.kind == CheckpointKind::kDelta) {
    // A DELTA is committed only on top of a committed FULL; until then it waits, PENDING with
    // all its shards committed, and the base's commit promotes it.
    ASSIGN_OR_RETURN(CheckpointRecord base, LoadCheckpoint(job, ckpt->spec.base_step));
    if (base.state != CheckpointState::kCommitted) return absl::OkStatus();
    ckpt->state = CheckpointState::kCommitted;
    ckpt->committed_unix_ms = options_.clock->NowUnixMillis();
    return absl::OkStatus();
  }
  ckpt->state = CheckpointState::kCommitted;
  ckpt->committed_unix_ms = options_.clock->NowUnixMillis();
  ASSIGN_OR_RETURN(std::vector<CheckpointRecord> deltas, DeltasOf(job, ckpt->spec.step));
  for (CheckpointRecord& d : deltas) {
    if (d.state == CheckpointState::kPending && d.committed_shards == d.spec.world_size) {
      d.state = CheckpointState::kCommitted;
      d.committed_unix_ms = ckpt->committed_unix_ms;
      b->puts.emplace_back(CheckpointKey(job, d.spec.step), EncodeCheckpoint(d));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CheckpointRecord>> EngineImpl::DeltasOf(const std::string& job,
                                                                   int64_t full_step) {
  ASSIGN_OR_RETURN(auto kvs, meta_->Scan(CheckpointPrefix(job)));
  std::vector<CheckpointRecord> out;
  for (const auto& [k, v] : kvs) {
    CheckpointRecord r;
    RETURN_IF_ERROR(DecodeCheckpoint(v, &r));
    if (r.spec.kind == CheckpointKind::kDelta && r.spec.base_step == full_step) {
      out.push_back(std::move(r));
    }
  }
  return out;
}

absl::Status EngineImpl::WriteShard(const ShardSpec& spec, const std::vector<const void*>& data) {
  if (data.size() != spec.tensors.size()) {
    return absl::InvalidArgumentError(absl::StrCat("WriteShard: ", data.size(),
                                                   " buffers for ", spec.tensors.size(),
                                                   " tensors"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<ShardWriter> w, OpenShardWriter(spec));
  uint64_t pos = 0;
  uint64_t skip = w->committed_size();  // a resumed writer continues where it stopped
  for (size_t i = 0; i < data.size(); ++i) {
    uint64_t len = spec.tensors[i].byte_length;
    if (pos + len > skip) {
      uint64_t from = skip > pos ? skip - pos : 0;
      if (data[i] == nullptr && len > 0) return absl::InvalidArgumentError("null tensor data");
      RETURN_IF_ERROR(w->Append(static_cast<const uint8_t*>(data[i]) + from, len - from));
    }
    pos += len;
  }
  return w->Finish();
}

absl::StatusOr<uint64_t> EngineImpl::ShardCommittedSize(const std::string& job, int64_t step,
                                                        int32_t rank, uint64_t epoch) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpoint(job, step));
  (void)ckpt;
  auto v = meta_->Get(ShardKey(job, step, rank));
  if (absl::IsNotFound(v.status())) return 0;
  if (!v.ok()) return v.status();
  ShardRecord r;
  RETURN_IF_ERROR(DecodeShard(*v, &r));
  // An older attempt's bytes: the asker's writer will start the shard over.
  if (!r.committed && epoch > r.epoch) return 0;
  // Asked about a committed shard, the client takes "complete" as saved (an idempotent save,
  // docs/protocol.md): only if what is stored reads back (OpenShardWriter's rule).
  if (r.committed) RETURN_IF_ERROR(SavedShardReadsBack(job, step, rank));
  return r.committed_size;
}

absl::Status EngineImpl::SavedShardReadsBack(const std::string& job, int64_t step,
                                             int32_t rank) {
  absl::Status readable = ReadBackShard(job, step, rank);
  if (!absl::IsDataLoss(readable)) return absl::OkStatus();  // other trouble: the save's own
  return absl::DataLossError(absl::StrCat(
      Where(job, step, rank), " is already saved, and what is stored does not read back (",
      readable.message(), "): delete the checkpoint (gradsnap rm) to save it again"));
}

absl::Status EngineImpl::AbortCheckpoint(const std::string& job, int64_t step, uint64_t epoch) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  RETURN_IF_ERROR(CheckWritable());
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckJobEpoch(meta_.get(), job, epoch));
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpoint(job, step));
  if (ckpt.state == CheckpointState::kCommitted) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint job ", job, " step ", step,
                                                      " is committed; use Delete"));
  }
  std::vector<int64_t> deltas;  // PENDING DELTAs on this FULL go with it
  if (ckpt.spec.kind == CheckpointKind::kFull) {
    ASSIGN_OR_RETURN(std::vector<CheckpointRecord> on_it, DeltasOf(job, step));
    for (const CheckpointRecord& r : on_it) {
      if (r.state == CheckpointState::kCommitted) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint job ", job, " step ", step, " is the base of committed DELTA step ",
            r.spec.step));
      }
      deltas.push_back(r.spec.step);
    }
  }
  uint64_t reclaimed = 0;
  for (int64_t d : deltas) RETURN_IF_ERROR(DeleteLocked(job, d, &reclaimed));
  return DeleteLocked(job, step, &reclaimed);
}

absl::StatusOr<uint64_t> EngineImpl::AcquireEpoch(const std::string& job) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckWritable());
  // The next epoch is above the catalog's and the mirror's (a catalog made anew beside an old
  // mirror does not count again).
  ASSIGN_OR_RETURN(uint64_t current, CurrentJobEpoch(meta_.get(), job));
  const uint64_t newest = std::max(current, MirroredJobEpoch(fs_, options_.data_dir, job));
  if (newest >= kMaxEpoch) {  // never wraps to 0, which is unfenced
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job, ": writer epochs exhausted (", newest, ")"));
  }
  // Also at least the wall clock in milliseconds: an attempt started after another gets a
  // larger epoch even from a node that lost its data (a new disk, a new data dir), where a
  // counter would start again below a zombie's (storage/epoch.h).
  const uint64_t next =
      std::min(kMaxEpoch, std::max(newest + 1, static_cast<uint64_t>(std::max<int64_t>(
                                                    0, UnixMillis()))));
  RETURN_IF_ERROR(CommitEpochLocked(job, next));
  return next;
}

absl::StatusOr<uint64_t> EngineImpl::RaiseEpoch(const std::string& job, uint64_t to) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  if (to > kMaxEpoch) {
    return absl::InvalidArgumentError(absl::StrCat("epoch ", to, " above ", kMaxEpoch));
  }
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckWritable());
  ASSIGN_OR_RETURN(uint64_t current, CurrentJobEpoch(meta_.get(), job));
  const uint64_t target =
      std::max({current, MirroredJobEpoch(fs_, options_.data_dir, job), to});
  if (target > current) RETURN_IF_ERROR(CommitEpochLocked(job, target));
  return target;
}

absl::Status EngineImpl::CommitEpochLocked(const std::string& job, uint64_t epoch) {
  // Mirrored before the catalog commits it (storage/epoch.h): a catalog rebuilt later never
  // hands out or admits an older one.
  RETURN_IF_ERROR(MirrorJobEpoch(fs_, options_.data_dir, job, epoch));
  RETURN_IF_ERROR(fs_->BeforeMetadataCommit());
  MetaStore::Batch b;
  PutJobEpoch(&b, job, epoch);
  return meta_->Commit(b);
}

absl::StatusOr<std::vector<std::string>> EngineImpl::ListJobs() {
  ASSIGN_OR_RETURN(auto kvs, meta_->Scan("c/"));
  std::vector<std::string> jobs;
  for (const auto& [k, v] : kvs) {
    std::string job = k.substr(2, k.rfind('/') - 2);
    if (jobs.empty() || jobs.back() != job) jobs.push_back(job);
  }
  return jobs;
}

absl::StatusOr<std::vector<CheckpointInfo>> EngineImpl::ListCheckpoints(const std::string& job,
                                                                        bool include_pending) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  ASSIGN_OR_RETURN(auto kvs, meta_->Scan(CheckpointPrefix(job)));
  std::vector<CheckpointInfo> out;
  for (const auto& [k, v] : kvs) {
    CheckpointRecord r;
    RETURN_IF_ERROR(DecodeCheckpoint(v, &r));
    if (r.state == CheckpointState::kCommitted || include_pending) out.push_back(ToInfo(r));
  }
  return out;
}

absl::StatusOr<ShardInfo> EngineImpl::MakeShardInfo(const ShardRecord& rec,
                                                    const std::vector<ChunkRecord>& chunks) {
  ShardInfo info;
  info.rank = rec.spec.rank;
  info.committed = rec.committed;
  info.stored_bytes = rec.stored_bytes;
  info.metadata = rec.spec.metadata;
  info.digest_algo = rec.digest_algo;
  for (size_t i = 0; i < rec.spec.tensors.size(); ++i) {
    TensorInfo ti;
    ti.spec = rec.spec.tensors[i];
    ti.digest_algo = rec.digest_algo;
    ti.digest = i < rec.tensor_digests.size() ? rec.tensor_digests[i] : "";
    if (rec.digest_algo == DigestAlgo::kSha256) ti.spec.sha256 = ti.digest;
    info.raw_bytes += ti.spec.byte_length;
    info.tensors.push_back(std::move(ti));
  }
  const std::vector<uint64_t> starts = TensorStarts(rec.spec);
  for (const ChunkRecord& c : chunks) {
    if (absl::Status s = CheckChunkPlacement(starts, c); !s.ok()) {
      return absl::DataLossError(absl::StrCat(Where(rec.spec.job, rec.spec.step, rec.spec.rank),
                                              ": ", s.message()));
    }
    if (c.members.empty()) {
      info.tensors[c.tensor].stored_bytes += c.header.record_len();
      info.tensors[c.tensor].chunks += 1;
      continue;
    }
    // A packed chunk's record bytes are shared in proportion to each tensor's raw bytes.
    uint64_t left = c.header.record_len();
    for (size_t i = 0; i < c.members.size(); ++i) {
      const ChunkMember& m = c.members[i];
      uint64_t share = i + 1 == c.members.size()
                           ? left
                           : c.header.record_len() * uint64_t{m.length} / c.header.raw_len;
      info.tensors[m.tensor].stored_bytes += share;
      info.tensors[m.tensor].chunks += 1;
      left -= share;
    }
  }
  return info;
}

absl::StatusOr<Manifest> EngineImpl::GetManifest(const std::string& job, int64_t step) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpoint(job, step));
  Manifest m;
  m.info = ToInfo(ckpt);
  ASSIGN_OR_RETURN(auto kvs, meta_->Scan(ShardPrefix(job, step)));
  for (const auto& [k, v] : kvs) {
    ShardRecord r;
    RETURN_IF_ERROR(DecodeShard(v, &r));
    ASSIGN_OR_RETURN(std::vector<ChunkRecord> chunks,
                     LoadChunks(job, step, r.spec.rank, r.chunk_count));
    ASSIGN_OR_RETURN(ShardInfo si, MakeShardInfo(r, chunks));
    m.shards.push_back(std::move(si));
  }
  return m;
}

absl::StatusOr<std::unique_ptr<ShardReader>> EngineImpl::OpenShardReader(const std::string& job,
                                                                         int64_t step,
                                                                         int32_t rank) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpoint(job, step));
  if (ckpt.state != CheckpointState::kCommitted) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint job ", job, " step ", step,
                                                      " is not committed"));
  }
  auto v = meta_->Get(ShardKey(job, step, rank));
  if (absl::IsNotFound(v.status())) {
    return absl::NotFoundError(absl::StrCat("no shard ", Where(job, step, rank)));
  }
  if (!v.ok()) return v.status();
  ShardRecord r;
  RETURN_IF_ERROR(DecodeShard(*v, &r));
  return NewShardReader(this, std::move(r));
}

absl::Status EngineImpl::ReadBackShard(const std::string& job, int64_t step, int32_t rank) {
  ASSIGN_OR_RETURN(std::unique_ptr<ShardReader> r, OpenShardReader(job, step, rank));
  std::vector<uint8_t> buf(options_.chunk_bytes);
  uint64_t pos = 0;
  for (;;) {
    ASSIGN_OR_RETURN(size_t n, r->Read(pos, buf.data(), buf.size()));
    if (n == 0) break;
    pos += n;
  }
  if (pos != r->info().raw_bytes) {
    return absl::DataLossError(absl::StrCat(Where(job, step, rank), ": read ", pos, " of ",
                                            r->info().raw_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status EngineImpl::Verify(const std::string& job, int64_t step) {
  ASSIGN_OR_RETURN(Manifest m, GetManifest(job, step));
  if (m.info.state != CheckpointState::kCommitted) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint job ", job, " step ", step,
                                                      " is not committed"));
  }
  if (static_cast<int32_t>(m.shards.size()) != m.info.world_size) {
    return absl::DataLossError(absl::StrCat("checkpoint job ", job, " step ", step, " has ",
                                            m.shards.size(), " of ", m.info.world_size,
                                            " shards"));
  }
  for (const ShardInfo& s : m.shards) RETURN_IF_ERROR(ReadBackShard(job, step, s.rank));
  return absl::OkStatus();
}

absl::Status EngineImpl::DeleteLocked(const std::string& job, int64_t step, uint64_t* reclaimed) {
  {
    absl::MutexLock lock(&writers_mu_);
    for (const std::string& key : active_writers_) {
      if (key.rfind(ShardPrefix(job, step), 0) == 0) {
        // Transient: a writer closes when its upload ends, also when the uploading process
        // died (the server notices the broken stream). A launcher rolling back a dead
        // attempt's PENDING checkpoints races that teardown, so the code is one clients retry.
        return absl::AbortedError(absl::StrCat("checkpoint job ", job, " step ", step,
                                               " has an open writer (retry once it closes)"));
      }
    }
  }
  ASSIGN_OR_RETURN(auto shards, meta_->Scan(ShardPrefix(job, step)));
  for (const auto& [k, v] : shards) {
    ShardRecord r;
    if (DecodeShard(v, &r).ok()) {
      for (const SegmentRef& s : r.segments) *reclaimed += s.durable_end;
    }
  }
  // Marked first (storage/rebuild.h): a rebuild after a kill past the commit below must not
  // bring the checkpoint back. Best effort: a disk too full for an empty file still deletes.
  const std::string dir = CheckpointDir(job, step);
  absl::Status marked = [&]() -> absl::Status {
    OpenOptions o;
    o.write = o.create = true;
    ASSIGN_OR_RETURN(std::unique_ptr<File> f, fs_->Open(dir + "/" + kDeletedMarker, o));
    RETURN_IF_ERROR(f->Sync());
    return fs_->SyncDir(dir);
  }();
  if (!marked.ok() && !absl::IsNotFound(marked)) {  // NOT_FOUND: no files to mark
    GS_LOG(WARNING) << "storage: deleting job " << job << " step " << step
                    << " without its marker: " << marked.message();
  }
  const MetaStore::Batch b = MetaStore::DeleteCheckpointBatch(job, step);
  RETURN_IF_ERROR(fs_->BeforeMetadataCommit());
  RETURN_IF_ERROR(meta_->Commit(b));
  // Metadata is gone: the files are now orphans, which recovery would also remove.
  return fs_->RemoveAll(CheckpointDir(job, step));
}

absl::Status EngineImpl::Delete(const std::string& job, int64_t step) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  RETURN_IF_ERROR(CheckWritable());
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(CheckpointRecord ckpt, LoadCheckpoint(job, step));
  if (ckpt.spec.kind == CheckpointKind::kFull) {
    ASSIGN_OR_RETURN(std::vector<CheckpointRecord> on_it, DeltasOf(job, step));
    if (!on_it.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint job ", job, " step ", step, " is the base of DELTA step ",
          on_it.front().spec.step));
    }
  } else {
    // A DELTA replays on every DELTA of its chain before it: one with a later step on the same
    // FULL needs this one.
    ASSIGN_OR_RETURN(std::vector<CheckpointRecord> chain, DeltasOf(job, ckpt.spec.base_step));
    for (const CheckpointRecord& d : chain) {
      if (d.spec.step > step) {
        return absl::FailedPreconditionError(absl::StrCat(
            "checkpoint job ", job, " step ", step, " is in the chain of DELTA step ",
            d.spec.step, " (each DELTA replays on the ones before it): delete that first"));
      }
    }
  }
  uint64_t reclaimed = 0;
  return DeleteLocked(job, step, &reclaimed);
}

absl::StatusOr<GcResult> EngineImpl::Gc(const std::string& job, const GcPolicy& policy) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  if (policy.keep_last < 0 || policy.keep_every < 0) {
    return absl::InvalidArgumentError("keep_last and keep_every must be >= 0");
  }
  RETURN_IF_ERROR(CheckWritable());
  // The FULLs kept: from the newest down, until keep_last of them verify (every chunk checksum
  // and tensor digest read back). A damaged one is kept but not counted, so gc never deletes
  // the checkpoint a restore of `latest` falls back to (nothing deleted by guesswork). Read
  // outside the lock: a verify reads whole checkpoints.
  int64_t keep_from = INT64_MIN;  // FULLs below this step may go
  if (policy.keep_last > 0) {
    ASSIGN_OR_RETURN(std::vector<CheckpointInfo> listed, ListCheckpoints(job, /*include_pending=*/false));
    int verified = 0;
    for (auto it = listed.rbegin(); it != listed.rend() && verified < policy.keep_last; ++it) {
      if (it->kind != CheckpointKind::kFull) continue;
      keep_from = it->step;
      absl::Status v = Verify(job, it->step);
      if (v.ok()) {
        ++verified;
      } else if (absl::IsDataLoss(v)) {
        GS_LOG(WARNING) << "gc: job " << job << " FULL " << it->step
                        << " does not verify; kept, not counted toward keep_last: " << v.message();
      } else {
        return v;  // cannot tell: delete nothing
      }
    }
    if (verified < policy.keep_last) keep_from = INT64_MIN;  // too few good FULLs: keep all
  }
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(PurgeQuarantine(fs_, options_.data_dir, options_.quarantine_grace_seconds,
                                  options_.clock->NowUnixMillis())
                      .status());
  ASSIGN_OR_RETURN(auto kvs, meta_->Scan(CheckpointPrefix(job)));
  std::vector<CheckpointRecord> all;
  for (const auto& [k, v] : kvs) {
    CheckpointRecord r;
    RETURN_IF_ERROR(DecodeCheckpoint(v, &r));
    all.push_back(std::move(r));
  }
  std::vector<int64_t> fulls;  // committed, ascending
  for (const CheckpointRecord& r : all) {
    if (r.spec.kind == CheckpointKind::kFull && r.state == CheckpointState::kCommitted) {
      fulls.push_back(r.spec.step);
    }
  }
  std::set<int64_t> doomed_fulls;
  for (size_t i = 0; i < fulls.size(); ++i) {
    const int64_t step = fulls[i];
    if (step >= keep_from) break;
    // keep_every K keeps, for every multiple of K, the newest FULL at or before it (the FULL
    // a restore of that step starts from): FULLs on multiples of K where they are there, and
    // one FULL per K steps where they are not (gockpt's FULLs end their window after it).
    if (policy.keep_every > 0 && i + 1 < fulls.size()) {
      const int64_t k = policy.keep_every;
      const int64_t to_multiple = (k - step % k) % k;
      if (to_multiple < fulls[i + 1] - step) continue;  // a multiple in [step, next FULL)
    }
    doomed_fulls.insert(step);
  }
  GcResult result;
  // DELTAs of a doomed FULL go first, then the FULL itself.
  for (const CheckpointRecord& r : all) {
    if (r.spec.kind == CheckpointKind::kDelta && doomed_fulls.count(r.spec.base_step) != 0) {
      RETURN_IF_ERROR(DeleteLocked(job, r.spec.step, &result.bytes_reclaimed));
      result.deleted_steps.push_back(r.spec.step);
    }
  }
  for (int64_t step : doomed_fulls) {
    RETURN_IF_ERROR(DeleteLocked(job, step, &result.bytes_reclaimed));
    result.deleted_steps.push_back(step);
  }
  std::sort(result.deleted_steps.begin(), result.deleted_steps.end());
  return result;
}

}  // namespace storage
}  // namespace gradsnap
