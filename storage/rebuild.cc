// RebuildCatalog: a new RocksDB catalog from the shard footers (storage/rebuild.h).
#include "storage/rebuild.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/status.h"
#include "storage/engine_impl.h"
#include "storage/epoch.h"
#include "storage/footer.h"
#include "storage/quarantine.h"

namespace gradsnap {
namespace storage {
namespace {

// Holds RocksDB's LOCK file of meta/ (an fcntl write lock, as RocksDB takes it), so no engine
// opens the directory while the catalog is rebuilt.
class MetaLock {
 public:
  ~MetaLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  absl::Status Acquire(const std::string& meta_dir) {
    std::string path = meta_dir + "/LOCK";
    fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd_ < 0) return absl::OkStatus();  // no database, nothing to lock
    struct flock fl = {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (::fcntl(fd_, F_SETLK, &fl) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          meta_dir, " is in use by another process (stop the server or trainer first)"));
    }
    return absl::OkStatus();
  }

 private:
  int fd_ = -1;
};

struct Candidate {
  CheckpointRecord ckpt;
  std::vector<ShardFooter> shards;  // by rank
};

std::string Name(const std::string& job, int64_t step) {
  return absl::StrCat("job ", job, " step ", step);
}

bool SameSpec(const CheckpointSpec& a, const CheckpointSpec& b) {
  return a.job == b.job && a.step == b.step && a.kind == b.kind && a.base_step == b.base_step &&
         a.world_size == b.world_size && a.metadata == b.metadata;
}

// The size of the file at `path`, through `fs` (NOT_FOUND when it does not exist).
absl::StatusOr<uint64_t> FileSize(FileSystem* fs, const std::string& path) {
  OpenOptions oo;
  ASSIGN_OR_RETURN(std::unique_ptr<File> file, fs->Open(path, oo));
  return file->Size();
}

// The checkpoint in `dir`, if every shard of it has an intact footer; else why not. Raises
// *newest_epoch to every writer and job epoch an intact footer records, also where the
// checkpoint is not brought back: that epoch was handed out all the same.
absl::StatusOr<Candidate> Examine(FileSystem* fs, const std::string& dir, const std::string& job,
                                  int64_t step, uint64_t* newest_epoch) {
  ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(dir));
  if (std::find(names.begin(), names.end(), kDeletedMarker) != names.end()) {
    return absl::FailedPreconditionError(
        "deleted (an rm or gc was stopped before it removed the files): not brought back");
  }
  std::map<int32_t, std::vector<uint32_t>> seqs;
  for (const std::string& n : names) {
    int32_t rank = 0;
    uint32_t seq = 0;
    if (ParseSegmentName(n, &rank, &seq)) seqs[rank].push_back(seq);
  }
  if (seqs.empty()) return absl::NotFoundError("no segment files");
  std::map<int32_t, ShardFooter> footers;
  std::string last_error;
  for (auto& [rank, list] : seqs) {
    std::sort(list.rbegin(), list.rend());
    for (uint32_t seq : list) {
      std::string path = absl::StrCat(dir, "/", SegmentFileName(rank, seq));
      auto f = ReadFooter(fs, path);
      if (f.ok()) {
        *newest_epoch = std::max({*newest_epoch, f->shard.epoch, f->job_epoch});
        footers[rank] = *std::move(f);
        break;
      }
      if (!absl::IsNotFound(f.status())) last_error = std::string(f.status().message());
    }
  }
  if (footers.empty()) {
    return absl::NotFoundError(last_error.empty() ? "no shard footer (no shard was finished)"
                                                  : last_error);
  }
  Candidate c;
  c.ckpt = footers.begin()->second.checkpoint;
  // That record is the checkpoint as it stood when that shard was written (the shards
  // committed before it counted): the sizes are summed below over every shard, once.
  c.ckpt.raw_bytes = 0;
  c.ckpt.stored_bytes = 0;
  const CheckpointSpec& spec = c.ckpt.spec;
  if (spec.job != job || spec.step != step) {
    return absl::DataLossError(absl::StrCat("footers name ", Name(spec.job, spec.step)));
  }
  int64_t committed_ms = 0;
  for (int32_t rank = 0; rank < spec.world_size; ++rank) {
    auto it = footers.find(rank);
    if (it == footers.end()) {
      return absl::NotFoundError(absl::StrCat("rank ", rank, " of ", spec.world_size,
                                              " has no complete shard (no footer)"));
    }
    ShardFooter& f = it->second;
    const ShardSpec& ss = f.shard.spec;
    if (!SameSpec(f.checkpoint.spec, spec) || ss.job != job || ss.step != step ||
        ss.rank != rank || !f.shard.committed || f.shard.chunk_count != f.chunks.size()) {
      return absl::DataLossError(absl::StrCat("rank ", rank, ": footer disagrees with the "
                                              "checkpoint's other shards"));
    }
    for (const SegmentRef& seg : f.shard.segments) {
      auto size = FileSize(fs, absl::StrCat(dir, "/", SegmentFileName(rank, seg.seq)));
      if (!size.ok() && !absl::IsNotFound(size.status())) return size.status();
      if (!size.ok() || *size < seg.durable_end) {
        return absl::DataLossError(absl::StrCat("rank ", rank, ": segment ", seg.seq,
                                                size.ok() ? " is truncated" : " is missing"));
      }
    }
    committed_ms = std::max(committed_ms, f.written_unix_ms);
    c.ckpt.raw_bytes += f.shard.committed_size;
    c.ckpt.stored_bytes += f.shard.stored_bytes;
    c.shards.push_back(std::move(f));
  }
  for (const auto& [rank, f] : footers) {
    if (rank >= spec.world_size) {
      return absl::DataLossError(absl::StrCat("rank ", rank, " outside world_size ",
                                              spec.world_size));
    }
  }
  c.ckpt.state = CheckpointState::kCommitted;
  c.ckpt.committed_shards = spec.world_size;
  c.ckpt.committed_unix_ms = committed_ms;
  return c;
}

absl::Status RemoveKeys(MetaStore* meta, const std::string& job, int64_t step) {
  return meta->Commit(MetaStore::DeleteCheckpointBatch(job, step));
}

// Writes the candidate's records, then verifies every byte; removes them again on failure.
absl::Status Install(EngineImpl* engine, const Candidate& c) {
  const std::string& job = c.ckpt.spec.job;
  const int64_t step = c.ckpt.spec.step;
  MetaStore::Batch b;
  b.puts.emplace_back(CheckpointKey(job, step), EncodeCheckpoint(c.ckpt));
  for (const ShardFooter& f : c.shards) {
    b.puts.emplace_back(ShardKey(job, step, f.shard.spec.rank), EncodeShard(f.shard));
    for (uint32_t i = 0; i < f.chunks.size(); ++i) {
      b.puts.emplace_back(ChunkKey(job, step, f.shard.spec.rank, i), EncodeChunk(f.chunks[i]));
    }
  }
  RETURN_IF_ERROR(engine->meta()->Commit(b));
  absl::Status v = engine->Verify(job, step);
  if (!v.ok()) {
    RETURN_IF_ERROR(RemoveKeys(engine->meta(), job, step));
    return v;
  }
  return absl::OkStatus();
}

// A 20-digit step directory name's step; false for any other name.
bool ParseStepDir(const std::string& s, int64_t* step) {
  return s.size() == 20 && absl::SimpleAtoi(s, step) && *step >= 0;
}

// Moves each whole checkpoint in quarantine/ (quarantine/<ms>/segments/<job>/<step>, newest
// entry first) back to segments/ where segments/ has no directory of that step, so the scan
// that follows rebuilds it like any other (a stale catalog's open quarantined it, for one).
// dry_run: reports what it would move, moves nothing.
absl::Status BringBackFromQuarantine(FileSystem* fs, const std::string& dir, bool dry_run,
                                     RebuildReport* report) {
  auto entries = fs->ListDir(dir + "/quarantine");
  if (absl::IsNotFound(entries.status())) return absl::OkStatus();
  if (!entries.ok()) return entries.status();
  std::sort(entries->rbegin(), entries->rend());
  for (const std::string& entry : *entries) {
    const std::string qroot = absl::StrCat(dir, "/quarantine/", entry, "/segments");
    auto jobs = fs->ListDir(qroot);
    if (!jobs.ok()) continue;  // not a quarantined part of segments/
    for (const std::string& job : *jobs) {
      if (!ValidateName(job, "job name").ok()) continue;
      auto steps = fs->ListDir(absl::StrCat(qroot, "/", job));
      if (!steps.ok()) continue;
      for (const std::string& s : *steps) {
        int64_t step = 0;
        uint64_t unused_epoch = 0;  // the scan of segments/ that follows records it
        const std::string from = absl::StrCat(qroot, "/", job, "/", s);
        const std::string to = absl::StrCat(dir, "/segments/", job, "/", s);
        if (!ParseStepDir(s, &step) || !absl::IsNotFound(fs->ListDir(to).status()) ||
            !Examine(fs, from, job, step, &unused_epoch).ok()) {
          continue;
        }
        report->from_quarantine.push_back(absl::StrCat(
            Name(job, step), dry_run ? " would come back from " : " came back from ",
            from.substr(dir.size() + 1)));
        if (dry_run) continue;
        RETURN_IF_ERROR(fs->CreateDirs(absl::StrCat(dir, "/segments/", job)));
        RETURN_IF_ERROR(fs->Rename(from, to));
        RETURN_IF_ERROR(fs->SyncDir(absl::StrCat(qroot, "/", job)));
        RETURN_IF_ERROR(fs->SyncDir(absl::StrCat(dir, "/segments/", job)));
      }
    }
  }
  return absl::OkStatus();
}

// Quarantines every step directory of segments/ that the new catalog does not hold (skipped
// above), as the next open would: segments/ then holds exactly what the catalog knows, so no
// skipped checkpoint looks like data newer than the catalog (CheckCatalogNotStale).
absl::Status QuarantineSkipped(FileSystem* fs, const EngineOptions& options,
                               const std::set<std::pair<std::string, int64_t>>& installed) {
  const std::string root = options.data_dir + "/segments";
  auto jobs = fs->ListDir(root);
  if (!jobs.ok()) return absl::IsNotFound(jobs.status()) ? absl::OkStatus() : jobs.status();
  for (const std::string& job : *jobs) {
    auto steps = fs->ListDir(absl::StrCat(root, "/", job));
    if (!steps.ok()) continue;
    for (const std::string& s : *steps) {
      int64_t step = 0;
      if (!ParseStepDir(s, &step) || installed.count({job, step}) != 0) continue;
      RETURN_IF_ERROR(QuarantinePath(fs, options.data_dir, absl::StrCat(root, "/", job, "/", s),
                                     "not brought back by the catalog rebuild",
                                     ClockOrReal(options.clock)->NowUnixMillis()));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckpointRecord> ExamineCheckpointDir(FileSystem* fs, const std::string& dir,
                                                      const std::string& job, int64_t step) {
  uint64_t newest_epoch = 0;
  ASSIGN_OR_RETURN(Candidate c, Examine(fs, dir, job, step, &newest_epoch));
  return c.ckpt;
}

absl::StatusOr<RebuildReport> RebuildCatalog(const EngineOptions& options, bool dry_run) {
  if (options.data_dir.empty()) return absl::InvalidArgumentError("data_dir is required");
  FileSystem* fs = options.fs != nullptr ? options.fs : FileSystem::Default();
  const std::string& dir = options.data_dir;
  const std::string root = dir + "/segments";
  const std::string meta_dir = dir + "/meta";
  const std::string tmp = dir + "/meta.rebuild";
  if (!fs->ListDir(dir).ok()) return absl::NotFoundError(absl::StrCat("no directory ", dir));
  MetaLock lock;
  RETURN_IF_ERROR(lock.Acquire(meta_dir));
  {
    MetaLock other;  // a rebuild running right now holds its database's lock
    absl::Status s = other.Acquire(tmp);
    if (!s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("another catalog rebuild of ", dir,
                                                        " is running"));
    }
  }
  RETURN_IF_ERROR(fs->RemoveAll(tmp));  // a previous rebuild's unfinished work
  ASSIGN_OR_RETURN(std::unique_ptr<MetaStore> meta, MetaStore::Open(tmp, MetaStore::Mode::kCreate));
  EngineOptions eo = options;
  eo.read_only = false;
  auto engine = std::make_unique<EngineImpl>(eo, fs, std::move(meta));

  RebuildReport report;
  RETURN_IF_ERROR(BringBackFromQuarantine(fs, dir, dry_run, &report));
  std::vector<Candidate> fulls, deltas;
  std::map<std::string, uint64_t> footer_epochs;  // job -> newest epoch its footers record
  auto jobs = fs->ListDir(root);
  if (!jobs.ok() && !absl::IsNotFound(jobs.status())) return jobs.status();
  std::vector<std::string> job_names = jobs.ok() ? *jobs : std::vector<std::string>();
  std::sort(job_names.begin(), job_names.end());
  for (const std::string& job : job_names) {
    if (!ValidateName(job, "job name").ok()) {
      report.skipped.push_back(absl::StrCat("segments/", job, ": not a job name"));
      continue;
    }
    auto steps = fs->ListDir(absl::StrCat(root, "/", job));
    if (!steps.ok()) continue;  // a stray file
    std::sort(steps->begin(), steps->end());
    for (const std::string& s : *steps) {
      int64_t step = 0;
      if (!ParseStepDir(s, &step)) {
        report.skipped.push_back(absl::StrCat("segments/", job, "/", s, ": not a step"));
        continue;
      }
      auto c = Examine(fs, absl::StrCat(root, "/", job, "/", s), job, step, &footer_epochs[job]);
      if (!c.ok()) {
        report.skipped.push_back(absl::StrCat(Name(job, step), ": ", c.status().message()));
        continue;
      }
      (c->ckpt.spec.kind == CheckpointKind::kFull ? fulls : deltas).push_back(*std::move(c));
    }
  }
  // (job, step) of every FULL rebuilt, and of every DELTA rebuilt with the base it replays on;
  // of every checkpoint rebuilt (the rest is quarantined at the end).
  std::set<std::pair<std::string, int64_t>> rebuilt_fulls, installed;
  std::map<std::pair<std::string, int64_t>, int64_t> rebuilt_deltas;
  auto install = [&](const Candidate& c) -> absl::Status {
    const CheckpointSpec& spec = c.ckpt.spec;
    absl::Status s = Install(engine.get(), c);
    if (s.ok()) {
      report.rebuilt.push_back(absl::StrCat(
          Name(spec.job, spec.step), " (", spec.kind == CheckpointKind::kFull ? "FULL" : "DELTA",
          ", ", spec.world_size, spec.world_size == 1 ? " shard)" : " shards)"));
      if (spec.kind == CheckpointKind::kFull) {
        rebuilt_fulls.insert({spec.job, spec.step});
      } else {
        rebuilt_deltas[{spec.job, spec.step}] = spec.base_step;
      }
      installed.insert({spec.job, spec.step});
      return absl::OkStatus();
    }
    if (absl::IsDataLoss(s) || absl::IsNotFound(s) || absl::IsFailedPrecondition(s)) {
      report.skipped.push_back(absl::StrCat(Name(spec.job, spec.step), ": ", s.message()));
      return absl::OkStatus();
    }
    return s;  // the new catalog itself failed: stop
  };
  for (const Candidate& c : fulls) RETURN_IF_ERROR(install(c));
  // DELTAs in step order (the step directories were listed sorted), each only on what it
  // replays on, as BeginCheckpoint asks of a new one: its FULL, and above base + 1 the DELTA
  // before it on that FULL. A DELTA after a skipped one is skipped too, so no chain comes back
  // with a hole (listed, and unrestorable past it).
  for (const Candidate& c : deltas) {
    const CheckpointSpec& spec = c.ckpt.spec;
    if (rebuilt_fulls.count({spec.job, spec.base_step}) == 0) {
      report.skipped.push_back(absl::StrCat(Name(spec.job, spec.step), ": its base FULL step ",
                                            spec.base_step, " was not rebuilt"));
      continue;
    }
    if (spec.step > spec.base_step + 1) {
      auto before = rebuilt_deltas.find({spec.job, spec.step - 1});
      if (before == rebuilt_deltas.end() || before->second != spec.base_step) {
        report.skipped.push_back(absl::StrCat(Name(spec.job, spec.step),
                                              ": the DELTA before it on FULL step ",
                                              spec.base_step, " (step ", spec.step - 1,
                                              ") was not rebuilt: the chain is cut there"));
        continue;
      }
    }
    RETURN_IF_ERROR(install(c));
  }
  // The writer epochs: per job the newer of its mirror and what its footers record (a lost
  // or older mirror must not let a job's epoch go back, and a zombie of an older attempt in).
  std::vector<std::string> bad;
  ASSIGN_OR_RETURN(auto epochs, ReadEpochMirrors(fs, dir, &bad));
  for (const std::string& b : bad) {
    report.skipped.push_back(absl::StrCat(b, ": not an epoch record (left as it is)"));
  }
  for (const auto& [job, epoch] : footer_epochs) {
    if (epoch != 0) epochs[job] = std::max(epochs[job], epoch);
  }
  if (!epochs.empty()) {
    MetaStore::Batch b;
    for (const auto& [job, epoch] : epochs) {
      PutJobEpoch(&b, job, epoch);
      report.epochs.push_back(absl::StrCat("job ", job, ": attempt ", epoch));
    }
    RETURN_IF_ERROR(engine->meta()->Commit(b));
  }
  engine.reset();
  if (dry_run) {
    RETURN_IF_ERROR(fs->RemoveAll(tmp));
    return report;
  }
  if (!absl::IsNotFound(fs->ListDir(meta_dir).status())) {
    report.old_catalog = absl::StrFormat("%s/meta.old-%013d", dir,
                                          ClockOrReal(options.clock)->NowUnixMillis());
    RETURN_IF_ERROR(fs->Rename(meta_dir, report.old_catalog));
  }
  RETURN_IF_ERROR(fs->Rename(tmp, meta_dir));
  RETURN_IF_ERROR(fs->SyncDir(dir));
  RETURN_IF_ERROR(QuarantineSkipped(fs, options, installed));
  GS_LOG(INFO) << "catalog of " << dir << " rebuilt: " << report.rebuilt.size()
               << " checkpoints, " << report.skipped.size() << " skipped";
  return report;
}

}  // namespace storage
}  // namespace gradsnap
