// A FileSystem for tests that wraps the POSIX one and injects faults (after RocksDB's
// FaultInjectionTestFS and LevelDB's fault_injection_test).
//
// - Fails the Nth write, the Nth sync or the Nth metadata commit (1-based, counted from
//   construction or Reset()), with EIO or ENOSPC for writes.
// - Tracks, per file, how many bytes were made durable by the last Sync(). SimulateCrash()
//   truncates every written file back to that size, i.e. drops unsynced data, and then fails
//   every later operation until Reset(), as a dead process would. A truncate that fails (other
//   than for a file already removed) is fatal: the crash could not be simulated.
// - By default files have no descriptor (fd() == -1), so the engine writes them through Write
//   (pwrite). With set_real_descriptors(true) files expose their real descriptor, the engine
//   writes them through io_uring, and every io_uring completion counts as a write: the Nth
//   fails (ENOSPC or EIO) or, with short_write_at, completes short (the writer must requeue
//   the rest).
// - Fails the Nth read (pread or io_uring completion; 1-based, -1: every read) with EIO, and
//   shortens the Nth io_uring read completion (-1: every one) to half its bytes, scribbling
//   over the bytes past the half so a reader that does not read them again returns garbage.
//   Read faults never SimulateCrash(). With set_real_descriptors(true) the shard reader reads
//   through io_uring and every completion goes through these faults.
// - Refuses O_DIRECT like file systems that do not support it: at open (the file opens
//   buffered, as the POSIX file system does on EINVAL), or at every write through a file
//   opened O_DIRECT (EINVAL, as where O_DIRECT opens but the writes' alignment is refused).
//
// THREAD SAFETY: thread-safe.
#ifndef GRADSNAP_STORAGE_FAULT_INJECTION_FS_H_
#define GRADSNAP_STORAGE_FAULT_INJECTION_FS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "storage/file_system.h"

namespace gradsnap {
namespace storage {

class FaultInjectionFileSystem : public FileSystem {
 public:
  struct Faults {
    int64_t fail_write_at = 0;    // 0 = never
    int64_t fail_sync_at = 0;
    int64_t fail_commit_at = 0;   // BeforeMetadataCommit
    bool enospc = false;          // write failures are ENOSPC instead of EIO
    int64_t short_write_at = 0;   // io_uring: the Nth write completes with half its bytes
    int64_t fail_read_at = 0;     // the Nth read fails with EIO (-1: every read)
    int64_t short_read_at = 0;    // io_uring: the Nth read completes with half (-1: every one)
    bool crash_on_fault = true;   // a fault also SimulateCrash()es
    bool refuse_direct_open = false;    // files asked O_DIRECT open buffered
    bool refuse_direct_writes = false;  // pwrite through an O_DIRECT file fails with EINVAL
  };

  FaultInjectionFileSystem();
  // Files opened from now on expose their real descriptor (io_uring). Default: false.
  void set_real_descriptors(bool on);
  bool real_descriptors();
  void SetFaults(const Faults& f);
  // Counters reset, faults cleared, the "dead" state ends.
  void Reset();
  // Drops unsynced data of every file written so far and fails all later operations.
  void SimulateCrash();
  bool crashed();
  int64_t writes();
  int64_t syncs();
  int64_t commits();
  int64_t reads();

  absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                             const OpenOptions& options) override;
  absl::Status CreateDirs(const std::string& path) override;
  absl::Status SyncDir(const std::string& path) override;
  absl::Status RemoveFile(const std::string& path) override;
  absl::Status RemoveAll(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) override;
  absl::Status BeforeMetadataCommit() override;

  // Used by its files.
  absl::Status OnWrite(const std::string& path, uint64_t end, bool direct);
  absl::Status OnSync(const std::string& path, uint64_t size);
  int OnUringWrite(const std::string& path, size_t n, int res, bool direct);
  absl::Status OnRead(const std::string& path, uint64_t offset);
  int OnUringRead(uint8_t* buf, size_t n, int res, bool direct);

 private:
  absl::Status Dead() const;
  // Dead() after a simulated crash, else OK.
  absl::Status Alive();
  int64_t Count(const int64_t* counter);
  // Whether the read just counted (reads_) is the one `at` names.
  bool ReadHit(int64_t at) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return at == -1 || (at > 0 && at == reads_);
  }
  void CrashLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  FileSystem* const base_;
  absl::Mutex mu_;
  Faults faults_ ABSL_GUARDED_BY(mu_);
  int64_t writes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t syncs_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t commits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reads_ ABSL_GUARDED_BY(mu_) = 0;
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  bool real_descriptors_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, uint64_t> synced_size_ ABSL_GUARDED_BY(mu_);  // files written to
};

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_FAULT_INJECTION_FS_H_
