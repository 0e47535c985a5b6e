#include "storage/fault_injection_fs.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace gradsnap {
namespace storage {
namespace {

class FaultFile : public File {
 public:
  FaultFile(FaultInjectionFileSystem* fs, std::string path, std::unique_ptr<File> base,
            bool real_fd)
      : fs_(fs), path_(std::move(path)), base_(std::move(base)), real_fd_(real_fd) {}
  int fd() const override { return real_fd_ ? base_->fd() : -1; }
  int OnUringCompletion(uint64_t offset, size_t n, int res) override {
    (void)offset;
    return fs_->OnUringWrite(path_, n, res, base_->direct());
  }
  bool direct() const override { return base_->direct(); }
  absl::Status Write(uint64_t offset, const void* data, size_t n) override {
    RETURN_IF_ERROR(fs_->OnWrite(path_, offset + n, base_->direct()));
    return base_->Write(offset, data, n);
  }
  absl::StatusOr<size_t> Read(uint64_t offset, void* out, size_t n) override {
    RETURN_IF_ERROR(fs_->OnRead(path_, offset));
    return base_->Read(offset, out, n);
  }
  int OnUringRead(uint64_t offset, uint8_t* buf, size_t n, int res) override {
    (void)offset;
    return fs_->OnUringRead(buf, n, res, base_->direct());
  }
  absl::Status Sync() override {
    ASSIGN_OR_RETURN(uint64_t size, base_->Size());
    RETURN_IF_ERROR(fs_->OnSync(path_, size));
    return base_->Sync();
  }
  absl::Status Truncate(uint64_t size) override {
    RETURN_IF_ERROR(fs_->OnWrite(path_, 0, false));
    return base_->Truncate(size);
  }
  absl::StatusOr<uint64_t> Size() override { return base_->Size(); }

 private:
  FaultInjectionFileSystem* const fs_;
  const std::string path_;
  const std::unique_ptr<File> base_;
  const bool real_fd_;
};

}  // namespace

FaultInjectionFileSystem::FaultInjectionFileSystem() : base_(FileSystem::Default()) {}

void FaultInjectionFileSystem::set_real_descriptors(bool on) {
  absl::MutexLock lock(&mu_);
  real_descriptors_ = on;
}

bool FaultInjectionFileSystem::real_descriptors() {
  absl::MutexLock lock(&mu_);
  return real_descriptors_;
}

int FaultInjectionFileSystem::OnUringWrite(const std::string& path, size_t n, int res,
                                           bool direct) {
  absl::MutexLock lock(&mu_);
  if (crashed_) return -EIO;
  synced_size_.try_emplace(path, 0);
  if (res < 0) return res;
  ++writes_;
  if (writes_ == faults_.fail_write_at) {
    if (faults_.crash_on_fault) CrashLocked();
    return faults_.enospc ? -ENOSPC : -EIO;
  }
  if (writes_ == faults_.short_write_at && static_cast<size_t>(res) == n) {
    // Half, kept 4 KiB aligned for O_DIRECT (a direct write shorter than a block stays whole).
    size_t half = direct ? n / 2 / 4096 * 4096 : n / 2;
    if (half > 0) return static_cast<int>(half);
  }
  return res;
}

absl::Status FaultInjectionFileSystem::OnRead(const std::string& path, uint64_t offset) {
  absl::MutexLock lock(&mu_);
  ++reads_;
  if (!ReadHit(faults_.fail_read_at)) return absl::OkStatus();
  return PosixError(absl::StrCat("injected read fault ", path, " at offset ", offset), EIO);
}

int FaultInjectionFileSystem::OnUringRead(uint8_t* buf, size_t n, int res, bool direct) {
  absl::MutexLock lock(&mu_);
  if (res < 0) return res;
  ++reads_;
  if (ReadHit(faults_.fail_read_at)) return -EIO;
  if (ReadHit(faults_.short_read_at) && static_cast<size_t>(res) == n) {
    // Half, kept 4 KiB aligned for O_DIRECT (a direct read of one block stays whole). The
    // bytes past it are garbage until read again.
    size_t half = direct ? n / 2 / 4096 * 4096 : n / 2;
    if (half > 0) {
      std::memset(buf + half, 0xA5, n - half);
      return static_cast<int>(half);
    }
  }
  return res;
}

void FaultInjectionFileSystem::SetFaults(const Faults& f) {
  absl::MutexLock lock(&mu_);
  faults_ = f;
}

void FaultInjectionFileSystem::Reset() {
  absl::MutexLock lock(&mu_);
  faults_ = Faults();
  writes_ = syncs_ = commits_ = reads_ = 0;
  crashed_ = false;
  synced_size_.clear();
}

bool FaultInjectionFileSystem::crashed() {
  absl::MutexLock lock(&mu_);
  return crashed_;
}
int64_t FaultInjectionFileSystem::Count(const int64_t* counter) {
  absl::MutexLock lock(&mu_);
  return *counter;
}
int64_t FaultInjectionFileSystem::writes() { return Count(&writes_); }
int64_t FaultInjectionFileSystem::syncs() { return Count(&syncs_); }
int64_t FaultInjectionFileSystem::commits() { return Count(&commits_); }
int64_t FaultInjectionFileSystem::reads() { return Count(&reads_); }

void FaultInjectionFileSystem::SimulateCrash() {
  absl::MutexLock lock(&mu_);
  CrashLocked();
}

void FaultInjectionFileSystem::CrashLocked() {
  if (crashed_) return;
  crashed_ = true;
  for (const auto& [path, size] : synced_size_) {
    if (::truncate(path.c_str(), static_cast<off_t>(size)) == 0 || errno == ENOENT) continue;
    // A crash that keeps unsynced data would let a test pass on bytes a real crash loses: stop
    // the test binary instead of simulating it wrongly.
    GS_LOG(FATAL) << "fault injection: cannot drop unsynced data of " << path << " (truncate to "
                  << size << " bytes): " << std::strerror(errno);
  }
}

absl::Status FaultInjectionFileSystem::Dead() const {
  return absl::UnavailableError("fault injection: simulated crash");
}

absl::Status FaultInjectionFileSystem::Alive() {
  absl::MutexLock lock(&mu_);
  return crashed_ ? Dead() : absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::OnWrite(const std::string& path, uint64_t end,
                                               bool direct) {
  (void)end;
  absl::MutexLock lock(&mu_);
  if (crashed_) return Dead();
  synced_size_.try_emplace(path, 0);
  if (direct && faults_.refuse_direct_writes) {
    return PosixError(absl::StrCat("injected O_DIRECT write refusal ", path), EINVAL);
  }
  if (++writes_ == faults_.fail_write_at) {
    absl::Status s = PosixError(absl::StrCat("injected write fault ", path),
                                faults_.enospc ? ENOSPC : EIO);
    if (faults_.crash_on_fault) CrashLocked();
    return s;
  }
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::OnSync(const std::string& path, uint64_t size) {
  absl::MutexLock lock(&mu_);
  if (crashed_) return Dead();
  if (++syncs_ == faults_.fail_sync_at) {
    if (faults_.crash_on_fault) CrashLocked();
    return PosixError(absl::StrCat("injected sync fault ", path), EIO);
  }
  synced_size_[path] = size;
  return absl::OkStatus();
}

absl::Status FaultInjectionFileSystem::BeforeMetadataCommit() {
  absl::MutexLock lock(&mu_);
  if (crashed_) return Dead();
  if (++commits_ == faults_.fail_commit_at) {
    if (faults_.crash_on_fault) CrashLocked();
    return absl::UnavailableError("injected crash before metadata commit");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<File>> FaultInjectionFileSystem::Open(const std::string& path,
                                                                     const OpenOptions& o) {
  OpenOptions base = o;
  {
    absl::MutexLock lock(&mu_);
    if (crashed_) return Dead();
    if (o.truncate) synced_size_[path] = 0;
    if (faults_.refuse_direct_open) base.direct = false;
  }
  ASSIGN_OR_RETURN(std::unique_ptr<File> f, base_->Open(path, base));
  return std::unique_ptr<File>(new FaultFile(this, path, std::move(f), real_descriptors()));
}

absl::Status FaultInjectionFileSystem::CreateDirs(const std::string& path) {
  RETURN_IF_ERROR(Alive());
  return base_->CreateDirs(path);
}

absl::Status FaultInjectionFileSystem::SyncDir(const std::string& path) {
  RETURN_IF_ERROR(Alive());
  return base_->SyncDir(path);
}

absl::Status FaultInjectionFileSystem::RemoveFile(const std::string& path) {
  {
    absl::MutexLock lock(&mu_);
    if (crashed_) return Dead();
    synced_size_.erase(path);
  }
  return base_->RemoveFile(path);
}

absl::Status FaultInjectionFileSystem::RemoveAll(const std::string& path) {
  {
    absl::MutexLock lock(&mu_);
    if (crashed_) return Dead();
    for (auto it = synced_size_.begin(); it != synced_size_.end();) {
      it = it->first.rfind(path, 0) == 0 ? synced_size_.erase(it) : std::next(it);
    }
  }
  return base_->RemoveAll(path);
}

absl::Status FaultInjectionFileSystem::Rename(const std::string& from, const std::string& to) {
  {
    absl::MutexLock lock(&mu_);
    if (crashed_) return Dead();
    std::map<std::string, uint64_t> moved;
    for (auto it = synced_size_.begin(); it != synced_size_.end();) {
      if (it->first.rfind(from, 0) == 0) {
        moved[to + it->first.substr(from.size())] = it->second;
        it = synced_size_.erase(it);
      } else {
        ++it;
      }
    }
    synced_size_.insert(moved.begin(), moved.end());
  }
  return base_->Rename(from, to);
}

absl::StatusOr<std::vector<std::string>> FaultInjectionFileSystem::ListDir(
    const std::string& path) {
  RETURN_IF_ERROR(Alive());
  return base_->ListDir(path);
}

}  // namespace storage
}  // namespace gradsnap
