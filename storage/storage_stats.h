// The storage engine's metrics in the process-wide Registry (common/stats.h), exported by the
// service's metrics endpoint. Cheap to update from any thread.
#ifndef GRADSNAP_STORAGE_STORAGE_STATS_H_
#define GRADSNAP_STORAGE_STORAGE_STATS_H_

#include "common/stats.h"

namespace gradsnap {
namespace storage {

struct StorageStats {
  Counter* raw_bytes_written;     // payload bytes appended by writers
  Counter* stored_bytes_written;  // record bytes (after compression) made durable
  Counter* chunks_written;
  Counter* chunks_compressed;
  Counter* fixed_buffer_writes;   // segment writes from registered (fixed) io_uring buffers
  Counter* raw_bytes_read;        // payload bytes returned by readers
  Counter* data_loss;             // DATA_LOSS errors reported by readers
  Counter* quarantined;           // segment files/directories moved to quarantine/
  Counter* quarantine_purged;     // quarantine entries removed after the grace period
  Histogram* commit_seconds;      // Flush/Finish: sync + metadata batch
  static StorageStats& Get();
};

}  // namespace storage
}  // namespace gradsnap

#endif  // GRADSNAP_STORAGE_STORAGE_STATS_H_
