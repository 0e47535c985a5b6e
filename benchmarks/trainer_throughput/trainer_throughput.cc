// trainer_throughput: runs gradsnap-train on the same model and data as (a) one rank, no
// checkpoints, (b) two ranks (ZeRO-1 over Gloo), (c) one rank with a sync FULL checkpoint every
// --every steps to the embedded engine, and prints tokens/s and the ratios. Warm-up: the first
// step of each run is excluded by the trainer's own mean (all steps count; use enough --steps).
//
//   build/bin/trainer_throughput [--model small] [--steps 10] [--batch 8] [--seq 128]
//                                [--every 5] [--dir /tmp/gs_bench]
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "benchmarks/common/bench_util.h"

ABSL_FLAG(std::string, model, "small", "Model. Default: small");
ABSL_FLAG(int, steps, 10, "Steps per run. Default: 10");
ABSL_FLAG(int, batch, 8, "Global batch (sequences). Default: 8");
ABSL_FLAG(int, seq, 128, "Sequence length. Default: 128");
ABSL_FLAG(int, every, 5, "Checkpoint interval of the sync run. Default: 5");
ABSL_FLAG(std::string, dir, "/tmp/gs_trainer_bench", "Scratch directory. Default: /tmp/gs_trainer_bench");

namespace {

// Runs gradsnap-train with `args`; returns the summary's tokens_per_s (or -1).
double TokensPerSecond(const std::string& args) {
  const std::string cmd = absl::StrCat(GRADSNAP_TRAIN_BIN, " ", args, " 2>&1");
  std::printf("# %s\n", cmd.c_str());
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return -1;
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  const size_t at = out.rfind("tokens_per_s=");
  if (at == std::string::npos) {
    std::fprintf(stderr, "trainer_throughput: no summary in:\n%s\n", out.c_str());
    return -1;
  }
  const size_t begin = at + 13, end = out.find(' ', begin);
  double v = -1;
  if (!absl::SimpleAtod(out.substr(begin, end - begin), &v)) return -1;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  gradsnap::bench::InitBenchmark(
      argc, argv, "trainer_throughput [--model M] [--steps N] [--batch B] [--seq S] [--dir D]");
  const std::string dir = absl::GetFlag(FLAGS_dir);
  std::system(absl::StrCat("rm -rf ", dir).c_str());
  const std::string base = absl::StrCat("--model ", absl::GetFlag(FLAGS_model), " --steps ",
                                        absl::GetFlag(FLAGS_steps), " --batch ",
                                        absl::GetFlag(FLAGS_batch), " --seq ",
                                        absl::GetFlag(FLAGS_seq));
  const double one = TokensPerSecond(base + " --nproc 1");
  const double two = TokensPerSecond(base + " --nproc 2");
  const double sync = TokensPerSecond(absl::StrCat(base, " --nproc 1 --ckpt-mode sync --ckpt-every ",
                                                   absl::GetFlag(FLAGS_every), " --ckpt-dir ", dir));
  std::system(absl::StrCat("rm -rf ", dir).c_str());
  if (one <= 0 || two <= 0 || sync <= 0) return 1;
  std::printf("tokens_per_s_nproc1=%.1f tokens_per_s_nproc2=%.1f tokens_per_s_sync=%.1f "
              "nproc2_over_nproc1=%.3f sync_over_none=%.3f\n",
              one, two, sync, two / one, sync / one);
  return 0;
}
