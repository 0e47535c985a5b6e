// Rebuilding the catalog (RocksDB meta/) from the shard footers in the segments
// (docs/format.md, "Rebuilding the catalog"). Used by `gradsnap-server --rebuild-catalog` and
// `gradsnap fsck [--rebuild]`.
//
// Every checkpoint directory of segments/ is examined, and of quarantine/ too: a whole
// checkpoint there (quarantined by an open of a stale catalog, for one) is moved back to
// segments/ first where segments/ has no directory of its step. A checkpoint is brought back
// only when every one of its world_size shards has an intact footer naming it, every segment
// the footers reference is at least as long as its durable end, and a full Verify (every chunk's checksums and every
// tensor's SHA-256) passes; a DELTA only when its base FULL is brought back too. Everything
// else is reported as skipped, with the reason, and moved to quarantine/ once the new
// catalog is in place (as the next Engine::Open would), never deleted. Writer epochs: per job
// the largest of its mirror in epochs/ (storage/epoch.h) and the epochs its footers record, so
// zombies of older attempts stay fenced. The new catalog is built in meta.rebuild/ and
// swapped in with renames; an existing meta/ is kept as meta.old-<unix_ms>/, never deleted.
//
// The data directory must not be open elsewhere (FAILED_PRECONDITION if meta/ is locked).
#ifndef GRADSNAP_STORAGE_REBUILD_H_
#define GRADSNAP_STORAGE_REBUILD_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/engine.h"
#include "storage/file_system.h"
#include "storage/metadata.h"

namespace gradsnap {
namespace storage {

// The file Delete writes (synced) into a checkpoint's directory before it removes the
// checkpoint from the catalog: a rebuild skips such a directory, so an rm or gc stopped between
// its catalog commit and the removal of the files is not undone by a later rebuild.
inline constexpr char kDeletedMarker[] = "DELETED";

struct RebuildReport {
  std::vector<std::string> rebuilt;  // "job J step S (FULL, 2 shards)"
  std::vector<std::string> skipped;  // "job J step S: reason"
  std::vector<std::string> epochs;   // "job J: attempt N", writer epochs kept (epochs/<job>)
  std::string old_catalog;           // where the previous meta/ went ("" when there was none)
  // "job J step S came back from quarantine/<ms>/segments/J/S" (dry run: "would come back")
  std::vector<std::string> from_quarantine;
};

// dry_run: build and verify in meta.rebuild/, report, then remove meta.rebuild/ and leave
// meta/ untouched (and quarantine/: what would come back from it is reported, not verified).
absl::StatusOr<RebuildReport> RebuildCatalog(const EngineOptions& options, bool dry_run);

// Whether the checkpoint directory `dir` of (job, step) is whole: every one of its world_size
// shards has an intact footer naming it, every segment its footers reference is long enough,
// and no DELETED marker (nothing is read but the footers: no Verify). Its record (COMMITTED)
// when so; else why not (NOT_FOUND: a shard was never finished; FAILED_PRECONDITION: deleted;
// DATA_LOSS: footers that disagree or a short segment).
absl::StatusOr<CheckpointRecord> ExamineCheckpointDir(FileSystem* fs, const std::string& dir,
                                                      const std::string& job, int64_t step);

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_REBUILD_H_
