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

#include "cli_runner.h"
#include "io/safetensors.h"
#include "io/tokens.h"

namespace tandem::cli_test {
namespace {

namespace fs = std::filesystem;

// Each job gets this long; the faults below must end it far sooner (seconds).
constexpr int kDeadlineS = 60;

// Sets an environment variable for the runs of one test (run_tandem passes the test's
// environment to the child) and restores the previous value afterwards.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::string& value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    ::setenv(name_.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Tags every process of one job (the launcher, mpirun and the ranks all inherit it), so the
// test can tell afterwards whether any of them outlived the job.
class JobTag {
 public:
  JobTag()
      : entry_("TANDEM_FAULT_TEST_JOB=" + std::to_string(::getpid()) + "-" +
               std::to_string(counter_++)),
        env_("TANDEM_FAULT_TEST_JOB", entry_.substr(entry_.find('=') + 1)) {}
  const std::string& entry() const { return entry_; }

 private:
  static inline int counter_ = 0;
  std::string entry_;
  ScopedEnv env_;
};

// Processes other than this one whose initial environment holds `entry`.
std::vector<pid_t> tagged_processes(const std::string& entry) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (pid == ::getpid()) continue;
    std::ifstream in(e.path() / "environ", std::ios::binary);
    std::string var;
    while (std::getline(in, var, '\0'))
      if (var == entry) {
        out.push_back(pid);
        break;
      }
  }
  return out;
}

// Every process of the job is gone within a few seconds of its end. Any that is not is
// killed (it was started by this test: it carries the job's tag) and reported.
::testing::AssertionResult nothing_left_running(const JobTag& tag) {
  std::vector<pid_t> left;
  for (int i = 0; i < 100; ++i) {
    left = tagged_processes(tag.entry());
    if (left.empty()) return ::testing::AssertionSuccess();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::ostringstream msg;
  msg << "processes of the job still run 10 s after it ended:";
  for (pid_t pid : left) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
    std::string cmd(std::istreambuf_iterator<char>(in), {});
    for (char& c : cmd)
      if (c == '\0') c = ' ';
    msg << "\n  " << pid << ": " << cmd;
    ::kill(pid, SIGKILL);
  }
  return ::testing::AssertionFailure() << msg.str();
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The per-step lines of a metrics file, without the summary line a finished run ends it
// with ({"summary": true, ...}, docs/formats.md).
std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line);
    if (!j.value("summary", false)) lines.push_back(std::move(j));
  }
  return lines;
}

std::string token_file(const TempDir& dir) {
  std::vector<uint32_t> tokens(800);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 32 + static_cast<uint32_t>(i * 13 % 90);
  const std::string path = dir / "data.tok";
  tokens_write(path, tokens, 2);
  return path;
}

// `tandem train` on tiny sequences at `ranks` ranks, plus `extra`. The learning rate is
// constant (--min-lr-ratio 1), so runs of different lengths take the same steps and a
// resumed run can be compared with an unbroken one.
std::vector<std::string> train_args(const std::string& data, int ranks,
                                    const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"train", "--data",         data, "--seq",      "16",  "--batch",
                                   "1",     "--min-lr-ratio", "1",  "--progress", "none"};
  if (ranks > 1) args.insert(args.end(), {"--ranks", std::to_string(ranks)});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

struct Timed {
  RunResult r;
  double seconds = 0;
};

Timed run_timed(const std::vector<std::string>& args) {
  const auto t0 = std::chrono::steady_clock::now();
  Timed t{run_tandem(args, kDeadlineS), 0};
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t;
}

// The job failed on its own: a nonzero exit, not the test's deadline.
::testing::AssertionResult ended_with_failure(const Timed& t) {
  if (t.r.timed_out)
    return ::testing::AssertionFailure()
           << "the job was still running after " << kDeadlineS << " s\n"
           << t.r.describe();
  if (t.r.exit_code == 0 && t.r.signal == 0)
    return ::testing::AssertionFailure() << "the job succeeded despite the fault\n"
                                         << t.r.describe();
  return ::testing::AssertionSuccess();
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

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
