// Training data: a byte-level corpus and the deterministic loader.
//
// The vocabulary is the 256 byte values, so "tokenizing" a text file is reading its bytes; no
// tokenizer files are needed. Without --data the trainer uses the default corpus: the license
// texts that Debian's base-files package installs in /usr/share/common-licenses (every regular
// file there, in name order, concatenated; ~250 KB on Debian 12), present on every Debian system.
//
// The loader draws batch number i (0-based) of the global batch from a hash of (seed, i): the
// global batch is the same for every world size, and rank r of P takes sequences
// [r*B/P, (r+1)*B/P) of it. The loader's whole state is LoaderPosition (train_state.h).
//
// Thread safety: Corpus is immutable after loading; DataLoader is const and thread-safe.
#ifndef GRADSNAP_TRAINER_DATA_H_
#define GRADSNAP_TRAINER_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/train_state.h"

namespace gradsnap {
namespace trainer {

inline constexpr const char* kDefaultCorpusDir = "/usr/share/common-licenses";

struct Corpus {
  std::string source;           // the file, or "default:/usr/share/common-licenses"
  std::vector<uint8_t> tokens;  // one token per byte
  std::string fingerprint;      // "<bytes>:<sha256 hex>"
};

// The largest corpus loaded: it is held in memory by every rank. 4 GiB.
inline constexpr uint64_t kMaxCorpusBytes = 4ull << 30;

// Reads `path` (empty: the default corpus). NOT_FOUND for a missing file, INVALID_ARGUMENT for
// an empty one, one too short for a sequence of `seq_len` + 1 tokens, one that is not a regular
// file (a device, FIFO...) or larger than kMaxCorpusBytes.

absl::StatusOr<Corpus> LoadCorpus(const std::string& path, int seq_len);

class DataLoader {
 public:
  DataLoader(const Corpus* corpus, int seq_len, int global_batch, int rank, int world_size);
  // Fills inputs and targets, (global_batch / world_size, seq_len) each, with this rank's part
  // of global batch `pos.batch_index`.
  void Batch(const LoaderPosition& pos, int32_t* inputs, int32_t* targets) const;
  int local_batch() const { return global_batch_ / world_size_; }

 private:
  const Corpus* corpus_;
  int seq_len_, global_batch_, rank_, world_size_;
};

// SplitMix64: the one hash behind data order and parameter initialization.
uint64_t SplitMix64(uint64_t x);

}  // namespace trainer
}  // namespace gradsnap

#endif  // GRADSNAP_TRAINER_DATA_H_
