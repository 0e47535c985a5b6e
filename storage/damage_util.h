// Test and drill support: damages a store's catalog the way a bad disk would, so the catalog
// guard and the rebuild (docs/format.md, "Catalog guard") can be exercised. Header-only, no
// test framework, so the fault drill (benchmarks/fault_drill) uses it too.
#ifndef GRADSNAP_STORAGE_DAMAGE_UTIL_H_
#define GRADSNAP_STORAGE_DAMAGE_UTIL_H_

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

namespace gradsnap {
namespace storage {

// Overwrites 64 bytes of every 512 in each RocksDB table file (*.sst) of `meta_dir` with junk.
// Returns how many files it damaged (0 when the catalog has no SST yet).
inline int CorruptSstFiles(const std::string& meta_dir) {
  namespace fs = std::filesystem;
  int corrupted = 0;
  for (const auto& e : fs::directory_iterator(meta_dir)) {
    if (e.path().extension() != ".sst") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    const std::string junk(64, '\x5a');
    for (uint64_t off = 0; off + 64 < fs::file_size(e.path()); off += 512) {
      f.seekp(static_cast<std::streamoff>(off));
      f.write(junk.data(), 64);
    }
    ++corrupted;
  }
  return corrupted;
}

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_DAMAGE_UTIL_H_
