#include "client/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/direct_file_writer.h"
#include "common/digest.h"
#include "common/json.h"
#include "common/status.h"

namespace gradsnap {
namespace client {
namespace {

const char* KindName(CheckpointKind k) { return k == CheckpointKind::kDelta ? "delta" : "full"; }

// Header, then the payload as it is restored, written by background threads (DirectFileWriter)
// while the next bytes are restored: on a disk through O_DIRECT staging buffers (each decoded
// chunk copied once, as the reader holds it); where the file takes any alignment (tmpfs, the
// page cache) the restored chunks themselves are lent to the writer threads, uncopied. A piece
// without a hold (the remote client's) or a file that needs alignment: AppendLent copies.
absl::Status StreamShard(Client& client, const Manifest& m, const ShardInfo& shard,
                         const std::string& header, DirectFileWriter* out,
                         const ProgressFn& progress) {
  RETURN_IF_ERROR(out->Append(header.data(), header.size()));
  uint64_t written = 0;
  auto count = [&](size_t n) -> absl::Status {
    written += n;
    if (written <= shard.raw_bytes) return absl::OkStatus();
    return absl::DataLossError(absl::StrCat("rank ", shard.rank, ": more payload than the ",
                                            shard.raw_bytes, " bytes in the manifest"));
  };
  RETURN_IF_ERROR(client.RestoreShardLent(
      m.info.job, m.info.step, shard.rank,
      [&](const void* data, size_t n, std::shared_ptr<const void> hold) -> absl::Status {
        RETURN_IF_ERROR(count(n));
        return out->AppendLent(data, n, std::move(hold));
      },
      progress));
  if (written != shard.raw_bytes) {
    return absl::DataLossError(absl::StrCat("rank ", shard.rank, ": payload has ", written,
                                            " bytes, manifest says ", shard.raw_bytes));
  }
  return out->Finish();
}

}  // namespace

std::string EncodeSafetensorsHeader(
    const std::vector<std::pair<std::string, std::string>>& metadata,
    const std::vector<SafetensorsEntry>& tensors) {
  std::string json = "{\"__metadata__\":{";
  for (size_t i = 0; i < metadata.size(); ++i) {
    absl::StrAppend(&json, i == 0 ? "" : ",", JsonQuote(metadata[i].first), ":",
                    JsonQuote(metadata[i].second));
  }
  json.push_back('}');
  uint64_t offset = 0;
  for (const SafetensorsEntry& t : tensors) {
    absl::StrAppend(&json, ",", JsonQuote(t.name), ":{\"dtype\":\"", DTypeSafetensorsName(t.dtype),
                    "\",\"shape\":[", absl::StrJoin(t.shape, ","), "],\"data_offsets\":[", offset,
                    ",", offset + t.bytes, "]}");
    offset += t.bytes;
  }
  json.push_back('}');
  // Pad with spaces so the payload starts 8-byte aligned, as the reference implementation does.
  while ((json.size() % 8) != 0) json.push_back(' ');
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += json;
  return out;
}

absl::StatusOr<uint64_t> SafetensorsHeaderLength(absl::string_view file_start,
                                                 uint64_t file_bytes, const std::string& what) {
  if (file_bytes < 8 || file_start.size() < 8) {
    return absl::DataLossError(absl::StrCat(what, ": not a safetensors file"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file_start[i]);
  if (n > kMaxSafetensorsHeaderBytes || n > file_bytes - 8) {
    return absl::DataLossError(absl::StrCat(what, ": bad safetensors header length ", n));
  }
  return n;
}

absl::StatusOr<SafetensorsHeaderInfo> ParseSafetensorsHeader(absl::string_view json,
                                                             uint64_t file_bytes,
                                                             const std::string& what) {
  SafetensorsHeaderInfo h;
  h.data_start = 8 + json.size();
  if (h.data_start > file_bytes) {
    return absl::DataLossError(absl::StrCat(what, ": bad safetensors header length ", json.size()));
  }
  ASSIGN_OR_RETURN(JsonValue root, ParseJson(json, what));
  if (root.type != JsonValue::Type::kObject) {
    return absl::DataLossError(absl::StrCat(what, ": header is not an object"));
  }
  const uint64_t data_bytes = file_bytes - h.data_start;
  for (const auto& [name, v] : root.object) {
    if (name == "__metadata__") {
      for (const auto& [k, mv] : v.object) h.metadata[k] = mv.text;
      continue;
    }
    SafetensorsHeaderInfo::Tensor t;
    const JsonValue* dt = v.Find("dtype");
    const JsonValue* shape = v.Find("shape");
    const JsonValue* offs = v.Find("data_offsets");
    bool ok = dt != nullptr && shape != nullptr && offs != nullptr && offs->array.size() == 2 &&
              offs->array[0].AsUint(&t.begin) && offs->array[1].AsUint(&t.end) &&
              t.begin <= t.end && t.end <= data_bytes;
    for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kF64, DType::kI32, DType::kI64,
                    DType::kU8}) {
      if (ok && dt->text == DTypeSafetensorsName(d)) t.dtype = d;
    }
    if (ok) {
      for (const JsonValue& d : shape->array) {
        int64_t x;
        ok = ok && d.AsInt(&x) && x >= 0;
        t.shape.push_back(x);
      }
    }
    if (!ok || t.dtype == DType::kUnknown) {
      return absl::DataLossError(absl::StrCat(what, ": bad entry for tensor ", name));
    }
    h.tensors[name] = std::move(t);
  }
  return h;
}

absl::StatusOr<SafetensorsHeaderInfo> ParseSafetensors(absl::string_view file,
                                                       const std::string& what) {
  ASSIGN_OR_RETURN(const uint64_t n, SafetensorsHeaderLength(file, file.size(), what));
  return ParseSafetensorsHeader(file.substr(8, n), file.size(), what);
}

absl::StatusOr<std::string> SafetensorsHeader(const CheckpointInfo& ckpt, const ShardInfo& shard) {
  std::vector<SafetensorsEntry> entries;
  std::vector<std::pair<std::string, std::string>> meta = {
      {"format", "gradsnap-shard-v1"},
      {"job", ckpt.job},
      {"step", absl::StrCat(ckpt.step)},
      {"kind", KindName(ckpt.kind)},
      {"base_step", absl::StrCat(ckpt.base_step)},
      {"world_size", absl::StrCat(ckpt.world_size)},
      {"rank", absl::StrCat(shard.rank)},
      {"checkpoint_metadata_b64", absl::Base64Escape(ckpt.metadata)},
      {"shard_metadata_b64", absl::Base64Escape(shard.metadata)}};
  uint64_t offset = 0;
  for (const storage::TensorInfo& t : shard.tensors) {
    const TensorSpec& s = t.spec;
    if (DTypeSize(s.dtype) == 0) {
      return absl::DataLossError(absl::StrCat("tensor ", s.name, " has an unknown dtype"));
    }
    if (s.name == "__metadata__") {
      return absl::InvalidArgumentError("a tensor named __metadata__ cannot be exported");
    }
    entries.push_back({s.name, s.dtype, s.shape, s.byte_length});
    offset += s.byte_length;
    if (!s.sha256.empty()) meta.push_back({"sha256." + s.name, s.sha256});
    if (t.digest_algo != DigestAlgo::kSha256) {
      meta.push_back({absl::StrCat(DigestAlgoName(t.digest_algo), ".", s.name), t.digest});
    }
    if (!s.flat_name.empty()) {
      meta.push_back({"slice." + s.name,
                      absl::StrCat(s.flat_name, ":", s.flat_offset, ":", s.flat_total)});
    }
  }
  if (offset != shard.raw_bytes) {
    return absl::DataLossError(absl::StrCat("rank ", shard.rank, ": tensors sum to ", offset,
                                            " bytes, manifest says ", shard.raw_bytes));
  }
  return EncodeSafetensorsHeader(meta, entries);
}

std::string RankFileName(const std::string& file, int32_t rank, int32_t world_size) {
  if (world_size <= 1) return file;
  size_t slash = file.rfind('/');
  size_t dot = file.rfind('.');
  bool has_ext = dot != std::string::npos && dot > 0 &&
                 (slash == std::string::npos || dot > slash + 1);
  if (!has_ext) return absl::StrCat(file, ".rank", rank);
  return absl::StrCat(file.substr(0, dot), ".rank", rank, file.substr(dot));
}

absl::Status CheckOutputFile(const std::string& path) {
  const size_t slash = path.rfind('/');
  const std::string last = slash == std::string::npos ? path : path.substr(slash + 1);
  if (last.empty() || last == "." || last == "..") {
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' names a directory, not a file"));
  }
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return absl::OkStatus();  // a new name (or none to see)
  if (S_ISLNK(st.st_mode)) {
    // The link itself is replaced, never its target; one to a directory is refused as that.
    if (::stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return absl::OkStatus();
  }
  if (S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is a directory, not a file"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is a device, FIFO or socket, not a regular file: it would be replaced"));
  }
  return absl::OkStatus();
}

absl::Status ExportShardSafetensors(Client& client, const Manifest& m, int32_t rank,
                                    const std::string& path, const ProgressFn& progress,
                                    std::string* staged) {
  const ShardInfo* shard = nullptr;
  for (const ShardInfo& s : m.shards) {
    if (s.rank == rank) shard = &s;
  }
  if (shard == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("job ", m.info.job, " step ", m.info.step, " has no rank ", rank));
  }
  ASSIGN_OR_RETURN(std::string header, SafetensorsHeader(m.info, *shard));
  RETURN_IF_ERROR(CheckOutputFile(path));
  // A temporary name of this export's own (exclusive: never another export's file, nor a
  // symlink's target), renamed over `path` once complete: two exports to one path each leave
  // a whole file, the later one's.
  const std::string tmp = storage::UniqueTempPath(path);
  // The file's length is known: its space is allocated up front (see DirectFileWriter).
  auto out = DirectFileWriter::Create(tmp, storage::FileSystem::Default(),
                                      header.size() + shard->raw_bytes, /*exclusive=*/true);
  if (!out.ok()) {
    // Created, then no room for it; a name already taken is not this export's to remove.
    if (!absl::IsAlreadyExists(out.status())) ::unlink(tmp.c_str());
    return out.status();
  }
  absl::Status st = StreamShard(client, m, *shard, header, out->get(), progress);
  out->reset();
  if (st.ok() && staged != nullptr) {
    *staged = tmp;
    return st;
  }
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = PosixError(absl::StrCat("rename ", tmp, " to ", path), errno);
  }
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

}  // namespace client
}  // namespace gradsnap
