#include "tests/snapshot/e2e_util.h"

#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gpu_snapshot/grad_log.h"
#include "gtest/gtest.h"
#include "tests/testing/trainer.h"

namespace gradsnap {
namespace e2e {

testing::TempDir* ScratchSuite::tmp_ = nullptr;

TrainRun Train(const std::string& train_bin, const std::string& scratch, const std::string& name,
               const std::vector<std::string>& args) {
  const testing::RunResult run = testing::RunTrainer(train_bin, absl::StrJoin(args, " "));
  TrainRun r;
  r.rc = run.exit_code;
  r.out = run.out;
  std::ofstream(scratch + "/" + name + ".out") << r.out;  // kept next to the run's store
  r.losses = testing::ParseLosses(r.out);
  r.sha = testing::SummaryField(r.out, "params_sha256");
  const std::string from = testing::SummaryField(r.out, "resumed_from");
  r.resumed_from = from.empty() ? -1 : std::stoll(from);
  const std::regex start_re(R"(^ckpt step (\d+) \S+ start)");
  std::istringstream lines(r.out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, start_re)) r.started.push_back(std::stoll(m[1]));
  }
  return r;
}

Store::Store(const std::string& dir) {
  client::ClientOptions o;
  o.local_dir = dir;
  auto c = client::Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status();
  if (c.ok()) client_ = std::move(*c);
}

std::map<int64_t, client::CheckpointInfo> Store::List(const std::string& job) {
  std::map<int64_t, client::CheckpointInfo> out;
  if (client_ == nullptr) return out;
  auto l = client_->List(job);
  EXPECT_TRUE(l.ok()) << l.status();
  if (l.ok()) {
    for (auto& c : *l) out[c.step] = c;
  }
  return out;
}

std::string Store::Tensor(const std::string& job, int64_t step, int rank,
                          const std::string& name) {
  if (client_ == nullptr) return "";
  auto m = client_->Show(job, step);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return "";
  for (const auto& t : m->shards.at(rank).tensors) {
    if (t.spec.name != name) continue;
    std::string out(t.spec.byte_length, '\0');
    absl::Status s = client_->RestoreTensor(job, step, rank, name, out.data(), out.size());
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }
  ADD_FAILURE() << "no tensor " << name << " in " << job << "@" << step;
  return "";
}

std::string Store::State(const std::string& job, int64_t step, int rank) {
  return Tensor(job, step, rank, "params") + Tensor(job, step, rank, "adam_m") +
         Tensor(job, step, rank, "adam_v");
}

Checked ExpectEqualsReference(Store& got, const std::string& job, Store& ref,
                              const std::string& ref_job, int nproc, const std::string& what) {
  Checked c;
  auto list = got.List(job);
  auto ref_list = ref.List(ref_job);
  gpu_snapshot::ReplayPool pool(2);
  for (const auto& [step, info] : list) {
    if (ref_list.count(step) == 0) {
      ADD_FAILURE() << what << ": no reference checkpoint of step " << step;
      continue;
    }
    for (int rank = 0; rank < nproc; ++rank) {
      if (info.kind == client::CheckpointKind::kFull) {
        EXPECT_TRUE(got.State(job, step, rank) == ref.State(ref_job, step, rank))
            << what << ": FULL " << step << " rank " << rank << " differs from sync";
        continue;
      }
      // A DELTA: its base FULL plus the DELTAs up to it must give the reference state.
      const int64_t base = info.base_step;
      if (list.count(base) == 0) {
        ADD_FAILURE() << what << ": DELTA " << step << " without its base " << base;
        continue;
      }
      std::string state = got.State(job, base, rank);
      const size_t n = state.size() / 12;
      float* p = reinterpret_cast<float*>(state.data());
      gpu_snapshot::HostStateRef s{p, p + n, p + 2 * n, n};
      bool ok = true;
      for (int64_t k = base + 1; k <= step && ok; ++k) {
        if (list.count(k) == 0) {
          ADD_FAILURE() << what << ": missing DELTA " << k;
          ok = false;
          break;
        }
        auto h = gpu_snapshot::DecodeDeltaHeader(got.Tensor(job, k, rank, "delta_header"));
        EXPECT_TRUE(h.ok()) << h.status();
        if (!h.ok()) {
          ok = false;
          break;
        }
        std::string g = got.Tensor(job, k, rank, "grad");
        absl::Status st = gpu_snapshot::ApplyDelta(&pool, s, *h, g.data(), g.size());
        EXPECT_TRUE(st.ok()) << st;
        ok = st.ok();
      }
      if (ok) {
        EXPECT_TRUE(state == ref.State(ref_job, step, rank))
            << what << ": FULL " << base << " + DELTAs to " << step << " rank " << rank
            << " differs from sync";
      }
    }
    if (info.kind == client::CheckpointKind::kFull) {
      ++c.fulls;
    } else {
      ++c.deltas;
    }
  }
  return c;
}

int CountDifferingFulls(Store& got, const std::string& job, Store& ref,
                        const std::string& ref_job, int nproc) {
  int differing = 0;
  for (const auto& [step, info] : got.List(job)) {
    if (info.kind != client::CheckpointKind::kFull) continue;
    for (int rank = 0; rank < nproc; ++rank) {
      if (got.State(job, step, rank) != ref.State(ref_job, step, rank)) {
        ++differing;
        break;
      }
    }
  }
  return differing;
}

}  // namespace e2e
}  // namespace gradsnap
