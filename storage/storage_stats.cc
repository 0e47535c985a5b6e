#include "storage/storage_stats.h"

#include <string>

namespace gradsnap {
namespace storage {

StorageStats& StorageStats::Get() {
  static StorageStats* s = [] {
    Registry* r = Registry::Global();
    auto* st = new StorageStats;
    // One row per counter: the field, its name (gradsnap_storage_<name>_total) and help.
    using S = StorageStats;
    const struct {
      Counter* S::*field;
      const char* name;
      const char* help;
    } kCounters[] = {
        {&S::raw_bytes_written, "raw_bytes_written", "Payload bytes appended to shard writers"},
        {&S::stored_bytes_written, "stored_bytes_written", "Chunk record bytes made durable"},
        {&S::chunks_written, "chunks_written", "Chunk records made durable"},
        {&S::chunks_compressed, "chunks_compressed", "Chunk records stored zstd-compressed"},
        {&S::fixed_buffer_writes, "fixed_buffer_writes",
         "Segment writes from registered (fixed) io_uring buffers"},
        {&S::raw_bytes_read, "raw_bytes_read", "Payload bytes returned by shard readers"},
        {&S::quarantined, "quarantined",
         "Segment files or directories the catalog does not know, moved to quarantine/"},
        {&S::quarantine_purged, "quarantine_purged",
         "Quarantine entries removed after the grace period"},
        {&S::data_loss, "data_loss", "Checksum, format or SHA-256 failures found by readers"},
    };
    for (const auto& c : kCounters) {
      st->*c.field = r->GetCounter(std::string("gradsnap_storage_") + c.name + "_total", c.help);
    }
    st->commit_seconds = r->GetHistogram("gradsnap_storage_commit_seconds",
                                         "Shard Flush/Finish: data sync plus metadata batch");
    return st;
  }();
  return *s;
}

}  // namespace storage
}  // namespace gradsnap
