// Writer epochs (storage/epoch.h): the job's epoch record in the catalog, its mirror under
// epochs/, and EngineImpl's AcquireEpoch and RaiseEpoch at the end.
//
// LOCKING: the free functions take no lock; their callers serialize an epoch's
// read-modify-write. AcquireEpoch and RaiseEpoch take the engine's mu_ around it;
// CommitEpochLocked requires mu_ held.
#include "storage/epoch.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/crc32c.h"
#include "common/names.h"
#include "common/status.h"
#include "storage/engine_impl.h"

namespace gradsnap {
namespace storage {

std::string EpochKey(const std::string& job) { return "e/" + job; }

absl::StatusOr<uint64_t> CurrentJobEpoch(MetaStore* meta, const std::string& job) {
  absl::StatusOr<std::string> v = meta->Get(EpochKey(job));
  if (absl::IsNotFound(v.status())) return 0;
  if (!v.ok()) return v.status();
  if (v->size() != 8) {
    return absl::DataLossError(absl::StrCat("epoch record of job ", job, " has ", v->size(),
                                            " bytes, expected 8"));
  }
  uint64_t e = 0;
  std::memcpy(&e, v->data(), 8);
  return e;
}

void PutJobEpoch(MetaStore::Batch* b, const std::string& job, uint64_t epoch) {
  b->puts.emplace_back(EpochKey(job),
                       std::string(reinterpret_cast<const char*>(&epoch), sizeof(epoch)));
}

absl::Status MirrorJobEpoch(FileSystem* fs, const std::string& data_dir, const std::string& job,
                            uint64_t epoch) {
  const std::string dir = data_dir + "/epochs";
  RETURN_IF_ERROR(fs->CreateDirs(dir));
  char bytes[12];
  std::memcpy(bytes, &epoch, 8);
  const uint32_t crc = Crc32c(bytes, 8);
  std::memcpy(bytes + 8, &crc, 4);
  const std::string path = dir + "/" + job;
  const std::string tmp = UniqueTempPath(path);
  OpenOptions o;
  o.write = o.create = o.exclusive = true;
  ASSIGN_OR_RETURN(std::unique_ptr<File> f, fs->Open(tmp, o));
  absl::Status s = f->Write(0, bytes, sizeof(bytes));
  if (s.ok()) s = f->Sync();
  f.reset();
  if (s.ok()) s = fs->Rename(tmp, path);
  if (!s.ok()) {
    fs->RemoveAll(tmp).IgnoreError();
    return s;
  }
  return fs->SyncDir(dir);
}

namespace {

// The epoch in mirror file `path`; false when it is missing or does not check.
bool ReadMirror(FileSystem* fs, const std::string& path, uint64_t* epoch) {
  OpenOptions o;
  auto f = fs->Open(path, o);
  if (!f.ok()) return false;
  char bytes[13];
  absl::StatusOr<size_t> got = (*f)->Read(0, bytes, sizeof(bytes));
  if (!got.ok() || *got != 12) return false;
  uint32_t crc = 0;
  std::memcpy(&crc, bytes + 8, 4);
  if (crc != Crc32c(bytes, 8)) return false;
  std::memcpy(epoch, bytes, 8);
  return true;
}

}  // namespace

uint64_t MirroredJobEpoch(FileSystem* fs, const std::string& data_dir, const std::string& job) {
  uint64_t epoch = 0;
  return ReadMirror(fs, data_dir + "/epochs/" + job, &epoch) ? epoch : 0;
}

absl::StatusOr<std::map<std::string, uint64_t>> ReadEpochMirrors(FileSystem* fs,
                                                                 const std::string& data_dir,
                                                                 std::vector<std::string>* bad) {
  std::map<std::string, uint64_t> out;
  const std::string dir = data_dir + "/epochs";
  auto names = fs->ListDir(dir);
  if (absl::IsNotFound(names.status())) return out;
  if (!names.ok()) return names.status();
  for (const std::string& job : *names) {
    if (IsUniqueTempPath(job)) continue;  // a temporary left by a kill, complete or not
    if (!ValidateName(job, "job name").ok()) {
      bad->push_back("epochs/" + job);
      continue;
    }
    uint64_t epoch = 0;
    if (!ReadMirror(fs, dir + "/" + job, &epoch)) {
      bad->push_back("epochs/" + job);
      continue;
    }
    out[job] = epoch;
  }
  return out;
}

absl::Status CheckJobEpoch(MetaStore* meta, const std::string& job, uint64_t epoch) {
  if (epoch == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(uint64_t current, CurrentJobEpoch(meta, job));
  if (epoch >= current) return absl::OkStatus();
  return SupersededError(job, current, epoch);
}

absl::StatusOr<uint64_t> EngineImpl::AcquireEpoch(const std::string& job) {
  RETURN_IF_ERROR(ValidateName(job, "job name"));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckRoomToAdd());  // before the mirror: a refused commit leaves it as it was
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
  if (target > current) {
    RETURN_IF_ERROR(CheckRoomToAdd());
    RETURN_IF_ERROR(CommitEpochLocked(job, target));
  }
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

}  // namespace storage
}  // namespace gradsnap
