// A restore directory as a StateSource (state_source.h, restore_dir.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/safetensors.h"
#include "common/json.h"
#include "common/sha256.h"
#include "common/small_file.h"
#include "common/status.h"
#include "recovery/layout.h"
#include "recovery/restore_dir.h"
#include "recovery/state_source.h"
#include "recovery/state_text.h"

namespace gradsnap {
namespace recovery {
namespace {

constexpr uint64_t kMaxSmallFile = 16u << 20;

using StTensor = client::SafetensorsHeaderInfo::Tensor;

// One opened safetensors file.
struct StFile {
  std::string path;
  int fd = -1;
  uint64_t data_start = 0;
  std::map<std::string, StTensor> tensors;
  std::map<std::string, std::string> meta;  // "__metadata__"
  ~StFile() {
    if (fd >= 0) ::close(fd);
  }
};

absl::Status PreadAll(int fd, uint64_t offset, void* out, uint64_t n, const std::string& path) {
  char* p = static_cast<char*>(out);
  while (n > 0) {
    ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return PosixError(absl::StrCat("read ", path), errno);
    if (r == 0) return absl::DataLossError(absl::StrCat(path, ": shorter than its header says"));
    p += r;
    n -= static_cast<uint64_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<StFile>> OpenSafetensors(const std::string& path) {
  auto f = std::make_unique<StFile>();
  f->path = path;
  f->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd < 0) return PosixError(absl::StrCat("open ", path), errno);
  struct stat st;
  if (::fstat(f->fd, &st) != 0) return PosixError(absl::StrCat("stat ", path), errno);
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::string start(std::min<uint64_t>(size, 8), '\0');
  RETURN_IF_ERROR(PreadAll(f->fd, 0, start.data(), start.size(), path));
  ASSIGN_OR_RETURN(const uint64_t n, client::SafetensorsHeaderLength(start, size, path));
  std::string header(n, '\0');
  RETURN_IF_ERROR(PreadAll(f->fd, 8, header.data(), n, path));
  ASSIGN_OR_RETURN(client::SafetensorsHeaderInfo h,
                   client::ParseSafetensorsHeader(header, size, path));
  f->data_start = h.data_start;
  f->tensors = std::move(h.tensors);
  f->meta = std::move(h.metadata);
  return f;
}

// Checks tensor `name` of `f` against the "sha256.<name>" in its metadata (gradsnap writes one
// for every tensor): a restore directory damaged after it was written is DATA_LOSS, never
// training state. A tensor without a digest passes.
absl::Status VerifyTensor(const StFile& f, const std::string& name, const StTensor& t) {
  auto want = f.meta.find("sha256." + name);
  if (want == f.meta.end()) return absl::OkStatus();
  std::vector<char> buf(std::min<uint64_t>(8u << 20, std::max<uint64_t>(t.end - t.begin, 1)));
  Sha256 sha;
  for (uint64_t off = t.begin; off < t.end;) {
    const uint64_t n = std::min<uint64_t>(buf.size(), t.end - off);
    RETURN_IF_ERROR(PreadAll(f.fd, f.data_start + off, buf.data(), n, f.path));
    sha.Update(buf.data(), n);
    off += n;
  }
  if (DigestToHex(sha.Finish()) != want->second) {
    return absl::DataLossError(
        absl::StrCat(f.path, ": tensor ", name, " does not match its SHA-256"));
  }
  return absl::OkStatus();
}

absl::Status VerifyTensors(const StFile& f) {
  for (const auto& [name, t] : f.tensors) RETURN_IF_ERROR(VerifyTensor(f, name, t));
  return absl::OkStatus();
}

class DirSource : public StateSource {
 public:
  DirSource(std::string dir, bool verify_all) : dir_(std::move(dir)), verify_all_(verify_all) {}

  absl::Status Open() {
    struct stat st;
    if (::stat(dir_.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return absl::NotFoundError(absl::StrCat("no restore directory ", dir_));
    }
    absl::StatusOr<std::string> manifest = ReadSmallFile(dir_ + "/manifest.json", "restore manifest", kMaxSmallFile);
    if (!manifest.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir_,
          " is not a complete restore output (no readable manifest.json; was the restore "
          "interrupted?)"));
    }
    ASSIGN_OR_RETURN(JsonValue m, ParseJson(*manifest, dir_ + "/manifest.json"));
    const JsonValue* kind = m.Find("kind");
    const JsonValue* ws = m.Find("world_size");
    const JsonValue* cons = m.Find("consolidated");
    int64_t world = 0;
    if (kind == nullptr || ws == nullptr || !ws->AsInt(&world) || world < 1 || world > 65536) {
      return absl::DataLossError(absl::StrCat(dir_, "/manifest.json: no kind or world_size"));
    }
    if (kind->text != "full") {
      return absl::FailedPreconditionError(absl::StrCat(
          dir_, " holds a raw ", kind->text,
          " record (restored with --no-replay); restore without it to get a resumable state"));
    }
    view_.info.kind = storage::CheckpointKind::kFull;
    view_.info.state = storage::CheckpointState::kCommitted;
    RETURN_IF_ERROR(ReadManifestIdentity(m, static_cast<int>(world)));
    if (cons != nullptr && cons->boolean) return OpenConsolidated();
    return OpenRankFiles(static_cast<int>(world));
  }

  absl::StatusOr<std::vector<storage::CheckpointInfo>> List() override {
    return std::vector<storage::CheckpointInfo>{view_.info};
  }
  absl::StatusOr<CheckpointView> Describe(int64_t step) override {
    if (step != view_.info.step) {
      return absl::NotFoundError(
          absl::StrCat(dir_, " holds step ", view_.info.step, ", not ", step));
    }
    return view_;
  }
  absl::Status Read(int64_t step, int32_t rank, const std::string& tensor, uint64_t offset,
                    uint64_t length, void* out) override {
    if (step != view_.info.step || rank < 0 || rank >= static_cast<int32_t>(files_.size())) {
      return absl::NotFoundError(absl::StrCat(dir_, ": no file for rank ", rank));
    }
    const StFile& f = *files_[rank];
    auto it = f.tensors.find(tensor);
    if (it == f.tensors.end()) {
      return absl::NotFoundError(absl::StrCat(f.path, ": no tensor ", tensor));
    }
    if (offset > it->second.end - it->second.begin ||
        length > it->second.end - it->second.begin - offset) {
      return absl::OutOfRangeError(absl::StrCat(f.path, ": bytes past the end of ", tensor));
    }
    RETURN_IF_ERROR(VerifyOnce(rank, tensor, f, it->second));
    return PreadAll(f.fd, f.data_start + it->second.begin + offset, out, length, f.path);
  }
  std::string Name() const override { return absl::StrCat("directory ", dir_); }

 private:
  // The first read of a tensor checks the whole tensor's digest (verify_all_ did it already).
  absl::Status VerifyOnce(int32_t rank, const std::string& tensor, const StFile& f,
                          const StTensor& t) {
    if (verify_all_) return absl::OkStatus();
    {
      absl::MutexLock lock(&mu_);
      if (verified_.count({rank, tensor}) != 0) return absl::OkStatus();
    }
    RETURN_IF_ERROR(VerifyTensor(f, tensor, t));  // two threads may both check: harmless
    absl::MutexLock lock(&mu_);
    verified_.insert({rank, tensor});
    return absl::OkStatus();
  }

  absl::Status SetState(const std::string& text) {
    ASSIGN_OR_RETURN(auto kv, ParseStateText(text));
    ASSIGN_OR_RETURN(view_.info.step, StateInt(kv, "step"));
    ASSIGN_OR_RETURN(int64_t ws, StateInt(kv, "world_size"));
    view_.info.world_size = static_cast<int32_t>(ws);
    view_.info.metadata = text;
    view_.info.job = dir_;
    return absl::OkStatus();
  }

  // The checkpoint manifest.json vouches for (job, step) and the ranks it lists: a restore's
  // "files" (rank files with their rank), a raw restore's "shards". Files of a directory that
  // two restores wrote into (another step, or --rank of another one) must not be read as one
  // state: each file's own job and step are checked against these (CheckIdentity).
  absl::Status ReadManifestIdentity(const JsonValue& m, int world) {
    const JsonValue* job = m.Find("job");
    const JsonValue* step = m.Find("step");
    if (job == nullptr || job->type != JsonValue::Type::kString || step == nullptr ||
        !step->AsInt(&manifest_step_)) {
      return absl::DataLossError(absl::StrCat(dir_, "/manifest.json: no job or step"));
    }
    manifest_job_ = job->text;
    const JsonValue* files = m.Find("files");
    if (files == nullptr) files = m.Find("shards");
    for (const JsonValue& f : files != nullptr ? files->array : std::vector<JsonValue>()) {
      int64_t r = -1;
      const JsonValue* rank = f.Find("rank");
      if (rank != nullptr && rank->AsInt(&r) && r >= 0 && r < world) listed_.insert(r);
    }
    return absl::OkStatus();
  }

  // `f` (rank `rank`, or -1 for a consolidated file) belongs to the manifest's checkpoint.
  absl::Status CheckIdentity(const StFile& f, int rank, int world) {
    if (rank >= 0 && listed_.count(rank) == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir_, "/manifest.json (job ", manifest_job_, " step ", manifest_step_,
          ") does not list rank ", rank, " (written by a restore with --rank?): restore every "
          "rank of one step into an empty directory to resume from it"));
    }
    auto field = [&](const char* k) {
      auto it = f.meta.find(k);
      return it == f.meta.end() ? std::string() : it->second;
    };
    std::string want_world = rank >= 0 ? absl::StrCat(world) : field("world_size");
    if (field("job") != manifest_job_ || field("step") != absl::StrCat(manifest_step_) ||
        field("world_size") != want_world) {
      return absl::FailedPreconditionError(absl::StrCat(
          f.path, " is job '", field("job"), "' step ", field("step"), " of world size ",
          field("world_size"), ", but ", dir_, "/manifest.json says job '", manifest_job_,
          "' step ", manifest_step_,
          rank >= 0 ? absl::StrCat(" of world size ", world) : std::string(),
          " (two restores into one directory?): restore again into an empty directory"));
    }
    return absl::OkStatus();
  }

  absl::Status OpenRankFiles(int world) {
    for (int r = 0; r < world; ++r) {
      ASSIGN_OR_RETURN(std::unique_ptr<StFile> f,
                       OpenSafetensors(absl::StrCat(dir_, "/rank", r, ".safetensors")));
      RETURN_IF_ERROR(CheckIdentity(*f, r, world));
      if (verify_all_) RETURN_IF_ERROR(VerifyTensors(*f));
      if (f->meta["kind"] != "full") {
        return absl::FailedPreconditionError(
            absl::StrCat(f->path, " is not a FULL shard (kind '", f->meta["kind"], "')"));
      }
      for (const auto& [name, t] : f->tensors) {
        storage::TensorSpec spec;
        spec.name = name;
        spec.dtype = t.dtype;
        spec.byte_length = t.end - t.begin;
        view_.tensors[r][name] = spec;
        auto sl = f->meta.find("slice." + name);
        if (sl == f->meta.end()) continue;
        std::vector<std::string> parts = absl::StrSplit(sl->second, ':');
        FlatPiece p;
        uint64_t total = 0;
        if (parts.size() != 3 || !absl::SimpleAtoi(parts[1], &p.flat_offset) ||
            !absl::SimpleAtoi(parts[2], &total)) {
          return absl::DataLossError(absl::StrCat(f->path, ": bad slice of ", name));
        }
        p.rank = r;
        p.tensor = name;
        p.dtype = t.dtype;
        p.count = spec.byte_length / DTypeSize(t.dtype);
        FlatBuffer& fb = view_.flats[parts[0]];
        if (fb.total != 0 && fb.total != total) {
          return absl::DataLossError(absl::StrCat(f->path, ": ", parts[0], " has two lengths"));
        }
        fb.total = total;
        fb.pieces.push_back(p);
      }
      files_.push_back(std::move(f));
    }
    for (auto& [name, fb] : view_.flats) {
      std::sort(fb.pieces.begin(), fb.pieces.end(), [](const FlatPiece& a, const FlatPiece& b) {
        return a.flat_offset < b.flat_offset;
      });
    }
    // The train state: rank 0's replicated_state tensor.
    auto it = files_[0]->tensors.find(kReplicatedTensor);
    if (it == files_[0]->tensors.end() || it->second.end - it->second.begin > kMaxSmallFile) {
      return absl::FailedPreconditionError(
          absl::StrCat(files_[0]->path, " has no train state (not a gradsnap-train checkpoint)"));
    }
    RETURN_IF_ERROR(VerifyTensor(*files_[0], kReplicatedTensor, it->second));
    std::string text(it->second.end - it->second.begin, '\0');
    RETURN_IF_ERROR(PreadAll(files_[0]->fd, files_[0]->data_start + it->second.begin, text.data(),
                             text.size(), files_[0]->path));
    return SetState(text);
  }

  // The model files: model.safetensors, or those model.safetensors.index.json names.
  absl::StatusOr<std::vector<std::string>> ModelFiles() {
    const std::string index_path = dir_ + "/" + kModelIndexFile;
    struct stat st;
    if (::stat(index_path.c_str(), &st) != 0) return std::vector<std::string>{kModelFile};
    ASSIGN_OR_RETURN(std::string text, ReadSmallFile(index_path, "model index", kMaxSmallFile));
    ASSIGN_OR_RETURN(JsonValue index, ParseJson(text, index_path));
    const JsonValue* map = index.Find("weight_map");
    std::set<std::string> names;
    for (const auto& [tensor, file] : map != nullptr ? map->object
                                                     : std::map<std::string, JsonValue>()) {
      if (file.type != JsonValue::Type::kString || file.text.find('/') != std::string::npos) {
        return absl::DataLossError(absl::StrCat(index_path, ": bad file of ", tensor));
      }
      names.insert(file.text);
    }
    if (names.empty()) return absl::DataLossError(absl::StrCat(index_path, ": no weight_map"));
    return std::vector<std::string>(names.begin(), names.end());
  }

  absl::Status OpenConsolidated() {
    ASSIGN_OR_RETURN(std::vector<std::string> model_files, ModelFiles());
    for (const std::string& name : model_files) {
      ASSIGN_OR_RETURN(std::unique_ptr<StFile> f, OpenSafetensors(dir_ + "/" + name));
      files_.push_back(std::move(f));
    }
    ASSIGN_OR_RETURN(std::unique_ptr<StFile> opt, OpenSafetensors(dir_ + "/optimizer.safetensors"));
    files_.push_back(std::move(opt));
    for (const auto& f : files_) {
      RETURN_IF_ERROR(CheckIdentity(*f, -1, 0));
      if (verify_all_) RETURN_IF_ERROR(VerifyTensors(*f));
    }
    RETURN_IF_ERROR(SetState(files_[0]->meta["train_state"]));
    ASSIGN_OR_RETURN(auto kv, ParseStateText(view_.info.metadata));
    ASSIGN_OR_RETURN(std::vector<ParamEntry> layout,
                     DecodeLayout(kv[std::string(kParamLayoutKey)]));
    const uint64_t total = LayoutTotal(layout);
    const std::pair<const char*, const char*> flats[3] = {
        {kFlatParams, ""}, {kFlatAdamM, ".exp_avg"}, {kFlatAdamV, ".exp_avg_sq"}};
    const int32_t opt_file = static_cast<int32_t>(files_.size()) - 1;
    for (int i = 0; i < 3; ++i) {
      FlatBuffer& fb = view_.flats[flats[i].first];
      fb.total = total;
      for (const ParamEntry& e : layout) {
        const std::string name = e.name + flats[i].second;
        // The file holding it: the optimizer's, or the model file that has it.
        int32_t file = i == 0 ? -1 : opt_file;
        for (int32_t m = 0; i == 0 && m < opt_file && file < 0; ++m) {
          if (files_[m]->tensors.count(name) != 0) file = m;
        }
        auto it = file < 0 ? files_[0]->tensors.end() : files_[file]->tensors.find(name);
        if (file < 0 || it == files_[file]->tensors.end() ||
            it->second.end - it->second.begin != e.numel() * DTypeSize(it->second.dtype)) {
          return absl::DataLossError(absl::StrCat(
              dir_, ": tensor ", name, " is missing or of the wrong size in ",
              i == 0 ? "the model files" : "optimizer.safetensors"));
        }
        fb.pieces.push_back(FlatPiece{file, name, it->second.dtype, e.offset, e.numel(), 0});
      }
    }
    return absl::OkStatus();
  }

  const std::string dir_;
  const bool verify_all_;
  CheckpointView view_;
  // By rank (consolidated: the model files, then optimizer.safetensors).
  std::vector<std::unique_ptr<StFile>> files_;
  std::string manifest_job_;    // the job and step manifest.json names
  int64_t manifest_step_ = -1;
  std::set<int64_t> listed_;    // the ranks it lists
  absl::Mutex mu_;
  std::set<std::pair<int32_t, std::string>> verified_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<StateSource>> OpenDirSource(const std::string& dir,
                                                           bool verify_all) {
  auto s = std::make_unique<DirSource>(dir, verify_all);
  RETURN_IF_ERROR(s->Open());
  return std::unique_ptr<StateSource>(std::move(s));
}

}  // namespace recovery
}  // namespace gradsnap
