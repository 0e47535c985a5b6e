// trainer_throughput: tokens/s of gradsnap-train on this machine, in one run:
//   (a) per thread count (--threads, each rank's --blas-threads), one rank, no checkpoints,
//       and PyTorch training the same GPT (torch_gpt.py: same model, batch, sequence length and
//       thread count) right before or after it, --rounds times, alternating which goes first, so
//       the two share the machine's load of the moment; the ratio of each round, and their
//       median, trainer_speed_vs_torch_tN (target >= 0.80);
//   (b) two ranks (ZeRO-1 over Gloo) and one rank with a sync FULL checkpoint every --every steps
//       to the embedded engine, against one rank, all with the default thread count.
// Every tokens/s is the trainer's own summary (all steps count; use enough --steps).
//
//   build/bin/trainer_throughput [--model small] [--steps 10] [--batch 8] [--seq 128]
//       [--every 5] [--threads 1,2] [--rounds 3] [--python /opt/gradsnap-venv/bin/python]
//       [--dir /tmp/gs_trainer_bench]
// --python '' skips PyTorch (and the ratios); a --python that cannot import torch is an error.
// benchmarks/trainer_throughput/vs_torch.sh makes the venv first.
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "benchmarks/common/bench_util.h"

ABSL_FLAG(std::string, model, "small", "Model. Default: small");
ABSL_FLAG(int, steps, 10, "Steps per run. Default: 10");
ABSL_FLAG(int, batch, 8, "Global batch (sequences). Default: 8");
ABSL_FLAG(int, seq, 128, "Sequence length. Default: 128");
ABSL_FLAG(int, every, 5, "Checkpoint interval of the sync run. Default: 5");
ABSL_FLAG(std::string, threads, "1,2", "Thread counts to measure, comma-separated. Default: 1,2");
ABSL_FLAG(int, rounds, 3, "Rounds of the per-thread-count runs (gradsnap and PyTorch). Default: 3");
ABSL_FLAG(std::string, python, "/opt/gradsnap-venv/bin/python",
          "Python with torch for the PyTorch runs; empty = skip them. Default: "
          "/opt/gradsnap-venv/bin/python");
ABSL_FLAG(std::string, dir, "/tmp/gs_trainer_bench", "Scratch directory. Default: /tmp/gs_trainer_bench");

namespace {

// Runs `cmd`; returns the value of `key` in its output (or -1, the output on stderr).
double RunFor(const std::string& cmd, const std::string& key) {
  std::printf("# %s\n", cmd.c_str());
  std::fflush(stdout);
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  const size_t at = out.rfind(key);
  double v = -1;
  if (at != std::string::npos) {
    const size_t begin = at + key.size(), end = out.find_first_of(" \n", begin);
    if (!absl::SimpleAtod(out.substr(begin, end - begin), &v)) v = -1;
  }
  if (v <= 0) std::fprintf(stderr, "trainer_throughput: no %s in:\n%s\n", key.c_str(), out.c_str());
  return v;
}

// gradsnap-train with `args`: its summary's tokens_per_s.
double Gradsnap(const std::string& args) {
  return RunFor(absl::StrCat(GRADSNAP_TRAIN_BIN, " ", args), " tokens_per_s=");
}

}  // namespace

int main(int argc, char** argv) {
  gradsnap::bench::InitBenchmark(argc, argv, "trainer_throughput",
                                 "[--model M] [--steps N] [--batch B] [--seq S] [--every K] "
                                 "[--threads 1,2] [--rounds R] [--python PY] [--dir D]");
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const std::string python = absl::GetFlag(FLAGS_python);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  std::vector<int> threads;
  for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_threads), ',')) {
    int v = 0;
    if (!absl::SimpleAtoi(t, &v) || v < 1 || v > 1024) {
      gradsnap::bench::BadFlag("--threads must be counts in [1, 1024], like 1,2");
    }
    threads.push_back(v);
  }
  if (rounds < 1 || rounds > 100) gradsnap::bench::BadFlag("--rounds must be in [1, 100]");
  std::system(absl::StrCat("rm -rf ", dir).c_str());
  const std::string shape = absl::StrCat(" --model ", absl::GetFlag(FLAGS_model), " --steps ",
                                         absl::GetFlag(FLAGS_steps), " --batch ",
                                         absl::GetFlag(FLAGS_batch), " --seq ",
                                         absl::GetFlag(FLAGS_seq));
  bool failed = false;
  std::string summary;
  // (a) per thread count, interleaved with PyTorch.
  std::vector<std::vector<double>> gs(threads.size()), pt(threads.size()), ratio(threads.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < threads.size(); ++i) {
      const std::string t = absl::StrCat(threads[i]);
      auto run_gs = [&] { return Gradsnap(shape + " --nproc 1 --blas-threads " + t); };
      auto run_pt = [&] {
        return RunFor(absl::StrCat(python, " ", GRADSNAP_TORCH_GPT_PY, shape, " --threads ", t),
                      "torch_tokens_per_s=");
      };
      double g = -1, p = -1;
      if (python.empty()) {
        g = run_gs();
      } else if (r % 2 == 0) {
        g = run_gs();
        p = run_pt();
      } else {
        p = run_pt();
        g = run_gs();
      }
      if (g <= 0 || (!python.empty() && p <= 0)) {
        failed = true;
        continue;
      }
      gs[i].push_back(g);
      std::printf("round=%d threads=%d gradsnap_tokens_per_s=%.1f", r + 1, threads[i], g);
      if (!python.empty()) {
        pt[i].push_back(p);
        ratio[i].push_back(g / p);
        std::printf(" torch_tokens_per_s=%.1f ratio=%.3f", p, g / p);
      }
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  using gradsnap::bench::Median;
  for (size_t i = 0; i < threads.size(); ++i) {
    if (gs[i].empty()) continue;
    absl::StrAppend(&summary, absl::StrFormat("tokens_per_s_t%d=%.1f ", threads[i], Median(gs[i])));
    if (!ratio[i].empty()) {
      absl::StrAppend(&summary,
                      absl::StrFormat("torch_tokens_per_s_t%d=%.1f trainer_speed_vs_torch_t%d=%.3f ",
                                      threads[i], Median(pt[i]), threads[i], Median(ratio[i])));
    }
  }
  // (b) ranks and checkpoints, default threads (cores per rank).
  const double one = Gradsnap(shape + " --nproc 1");
  const double two = Gradsnap(shape + " --nproc 2");
  const double sync = Gradsnap(absl::StrCat(shape, " --nproc 1 --ckpt-mode sync --ckpt-every ",
                                            absl::GetFlag(FLAGS_every), " --ckpt-dir ", dir));
  std::system(absl::StrCat("rm -rf ", dir).c_str());
  if (one <= 0 || two <= 0 || sync <= 0) failed = true;
  std::printf("%stokens_per_s_nproc1=%.1f tokens_per_s_nproc2=%.1f tokens_per_s_sync=%.1f "
              "nproc2_over_nproc1=%.3f sync_over_none=%.3f\n",
              summary.c_str(), one, two, sync, two / one, sync / one);
  return failed ? 1 : 0;
}
