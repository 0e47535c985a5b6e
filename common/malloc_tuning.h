// glibc malloc settings for the processes gradsnap starts (gradsnap-server, the gradsnap CLI,
// gradsnap-train, the benchmarks), which move gigabytes through gRPC.
//
// gRPC reads each socket into freshly malloc'd buffers of up to 1 MiB (proto/transport.h) and
// frees them once the message is consumed. With glibc's defaults every free of a buffer at the
// top of a heap gives the memory back (trim threshold 128 KiB, no pad), so the next read faults
// it in again, 4 KiB at a time: measured, a third of the bytes received by a client and most of
// those received by the server were page-faulted afresh, at about 0.35 CPU-s per GB faulted.
// Keeping up to 32 MiB free per heap (8 MiB pad after a trim) makes the buffers warm memory;
// allocations from 2 MiB up (chunk buffers, the RAM tier) are mapped and unmapped on their own
// so a large free never sits in a heap.
//
// Processes embedding the client (a training script) can get the same with
// GLIBC_TUNABLES=glibc.malloc.trim_threshold=33554432:glibc.malloc.top_pad=8388608:glibc.malloc.mmap_threshold=2097152
// (docs/protocol.md, "Transport tuning").
#ifndef GRADSNAP_COMMON_MALLOC_TUNING_H_
#define GRADSNAP_COMMON_MALLOC_TUNING_H_

namespace gradsnap {

// Applies the settings above; call at the start of main(), before threads start.
// few_arenas: also at most 4 malloc arenas (gradsnap-server: its many gRPC threads would
// otherwise each keep an arena of freed buffers).
void TuneMallocForStreaming(bool few_arenas);

}  // namespace gradsnap

#endif  // GRADSNAP_COMMON_MALLOC_TUNING_H_
