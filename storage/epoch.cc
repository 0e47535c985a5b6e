#include "storage/epoch.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/crc32c.h"
#include "common/names.h"
#include "common/status.h"

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

}  // namespace storage
}  // namespace gradsnap
