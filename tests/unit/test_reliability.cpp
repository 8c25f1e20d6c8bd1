// Nothing lost under kill, preemption, divergence or a full disk, tried on real `tandem
// train` jobs: a save never destroys the last good checkpoint, two runs never share a
// checkpoint directory, a NaN stops the run (or is skipped) before it reaches a checkpoint,
// output that cannot be written is an error, and SIGINT/SIGTERM to a run, its launcher or
// one of its ranks saves and exits with the documented status.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/fault.h"
#include "fault_util.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "io/shard_checkpoint.h"
#include "train/trainer.h"

namespace tandem::cli_test {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> tiny(const std::string& data, int ranks, std::vector<std::string> extra) {
  extra.insert(extra.begin(), {"--model", "gpt2-tiny"});
  return train_args(data, ranks, extra);
}

int index_step(const std::string& ckpt) {
  return nlohmann::json::parse(read_file(ckpt + "/index.json"))["step"].get<int>();
}

std::vector<std::string> listing(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The whole model of a checkpoint, every element compared bitwise by the caller.
std::vector<std::vector<float>> params_of(const std::string& ckpt) {
  return checkpoint_load_params(ckpt);
}

// ---------------------------------------------------------------------------------------
// A save never destroys the last good checkpoint.

TEST(Reliability, SaveIntoAnotherRunsCheckpointIsRefused) {
  TempDir dir;
  const std::string data = token_file(dir), ckpt = dir / "ckpt";
  ASSERT_TRUE(succeeded(run_tandem(tiny(data, 1, {"--steps", "2", "--save", ckpt}))));
  const auto before = params_of(ckpt);
  // A fresh run into the same directory: refused before any step, the checkpoint untouched.
  const RunResult r = run_tandem(tiny(data, 1, {"--steps", "2", "--seed", "7", "--save", ckpt}));
  EXPECT_TRUE(one_error_line(r, 1,
                             {ckpt, "already holds a checkpoint of model 'gpt2-tiny' at step 2",
                              "--resume", "--save-overwrite"}));
  EXPECT_EQ(index_step(ckpt), 2);
  EXPECT_EQ(params_of(ckpt), before);
  // Continuing it is the same run.
  ASSERT_TRUE(
      succeeded(run_tandem(tiny(data, 1, {"--resume", ckpt, "--steps", "3", "--save", ckpt}))));
  EXPECT_EQ(index_step(ckpt), 3);
  // --save-overwrite replaces it.
  ASSERT_TRUE(succeeded(run_tandem(
      tiny(data, 1, {"--steps", "1", "--seed", "7", "--save", ckpt, "--save-overwrite"}))));
  EXPECT_EQ(index_step(ckpt), 1);
}

// The case that once lost both checkpoints: a run saving a step that the directory already
// holds, killed after writing its shard files and before its index. The old checkpoint must
// still load, bit for bit; the finished overwrite then replaces it.
void killed_overwrite_keeps_the_old_checkpoint(int ranks) {
  TempDir dir;
  const std::string data = token_file(dir), ckpt = dir / "ckpt";
  ASSERT_TRUE(succeeded(run_tandem(tiny(data, ranks, {"--steps", "2", "--save", ckpt}))));
  const auto before = params_of(ckpt);
  {
    JobTag tag;
    ScopedEnv fault("TANDEM_FAULT", "0:save:exit");
    const Timed t = run_timed(
        tiny(data, ranks, {"--steps", "2", "--seed", "9", "--save", ckpt, "--save-overwrite"}));
    ASSERT_TRUE(ended_with_failure(t));
    EXPECT_TRUE(contains(t.r.err, "injected fault: rank 0 exits at save")) << t.r.describe();
    EXPECT_TRUE(nothing_left_running(tag));
  }
  EXPECT_EQ(index_step(ckpt), 2);
  EXPECT_EQ(params_of(ckpt), before) << "the interrupted save changed the old checkpoint";
  ASSERT_TRUE(succeeded(run_tandem(
      tiny(data, ranks, {"--steps", "2", "--seed", "9", "--save", ckpt, "--save-overwrite"}))));
  EXPECT_EQ(index_step(ckpt), 2);
  EXPECT_NE(params_of(ckpt), before);
  // Only the new save's files remain (the same step, so under the other name).
  const std::vector<std::string> files = listing(ckpt);
  for (const std::string& f : files)
    if (f.rfind("step-", 0) == 0) {
      EXPECT_EQ(f.rfind("step-00000002-1-shard", 0), 0u) << f;
    }
}

TEST(Reliability, KilledOverwriteKeepsTheOldCheckpointAtOneRank) {
  killed_overwrite_keeps_the_old_checkpoint(1);
}

TEST(Reliability, KilledOverwriteKeepsTheOldCheckpointAtTwoRanks) {
  killed_overwrite_keeps_the_old_checkpoint(2);
}

TEST(Reliability, TwoRunsCannotShareASaveDirectory) {
  TempDir dir;
  const std::string data = token_file(dir), ckpt = dir / "ckpt";
  fs::create_directories(ckpt);
  {
    const DirectoryLock held(ckpt, "checkpoint directory");
    const RunResult r = run_tandem(tiny(data, 1, {"--steps", "2", "--save", ckpt}));
    EXPECT_TRUE(one_error_line(
        r, 1,
        {ckpt, "in use by another tandem run", "(process " + std::to_string(::getpid()) + ")"}));
  }
  // Released: the directory is free again.
  EXPECT_TRUE(succeeded(run_tandem(tiny(data, 1, {"--steps", "2", "--save", ckpt}))));
}

// [Fault suite] kill -9 at moments spread over runs that save after every step, from a fixed
// seed: into a fresh directory (it holds either nothing or a loadable checkpoint) and into
// one holding another run's checkpoint with --save-overwrite (it always holds a loadable
// one). Prints the trials and the checkpoints lost; none may be.
void kill_during_saves(int ranks, bool occupied, int trials) {
  std::mt19937 moments(ranks * 10 + (occupied ? 1 : 0));
  // The moments spread over a whole run, timed once unbroken on this machine: start-up
  // (loading libraries, at two ranks mpirun) is most of it, the six saves the rest.
  int span_ms = 0;
  {
    TempDir dir;
    const std::string data = token_file(dir), ckpt = dir / "ckpt";
    const Timed whole = run_timed(
        tiny(data, ranks, {"--steps", "6", "--save", ckpt, "--save-every", "1", "--seed", "5"}));
    ASSERT_TRUE(succeeded(whole.r));
    span_ms = std::max(100, static_cast<int>(whole.seconds * 1e3));
  }
  int lost = 0, killed_mid_run = 0, loaded = 0;
  for (int trial = 0; trial < trials; ++trial) {
    TempDir dir;
    const std::string data = token_file(dir), ckpt = dir / "ckpt";
    if (occupied) {
      ASSERT_TRUE(succeeded(run_tandem(tiny(data, ranks, {"--steps", "1", "--save", ckpt}))));
    }
    JobTag tag;
    std::vector<std::string> args =
        tiny(data, ranks, {"--steps", "6", "--save", ckpt, "--save-every", "1", "--seed", "5"});
    if (occupied) args.push_back("--save-overwrite");
    const int at_ms = std::uniform_int_distribution<int>(20, span_ms)(moments);
    BackgroundJob job(args, dir / "out.txt", dir / "err.txt");
    std::this_thread::sleep_for(std::chrono::milliseconds(at_ms));
    // The whole job: at two ranks the launcher, mpirun and the ranks.
    for (pid_t pid : tagged_processes(tag.entry())) ::kill(pid, SIGKILL);
    ::kill(job.pid(), SIGKILL);
    const RunResult r = job.wait();
    killed_mid_run += r.signal == SIGKILL ? 1 : 0;
    EXPECT_TRUE(nothing_left_running(tag));
    const bool has_index = fs::exists(ckpt + "/index.json");
    if (occupied && !has_index) {
      ++lost;
      continue;
    }
    if (!has_index) continue;
    try {
      checkpoint_load_params(ckpt);
      ++loaded;
    } catch (const std::exception& e) {
      ++lost;
      ADD_FAILURE() << "trial " << trial << " (kill at " << at_ms << " ms): " << e.what();
    }
  }
  std::printf(
      "[fault suite] kill -9 during saves, %d rank(s), %s directory: %d trials over a run of "
      "%d ms, %d killed mid-run, %d checkpoints loaded, %d lost\n",
      ranks, occupied ? "occupied" : "fresh", trials, span_ms, killed_mid_run, loaded, lost);
  EXPECT_EQ(lost, 0);
}

TEST(Reliability, KillDuringSavesOneRankFreshDirectory) {
  kill_during_saves(1, false, 20);
}
TEST(Reliability, KillDuringSavesOneRankOccupiedDirectory) {
  kill_during_saves(1, true, 20);
}
TEST(Reliability, KillDuringSavesTwoRanksFreshDirectory) {
  kill_during_saves(2, false, 20);
}
TEST(Reliability, KillDuringSavesTwoRanksOccupiedDirectory) {
  kill_during_saves(2, true, 20);
}

// ---------------------------------------------------------------------------------------
// Non-finite numbers stop the run before they spread.

void nan_stops_the_run(int ranks, int fault_rank) {
  TempDir dir;
  const std::string data = token_file(dir), ckpt = dir / "ckpt", metrics = dir / "m.jsonl";
  JobTag tag;
  ScopedEnv fault("TANDEM_FAULT", std::to_string(fault_rank) + ":step3:nan");
  const Timed t = run_timed(tiny(
      data, ranks, {"--steps", "5", "--save", ckpt, "--save-every", "1", "--metrics", metrics}));
  ASSERT_TRUE(ended_with_failure(t));
  EXPECT_EQ(t.r.exit_code, 1) << t.r.describe();
  const std::string line = last_line(t.r.err);
  EXPECT_EQ(line.rfind("tandem: error: ", 0), 0u) << t.r.describe();
  for (const std::string& part : std::vector<std::string>{
           "step 3", "gradient norm nan", "NaN or Inf in the gradients of 'head'",
           "the update was not applied", "the last checkpoint in '" + ckpt + "' is kept",
           "--skip-nonfinite"})
    EXPECT_TRUE(contains(line, part)) << "missing '" << part << "' in: " << line;
  EXPECT_EQ(index_step(ckpt), 2);
  EXPECT_EQ(read_metrics(metrics).size(), 2u);
  EXPECT_TRUE(nothing_left_running(tag));
}

TEST(Reliability, NanGradientStopsTheRunAndKeepsTheCheckpoint) {
  nan_stops_the_run(1, 0);
}

TEST(Reliability, NanGradientOnOneRankStopsEveryRank) {
  nan_stops_the_run(2, 1);
}

TEST(Reliability, SkipNonfiniteLeavesTheParametersUntouched) {
  TempDir dir;
  TrainOptions o;
  o.model = "gpt2-tiny";
  o.data = token_file(dir);
  o.seq = 16;
  o.batch = 1;
  o.steps = 5;
  o.progress = ProgressMode::none;
  o.skip_nonfinite = 1;
  o.metrics = dir / "m.jsonl";
  fault_configure("0:step3:nan");
  struct Disarm {
    ~Disarm() { fault_configure(""); }
  } disarm;
  Trainer t(o);
  t.step();
  t.step();
  const ShardState before = t.engine().shards();
  const StepMetrics skipped = t.step();
  EXPECT_TRUE(skipped.skipped);
  EXPECT_TRUE(std::isfinite(skipped.loss));
  EXPECT_TRUE(std::isnan(skipped.grad_norm));
  const ShardState after = t.engine().shards();
  EXPECT_EQ(after.params, before.params) << "a skipped step changed the parameters";
  EXPECT_EQ(after.m, before.m);
  EXPECT_EQ(after.v, before.v);
  const StepMetrics next = t.step();
  EXPECT_FALSE(next.skipped);
  EXPECT_NE(t.engine().shards().params, before.params);
  // Metrics: the skipped step says so; JSON has no NaN, so its norm is null.
  const nlohmann::json j = step_metrics_to_json(skipped);
  EXPECT_TRUE(j["skipped"].get<bool>());
  EXPECT_EQ(j["nonfinite"], nlohmann::json::array({"grad_norm"}));
  EXPECT_TRUE(j["grad_norm"].is_null());
  EXPECT_FALSE(step_metrics_to_json(next).contains("skipped"));
}

TEST(Reliability, SkipNonfiniteAllowsOnlyTheGivenCount) {
  TempDir dir;
  const std::string data = token_file(dir), metrics = dir / "m.jsonl";
  {
    ScopedEnv fault("TANDEM_FAULT", "0:step3:nan");
    const RunResult r =
        run_tandem(tiny(data, 1, {"--steps", "5", "--skip-nonfinite", "1", "--metrics", metrics}));
    ASSERT_TRUE(succeeded(r));
    EXPECT_TRUE(contains(r.err, "tandem: warning: step 3")) << r.describe();
    EXPECT_TRUE(contains(r.err, "update skipped (1 of 1 allowed by --skip-nonfinite)"));
  }
  const std::vector<nlohmann::json> lines = read_metrics(metrics);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_TRUE(lines[2]["skipped"].get<bool>());
  for (size_t i : {0u, 1u, 3u, 4u}) EXPECT_FALSE(lines[i].contains("skipped")) << i;
}

TEST(Reliability, NonFiniteOptionValuesAreRefused) {
  TempDir dir;
  const std::string data = token_file(dir);
  for (const std::string& flag :
       std::vector<std::string>{"--weight-decay", "--eps", "--grad-clip"}) {
    const RunResult r = run_tandem(tiny(data, 1, {"--steps", "2", flag, "inf"}));
    EXPECT_TRUE(one_error_line(r, 1, {flag})) << flag;
  }
  EXPECT_TRUE(one_error_line(run_tandem(tiny(data, 1, {"--steps", "10", "--warmup", "20"})), 1,
                             {"--warmup 20 exceeds --steps 10"}));
  EXPECT_TRUE(
      one_error_line(run_tandem(tiny(data, 1, {"--steps", "2", "--seed", "-1"})), 2, {"--seed"}));
  EXPECT_TRUE(one_error_line(run_tandem(tiny(data, 1, {"--steps", "2", "--mem-limit", "1KiB"})), 1,
                             {"--mem-limit is 1.0 KiB"}));
}

// ---------------------------------------------------------------------------------------
// Output that fails is an error.

TEST(Reliability, MetricsOnAFullDiskIsAnError) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  TempDir dir;
  const RunResult r =
      run_tandem(tiny(token_file(dir), 1, {"--steps", "2", "--metrics", "/dev/full"}));
  EXPECT_TRUE(one_error_line(r, 1, {"cannot write to '/dev/full'"}));
}

TEST(Reliability, TokenCountPastTwoToTheSixtyFourBytesIsNamed) {
  TempDir dir;
  const std::string path = dir / "huge.tok";
  tokens_write(path, {1, 2, 3}, 2);
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  const uint64_t count = uint64_t{1} << 63;  // the header's token count, at byte 16
  f.seekp(16);
  f.write(reinterpret_cast<const char*>(&count), sizeof count);
  f.close();
  const RunResult r = run_tandem(tiny(path, 1, {"--steps", "1"}));
  EXPECT_TRUE(one_error_line(r, 1, {path, "more than 2^64 bytes"}));
}

// ---------------------------------------------------------------------------------------
// Preemption and interrupts.

// Signals a long run once its metrics show `after` steps, then checks that it saved, said
// so in one line and exited with `code`, and that resuming it gives the unbroken run's
// losses bit for bit. to_rank: signal rank 1 of a two-rank job instead of the launcher.
void interrupt_and_resume(int ranks, int sig, int code, bool to_rank) {
  TempDir dir;
  const std::string data = token_file(dir), ckpt = dir / "ckpt";
  const std::string ref_metrics = dir / "ref.jsonl", metrics = dir / "m.jsonl";
  ASSERT_TRUE(succeeded(
      run_tandem(tiny(data, ranks, {"--steps", "60", "--metrics", ref_metrics}), kDeadlineS)));
  const std::vector<nlohmann::json> reference = read_metrics(ref_metrics);
  ASSERT_EQ(reference.size(), 60u);

  JobTag tag;
  RunResult r;
  {
    BackgroundJob job(
        tiny(data, ranks, {"--steps", "100000", "--save", ckpt, "--metrics", metrics}),
        dir / "out.txt", dir / "err.txt");
    ASSERT_TRUE(wait_for_lines(metrics, 3)) << read_file(dir / "err.txt");
    pid_t target = job.pid();
    if (to_rank) {
      target = -1;
      for (pid_t pid : tagged_processes(tag.entry())) {
        std::ifstream in("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
        for (std::string var; std::getline(in, var, '\0');)
          if (var == "OMPI_COMM_WORLD_RANK=1") target = pid;
      }
      ASSERT_GT(target, 0) << "rank 1 of the job was not found";
    }
    ASSERT_EQ(::kill(target, sig), 0);
    r = job.wait();
  }
  EXPECT_FALSE(r.timed_out) << r.describe();
  EXPECT_EQ(r.exit_code, code) << r.describe();
  EXPECT_TRUE(nothing_left_running(tag));
  const int stopped = index_step(ckpt);
  const std::string name = sig == SIGINT ? "SIGINT" : "SIGTERM";
  EXPECT_TRUE(contains(r.out, "interrupted by " + name + " after step " + std::to_string(stopped) +
                                  ": checkpoint saved to '" + ckpt))
      << r.describe();
  EXPECT_EQ(read_metrics(metrics).size(), static_cast<size_t>(stopped));
  ASSERT_LE(stopped + 2, 60) << "the run was not interrupted early enough to compare";

  const std::string resumed_metrics = dir / "resumed.jsonl";
  ASSERT_TRUE(succeeded(run_tandem(tiny(data, ranks,
                                        {"--resume", ckpt, "--steps", std::to_string(stopped + 2),
                                         "--metrics", resumed_metrics}),
                                   kDeadlineS)));
  const std::vector<nlohmann::json> resumed = read_metrics(resumed_metrics);
  ASSERT_EQ(resumed.size(), 2u);
  for (size_t i = 0; i < 2; ++i)
    EXPECT_EQ(resumed[i]["loss"].get<double>(),
              reference[static_cast<size_t>(stopped) + i]["loss"].get<double>())
        << "step " << stopped + 1 + static_cast<int>(i) << " after resuming differs";
}

TEST(Reliability, SigtermSavesAndTheResumedRunIsBitwiseTheSame) {
  interrupt_and_resume(1, SIGTERM, 143, false);
}

TEST(Reliability, SigintSavesAtOneRank) {
  interrupt_and_resume(1, SIGINT, 130, false);
}

TEST(Reliability, SigintToTheLauncherSavesEveryRank) {
  interrupt_and_resume(2, SIGINT, 130, false);
}

TEST(Reliability, SigtermToTheLauncherSavesEveryRank) {
  interrupt_and_resume(2, SIGTERM, 143, false);
}

TEST(Reliability, SigtermToOneRankSavesEveryRank) {
  interrupt_and_resume(2, SIGTERM, 143, true);
}

// The signal reaches rank 1 only: rank 0, which prints the line, names the signal rank 1
// got (the ranks agree on the signal, not only on stopping).
TEST(Reliability, SigintToOneRankIsNamedByEveryRank) {
  interrupt_and_resume(2, SIGINT, 130, true);
}

TEST(Reliability, KilledLauncherLeavesNoRanksBehind) {
  TempDir dir;
  const std::string data = token_file(dir), metrics = dir / "m.jsonl";
  JobTag tag;
  BackgroundJob job(tiny(data, 2, {"--steps", "100000", "--metrics", metrics}), dir / "out.txt",
                    dir / "err.txt");
  ASSERT_TRUE(wait_for_lines(metrics, 1)) << read_file(dir / "err.txt");
  ASSERT_EQ(::kill(job.pid(), SIGKILL), 0);
  job.wait();
  EXPECT_TRUE(nothing_left_running(tag));
}

TEST(Reliability, AMultiRankErrorIsTheLastLine) {
  TempDir dir;
  const std::string data = token_file(dir);
  ScopedEnv fault("TANDEM_FAULT", "1:step2:nan");
  const RunResult r = run_tandem(tiny(data, 2, {"--steps", "4"}), kDeadlineS);
  ASSERT_NE(r.exit_code, 0) << r.describe();
  const std::string line = last_line(r.err);
  EXPECT_EQ(line.rfind("tandem: error: [rank ", 0), 0u) << r.describe();
  EXPECT_TRUE(contains(line, "training diverged")) << line;
}

}  // namespace
}  // namespace tandem::cli_test

namespace tandem::cli_test {
namespace {

TEST(Reliability, GenerateRefusesUnboundedAndNonFiniteSettings) {
  TempDir dir;
  const std::string ckpt = dir / "ckpt";
  ASSERT_TRUE(succeeded(run_tandem(tiny(token_file(dir), 1, {"--steps", "1", "--save", ckpt}))));
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", ckpt, "--tokens", "1000000"}),
                             1, {"--tokens"}));
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", ckpt, "--temperature", "inf"}),
                             1, {"--temperature must be a finite number"}));
}

// Weights with a NaN (here in a Hugging Face directory, which tandem did not write) would
// give non-finite logits: generate refuses them, naming the unit, instead of printing what
// it sampled; so does the cache-free reference, from the logits.
TEST(Reliability, GenerateStopsOnNonFiniteLogits) {
  TempDir dir;
  const std::string ckpt = dir / "ckpt", hf = dir / "hf";
  ASSERT_TRUE(succeeded(run_tandem(tiny(token_file(dir), 1, {"--steps", "1", "--save", ckpt}))));
  ASSERT_TRUE(
      succeeded(run_tandem({"export", "--format", "hf", "--checkpoint", ckpt, "--out", hf})));
  SafeTensorsFile f = safetensors_read(hf + "/model.safetensors");
  bool poisoned = false;
  for (SafeTensor& t : f.tensors)
    if (t.dtype == "F32" && t.name.find("ln_f.weight") != std::string::npos) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(t.data.data(), &nan, sizeof nan);
      poisoned = true;
    }
  ASSERT_TRUE(poisoned) << "no ln_f.weight in the export";
  safetensors_write(hf + "/model.safetensors", f.tensors, f.metadata);
  const RunResult r = run_tandem({"generate", "--checkpoint", hf, "--tokens", "4"});
  ASSERT_NE(r.exit_code, 0) << r.describe();
  EXPECT_TRUE(contains(last_line(r.err), "of unit head is nan: the weights hold NaN or Inf"))
      << r.describe();
  EXPECT_EQ(r.out.find('\0'), std::string::npos) << "generate printed NUL bytes";
  const RunResult ref =
      run_tandem({"generate", "--checkpoint", hf, "--tokens", "4", "--recompute"});
  ASSERT_NE(ref.exit_code, 0) << ref.describe();
  EXPECT_TRUE(contains(last_line(ref.err), "logits are not finite")) << ref.describe();
}

TEST(Reliability, DataPrepareRefusesToWriteOverItsInput) {
  TempDir dir;
  const std::string text = dir / "a.txt";
  { std::ofstream(text) << "some text\n"; }
  const RunResult r = run_tandem({"data", "prepare", "--text", text, "--out", text});
  EXPECT_TRUE(one_error_line(r, 1, {"it is the input text file"}));
  EXPECT_EQ(read_file(text), "some text\n");
}

}  // namespace
}  // namespace tandem::cli_test
