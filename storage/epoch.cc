#include "storage/epoch.h"

#include <cstring>

#include "absl/strings/str_cat.h"
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

absl::StatusOr<uint64_t> AcquireJobEpoch(MetaStore* meta, const std::string& job) {
  ASSIGN_OR_RETURN(uint64_t current, CurrentJobEpoch(meta, job));
  const uint64_t next = current + 1;
  MetaStore::Batch b;
  b.puts.emplace_back(EpochKey(job),
                      std::string(reinterpret_cast<const char*>(&next), sizeof(next)));
  RETURN_IF_ERROR(meta->Commit(b));
  return next;
}

absl::Status CheckJobEpoch(MetaStore* meta, const std::string& job, uint64_t epoch) {
  if (epoch == 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(uint64_t current, CurrentJobEpoch(meta, job));
  if (epoch >= current) return absl::OkStatus();
  return SupersededError(job, current, epoch);
}

}  // namespace storage
}  // namespace gradsnap
