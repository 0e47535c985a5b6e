// The file-system seam of the storage engine (after RocksDB's FileSystem / LevelDB's Env).
//
// Everything the engine does to segment files goes through a FileSystem, so tests can swap in
// FaultInjectionFileSystem (fault_injection_fs.h), which fails chosen operations and drops
// unsynced data on a simulated crash. The io_uring writer and reader need a real descriptor: a
// File whose fd() is -1 is written through File::Write (the pwrite path) and read through
// File::Read (pread) instead.
// RocksDB keeps its own Env; the engine calls BeforeMetadataCommit() right before each synced
// metadata batch so a fault-injecting file system can also "crash" at that step.
//
// THREAD SAFETY: FileSystem implementations are thread-safe. A File may be used from several
// threads for positional reads/writes of disjoint ranges.
#ifndef GRADSNAP_STORAGE_FILE_SYSTEM_H_
#define GRADSNAP_STORAGE_FILE_SYSTEM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace gradsnap {
namespace storage {

class File {
 public:
  virtual ~File() = default;
  // A descriptor io_uring may use directly, or -1 (then use Write/Read).
  virtual int fd() const = 0;
  // True when opened with O_DIRECT: offsets, lengths and buffers must be 4 KiB aligned.
  virtual bool direct() const = 0;
  // Writes all of data[0, n) at `offset` (retrying short writes).
  virtual absl::Status Write(uint64_t offset, const void* data, size_t n) = 0;
  // Reads up to n bytes at `offset`; fewer only at end of file.
  virtual absl::StatusOr<size_t> Read(uint64_t offset, void* out, size_t n) = 0;
  // fdatasync: everything written so far survives a crash.
  virtual absl::Status Sync() = 0;
  virtual absl::Status Truncate(uint64_t size) = 0;
  virtual absl::StatusOr<uint64_t> Size() = 0;
  // Called by the io_uring writer for each completion of a write through fd() of n bytes at
  // `offset`, with the kernel's result; returns the result to act on. The POSIX file system
  // returns `res`; a fault-injecting one may turn it into an error (-ENOSPC, -EIO) or a short
  // write, so the io_uring completion paths are tested like the pwrite ones.
  virtual int OnUringCompletion(uint64_t offset, size_t n, int res) {
    (void)offset;
    (void)n;
    return res;
  }
  // The same for each completion of an io_uring read through fd() of n bytes at `offset` into
  // buf[0, n) (UringReader). A fault-injecting file system may turn it into -EIO or a short
  // read (and scribble over the bytes past it, which the reader must then read again).
  virtual int OnUringRead(uint64_t offset, uint8_t* buf, size_t n, int res) {
    (void)offset;
    (void)buf;
    (void)n;
    return res;
  }
};

struct OpenOptions {
  bool write = false;     // open read-write (else read-only)
  bool create = false;    // O_CREAT
  bool truncate = false;  // O_TRUNC
  bool direct = false;    // try O_DIRECT; falls back to buffered where unsupported
  bool exclusive = false;  // O_EXCL with create: ALREADY_EXISTS where the path exists (a
                           // symlink too), so a file is only ever one this call created
};

// A name for a temporary file beside `path` that no other writer in this or another process
// picks: "PATH.tmp-PID-N". Written, synced, then renamed over `path`; opened with
// OpenOptions::exclusive. One left by a killed process is safe to delete.
std::string UniqueTempPath(const std::string& path);
// Whether `name` is one UniqueTempPath made (ends with ".tmp-PID-N").
bool IsUniqueTempPath(const std::string& name);
// Removes this process's own unfinished temporaries: every "NAME.tmp-<getpid()>-N" in the
// directories UniqueTempPath has named in this process. For a command interrupted by a signal
// (the CLI's SIGINT/SIGTERM), which then exits without returning: it waits for renames in a
// TempRenameSection to end and keeps later ones from starting. Returns the number removed.
int RemoveOwnTempFiles();
// Held around the renames that put finished temporaries in place (StagedFiles::Commit), so
// RemoveOwnTempFiles never cuts a set of renames in two. Sections may overlap each other.
class TempRenameSection {
 public:
  TempRenameSection();
  ~TempRenameSection();
  TempRenameSection(const TempRenameSection&) = delete;
  TempRenameSection& operator=(const TempRenameSection&) = delete;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // The process-wide POSIX file system.
  static FileSystem* Default();

  virtual absl::StatusOr<std::unique_ptr<File>> Open(const std::string& path,
                                                     const OpenOptions& options) = 0;
  // mkdir -p, then fsync of every directory whose entries changed.
  virtual absl::Status CreateDirs(const std::string& path) = 0;
  // fsync of a directory, making entries created or removed in it durable.
  virtual absl::Status SyncDir(const std::string& path) = 0;
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // rm -r (missing is OK).
  virtual absl::Status RemoveAll(const std::string& path) = 0;
  // rename(2): moves a file or directory; the parent of `to` must exist. Callers SyncDir both
  // parents when the move must be durable.
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // Entry names in a directory (no "." / ".."); NOT_FOUND if it does not exist.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(const std::string& path) = 0;
  // Fault-injection seam: called before every synced metadata batch. Default: OK.
  virtual absl::Status BeforeMetadataCommit() { return absl::OkStatus(); }
};

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_FILE_SYSTEM_H_
