#include "storage/storage_stats.h"

namespace gradsnap {
namespace storage {

StorageStats& StorageStats::Get() {
  static StorageStats* s = [] {
    Registry* r = Registry::Global();
    auto* st = new StorageStats;
    st->raw_bytes_written = r->GetCounter("gradsnap_storage_raw_bytes_written_total",
                                          "Payload bytes appended to shard writers");
    st->stored_bytes_written = r->GetCounter("gradsnap_storage_stored_bytes_written_total",
                                             "Chunk record bytes made durable");
    st->chunks_written = r->GetCounter("gradsnap_storage_chunks_written_total",
                                       "Chunk records made durable");
    st->chunks_compressed = r->GetCounter("gradsnap_storage_chunks_compressed_total",
                                          "Chunk records stored zstd-compressed");
    st->raw_bytes_read = r->GetCounter("gradsnap_storage_raw_bytes_read_total",
                                       "Payload bytes returned by shard readers");
    st->quarantined = r->GetCounter("gradsnap_storage_quarantined_total",
                                    "Segment files or directories the catalog does not know, "
                                    "moved to quarantine/");
    st->quarantine_purged = r->GetCounter("gradsnap_storage_quarantine_purged_total",
                                          "Quarantine entries removed after the grace period");
    st->data_loss = r->GetCounter("gradsnap_storage_data_loss_total",
                                  "Checksum, format or SHA-256 failures found by readers");
    st->commit_seconds = r->GetHistogram("gradsnap_storage_commit_seconds",
                                         "Shard Flush/Finish: data sync plus metadata batch");
    return st;
  }();
  return *s;
}

}  // namespace storage
}  // namespace gradsnap
