#include "trainer/data.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "common/small_file.h"
#include "common/status.h"

namespace gradsnap {
namespace trainer {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

absl::StatusOr<Corpus> LoadCorpus(const std::string& path, int seq_len) {
  Corpus c;
  if (path.empty()) {
    c.source = absl::StrCat("default:", kDefaultCorpusDir);
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(kDefaultCorpusDir, ec)) {
      if (e.is_regular_file(ec) && !e.is_symlink(ec)) files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) {
      return absl::NotFoundError(absl::StrCat("default corpus ", kDefaultCorpusDir,
                                              " is missing; pass --data FILE"));
    }
    for (const std::string& f : files) {
      RETURN_IF_ERROR(AppendFile(f, "data file", kMaxCorpusBytes, &c.tokens));
    }
  } else {
    c.source = path;
    RETURN_IF_ERROR(AppendFile(path, "data file", kMaxCorpusBytes, &c.tokens));
  }
  if (c.tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("data file ", c.source, " is empty"));
  }
  if (c.tokens.size() < static_cast<size_t>(seq_len) + 2) {
    return absl::InvalidArgumentError(absl::StrCat("data file ", c.source, " has ",
                                                   c.tokens.size(), " bytes; need at least ",
                                                   seq_len + 2, " for --seq ", seq_len));
  }
  c.fingerprint =
      absl::StrCat(c.tokens.size(), ":", Sha256Hex(c.tokens.data(), c.tokens.size()));
  return c;
}

DataLoader::DataLoader(const Corpus* corpus, int seq_len, int global_batch, int rank,
                       int world_size)
    : corpus_(corpus),
      seq_len_(seq_len),
      global_batch_(global_batch),
      rank_(rank),
      world_size_(world_size) {}

void DataLoader::Batch(const LoaderPosition& pos, int32_t* inputs, int32_t* targets) const {
  const int local = local_batch();
  const uint64_t span = corpus_->tokens.size() - static_cast<uint64_t>(seq_len_) - 1;
  for (int i = 0; i < local; ++i) {
    const uint64_t seq = static_cast<uint64_t>(rank_) * local + i;
    uint64_t h = SplitMix64(pos.seed ^ SplitMix64(static_cast<uint64_t>(pos.batch_index)));
    h = SplitMix64(h ^ seq);
    const uint8_t* src = corpus_->tokens.data() + (h % span);
    for (int t = 0; t < seq_len_; ++t) {
      inputs[i * seq_len_ + t] = src[t];
      targets[i * seq_len_ + t] = src[t + 1];
    }
  }
}

}  // namespace trainer
}  // namespace gradsnap
