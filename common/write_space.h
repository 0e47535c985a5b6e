// WriteSpaceState: whether a checkpoint store takes writes, for health reports. A store below
// its catalog's free-space reserve refuses writes with RESOURCE_EXHAUSTED while it still serves
// reads, rm and gc (docs/format.md, "Full disks"); the engine reports it
// (storage::Engine::WriteSpace), the server in its ready line, Health and metrics, the CLI in
// `gradsnap health`, all with the one note below.
#ifndef GRADSNAP_COMMON_WRITE_SPACE_H_
#define GRADSNAP_COMMON_WRITE_SPACE_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace gradsnap {

struct WriteSpaceState {
  bool writes_refused = false;  // below the catalog's reserve: writes are RESOURCE_EXHAUSTED
  uint64_t free_bytes = 0;      // free now on the data directory's file system
  uint64_t reserve_bytes = 0;   // EngineOptions::catalog_reserve_bytes
  // Only a restart takes writes again: the store opened with less free than a delete needs,
  // so its catalog is read-only (rm and gc are refused too).
  bool restart_needed = false;

  // "writes refused: F bytes free, below the catalog's reserve of R bytes; ..." ("" when
  // writes are taken).
  std::string Note() const {
    if (!writes_refused) return "";
    return absl::StrCat("writes refused: ", free_bytes, " bytes free, below the catalog's "
                        "reserve of ", reserve_bytes, " bytes; ",
                        restart_needed ? "reads are served, restart once space is freed"
                                       : "reads, rm and gc are served until space is back");
  }
};

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_WRITE_SPACE_H_
