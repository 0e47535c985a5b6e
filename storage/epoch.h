// Writer epochs ("one writer per job", DESIGN.md section 3, docs/protocol.md "Epochs").
//
// Every attempt of a training job takes a new epoch from the store (AcquireEpoch): one more than
// the job's newest, and at least the node's wall clock in milliseconds since the Unix epoch (a
// hybrid clock), kept per job in RocksDB under key e/<job> (8 bytes, little-endian). The clock
// keeps epochs growing across a node that lost its data: a counter on a fresh data dir would
// start again at 1, below the epoch of a zombie of the attempt before, and fence nothing. Requests that carry an
// epoch (CheckpointSpec::epoch, ShardSpec::epoch; 0 = not fenced, e.g. the CLI) are refused
// with FAILED_PRECONDITION "superseded by attempt N" when a newer epoch of the job exists, so
// a zombie rank of an older attempt can never begin, write or commit anything.
//
// The catalog can be lost and rebuilt from the segments (storage/rebuild.h). So every epoch is
// also mirrored, before the catalog commits it, in <data_dir>/epochs/<job> (8 bytes
// little-endian, then their CRC-32C), and every shard footer records its writer's epoch and the
// job's (storage/footer.h): a rebuilt catalog takes the largest of them, and a zombie of an
// attempt older than the newest is still refused.
//
// THREAD SAFETY: the functions read and write the MetaStore; callers serialize the
// read-modify-write of an epoch (Engine::AcquireEpoch holds the engine's mutex).
#ifndef GRADSNAP_STORAGE_EPOCH_H_
#define GRADSNAP_STORAGE_EPOCH_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "storage/file_system.h"
#include "storage/metadata.h"

namespace gradsnap {
namespace storage {

// The largest writer epoch a job takes (2^62): an epoch never wraps around to 0 (unfenced).
inline constexpr uint64_t kMaxEpoch = uint64_t{1} << 62;

std::string EpochKey(const std::string& job);

// The job's newest epoch (0 when none was ever acquired).
absl::StatusOr<uint64_t> CurrentJobEpoch(MetaStore* meta, const std::string& job);

// Adds the record of the job's epoch (key e/<job>) to `b`.
void PutJobEpoch(MetaStore::Batch* b, const std::string& job, uint64_t epoch);

// Writes <data_dir>/epochs/<job> = epoch durably (a temporary of its own, synced, renamed,
// the directory synced).
absl::Status MirrorJobEpoch(FileSystem* fs, const std::string& data_dir, const std::string& job,
                            uint64_t epoch);

// The job's mirrored epoch (0 when there is none or it does not check).
uint64_t MirroredJobEpoch(FileSystem* fs, const std::string& data_dir, const std::string& job);

// The mirrored epochs under <data_dir>/epochs (none when it does not exist); a file that is
// not a valid job name or does not check (size, CRC) is named in *bad and left out.
absl::StatusOr<std::map<std::string, uint64_t>> ReadEpochMirrors(FileSystem* fs,
                                                                 const std::string& data_dir,
                                                                 std::vector<std::string>* bad);

// OK when `epoch` is 0 (unfenced) or not older than the job's newest epoch; else
// FAILED_PRECONDITION "job J: superseded by attempt N (request epoch E)".
absl::Status CheckJobEpoch(MetaStore* meta, const std::string& job, uint64_t epoch);

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_EPOCH_H_
