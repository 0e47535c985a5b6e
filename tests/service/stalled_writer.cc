// stalled_writer ADDRESS JOB STEP BYTES SEED: a client frozen mid-upload. Begins the upload of
// rank 0 of (JOB, STEP) (MakeShard's shard of one BYTES tensor with SEED: the same spec as a
// test's own save of it), sends its first MiB without finishing, prints "stalled" and stops
// itself (SIGSTOP) with the stream open. Used by service_fault_test.
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "proto/gradsnap.grpc.pb.h"
#include "tests/service/service_test_util.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: stalled_writer ADDRESS JOB STEP BYTES SEED\n");
    return 2;
  }
  const std::string address = argv[1], job = argv[2];
  const int64_t step = std::atoll(argv[3]);
  const uint64_t bytes = std::strtoull(argv[4], nullptr, 10);
  const uint64_t seed = std::strtoull(argv[5], nullptr, 10);
  gradsnap::testing::TestShard shard = gradsnap::testing::MakeShard(job, step, 0, {bytes}, seed);
  auto stub = gradsnap::testing::RawStub(address);
  grpc::ClientContext ctx;
  gradsnap::v1::WriteResponse resp;
  auto stream = stub->Write(&ctx, &resp);
  if (!gradsnap::testing::SendRawPrefix(stream.get(), shard, std::min<uint64_t>(bytes, 1u << 20))) {
    std::fprintf(stderr, "stalled_writer: the stream broke at once\n");
    return 1;
  }
  std::printf("stalled\n");
  std::fflush(stdout);
  std::raise(SIGSTOP);
  return 0;
}
