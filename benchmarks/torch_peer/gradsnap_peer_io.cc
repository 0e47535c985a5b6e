// gradsnap_peer_io: gradsnap's half of benchmarks/torch_peer/torch_bench.py, which compares
// gradsnap with torch.save / torch.load on the same bytes, in one run.
//
//   build/bin/gradsnap_peer_io --raw FILE --tensors NAME:NUMEL,... --dir DIR [--endpoint HOST:PORT]
//
// Reads FILE (the fp32 tensors torch_bench.py saved with torch.save, back to back, in the
// order of --tensors) into memory, untimed, and opens the client. Then, for each line read
// from stdin (a step number; the process lives through every pass, as the Python process that
// runs torch.save and torch.load does), timed:
//   save     Client::SaveShard of those tensors as one shard of a new checkpoint, to a store in
//            DIR/store (the embedded client) or to a gradsnap-server (--endpoint). It returns
//            once the shard is durable (fdatasync + synced catalog), as torch.save + fsync.
//   restore  after dropping the page cache, Client::RestoreTensor of each tensor into memory
//            allocated for it then, as torch.load allocates its tensors (the restore is charged
//            for faulting those pages in).
// The restored bytes are compared with FILE's; any difference fails (exit 1). The checkpoint
// is deleted after the pass.
//
// A line per pass: gradsnap_save_s= gradsnap_restore_s= bytes=
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "benchmarks/common/bench_util.h"
#include "client/client.h"
#include "common/clock.h"
#include "common/status.h"

ABSL_FLAG(std::string, raw, "", "The tensors' bytes, back to back (fp32). Required.");
ABSL_FLAG(std::string, tensors, "", "NAME:NUMEL,... in FILE's order. Required.");
ABSL_FLAG(std::string, dir, "/tmp",
          "Scratch directory on the disk under test (DIR/store; removed afterwards). Default: /tmp.");
ABSL_FLAG(std::string, endpoint, "",
          "Save to and restore from this gradsnap-server instead of an embedded store. Default: "
          "none.");

namespace gradsnap {
namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "gradsnap_peer_io: %s\n", what.c_str());
  return 1;
}

struct Times {
  double save_s = 0, restore_s = 0;
};

// One pass: the shard saved as checkpoint `step`, the page cache dropped, the shard restored
// into fresh memory and compared.
absl::StatusOr<Times> SaveAndRestore(client::Client& c, int64_t step,
                                     const std::vector<storage::TensorSpec>& specs,
                                     const std::vector<char>& src) {
  RETURN_IF_ERROR(
      Annotate(c.BeginCheckpoint({"peer", step, storage::CheckpointKind::kFull, -1, 1, ""}), "begin"));
  client::ShardSpec spec{"peer", step, 0, {}, ""};
  std::vector<client::TensorRef> refs;
  uint64_t off = 0;
  for (const storage::TensorSpec& t : specs) {
    refs.push_back({t, src.data() + off});
    off += t.byte_length;
  }
  Times t;
  Stopwatch w;
  RETURN_IF_ERROR(Annotate(c.SaveShard(spec, refs), "save"));
  t.save_s = w.ElapsedSeconds();
  bench::DropPageCache(absl::GetFlag(FLAGS_dir));
  w.Restart();
  // Each tensor into memory allocated for it now, as torch.load allocates its tensors.
  std::vector<std::unique_ptr<char[]>> out;
  for (const storage::TensorSpec& ts : specs) {
    out.emplace_back(new char[ts.byte_length]);
    RETURN_IF_ERROR(Annotate(c.RestoreTensor("peer", step, 0, ts.name, out.back().get(),
                                             ts.byte_length),
                             "restore"));
  }
  t.restore_s = w.ElapsedSeconds();
  off = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (std::memcmp(out[i].get(), src.data() + off, specs[i].byte_length) != 0) {
      return absl::DataLossError("restored bytes differ from the saved ones");
    }
    off += specs[i].byte_length;
  }
  return t;
}

int Run() {
  const std::string raw = absl::GetFlag(FLAGS_raw);
  if (raw.empty() || absl::GetFlag(FLAGS_tensors).empty()) return Fail("--raw and --tensors are required");
  std::vector<storage::TensorSpec> specs;
  uint64_t total = 0;
  for (absl::string_view item : absl::StrSplit(absl::GetFlag(FLAGS_tensors), ',')) {
    std::vector<std::string> parts = absl::StrSplit(item, ':');
    int64_t numel = 0;
    if (parts.size() != 2 || parts[0].empty() || !absl::SimpleAtoi(parts[1], &numel) || numel <= 0) {
      return Fail(absl::StrCat("--tensors: bad entry '", item, "' (NAME:NUMEL)"));
    }
    storage::TensorSpec t;
    t.name = parts[0];
    t.dtype = DType::kF32;
    t.shape = {numel};
    t.byte_length = static_cast<uint64_t>(numel) * 4;
    total += t.byte_length;
    specs.push_back(t);
  }
  std::error_code ec;
  if (std::filesystem::file_size(raw, ec) != total || ec) {
    return Fail(absl::StrCat(raw, ": not ", total, " bytes (the tensors' fp32 bytes)"));
  }
  std::vector<char> src(total);
  {
    std::ifstream in(raw, std::ios::binary);
    if (!in.read(src.data(), static_cast<std::streamsize>(total))) return Fail(raw + ": read failed");
  }
  client::ClientOptions o;
  const std::string store = absl::GetFlag(FLAGS_dir) + "/store";
  if (absl::GetFlag(FLAGS_endpoint).empty()) {
    o.local_dir = store;
  } else {
    o.endpoints = {absl::GetFlag(FLAGS_endpoint)};
  }
  absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(o);
  if (!c.ok()) return Fail(absl::StrCat("connect: ", c.status().ToString()));
  std::string line;
  for (int64_t step = 0; std::getline(std::cin, line);) {
    if (!absl::SimpleAtoi(line, &step) || step < 0) return Fail("stdin: a step number per line");
    absl::StatusOr<Times> t = SaveAndRestore(**c, step, specs, src);
    if (!t.ok()) return Fail(t.status().ToString());
    (*c)->Delete("peer", step).IgnoreError();
    std::printf("gradsnap_save_s=%.6f gradsnap_restore_s=%.6f bytes=%llu\n", t->save_s,
                t->restore_s, static_cast<unsigned long long>(total));
    std::fflush(stdout);
  }
  if (o.endpoints.empty()) {
    c->reset();
    std::filesystem::remove_all(store, ec);
  }
  return 0;
}

}  // namespace
}  // namespace gradsnap

int main(int argc, char** argv) {
  gradsnap::bench::InitBenchmark(
      argc, argv,
      "gradsnap_peer_io --raw FILE --tensors NAME:NUMEL,... [--dir DIR] [--endpoint HOST:PORT]: "
      "gradsnap's save and cold restore of torch_bench.py's tensors");
  return gradsnap::Run();
}
