// The GPU schedule on the simulated asynchronous device (--device sim, docs/gockpt.md), end to
// end through the real gradsnap-train: kernels run asynchronously on a compute-stream thread,
// copies honour compute events and a throttled copy engine, and the poison test mode
// (--sim_poison) corrupts every byte a kernel writes while it runs, so a copy that is not ordered
// after the update that produced its data makes the checkpoint differ from the stop-the-world
// reference. Checked here:
//  - sim results (bf16 compute copy and gradients, as on CUDA) are the same bits run to run;
//  - gockpt with K = 2..6, with and without -O, with and without the gradient log, 1 rank and 2
//    ranks (two simulated devices): every FULL (and every FULL + DELTA replay) is byte-identical
//    to the sync run's snapshot of the same step, and the final params_sha256 is the same;
//  - the poison is really detected: with copies deliberately unordered (test hook), checkpoints
//    differ;
//  - with late copies (--sim_late_copies), leaving out any one kind of wait (--test_drop_wait
//    block, grad, replay) always makes a FULL differ, and leaving out none never does;
//  - bad device flags (also --device cuda without a GPU) are one clear line and exit status 2.
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gpu_snapshot/device.h"
#include "gtest/gtest.h"
#include "tests/snapshot/e2e_util.h"

namespace gradsnap {
namespace {

using e2e::Store;
using e2e::TrainRun;

std::vector<std::string> Base(const std::string& dir, int nproc) {
  return {"--model=tiny",         "--steps=12",          "--batch=4",
          "--warmup=3",           "--grad_clip=0.5",     "--test_skip_step=6",
          "--device=sim",         "--sim_poison",        absl::StrCat("--nproc=", nproc),
          absl::StrCat("--ckpt_dir=", dir)};
}

TrainRun RunTrain(const std::string& scratch, const std::string& name, std::vector<std::string> a) {
  return e2e::Train(GRADSNAP_TRAIN_PATH, scratch, name, a);
}

class SimE2E : public e2e::ScratchSuite {
 protected:
  // The reference of `nproc` ranks, run on first use: a stop-the-world FULL after every step, on
  // sim (pinned staging).
  static const TrainRun& Reference(int nproc) {
    if (refs_.count(nproc) == 0) {
      std::vector<std::string> a = Base(Ref(nproc), nproc);
      a.insert(a.end(), {"--ckpt_mode=sync", "--ckpt_every=1", "--job=ref"});
      refs_[nproc] = RunTrain(scratch(), absl::StrCat("ref", nproc), a);
    }
    return refs_[nproc];
  }
  static std::string Ref(int nproc) { return absl::StrCat(scratch(), "/ref", nproc); }

  // gockpt with window k, -O on/off, gradient log on/off, against the sync reference.
  void CheckGockpt(int k, int nproc) {
    const TrainRun& ref = Reference(nproc);
    ASSERT_EQ(ref.rc, 0) << ref.out;
    Store ref_store(Ref(nproc));
    for (bool overlap : {true, false}) {
      for (bool grad_log : {false, true}) {
        const std::string name =
            absl::StrCat("k", k, "_np", nproc, overlap ? "_O" : "", grad_log ? "_gl" : "");
        const std::string dir = scratch() + "/" + name;
        std::vector<std::string> a = Base(dir, nproc);
        a.insert(a.end(), {"--ckpt_mode=gockpt", "--ckpt_every=4",
                           absl::StrCat("--gockpt_window=", k),
                           absl::StrCat("--gockpt_overlap=", overlap ? "true" : "false"),
                           "--job=g"});
        if (grad_log) a.push_back("--grad_log");
        TrainRun r = RunTrain(scratch(), name, a);
        ASSERT_EQ(r.rc, 0) << name << "\n" << r.out;
        EXPECT_EQ(r.sha, ref.sha) << name << ": checkpointing changed training";
        EXPECT_EQ(r.losses, ref.losses) << name;
        ASSERT_FALSE(r.started.empty()) << name << "\n" << r.out;
        Store got(dir);
        const e2e::Checked c = e2e::ExpectEqualsReference(got, "g", ref_store, "ref", nproc, name);
        // The first window starts after update 4 and closes at 4 + K - 1 (12 at the latest).
        EXPECT_GE(c.fulls, 1) << name << "\n" << r.out;
        if (grad_log) {
          EXPECT_GE(c.deltas, 3) << name << "\n" << r.out;
        }
      }
    }
  }

  // The sim's late_copies mode starts a copy only when the host waits for it or once a kernel
  // overwrote its source (sim_device.h), so leaving out one kind of wait (the engine's
  // test_drop_wait hook) always corrupts a checkpoint, whatever the timing; with every wait in
  // place the same mode gives exact checkpoints. `drop`: the wait left out; `late`: the copy
  // stream whose copies start late.
  void CheckDroppedWaitIsCaught(const std::string& drop, const std::string& late) {
    const TrainRun& ref = Reference(1);
    ASSERT_EQ(ref.rc, 0) << ref.out;
    Store ref_store(Ref(1));
    for (bool dropped : {false, true}) {
      const std::string name =
          absl::StrCat("late_", late, "_", drop, dropped ? "_dropped" : "_kept");
      const std::string dir = scratch() + "/" + name;
      std::vector<std::string> a = Base(dir, 1);
      a.insert(a.end(), {"--ckpt_mode=gockpt", "--ckpt_every=4", "--gockpt_window=3",
                         "--sim_late_copies=" + late, "--job=d"});
      if (dropped) a.push_back("--test_drop_wait=" + drop);
      TrainRun r = RunTrain(scratch(), name, a);
      ASSERT_EQ(r.rc, 0) << name << "\n" << r.out;
      EXPECT_EQ(r.sha, ref.sha) << name << ": training itself must be unaffected";
      Store got(dir);
      ASSERT_FALSE(got.List("d").empty()) << name << "\n" << r.out;
      if (dropped) {
        EXPECT_GT(e2e::CountDifferingFulls(got, "d", ref_store, "ref", 1), 0)
            << name << ": the missing " << drop << " wait went unnoticed\n" << r.out;
      } else {
        const e2e::Checked c = e2e::ExpectEqualsReference(got, "d", ref_store, "ref", 1, name);
        EXPECT_GE(c.fulls, 2) << name << "\n" << r.out;
      }
    }
  }

  static std::map<int, TrainRun> refs_;
};
std::map<int, TrainRun> SimE2E::refs_;

// sim keeps the CUDA back end's precision layout (bf16 compute copy and gradients): its results
// are the same bits run to run (1 and 2 ranks, with and without checkpointing), and differ from
// the CPU back end's fp32 ones (which the CPU tests keep as they are).
TEST_F(SimE2E, SimIsBitIdenticalRunToRunInMixedPrecision) {
  for (int nproc : {1, 2}) {
    const TrainRun& ref = Reference(nproc);
    ASSERT_EQ(ref.rc, 0) << ref.out;
    ASSERT_NE(ref.out.find(" skipped"), std::string::npos) << "step 6 was not skipped";
    std::vector<std::string> a = Base(absl::StrCat(scratch(), "/again", nproc), nproc);
    a.push_back("--job=again");
    TrainRun again = RunTrain(scratch(), absl::StrCat("again", nproc), a);
    ASSERT_EQ(again.rc, 0) << again.out;
    EXPECT_EQ(again.sha, ref.sha);
    EXPECT_EQ(again.losses, ref.losses);
    std::vector<std::string> c = {"--model=tiny",    "--steps=12",
                                  "--batch=4",       "--warmup=3",
                                  "--grad_clip=0.5", "--test_skip_step=6",
                                  "--device=cpu",    absl::StrCat("--nproc=", nproc),
                                  absl::StrCat("--ckpt_dir=", scratch(), "/cpu", nproc)};
    TrainRun cpu = RunTrain(scratch(), absl::StrCat("cpu", nproc), c);
    ASSERT_EQ(cpu.rc, 0) << cpu.out;
    EXPECT_NE(cpu.sha, ref.sha) << "sim trained in fp32 like the CPU back end, not in bf16";
  }
}

TEST_F(SimE2E, GockptK2EqualsSync) { CheckGockpt(2, 1); }
TEST_F(SimE2E, GockptK3EqualsSync) { CheckGockpt(3, 1); }
TEST_F(SimE2E, GockptK4EqualsSync) { CheckGockpt(4, 1); }
TEST_F(SimE2E, GockptK5EqualsSync) { CheckGockpt(5, 1); }
TEST_F(SimE2E, GockptK6EqualsSync) { CheckGockpt(6, 1); }
TEST_F(SimE2E, GockptTwoRanksTwoDevicesEqualsSync) { CheckGockpt(3, 2); }

// The test hook --sim_unordered_copies makes the copy streams ignore compute events: a copy then
// races the update that produces its data, and with --sim_poison it reads poisoned (or stale)
// bytes. The comparison above must catch it, or it would not catch a real ordering bug.
TEST_F(SimE2E, PoisonDetectsCopiesNotOrderedAfterTheUpdate) {
  ASSERT_EQ(Reference(1).rc, 0) << refs_[1].out;
  Store ref_store(Ref(1));
  for (const std::string mode : {"sync", "gockpt"}) {
    const std::string name = "unordered_" + mode;
    const std::string dir = scratch() + "/" + name;
    std::vector<std::string> a = Base(dir, 1);
    a.insert(a.end(), {"--ckpt_mode=" + mode, "--ckpt_every=2", "--gockpt_window=2",
                       "--sim_unordered_copies", "--job=u"});
    TrainRun r = RunTrain(scratch(), name, a);
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_EQ(r.sha, refs_[1].sha) << "training itself must be unaffected";
    Store got(dir);
    ASSERT_FALSE(got.List("u").empty()) << r.out;
    EXPECT_GT(e2e::CountDifferingFulls(got, "u", ref_store, "ref", 1), 0)
        << name << ": unordered copies went unnoticed\n" << r.out;
  }
}

TEST_F(SimE2E, DroppedBlockCopyWaitIsCaught) { CheckDroppedWaitIsCaught("block", "state"); }
TEST_F(SimE2E, DroppedGradientCopyWaitIsCaught) {
  CheckDroppedWaitIsCaught("grad", "grad");
}
TEST_F(SimE2E, DroppedReplayWaitIsCaught) { CheckDroppedWaitIsCaught("replay", "grad"); }

// A kill while a gockpt window is in flight, on sim with -O and the gradient log: the restart
// restores a checkpoint (resumed_from is a real step) and continues exactly.
TEST_F(SimE2E, KilledRankResumesFromACheckpoint) {
  ASSERT_EQ(Reference(1).rc, 0) << refs_[1].out;
  const std::string dir = scratch() + "/kill";
  std::vector<std::string> a = Base(dir, 1);
  a.insert(a.end(), {"--ckpt_mode=gockpt", "--ckpt_every=3", "--gockpt_window=3", "--grad_log",
                     "--fail_at_step=8", "--fail_rank=0", "--test_fail_after_commit",
                     "--max_restarts=1", "--job=k"});
  TrainRun r = RunTrain(scratch(), "kill", a);
  ASSERT_EQ(r.rc, 0) << r.out;
  ASSERT_NE(r.out.find("restart 1 of 1"), std::string::npos) << r.out;
  EXPECT_GE(r.resumed_from, 5) << r.out;
  EXPECT_LE(r.resumed_from, 7) << r.out;
  EXPECT_EQ(r.sha, refs_[1].sha) << r.out;
  for (int64_t s = r.resumed_from + 1; s <= 12; ++s) {
    EXPECT_EQ(r.losses[s], refs_[1].losses.count(s) ? refs_[1].losses.at(s) : "?") << s;
  }
}

// Bad device flags fail in the launcher with exit status 2 and one line on stderr.
TEST_F(SimE2E, BadDeviceFlagsAreOneClearLine) {
  struct Case {
    std::string flags, expect;
  };
  std::vector<Case> cases = {
      {"--device=sim --sim_copy_gbps=0", "--sim_copy_gbps must be > 0"},
      {"--device=sim --device_id=8", "--device_id 8"},
      {"--device=sim --device_id=7 --nproc=2", "needs sim devices 7..8"},
      {"--device=sim --device_id=-1", "--device_id -1"},
      {"--device=tpu", "--device must be cpu, cuda or sim"},
      {"--device=sim --sim_late_copies=all", "unknown --sim_late_copies 'all'"},
  };
  absl::StatusOr<int> gpus = gpu_snapshot::CudaDeviceCount();
  if (gpus.ok() && *gpus == 0) {
    cases.push_back({"--device=cuda", "--device cuda: "});
  } else if (gpus.ok()) {
    cases.push_back({absl::StrCat("--device=cuda --device_id=", *gpus), "--device_id"});
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string name = absl::StrCat("bad", i);
    std::vector<std::string> a = {"--model=tiny", "--steps=2", "--batch=4", cases[i].flags,
                                  absl::StrCat("--ckpt_dir=", scratch(), "/", name)};
    TrainRun r = RunTrain(scratch(), name, a);
    EXPECT_EQ(r.rc, 2) << cases[i].flags << "\n" << r.out;
    EXPECT_NE(r.out.find(cases[i].expect), std::string::npos) << r.out;
    std::istringstream lines(r.out);
    int n = 0;
    for (std::string line; std::getline(lines, line);) n += line.empty() ? 0 : 1;
    EXPECT_EQ(n, 1) << r.out;
  }
}

}  // namespace
}  // namespace gradsnap
