// EngineImpl, opening: Engine::Open (option checks and the catalog guard, docs/format.md
// "Catalog guard"), the constructor, the data directory's layout, and CheckWritable.
//
// LOCKING: none. Open runs before the engine is shared; the constructor sets the members that
// are constant after construction, and the rest of this file reads only those (CheckWritable
// is called with or without mu_ held). Creating a new store holds an flock on the data
// directory, not a mutex.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/status.h"
#include "storage/engine_impl.h"
#include "storage/quarantine.h"

namespace gradsnap {
namespace storage {
namespace {

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
  // Below the catalog's reserve (docs/format.md, "Full disks"): a new store is not made, and
  // an existing one opens refusing writes, so a full node still serves its restores and can
  // free space (rm, gc); with less than a delete needs, its catalog opens read-only.
  bool low_space = false;
  if (mode != MetaStore::Mode::kReadOnly && options.catalog_reserve_bytes > 0) {
    const uint64_t free = FreeBytes(dir);
    if (free < options.catalog_reserve_bytes && mode == MetaStore::Mode::kCreate) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "not enough free space to create a checkpoint store in ", dir, ": ", free,
          " bytes free, the catalog needs ", options.catalog_reserve_bytes));
    }
    if (free < options.catalog_reserve_bytes) {
      low_space = true;
      if (free < std::min<uint64_t>(options.catalog_reserve_bytes, kMinFreeForDeletes)) {
        mode = MetaStore::Mode::kReadOnly;
      }
      GS_LOG(WARNING) << "storage: " << dir << " has " << free << " bytes free, below the "
                      << "catalog's reserve of " << options.catalog_reserve_bytes << ": "
                      << (mode == MetaStore::Mode::kReadOnly
                              ? "opened read-only (writes, rm and gc wait for a restart)"
                              : "writes are refused until space is back (reads, rm and gc work)");
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
    RETURN_IF_ERROR(CheckCatalogNotStale(fs, probe->get(), dir));
  }
  auto meta = MetaStore::Open(dir + "/meta", mode, low_space);
  if (low_space && absl::IsResourceExhausted(meta.status())) {
    // Not even room for RocksDB's own open (its MANIFEST and OPTIONS files): serve reads.
    GS_LOG(WARNING) << "storage: " << dir << ": " << meta.status().message()
                    << "; opened read-only (writes, rm and gc wait for a restart)";
    meta = MetaStore::Open(dir + "/meta", MetaStore::Mode::kReadOnly);
  }
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
  if (!engine->meta()->read_only()) RETURN_IF_ERROR(engine->Recover());
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

absl::Status EngineImpl::CheckWritable() const {
  if (options_.read_only) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint store ", options_.data_dir,
                                                      " is open read-only"));
  }
  if (meta_->read_only()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "checkpoint store ", options_.data_dir, " opened with less than ", kMinFreeForDeletes,
        " bytes free, so its catalog is read-only: only reads are served; free space and "
        "restart to write, rm or gc"));
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

absl::Status EngineImpl::CheckJobChange(const std::string& job) const {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  return CheckWritable();
}

absl::Status EngineImpl::CheckRoomToAdd() const {
  RETURN_IF_ERROR(CheckWritable());
  return storage::CheckRoomToAdd(options_.data_dir, options_.catalog_reserve_bytes);
}

WriteSpaceState EngineImpl::WriteSpace() {
  WriteSpaceState s;
  s.reserve_bytes = options_.catalog_reserve_bytes;
  s.free_bytes = FreeBytes(options_.data_dir);
  s.restart_needed = !options_.read_only && meta_->read_only();
  s.writes_refused = s.restart_needed || (s.reserve_bytes > 0 && s.free_bytes < s.reserve_bytes);
  return s;
}

}  // namespace storage
}  // namespace gradsnap
