// Resume falls back past damage: with a byte flipped in the newest DELTA, in a middle
// DELTA, or in the newest FULL, `gradsnap-train --resume latest` reports the damaged record
// (job, step, rank, tensor), resumes from the last good step (the chain's prefix that verifies,
// or the previous FULL and its chain), prints the steps lost, and ends equal to an
// uninterrupted run from that point (gradsnap-train --init-from the CLI's restore of that step).
// Embedded (rank 0 restores for all) and through a real server (every rank reads its own slice
// and the ranks agree on the step). Across two servers, a node that came back with an older
// copy of its data leaves the newest FULL with a rank no node holds: the CLI's `latest` and the
// trainer both go back to the FULL before it.
#include <signal.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/backends.h"
#include "client/remote_placement.h"
#include "gtest/gtest.h"
#include "tests/testing/gtest_util.h"
#include "tests/testing/server_process.h"
#include "tests/testing/temp_dir.h"
#include "tests/testing/trainer.h"
#include "tests/testing/util.h"
#include "tests/trainer/restore_util.h"

namespace gradsnap {
namespace testing {
namespace {

const std::string kCli = GRADSNAP_CLI_BIN;

RunResult Train(const std::string& args) { return TrainTwoRanks(args); }

// FULLs 5 and 10, DELTAs 6..9 on 5 and 11..13 on 10: the recovery point is step 13.
void TrainJob(const std::string& store) {
  const RunResult r = Train(
      "--steps 13 --ckpt-mode gockpt --ckpt-every 5 --gockpt-window 1 --grad-log --job j" + store);
  ASSERT_EQ(r.exit_code, 0) << r.out;
}

// Resumes the damaged job to step 15 and checks it fell back to `expect_step`, naming the
// damage, and ends equal to a run from a clean restore of that step.
void ExpectFallback(const std::string& dir, const std::string& store, const std::string& cli_store,
                    int64_t expect_step, const std::string& damage) {
  const RunResult resumed = Train("--steps 15 --resume latest --job j" + store);
  ASSERT_TRUE(IsOk(ResumedFrom(resumed, expect_step)));
  EXPECT_TRUE(absl::StrContains(
      resumed.out, absl::StrCat("recovery point fell back from step 13 to step ", expect_step, ": ",
                                13 - expect_step, " step(s) lost")))
      << resumed.out;
  EXPECT_TRUE(absl::StrContains(resumed.out, damage)) << resumed.out;
  // The uninterrupted run from that point: the same state restored by the CLI.
  const std::string clean = absl::StrCat(dir, "/clean", expect_step);
  const RunResult restored =
      RunCommand(absl::StrCat(kCli, cli_store, " restore j ", expect_step, " --out ", clean));
  ASSERT_EQ(restored.exit_code, 0) << restored.out;
  const RunResult reference = Train("--steps 15 --init-from " + clean);
  ASSERT_EQ(reference.exit_code, 0) << reference.out;
  // Also the parameters (a hash present in both) and every loss after the fallback step.
  const absl::Status exact = ResumedExactly(reference.out, resumed.out, expect_step);
  EXPECT_TRUE(exact.ok()) << exact << "\n" << resumed.out;
}

TEST(FallbackTest, EmbeddedNewestDeltaMiddleDeltaNewestFull) {
  const TempDir tmp("fallback");
  const std::string dir = tmp.path();
  const std::string ckpt = dir + "/ckpt";
  const std::string store = " --ckpt-dir " + ckpt;
  TrainJob(store);
  ASSERT_EQ(FlipSegmentBytes(ckpt, "j", 13, 1), 1);
  // grad shares a packed chunk with the small delta_header (docs/format.md, "Packed chunks").
  ExpectFallback(dir, store, store, 12,
                 "job j step 13 rank 1 tensor delta_header: packed chunk holding tensors "
                 "delta_header, grad");
  ASSERT_EQ(FlipSegmentBytes(ckpt, "j", 12, 0), 1);
  ExpectFallback(dir, store, store, 11,
                 "job j step 12 rank 0 tensor delta_header: packed chunk holding tensors "
                 "delta_header, grad");
  ASSERT_EQ(FlipSegmentBytes(ckpt, "j", 10, 1), 1);
  ExpectFallback(dir, store, store, 9, "job j step 10 rank 1 tensor");
  // The CLI's latest falls back the same way, with a warning.
  const RunResult cli = RunCommand(kCli + store + " restore j latest --out " + dir + "/latest");
  EXPECT_EQ(cli.exit_code, 0) << cli.out;
  EXPECT_TRUE(absl::StrContains(cli.out, "damaged record skipped")) << cli.out;
  EXPECT_TRUE(absl::StrContains(cli.out, "job j step 9 (full 5 + 4 deltas -> step 9)")) << cli.out;
}

// A job of FULLs only: a damaged newest FULL falls back to the previous one, in the CLI (whose
// `latest` then streams nothing raw from the damaged record) and in the trainer.
TEST(FallbackTest, DamagedNewestFullWithoutChain) {
  const TempDir tmp("fallback_full");
  const std::string dir = tmp.path();
  const std::string ckpt = dir + "/ckpt";
  const std::string store = " --ckpt-dir " + ckpt;
  const RunResult trained =
      Train("--steps 8 --ckpt-mode sync --ckpt-every 4 --job j" + store);
  ASSERT_EQ(trained.exit_code, 0) << trained.out;
  ASSERT_FALSE(SummaryField(trained.out, "params_sha256").empty()) << trained.out;
  ASSERT_EQ(FlipSegmentBytes(ckpt, "j", 8, 0), 1);
  const RunResult cli = RunCommand(kCli + store + " restore j latest --out " + dir + "/latest");
  EXPECT_EQ(cli.exit_code, 0) << cli.out;
  EXPECT_TRUE(absl::StrContains(cli.out, "damaged record skipped: job j step 8 rank 0")) << cli.out;
  EXPECT_TRUE(absl::StrContains(cli.out, "job j step 4 (full 4)")) << cli.out;
  const RunResult resumed = Train("--steps 8 --resume latest --job j" + store);
  ASSERT_TRUE(IsOk(ResumedFrom(resumed, 4)));
  EXPECT_EQ(SummaryField(resumed.out, "params_sha256"), SummaryField(trained.out, "params_sha256"));
  // Resumed with checkpointing on, step 8 saved again is not reported saved over its damaged
  // copy: the persist fails (the stored shard does not read back) and the recovery point
  // stays at 4.
  const RunResult again =
      Train("--steps 8 --ckpt-mode sync --ckpt-every 4 --resume latest --job j" + store);
  ASSERT_EQ(again.exit_code, 0) << again.out;
  EXPECT_EQ(SummaryField(again.out, "ckpt_failures"), "1") << again.out;
  EXPECT_EQ(SummaryField(again.out, "recovery_point"), "4") << again.out;
  EXPECT_TRUE(absl::StrContains(again.out, "does not read back")) << again.out;
  const RunResult from_dir = Train("--steps 8 --init-from " + dir + "/latest");
  ASSERT_EQ(from_dir.exit_code, 0) << from_dir.out;
  EXPECT_EQ(SummaryField(from_dir.out, "params_sha256"),
            SummaryField(trained.out, "params_sha256"));
  // The export's `latest` falls back as the restore's does.
  const std::string file = dir + "/latest.safetensors";
  const RunResult exported = RunCommand(kCli + store + " export j latest --out " + file);
  EXPECT_EQ(exported.exit_code, 0) << exported.out;
  EXPECT_TRUE(absl::StrContains(exported.out, "damaged record skipped: job j step 8 rank 0"))
      << exported.out;
  EXPECT_EQ(SafetensorsMetadata(dir + "/latest.rank0.safetensors", "step"), "4");
  EXPECT_EQ(SafetensorsMetadata(dir + "/latest.rank1.safetensors", "step"), "4");
  // Every FULL damaged: DATA_LOSS (exit 3), never "no such checkpoint" (exit 4), which a
  // wrapper could take for "nothing to resume" and start the job over.
  ASSERT_EQ(FlipSegmentBytes(ckpt, "j", 4, 1), 1);
  for (const std::string& cmd : {" restore j latest --out " + dir + "/none",
                                  " export j latest --out " + dir + "/none.safetensors"}) {
    const RunResult r = RunCommand(kCli + store + cmd);
    EXPECT_EQ(r.exit_code, 3) << cmd << ": " << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "DATA_LOSS")) << r.out;
    EXPECT_TRUE(absl::StrContains(r.out, "job j step 4 rank 1")) << r.out;
    const size_t first = r.out.find("job j step 4 rank 1");  // named once, not twice
    EXPECT_EQ(r.out.find("job j step 4 rank 1", first + 1), std::string::npos) << r.out;
  }
  const RunResult none = Train("--steps 8 --resume latest --job j" + store);
  EXPECT_NE(none.exit_code, 0) << none.out;
  EXPECT_TRUE(absl::StrContains(none.out, "every FULL checkpoint is damaged")) << none.out;
}

// After a rank failure the launcher restarts the job; rank 0 prints the time from the failure to
// the first resumed step, split into detection, process start, fetch and replay, and the run
// ends exactly like an uninterrupted one.
TEST(FallbackTest, RestartPrintsRecoveryTimeSplit) {
  const TempDir tmp("recovery_time");
  const std::string dir = tmp.path();
  const std::string flags =
      "--steps 9 --ckpt-mode gockpt --ckpt-every 5 --gockpt-window 1 --grad-log";
  const RunResult whole = Train(flags + " --ckpt-dir " + dir + "/a");
  // Rank 1 dies only once a checkpoint is committed (persists drain from a backlog and never
  // hold a step, so FULL 5 may not be durable yet at step 8); that wait lists the store, which
  // two ranks do through a server.
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.StartOn(dir + "/server").ok()) << server.Log();
  const RunResult failed =
      Train(flags + " --storage " + server.address() +
            " --fail-at-step 8 --fail-rank 1 --max-restarts 1 --test-fail-after-commit");
  ASSERT_EQ(whole.exit_code, 0) << whole.out;
  ASSERT_EQ(failed.exit_code, 0) << failed.out;
  // FULL 5 and whichever of the DELTAs 6, 7 were durable when rank 1 died.
  const std::string from = SummaryField(failed.out, "resumed_from");
  EXPECT_TRUE(from == "5" || from == "6" || from == "7") << failed.out;
  for (const char* key : {"recovery failure_to_first_step_ms=", " detection_ms=",
                          " process_start_ms=", " fetch_ms=", " replay_ms="}) {
    EXPECT_TRUE(absl::StrContains(failed.out, key)) << key << "\n" << failed.out;
  }
  // Once, at the first resumed step, not at every step after it.
  size_t lines = 0;
  for (size_t p = failed.out.find("recovery failure_to_first_step_ms="); p != std::string::npos;
       p = failed.out.find("recovery failure_to_first_step_ms=", p + 1)) {
    ++lines;
  }
  EXPECT_EQ(lines, 1u) << failed.out;
  ASSERT_FALSE(SummaryField(whole.out, "params_sha256").empty()) << whole.out;
  EXPECT_EQ(SummaryField(whole.out, "params_sha256"), SummaryField(failed.out, "params_sha256"));
}

// Through a server every rank restores its own slice: only rank 1 reads the damaged part of
// DELTA 13, and both ranks agree to resume from step 12.
TEST(FallbackTest, ServerRanksAgreeOnTheStep) {
  const TempDir tmp("fallback_server");
  const std::string dir = tmp.path();
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.StartOn(dir + "/server").ok()) << server.Log();
  TrainJob(" --storage " + server.address());
  ASSERT_EQ(server.Stop(), 0) << server.Log();
  ASSERT_EQ(FlipSegmentBytes(dir + "/server", "j", 13, 1), 1);
  ASSERT_TRUE(server.Restart().ok()) << server.Log();
  ExpectFallback(dir, " --storage " + server.address(), " --server " + server.address(), 12,
                 "a damaged record on another rank");
}

// Through a server: after a fallback past a damaged FULL, the run saves that step again; the
// client asks whether the shard is complete before uploading it, and a damaged stored copy is
// not "complete" (DATA_LOSS): the persist fails, and the recovery point is not claimed.
TEST(FallbackTest, ServerDoesNotCountADamagedStepSavedAgain) {
  const TempDir tmp("fallback_resave");
  const std::string dir = tmp.path();
  ServerProcess server(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(server.StartOn(dir + "/server").ok()) << server.Log();
  const std::string store = " --storage " + server.address();
  const RunResult trained = Train("--steps 8 --ckpt-mode sync --ckpt-every 4 --job j" + store);
  ASSERT_EQ(trained.exit_code, 0) << trained.out;
  ASSERT_EQ(server.Stop(), 0) << server.Log();
  ASSERT_EQ(FlipSegmentBytes(dir + "/server", "j", 8, 0), 1);
  ASSERT_TRUE(server.Restart().ok()) << server.Log();
  const RunResult again =
      Train("--steps 8 --ckpt-mode sync --ckpt-every 4 --resume latest --job j" + store);
  ASSERT_TRUE(IsOk(ResumedFrom(again, 4)));
  EXPECT_EQ(SummaryField(again.out, "ckpt_failures"), "1") << again.out;
  EXPECT_EQ(SummaryField(again.out, "recovery_point"), "4") << again.out;
  EXPECT_TRUE(absl::StrContains(again.out, "does not read back")) << again.out;
}

// Two servers; the one holding rank 0 comes back with a copy of its data taken before FULL 8
// was written. FULL 8 is still listed (the other node committed it) but rank 0 of it is held by
// no node: `restore latest` and `export latest` go back to FULL 4 with a warning naming the
// damage (before: DATA_LOSS, exit 3, while the trainer's resume went back), and the resume
// agrees.
TEST(FallbackTest, FullWithARankNoNodeHoldsFallsBackInTheCli) {
  const TempDir tmp("fallback_lost_node");
  const std::string dir = tmp.path();
  ServerProcess a(GRADSNAP_SERVER_BIN), b(GRADSNAP_SERVER_BIN);
  ASSERT_TRUE(a.StartOn(dir + "/a").ok()) << a.Log();
  ASSERT_TRUE(b.StartOn(dir + "/b").ok()) << b.Log();
  client::ClientOptions both;
  both.endpoints = {a.address(), b.address()};
  auto keys = client::StaticPlacementKeys(both);  // the nodes' ids, as the trainer ranks them
  ASSERT_TRUE(keys.ok()) << keys.status();
  const bool a_holds_rank0 = client::RankEndpoints(*keys, "j", 0)[0] == 0;
  ServerProcess& loser = a_holds_rank0 ? a : b;
  const std::string loser_dir = dir + (a_holds_rank0 ? "/a" : "/b");
  const std::string store = " --storage " + a.address() + "," + b.address();
  const std::string flags = " --ckpt-mode sync --ckpt-every 4 --job j" + store;
  const RunResult first = Train("--steps 4" + flags);
  ASSERT_EQ(first.exit_code, 0) << first.out;
  ASSERT_EQ(loser.Stop(), 0) << loser.Log();
  std::filesystem::copy(loser_dir, dir + "/backup", std::filesystem::copy_options::recursive);
  ASSERT_TRUE(loser.Restart().ok()) << loser.Log();
  const RunResult second = Train("--steps 8 --resume latest" + flags);
  ASSERT_EQ(second.exit_code, 0) << second.out;
  ASSERT_EQ(loser.Stop(), 0) << loser.Log();
  std::filesystem::remove_all(loser_dir);
  std::filesystem::rename(dir + "/backup", loser_dir);
  ASSERT_TRUE(loser.Restart().ok()) << loser.Log();
  const std::string cli = kCli + " --server " + a.address() + "," + b.address();
  const RunResult restored = RunCommand(cli + " restore j latest --out " + dir + "/latest");
  EXPECT_EQ(restored.exit_code, 0) << restored.out;
  EXPECT_TRUE(absl::StrContains(restored.out, "damaged record skipped: ")) << restored.out;
  EXPECT_TRUE(absl::StrContains(restored.out, "rank 0: no node holds its data")) << restored.out;
  EXPECT_TRUE(absl::StrContains(restored.out, "fell back from step 8 to 4")) << restored.out;
  EXPECT_EQ(SafetensorsMetadata(dir + "/latest/rank0.safetensors", "step"), "4") << restored.out;
  const size_t named = restored.out.find("no node holds its data");  // said once
  EXPECT_EQ(restored.out.find("no node holds its data", named + 1), std::string::npos)
      << restored.out;
  // Re-cut to one rank (replayed, not streamed as stored): the damage is named once as well.
  const RunResult recut =
      RunCommand(cli + " restore j latest --world-size 1 --out " + dir + "/one");
  EXPECT_EQ(recut.exit_code, 0) << recut.out;
  const size_t once = recut.out.find("no node holds its data");
  EXPECT_NE(once, std::string::npos) << recut.out;
  EXPECT_EQ(recut.out.find("no node holds its data", once + 1), std::string::npos) << recut.out;
  EXPECT_TRUE(absl::StrContains(recut.out, "job j step 4 (full 4)")) << recut.out;
  const std::string file = dir + "/latest.safetensors";
  const RunResult exported = RunCommand(cli + " export j latest --out " + file);
  EXPECT_EQ(exported.exit_code, 0) << exported.out;
  EXPECT_EQ(SafetensorsMetadata(dir + "/latest.rank0.safetensors", "step"), "4");
  EXPECT_EQ(SafetensorsMetadata(dir + "/latest.rank1.safetensors", "step"), "4");
  // A named step is not replaced by another: still DATA_LOSS.
  const RunResult named8 = RunCommand(cli + " restore j 8 --out " + dir + "/eight");
  EXPECT_EQ(named8.exit_code, 3) << named8.out;
  // The CLI's restore of step 4 is what the trainer resumes from.
  const RunResult resumed = Train("--steps 8 --resume latest --job j" + store);
  ASSERT_TRUE(IsOk(ResumedFrom(resumed, 4)));
  EXPECT_EQ(SummaryField(resumed.out, "params_sha256"), SummaryField(second.out, "params_sha256"))
      << resumed.out;
  const RunResult from_dir = Train("--steps 8 --init-from " + dir + "/latest");
  ASSERT_EQ(from_dir.exit_code, 0) << from_dir.out;
  EXPECT_EQ(SummaryField(from_dir.out, "params_sha256"), SummaryField(second.out, "params_sha256"));
}

}  // namespace
}  // namespace testing
}  // namespace gradsnap
