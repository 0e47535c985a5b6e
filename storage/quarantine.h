// Quarantine and the catalog guard: the engine never deletes segment data by guesswork
// (docs/format.md, "Quarantine" and "Catalog guard").
//
// Segment files or checkpoint directories that the catalog (RocksDB) does not reference are
// moved, not unlinked, to <data_dir>/quarantine/<unix_ms:013>/<path relative to data_dir>, with
// a warning and the gradsnap_storage_quarantined_total metric. Engine::Gc removes quarantine
// entries older than EngineOptions::quarantine_grace_seconds.
//
// THREAD SAFETY: free functions; callers serialize moves of the same path.
#ifndef GRADSNAP_STORAGE_QUARANTINE_H_
#define GRADSNAP_STORAGE_QUARANTINE_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/file_system.h"
#include "storage/metadata.h"

namespace gradsnap {
namespace storage {

// Moves `path` (a file or directory below data_dir) into the quarantine entry of now_unix_ms
// (EngineOptions::clock) and logs a warning naming `reason`. The move is durable (both parents
// fsync'ed) when this returns OK.
absl::Status QuarantinePath(FileSystem* fs, const std::string& data_dir, const std::string& path,
                            const std::string& reason, int64_t now_unix_ms);

// Removes quarantine entries created more than grace_seconds before now_unix_ms; returns how
// many were removed.
absl::StatusOr<int> PurgeQuarantine(FileSystem* fs, const std::string& data_dir,
                                    int64_t grace_seconds, int64_t now_unix_ms);

// Regular files below <data_dir>/segments (0 when it does not exist). FAILED_PRECONDITION when
// the walk cannot see every file (a directory it may not read, an I/O error).
absl::StatusOr<uint64_t> CountSegmentFiles(const std::string& data_dir);

// The state of <data_dir>/meta before the engine opens it.
enum class CatalogState {
  kAbsent,      // no meta/ directory, or an empty one
  kPresent,     // meta/CURRENT exists
  kBroken,      // meta/ has files but no CURRENT
};
CatalogState InspectCatalog(const std::string& data_dir);

// The one-line refusal when the catalog cannot be trusted while segment data exists.
absl::Status CatalogRefusal(const std::string& data_dir, const std::string& why);

// The stale-catalog guard (docs/format.md, "Catalog guard"): a CatalogRefusal when segments/
// holds a whole checkpoint (ExamineCheckpointDir: every shard's footer intact, no DELETED
// marker) that `meta` does not know, at a step above the newest step `meta` knows for its job
// (any step, for a job it does not know): the catalog is older than the data (meta/ put back
// from a backup, a meta.old-* put back), and recovery would quarantine that data. What an
// interrupted write leaves (a shard without its footer; an rm stopped after its commit) does
// not count. Reads only the footers of the directories the catalog does not know.
absl::Status CheckCatalogNotStale(FileSystem* fs, MetaStore* meta, const std::string& data_dir);

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_QUARANTINE_H_
