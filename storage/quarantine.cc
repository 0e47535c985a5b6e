#include "storage/quarantine.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <utility>
#include <vector>
#include <system_error>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status.h"
#include "storage/rebuild.h"
#include "storage/storage_stats.h"

namespace gradsnap {
namespace storage {
namespace {

std::string Parent(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

}  // namespace

absl::Status QuarantinePath(FileSystem* fs, const std::string& data_dir, const std::string& path,
                            const std::string& reason, int64_t now_unix_ms) {
  const std::string prefix = data_dir + "/";
  if (path.rfind(prefix, 0) != 0) {
    return absl::InternalError(absl::StrCat("quarantine: ", path, " is not below ", data_dir));
  }
  std::string rel = path.substr(prefix.size());
  const std::string first = absl::StrFormat("%s/quarantine/%013d/%s", data_dir, now_unix_ms, rel);
  // The same path quarantined twice in one millisecond (or under a clock that stands still)
  // gets a numbered sibling instead of replacing the first.
  std::string target = first;
  std::error_code ec;
  for (int n = 1; std::filesystem::exists(target, ec); ++n) target = absl::StrCat(first, ".", n);
  RETURN_IF_ERROR(fs->CreateDirs(Parent(target)));
  RETURN_IF_ERROR(fs->Rename(path, target));
  RETURN_IF_ERROR(fs->SyncDir(Parent(path)));
  RETURN_IF_ERROR(fs->SyncDir(Parent(target)));
  StorageStats::Get().quarantined->Add();
  GS_LOG(WARNING) << "storage: quarantined " << path << " (" << reason << ") to " << target
                  << "; it is removed after the quarantine grace period";
  return absl::OkStatus();
}

absl::StatusOr<int> PurgeQuarantine(FileSystem* fs, const std::string& data_dir,
                                    int64_t grace_seconds, int64_t now_unix_ms) {
  const std::string root = data_dir + "/quarantine";
  auto names = fs->ListDir(root);
  if (absl::IsNotFound(names.status())) return 0;
  if (!names.ok()) return names.status();
  int removed = 0;
  for (const std::string& name : *names) {
    int64_t ms = 0;
    if (!absl::SimpleAtoi(name, &ms) || ms < 0) continue;  // not ours: never guess
    if (ms > now_unix_ms) continue;  // stamped by a clock ahead of this one: not old yet
    // Its age against the grace, in a form that cannot overflow (a grace of INT64_MAX keeps
    // everything for ever).
    if ((now_unix_ms - ms) / 1000 < grace_seconds) continue;
    RETURN_IF_ERROR(fs->RemoveAll(absl::StrCat(root, "/", name)));
    StorageStats::Get().quarantine_purged->Add();
    GS_LOG(INFO) << "storage: removed quarantine entry " << root << "/" << name;
    ++removed;
  }
  if (removed > 0) RETURN_IF_ERROR(fs->SyncDir(root));
  return removed;
}

absl::StatusOr<uint64_t> CountSegmentFiles(const std::string& data_dir) {
  const std::string segments = data_dir + "/segments";
  std::error_code ec;
  uint64_t n = 0;
  std::filesystem::recursive_directory_iterator it(segments, ec), end;
  if (ec == std::errc::no_such_file_or_directory) return 0;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (it->is_regular_file(type_ec)) ++n;
  }
  // A walk cut short (EACCES, EIO) has not seen every file: a count of what it saw could
  // pass for "no segment data" and let a new, empty catalog be made beside the data.
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot list every file under ", segments, ": ", ec.message()));
  }
  return n;
}

CatalogState InspectCatalog(const std::string& data_dir) {
  const std::string meta = data_dir + "/meta";
  std::error_code ec;
  if (!std::filesystem::is_directory(meta, ec)) return CatalogState::kAbsent;
  if (std::filesystem::exists(meta + "/CURRENT", ec)) return CatalogState::kPresent;
  if (std::filesystem::is_empty(meta, ec)) return CatalogState::kAbsent;
  return CatalogState::kBroken;
}

absl::Status CatalogRefusal(const std::string& data_dir, const std::string& why) {
  return absl::FailedPreconditionError(absl::StrCat(
      "refusing to open ", data_dir, ": ", why,
      "; nothing was changed. Rebuild the catalog from the segments with "
      "'gradsnap-server --data-dir ", data_dir, " --rebuild-catalog' (or 'gradsnap --ckpt-dir ",
      data_dir, " fsck --rebuild')"));
}

absl::Status CheckCatalogNotStale(FileSystem* fs, MetaStore* meta, const std::string& data_dir) {
  ASSIGN_OR_RETURN(auto kvs, meta->Scan("c/"));
  std::set<std::pair<std::string, int64_t>> known;
  std::map<std::string, int64_t> newest;  // job -> the newest step the catalog knows
  for (const auto& [key, value] : kvs) {
    CheckpointRecord r;
    if (!DecodeCheckpoint(value, &r).ok()) continue;  // recovery reports it
    known.insert({r.spec.job, r.spec.step});
    auto [it, added] = newest.emplace(r.spec.job, r.spec.step);
    if (!added) it->second = std::max(it->second, r.spec.step);
  }
  const std::string root = data_dir + "/segments";
  auto jobs = fs->ListDir(root);
  if (absl::IsNotFound(jobs.status())) return absl::OkStatus();
  if (!jobs.ok()) return jobs.status();
  std::sort(jobs->begin(), jobs->end());
  std::vector<std::string> newer;
  for (const std::string& job : *jobs) {
    auto steps = fs->ListDir(absl::StrCat(root, "/", job));
    if (!steps.ok()) continue;
    std::sort(steps->begin(), steps->end());
    auto top = newest.find(job);
    for (const std::string& s : *steps) {
      int64_t step = 0;
      if (s.size() != 20 || !absl::SimpleAtoi(s, &step) || step < 0) continue;
      if ((top != newest.end() && step <= top->second) || known.count({job, step}) != 0) continue;
      if (ExamineCheckpointDir(fs, absl::StrCat(root, "/", job, "/", s), job, step).ok()) {
        newer.push_back(absl::StrCat("job ", job, " step ", step));
      }
    }
  }
  if (newer.empty()) return absl::OkStatus();
  const size_t shown = std::min<size_t>(newer.size(), 4);
  return CatalogRefusal(
      data_dir,
      absl::StrCat("segments/ holds ", newer.size(), " whole checkpoint",
                   newer.size() == 1 ? "" : "s", " newer than its catalog knows (",
                   absl::StrJoin(newer.begin(), newer.begin() + shown, ", "),
                   newer.size() > shown ? ", ..." : "",
                   "): the catalog is older than the data (put back from a backup?), and "
                   "opening it would quarantine them"));
}

}  // namespace storage
}  // namespace gradsnap
