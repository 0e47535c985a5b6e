#include "recovery/restore_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>
#include <algorithm>
#include <filesystem>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/safetensors.h"
#include "common/json.h"
#include "common/rank_slice.h"
#include "common/sha256.h"
#include "common/status.h"
#include "gpu_snapshot/adamw.h"
#include "recovery/layout.h"
#include "recovery/state_source.h"
#include "recovery/state_text.h"
#include "storage/file_system.h"

namespace gradsnap {
namespace recovery {
namespace {


absl::Status WriteAll(int fd, const void* data, uint64_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<uint64_t>(n, 1u << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      return PosixError(absl::StrCat("write ", path), errno);
    }
    p += w;
    n -= static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

StagedFiles::~StagedFiles() {
  for (const auto& [tmp, path] : files_) ::unlink(tmp.c_str());
}

void StagedFiles::Add(std::string tmp, std::string path) {
  files_.emplace_back(std::move(tmp), std::move(path));
}

absl::Status StagedFiles::Commit() {
  for (const auto& [tmp, path] : files_) RETURN_IF_ERROR(client::CheckOutputFile(path));
  // An interrupt (the CLI's SIGINT) waits for the renames to end: the set is never cut in two.
  storage::TempRenameSection renaming;
  absl::Status st;
  size_t done = 0;
  for (; done < files_.size() && st.ok(); ++done) {
    const auto& [tmp, path] = files_[done];
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      st = PosixError(absl::StrCat("rename onto ", path), errno);
      ::unlink(tmp.c_str());
    }
  }
  files_.erase(files_.begin(), files_.begin() + static_cast<ptrdiff_t>(done));
  return st;  // the rest: removed by the destructor
}

absl::Status StageFile(const std::string& path,
                       const std::vector<std::pair<const void*, uint64_t>>& parts,
                       StagedFiles* staged) {
  // This call's own temporary name (storage::UniqueTempPath), created exclusively.
  const std::string tmp = storage::UniqueTempPath(path);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return PosixError(absl::StrCat("open ", tmp), errno);
  absl::Status st;
  for (const auto& [p, n] : parts) {
    if (st.ok()) st = WriteAll(fd, p, n, tmp);
  }
  if (st.ok() && ::fdatasync(fd) != 0) st = PosixError(absl::StrCat("fdatasync ", tmp), errno);
  if (::close(fd) != 0 && st.ok()) st = PosixError(absl::StrCat("close ", tmp), errno);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  staged->Add(tmp, path);
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path,
                                 const std::vector<std::pair<const void*, uint64_t>>& parts) {
  StagedFiles staged;
  RETURN_IF_ERROR(StageFile(path, parts, &staged));
  return staged.Commit();
}

namespace {

// A float from the state text's "0x%08x" bit pattern, printed for JSON.
std::string FloatText(const std::map<std::string, std::string>& kv, const std::string& key) {
  auto it = kv.find(key);
  uint32_t u = 0;
  if (it == kv.end() || it->second.size() < 3 ||
      !absl::SimpleHexAtoi(absl::string_view(it->second).substr(2), &u)) {
    return "null";
  }
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return absl::StrFormat("%.9g", f);
}

std::string IntText(const std::map<std::string, std::string>& kv, const std::string& key) {
  auto it = kv.find(key);
  int64_t v;
  if (it == kv.end() || !absl::SimpleAtoi(it->second, &v)) return "null";
  return absl::StrCat(v);
}

std::string TrainerStateJson(const FullState& s, const std::map<std::string, std::string>& kv) {
  std::vector<std::string> config;
  for (const auto& [k, v] : kv) {
    if (k == kParamLayoutKey) continue;  // in model.safetensors already, and long
    config.push_back(absl::StrCat(JsonQuote(k), ":", JsonQuote(v)));
  }
  return absl::StrCat(
      "{\"format\":\"", kRestoreFormat, "\",\"job\":", JsonQuote(s.job), ",\"step\":", s.step,
      ",\"optimizer_step\":", IntText(kv, "opt_t"),
      ",\"skipped_steps\":", IntText(kv, "skipped_steps"),
      ",\"lr_schedule\":{\"max_lr\":", FloatText(kv, "max_lr"),
      ",\"min_lr\":", FloatText(kv, "min_lr"), ",\"warmup_steps\":", IntText(kv, "warmup_steps"),
      ",\"total_steps\":", IntText(kv, "total_steps"),
      "},\"loader\":{\"seed\":", IntText(kv, "loader_seed"),
      ",\"batch_index\":", IntText(kv, "loader_batch_index"),
      "},\"adamw\":{\"beta1\":", FloatText(kv, "beta1"), ",\"beta2\":", FloatText(kv, "beta2"),
      ",\"eps\":", FloatText(kv, "eps"), ",\"weight_decay\":", FloatText(kv, "weight_decay"),
      "},\"grad_clip\":", FloatText(kv, "grad_clip"), ",\"config\":{", absl::StrJoin(config, ","),
      "},\"train_state\":", JsonQuote(s.state), "}\n");
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, std::string>>& metadata,
                              const std::vector<SafetensorsTensor>& tensors) {
  StagedFiles staged;
  RETURN_IF_ERROR(StageSafetensors(path, metadata, tensors, &staged));
  return staged.Commit();
}

absl::Status StageSafetensors(const std::string& path,
                              const std::vector<std::pair<std::string, std::string>>& metadata,
                              const std::vector<SafetensorsTensor>& tensors, StagedFiles* staged) {
  std::vector<client::SafetensorsEntry> entries;
  for (const SafetensorsTensor& t : tensors) entries.push_back({t.name, t.dtype, t.shape, t.bytes});
  const std::string head = client::EncodeSafetensorsHeader(metadata, entries);
  std::vector<std::pair<const void*, uint64_t>> parts = {{head.data(), head.size()}};
  for (const SafetensorsTensor& t : tensors) parts.emplace_back(t.data, t.bytes);
  return StageFile(path, parts, staged);
}

std::string RankFilePath(const std::string& dir, int rank) {
  return absl::StrCat(dir, "/rank", rank, ".safetensors");
}

absl::StatusOr<std::vector<WrittenFile>> WriteRankFiles(
    const FullState& s, int world_size, const std::function<std::string(int)>& path_of,
    int only_rank) {
  const uint64_t total = s.master.size();
  const std::string state = SetStateField(s.state, "world_size", absl::StrCat(world_size));
  const std::string state_b64 = absl::Base64Escape(state);
  std::vector<WrittenFile> files;
  StagedFiles staged;
  for (int r = 0; r < world_size; ++r) {
    if (only_rank >= 0 && r != only_rank) continue;
    const auto [lo, hi] = SliceOfRank(total, r, world_size);
    const uint64_t bytes = (hi - lo) * sizeof(float);
    const float* bufs[3] = {s.master.data() + lo, s.m.data() + lo, s.v.data() + lo};
    const char* names[3] = {kFlatParams, kFlatAdamM, kFlatAdamV};
    std::vector<SafetensorsTensor> tensors;
    std::vector<std::pair<std::string, std::string>> meta = {
        {"format", "gradsnap-shard-v1"},
        {"job", s.job},
        {"step", absl::StrCat(s.step)},
        {"kind", "full"},
        {"base_step", "-1"},
        {"world_size", absl::StrCat(world_size)},
        {"rank", absl::StrCat(r)},
        {"checkpoint_metadata_b64", state_b64},
        {"shard_metadata_b64", state_b64}};
    for (int i = 0; i < 3; ++i) {
      tensors.push_back({names[i], DType::kF32, {static_cast<int64_t>(hi - lo)}, bufs[i], bytes});
      meta.push_back({absl::StrCat("sha256.", names[i]), Sha256Hex(bufs[i], bytes)});
      meta.push_back(
          {absl::StrCat("slice.", names[i]), absl::StrCat(names[i], ":", lo, ":", total)});
    }
    tensors.push_back({kReplicatedTensor,
                       DType::kU8,
                       {static_cast<int64_t>(state.size())},
                       state.data(),
                       state.size()});
    meta.push_back(
        {absl::StrCat("sha256.", kReplicatedTensor), Sha256Hex(state.data(), state.size())});
    const std::string path = path_of(r);
    RETURN_IF_ERROR(StageSafetensors(path, meta, tensors, &staged));
    files.push_back(WrittenFile{path, 3 * bytes + state.size(), r});
  }
  RETURN_IF_ERROR(staged.Commit());
  return files;
}

std::string ModelShardName(size_t i, size_t n) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, n);
}

namespace {

// The model's tensors in files of at most max_shard_bytes (0: no limit) in order, a tensor
// larger than that alone in its file; one group when the whole model fits.
std::vector<std::vector<SafetensorsTensor>> SplitModel(const std::vector<SafetensorsTensor>& model,
                                                       uint64_t model_bytes,
                                                       uint64_t max_shard_bytes) {
  if (max_shard_bytes == 0 || model_bytes <= max_shard_bytes) return {model};
  std::vector<std::vector<SafetensorsTensor>> groups(1);
  uint64_t bytes = 0;
  for (const SafetensorsTensor& t : model) {
    if (!groups.back().empty() && bytes + t.bytes > max_shard_bytes) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(t);
    bytes += t.bytes;
  }
  return groups;
}

// Removes model.safetensors, model.safetensors.index.json and model-*-of-*.safetensors files
// of `dir` that are not in `keep`.
absl::Status RemoveOtherModelFiles(const std::string& dir, const std::vector<std::string>& keep) {
  std::error_code ec;
  std::vector<std::string> stale;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool model_file =
        name == kModelFile || name == kModelIndexFile ||
        (absl::StartsWith(name, "model-") && absl::StrContains(name, "-of-") &&
         absl::EndsWith(name, ".safetensors"));
    if (model_file && std::find(keep.begin(), keep.end(), name) == keep.end() &&
        !(keep.size() > 1 && name == kModelIndexFile)) {
      stale.push_back(e.path().string());
    }
  }
  if (ec) return PosixError(absl::StrCat("list ", dir), ec.value());
  for (const std::string& p : stale) {
    if (!std::filesystem::remove(p, ec) && ec) return PosixError("remove " + p, ec.value());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<WrittenFile>> WriteConsolidated(const std::string& dir,
                                                           const FullState& s, DType dtype,
                                                           uint64_t max_shard_bytes) {
  ASSIGN_OR_RETURN(auto kv, ParseStateText(s.state));
  auto it = kv.find(std::string(kParamLayoutKey));
  if (it == kv.end()) {
    return absl::FailedPreconditionError(
        "this checkpoint carries no model layout (written by an older or another trainer): "
        "it cannot be consolidated by parameter name");
  }
  ASSIGN_OR_RETURN(std::vector<ParamEntry> layout, DecodeLayout(it->second));
  if (LayoutTotal(layout) != s.master.size()) {
    return absl::DataLossError(absl::StrCat("model layout covers ", LayoutTotal(layout),
                                            " elements, the state has ", s.master.size()));
  }
  std::vector<uint16_t> bf16;
  if (dtype == DType::kBF16) {
    bf16.resize(s.master.size());
    for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = FloatToBf16(s.master[i]);
  }
  const size_t es = DTypeSize(dtype);
  std::vector<SafetensorsTensor> model, opt;
  std::vector<std::pair<std::string, std::string>> opt_sha;
  for (const ParamEntry& e : layout) {
    const void* p = dtype == DType::kBF16 ? static_cast<const void*>(bf16.data() + e.offset)
                                          : static_cast<const void*>(s.master.data() + e.offset);
    model.push_back({e.name, dtype, e.shape, p, e.numel() * es});
    opt.push_back({e.name + ".exp_avg", DType::kF32, e.shape, s.m.data() + e.offset,
                   e.numel() * sizeof(float)});
    opt.push_back({e.name + ".exp_avg_sq", DType::kF32, e.shape, s.v.data() + e.offset,
                   e.numel() * sizeof(float)});
  }
  // Every tensor's SHA-256 in the metadata, as in rank files: --init-from checks them.
  for (const SafetensorsTensor& t : opt) {
    opt_sha.push_back({"sha256." + t.name, Sha256Hex(t.data, t.bytes)});
  }
  const std::vector<std::pair<std::string, std::string>> meta = {
      // "pt": transformers refuses a safetensors file whose format is not pt, tf, flax or mlx.
      {"format", "pt"}, {"gradsnap_format", "gradsnap-model-v1"}, {"job", s.job},
      {"step", absl::StrCat(s.step)}, {"dtype", DTypeName(dtype)}, {"train_state", s.state}};
  std::vector<WrittenFile> files;
  StagedFiles staged;
  const std::vector<std::vector<SafetensorsTensor>> groups =
      SplitModel(model, s.master.size() * es, max_shard_bytes);
  std::vector<std::string> names;  // the model files, in order
  std::vector<std::pair<std::string, std::string>> weight_map;
  for (size_t g = 0; g < groups.size(); ++g) {
    names.push_back(groups.size() == 1 ? std::string(kModelFile)
                                       : ModelShardName(g, groups.size()));
    std::vector<std::pair<std::string, std::string>> m = meta;
    uint64_t bytes = 0;
    for (const SafetensorsTensor& t : groups[g]) {
      m.push_back({"sha256." + t.name, Sha256Hex(t.data, t.bytes)});
      weight_map.push_back({t.name, names.back()});
      bytes += t.bytes;
    }
    RETURN_IF_ERROR(StageSafetensors(dir + "/" + names.back(), m, groups[g], &staged));
    files.push_back({dir + "/" + names.back(), bytes, -1});
  }
  if (groups.size() > 1) {
    // model.safetensors.index.json, as transformers reads a sharded checkpoint.
    std::vector<std::string> entries;
    for (const auto& [name, file] : weight_map) {
      entries.push_back(absl::StrCat("    ", JsonQuote(name), ": ", JsonQuote(file)));
    }
    const std::string index = absl::StrCat(
        "{\n  \"metadata\": {\"total_size\": ", s.master.size() * es, "},\n  \"weight_map\": {\n",
        absl::StrJoin(entries, ",\n"), "\n  }\n}\n");
    const std::string index_path = dir + "/" + kModelIndexFile;
    RETURN_IF_ERROR(StageFile(index_path, {{index.data(), index.size()}}, &staged));
    files.push_back({index_path, index.size(), -1});
  }
  const std::string opt_path = dir + "/optimizer.safetensors";
  std::vector<std::pair<std::string, std::string>> opt_meta = {
      {"format", "gradsnap-optimizer-v1"}, {"job", s.job}, {"step", absl::StrCat(s.step)}};
  opt_meta.insert(opt_meta.end(), opt_sha.begin(), opt_sha.end());
  RETURN_IF_ERROR(StageSafetensors(opt_path, opt_meta, opt, &staged));
  files.push_back({opt_path, 2 * s.master.size() * sizeof(float), -1});
  const std::string json = TrainerStateJson(s, kv);
  const std::string state_path = dir + "/trainer_state.json";
  RETURN_IF_ERROR(StageFile(state_path, {{json.data(), json.size()}}, &staged));
  files.push_back({state_path, json.size(), -1});
  RETURN_IF_ERROR(staged.Commit());
  // The other layout's files of an earlier restore into this directory would be found first
  // (transformers reads model.safetensors before the index): removed.
  RETURN_IF_ERROR(RemoveOtherModelFiles(dir, names));
  return files;
}

absl::Status WriteRestoreManifest(const std::string& dir, const FullState& s, int world_size,
                                  bool consolidated, const std::vector<WrittenFile>& files) {
  std::vector<std::string> fj;
  for (const WrittenFile& f : files) {
    const size_t slash = f.path.rfind('/');
    fj.push_back(absl::StrCat(
        "{\"file\":", JsonQuote(slash == std::string::npos ? f.path : f.path.substr(slash + 1)),
        f.rank >= 0 ? absl::StrCat(",\"rank\":", f.rank) : "", ",\"bytes\":", f.bytes, "}"));
  }
  const std::string json = absl::StrCat(
      "{\"format\":\"", kRestoreFormat, "\",\"job\":", JsonQuote(s.job), ",\"step\":", s.step,
      ",\"kind\":\"full\",\"world_size\":", world_size,
      ",\"consolidated\":", consolidated ? "true" : "false", ",\"elements\":", s.master.size(),
      ",\"recovery_point\":{\"full_step\":", s.source.full_step, ",\"delta_steps\":[",
      absl::StrJoin(s.source.delta_steps, ","), "]},\"files\":[", absl::StrJoin(fj, ","), "]}\n");
  return WriteFileAtomically(dir + "/manifest.json", {{json.data(), json.size()}});
}

}  // namespace recovery
}  // namespace gradsnap
