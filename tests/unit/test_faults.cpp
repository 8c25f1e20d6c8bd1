// Injected faults (TANDEM_FAULT) in real multi-rank `tandem train` runs: a rank that hangs
// or exits mid-step ends the whole job with an error within a deadline, and a save cut
// short by a dying process leaves the previous checkpoint loadable and resumable.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fault_util.h"
#include "io/safetensors.h"

namespace tandem::cli_test {
namespace {

// ---------------------------------------------------------------------------------------
// A rank that stops mid-step.

TEST(Faults, HangingRankEndsTheJobWithATimeoutNamingTheCollective) {
  TempDir dir;
  const std::string data = token_file(dir), metrics = dir / "metrics.jsonl";
  JobTag tag;
  ScopedEnv fault("TANDEM_FAULT", "1:step3:hang");
  const Timed t = run_timed(train_args(
      data, 2,
      {"--model", "gpt2-tiny", "--steps", "6", "--comm-timeout", "3", "--metrics", metrics}));
  std::printf("[faults] hanging rank: job ended after %.1f s\n", t.seconds);
  ASSERT_TRUE(ended_with_failure(t));
  EXPECT_TRUE(contains(t.r.err, "injected fault: rank 1 hangs at step3")) << t.r.describe();
  // Rank 0 reports the collective it was waiting in when its peer stopped.
  std::string line;
  std::istringstream err(t.r.err);
  for (std::string l; std::getline(err, l);)
    if (contains(l, "tandem: error: [rank 0]") && contains(l, "timed out")) line = l;
  ASSERT_FALSE(line.empty()) << "no timeout error from rank 0\n" << t.r.describe();
  EXPECT_TRUE(contains(line, "all-gather") || contains(line, "reduce-scatter") ||
              contains(line, "all-reduce"))
      << "the error does not name the collective: " << line;
  EXPECT_TRUE(contains(line, "'embedding'") || contains(line, "'block.") ||
              contains(line, "'head'"))
      << "the error does not name the unit: " << line;
  EXPECT_TRUE(contains(line, "rank 0 of 2")) << line;
  // Steps 1 and 2 completed; step 3 never did.
  const std::vector<nlohmann::json> lines = read_metrics(metrics);
  ASSERT_EQ(lines.size(), 2u) << read_file(metrics);
  EXPECT_EQ(lines.back()["step"], 2);
  EXPECT_TRUE(nothing_left_running(tag));
}

TEST(Faults, ExitingRankEndsTheJob) {
  TempDir dir;
  const std::string data = token_file(dir);
  JobTag tag;
  ScopedEnv fault("TANDEM_FAULT", "1:step3:exit");
  // A comm timeout past the deadline: the job must end because mpirun notices the dead
  // rank and tears the others down, not because a collective gives up.
  const Timed t = run_timed(
      train_args(data, 2, {"--model", "gpt2-tiny", "--steps", "6", "--comm-timeout", "600"}));
  std::printf("[faults] exiting rank: job ended after %.1f s\n", t.seconds);
  ASSERT_TRUE(ended_with_failure(t));
  EXPECT_TRUE(contains(t.r.err, "injected fault: rank 1 exits at step3")) << t.r.describe();
  EXPECT_TRUE(nothing_left_running(tag));
}

// ---------------------------------------------------------------------------------------
// A save cut short.

// Trains 2 steps with a checkpoint after each, then resumes towards step 4 while rank 0
// dies inside the save of step 3 (its shard file written, the index not yet). The step-2
// checkpoint must survive: it exports, and a resume from it reproduces the unbroken run.
void check_interrupted_save(int ranks) {
  TempDir dir;
  const std::string data = token_file(dir), ckpt = dir / "ckpt";

  const std::string ref_metrics = dir / "reference.jsonl";
  ASSERT_TRUE(succeeded(run_tandem(
      train_args(data, ranks, {"--model", "gpt2-tiny", "--steps", "3", "--metrics", ref_metrics}),
      kDeadlineS)));
  const std::vector<nlohmann::json> reference = read_metrics(ref_metrics);
  ASSERT_EQ(reference.size(), 3u);

  ASSERT_TRUE(succeeded(run_tandem(
      train_args(data, ranks,
                 {"--model", "gpt2-tiny", "--steps", "2", "--save", ckpt, "--save-every", "1"}),
      kDeadlineS)));
  {
    JobTag tag;
    ScopedEnv fault("TANDEM_FAULT", "0:save:exit");
    const Timed t = run_timed(train_args(
        data, ranks, {"--resume", ckpt, "--steps", "4", "--save", ckpt, "--save-every", "1"}));
    std::printf("[faults] save interrupted at %d rank(s): job ended after %.1f s\n", ranks,
                t.seconds);
    ASSERT_TRUE(ended_with_failure(t));
    EXPECT_TRUE(contains(t.r.err, "injected fault: rank 0 exits at save")) << t.r.describe();
    EXPECT_TRUE(nothing_left_running(tag));
  }
  // The fault struck mid-save: step 3's shard file exists, but the index still says 2.
  bool step3_file = false;
  for (const auto& e : fs::directory_iterator(ckpt))
    step3_file = step3_file || e.path().filename().string().rfind("step-00000003-", 0) == 0;
  EXPECT_TRUE(step3_file) << "the save of step 3 never wrote its shard file";
  EXPECT_EQ(nlohmann::json::parse(read_file(ckpt + "/index.json"))["step"], 2);

  const std::string exported = dir / "model.safetensors";
  const RunResult ex = run_tandem({"export", "--checkpoint", ckpt, "--out", exported}, kDeadlineS);
  ASSERT_TRUE(succeeded(ex));
  EXPECT_FALSE(safetensors_read(exported).tensors.empty());

  const std::string resumed_metrics = dir / "resumed.jsonl";
  ASSERT_TRUE(succeeded(run_tandem(
      train_args(data, ranks,
                 {"--resume", ckpt, "--steps", "3", "--save", ckpt, "--metrics", resumed_metrics}),
      kDeadlineS)));
  const std::vector<nlohmann::json> resumed = read_metrics(resumed_metrics);
  ASSERT_EQ(resumed.size(), 1u);
  EXPECT_EQ(resumed[0]["step"], 3);
  const double want = reference[2]["loss"].get<double>();
  EXPECT_NEAR(resumed[0]["loss"].get<double>(), want, 1e-6 * want)
      << "the resumed run does not continue the unbroken one";
  EXPECT_EQ(nlohmann::json::parse(read_file(ckpt + "/index.json"))["step"], 3);
}

TEST(Faults, InterruptedSaveKeepsThePreviousCheckpointAtOneRank) {
  check_interrupted_save(1);
}

TEST(Faults, InterruptedSaveKeepsThePreviousCheckpointAtTwoRanks) {
  check_interrupted_save(2);
}

}  // namespace
}  // namespace tandem::cli_test
