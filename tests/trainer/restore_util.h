// Helpers for the restore, resharding and fallback end-to-end tests: read the rank files of a
// `gradsnap restore` directory back into flat buffers. (A stored byte is flipped with
// tests/testing/util.h's FlipSegmentBytes.)
#ifndef GRADSNAP_TESTS_TRAINER_RESTORE_UTIL_H_
#define GRADSNAP_TESTS_TRAINER_RESTORE_UTIL_H_

#include <cstdint>
#include <map>
#include <string>

#include "tests/testing/process.h"

namespace gradsnap {
namespace testing {

// The logical state in a directory of rank files rank0..rank<n-1>.safetensors: each flat
// buffer ("params", "adam_m", "adam_v") put together from its slices (by the "slice.<tensor>"
// metadata), and rank 0's "replicated_state" text under that name. Empty map on a bad file.
std::map<std::string, std::string> ReadRankDir(const std::string& dir, int n);

// gradsnap-train with the job flags the restore and fallback tests share (tiny model, batch 12,
// seed 5, two ranks) and `args`.
RunResult TrainTwoRanks(const std::string& args);

// The string `key` of a safetensors file's "__metadata__"; empty where the file, its header or
// the key is missing.
std::string SafetensorsMetadata(const std::string& path, const std::string& key);

// "key=value" lines of a train state text without the world_size line (it changes on a reshard).
std::string WithoutWorldSize(const std::string& state);

}  // namespace testing
}  // namespace gradsnap

#endif  // GRADSNAP_TESTS_TRAINER_RESTORE_UTIL_H_
