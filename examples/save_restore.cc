// Saves a two-rank checkpoint through the gradsnap client library and restores it, using only
// the installed headers (<gradsnap/client.h>). Usage: save_restore DIR
// DIR is the embedded engine's data directory (created if missing); with --server HOST:PORT
// instead, the same program talks to a running gradsnap-server.
// Prints one line per step and exits 0 when every restored byte matches what was saved.
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gradsnap/client.h"

namespace {

namespace gs = gradsnap::client;

int Fail(const char* what, const absl::Status& s) {
  std::fprintf(stderr, "save_restore: %s: %s\n", what, s.ToString().c_str());
  return 1;
}

// One rank's state: fp32 parameters and a step counter.
struct RankState {
  std::vector<float> params;
  int64_t step = 0;
};

RankState MakeState(int rank, int64_t step) {
  RankState st;
  st.params.resize(4096);
  for (size_t i = 0; i < st.params.size(); ++i) {
    st.params[i] = static_cast<float>(rank * 1000 + static_cast<int>(i)) * 0.5f;
  }
  st.step = step;
  return st;
}

std::vector<gs::TensorRef> Refs(const RankState& st) {
  gs::TensorRef params;
  params.spec.name = "params";
  params.spec.dtype = gradsnap::DType::kF32;
  params.spec.shape = {static_cast<int64_t>(st.params.size())};
  params.spec.byte_length = st.params.size() * sizeof(float);
  params.data = st.params.data();
  gs::TensorRef step;
  step.spec.name = "step";
  step.spec.dtype = gradsnap::DType::kI64;
  step.spec.shape = {1};
  step.spec.byte_length = sizeof(int64_t);
  step.data = &st.step;
  return {params, step};
}

}  // namespace

int main(int argc, char** argv) {
  gs::ClientOptions options;
  if (argc == 3 && std::strcmp(argv[1], "--server") == 0) {
    options.endpoints = {argv[2]};
  } else if (argc == 2) {
    options.local_dir = argv[1];
  } else {
    std::fprintf(stderr, "usage: save_restore DIR | save_restore --server HOST:PORT\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<gs::Client>> client = gs::Client::Connect(options);
  if (!client.ok()) return Fail("connect", client.status());
  gs::Client& c = **client;

  constexpr int kRanks = 2;
  constexpr int64_t kStep = 100;
  gs::CheckpointSpec spec;
  spec.job = "example";
  spec.step = kStep;
  spec.kind = gs::CheckpointKind::kFull;
  spec.world_size = kRanks;
  if (absl::Status s = c.BeginCheckpoint(spec); !s.ok()) return Fail("begin", s);

  // Both ranks save concurrently; the checkpoint commits when the second shard is durable.
  std::vector<RankState> states;
  for (int r = 0; r < kRanks; ++r) states.push_back(MakeState(r, kStep));
  std::vector<std::future<absl::Status>> saves;
  for (int r = 0; r < kRanks; ++r) {
    gs::ShardSpec shard;
    shard.job = spec.job;
    shard.step = kStep;
    shard.rank = r;
    saves.push_back(c.SaveShardAsync(shard, Refs(states[r])));
  }
  for (auto& f : saves) {
    if (absl::Status s = f.get(); !s.ok()) return Fail("save", s);
  }
  std::printf("saved job %s step %lld, %d ranks\n", spec.job.c_str(),
              static_cast<long long>(kStep), kRanks);

  absl::StatusOr<std::vector<gs::CheckpointInfo>> listed = c.List(spec.job);
  if (!listed.ok()) return Fail("list", listed.status());
  if (listed->empty() || listed->back().step != kStep ||
      listed->back().state != gs::CheckpointState::kCommitted) {
    std::fprintf(stderr, "save_restore: step %lld is not listed as committed\n",
                 static_cast<long long>(kStep));
    return 1;
  }
  if (absl::Status s = c.Verify(spec.job, kStep); !s.ok()) return Fail("verify", s);

  for (int r = 0; r < kRanks; ++r) {
    RankState got;
    got.params.resize(states[r].params.size());
    absl::Status s = c.RestoreTensor(spec.job, kStep, r, "params", got.params.data(),
                                     got.params.size() * sizeof(float));
    if (!s.ok()) return Fail("restore params", s);
    s = c.RestoreTensor(spec.job, kStep, r, "step", &got.step, sizeof(got.step));
    if (!s.ok()) return Fail("restore step", s);
    if (got.params != states[r].params || got.step != states[r].step) {
      std::fprintf(stderr, "save_restore: rank %d restored different bytes\n", r);
      return 1;
    }
    std::printf("restored rank %d: %zu params, step %lld\n", r, got.params.size(),
                static_cast<long long>(got.step));
  }
  std::printf("ok\n");
  return 0;
}
