// The sharding flags of the real tandem binary: --mem-limit, --strategy/--shard-group
// checks, `tandem plan --print-schedule`, multi-rank training of every strategy against one
// rank, export of a sharded checkpoint, and progress lines printed once per step.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "io/safetensors.h"
#include "io/tokens.h"

namespace tandem::cli_test {
namespace {

namespace fs = std::filesystem;

using namespace std::string_literals;

constexpr int kDeadlineS = 120;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The per-step lines of a metrics file; a finished run's last line, its summary
// ({"summary": true, ...}, docs/formats.md), is checked and left out.
std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  EXPECT_FALSE(lines.empty()) << path;
  if (!lines.empty()) {
    EXPECT_EQ(lines.back().value("summary", false), true) << "no summary line in " << path;
    lines.pop_back();
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

// `tandem train` of gpt2-tiny: 4 sequences of 16 tokens per step at any rank count, no
// progress output unless `extra` asks for it.
std::vector<std::string> train_args(const std::string& data, int ranks,
                                    const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args = {"train", "--model", "gpt2-tiny", "--data", data,
                                   "--seq", "16",      "--batch",   "1",      "--global-batch",
                                   "4",     "--steps", "3"};
  if (std::find(extra.begin(), extra.end(), "--progress") == extra.end())
    args.insert(args.end(), {"--progress", "none"});
  if (ranks > 1) args.insert(args.end(), {"--ranks", std::to_string(ranks)});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

size_t count_of(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// ---------------------------------------------------------------------------------------
// Flags checked before anything runs.

TEST(CliSharded, MemLimitTooSmallRefusesBeforeTraining) {
  TempDir dir;
  const std::string metrics = dir / "metrics.jsonl";
  const RunResult r =
      run_tandem(train_args(token_file(dir), 1, {"--mem-limit", "1MiB", "--metrics", metrics}));
  EXPECT_TRUE(one_error_line(r, 1, {"--mem-limit", "over by"}));
  EXPECT_FALSE(fs::exists(metrics)) << "a step ran although the plan does not fit";
}

TEST(CliSharded, MemLimitLargeEnoughPasses) {
  TempDir dir;
  EXPECT_TRUE(succeeded(run_tandem(train_args(token_file(dir), 1, {"--mem-limit", "100GiB"}))));
}

TEST(CliSharded, HybridWithoutShardGroup) {
  TempDir dir;
  EXPECT_TRUE(one_error_line(run_tandem(train_args(token_file(dir), 1, {"--strategy", "hybrid"})),
                             1, {"hybrid", "--shard-group"}));
}

TEST(CliSharded, UnknownStrategy) {
  TempDir dir;
  EXPECT_TRUE(one_error_line(run_tandem(train_args(token_file(dir), 1, {"--strategy", "bogus"})), 1,
                             {"strategy", "bogus"}));
}

// `tandem train` of gpt2-tiny for the recompute tests, plus `extra`. Sequences of 64:
// attention's [B, H, T, T] state outweighs the reduce scratch.
std::vector<std::string> recompute_train_args(const std::string& data, int steps,
                                              std::vector<std::string> extra) {
  std::vector<std::string> a = {"train",
                                "--model",
                                "gpt2-tiny",
                                "--data",
                                data,
                                "--seq",
                                "64",
                                "--batch",
                                "2",
                                "--global-batch",
                                "2",
                                "--steps",
                                std::to_string(steps),
                                "--progress",
                                "none"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// [Activation recompute] from the command: the same losses bit for bit in less memory, the
// planner's memory falling and its step time rising, and the flag's errors.
TEST(CliSharded, RecomputeTrainsTheSameStepsInLessMemory) {
  TempDir dir;
  const std::string data = token_file(dir);
  const auto args = [&](std::vector<std::string> extra) {
    return recompute_train_args(data, 3, std::move(extra));
  };
  std::vector<std::vector<nlohmann::json>> runs;
  for (const char* mode : {"none", "attention", "unit"}) {
    const std::string metrics = dir / (std::string(mode) + ".jsonl");
    const RunResult r = run_tandem(args({"--recompute", mode, "--metrics", metrics}), kDeadlineS);
    ASSERT_TRUE(succeeded(r)) << r.err;
    EXPECT_EQ(r.out.find(", recompute "s + mode) != std::string::npos, std::string(mode) != "none")
        << r.out;
    runs.push_back(read_metrics(metrics));
    ASSERT_EQ(runs.back().size(), 3u) << mode;
  }
  for (size_t m = 1; m < runs.size(); ++m)
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(runs[m][i]["loss"].get<double>(), runs[0][i]["loss"].get<double>()) << m;
      EXPECT_LT(runs[m][i]["peak_mem_bytes"].get<double>(),
                runs[m - 1][i]["peak_mem_bytes"].get<double>())
          << m;
    }
  EXPECT_TRUE(
      one_error_line(run_tandem(args({"--recompute", "blocks"})), 1, {"--recompute", "blocks"}));
  // A bound that the run recomputing blocks fits in (its peak, the reduce scratch
  // included, which --mem-limit leaves out) and the run keeping everything does not.
  const std::string limit =
      std::to_string(static_cast<uint64_t>(runs[2][0]["peak_mem_bytes"].get<double>()));
  EXPECT_TRUE(
      one_error_line(run_tandem(args({"--mem-limit", limit})), 1, {"--mem-limit", "over by"}));
  EXPECT_TRUE(succeeded(run_tandem(args({"--mem-limit", limit, "--recompute", "unit"}))));

  std::vector<nlohmann::json> plans;
  for (const char* mode : {"none", "attention", "unit"}) {
    const RunResult r = run_tandem({"plan", "--model", "gpt2-tiny", "--strategy", "full",
                                    "--recompute", mode, "--seq", "64", "--json"});
    ASSERT_TRUE(succeeded(r)) << r.err;
    plans.push_back(nlohmann::json::parse(r.out));
    EXPECT_EQ(plans.back()["recompute"], mode);
  }
  for (size_t m = 1; m < plans.size(); ++m) {
    const nlohmann::json &a = plans[m - 1]["strategies"][0], &b = plans[m]["strategies"][0];
    EXPECT_LT(b["peak_mem_bytes"].get<double>(), a["peak_mem_bytes"].get<double>()) << m;
    EXPECT_GT(b["compute_ms"].get<double>(), a["compute_ms"].get<double>()) << m;
  }
  EXPECT_TRUE(one_error_line(
      run_tandem({"plan", "--model", "gpt2-tiny", "--task", "generate", "--recompute", "unit"}), 1,
      {"--recompute", "training"}));
}

// [Partial recompute] from the command: the first 3 of gpt2-tiny's 4 blocks recomputing
// train the same losses bit for bit in memory between keeping everything and every block
// recomputing; the start line says how many; the flag's errors; and `tandem plan` names the
// fewest blocks that fit a memory size, worked out here from its own peaks.
TEST(CliSharded, RecomputingTheFirstBlocksTrainsTheSameSteps) {
  TempDir dir;
  const std::string data = token_file(dir);
  const auto args = [&](std::vector<std::string> extra) {
    return recompute_train_args(data, 2, std::move(extra));
  };
  std::vector<std::vector<nlohmann::json>> runs;
  const std::vector<std::vector<std::string>> modes = {
      {"--recompute", "none"},
      {"--recompute", "unit", "--recompute-blocks", "3"},
      {"--recompute", "unit"}};
  for (size_t m = 0; m < modes.size(); ++m) {
    const std::string metrics = dir / fmt::format("run{}.jsonl", m);
    std::vector<std::string> extra = modes[m];
    extra.insert(extra.end(), {"--metrics", metrics});
    const RunResult r = run_tandem(args(extra), kDeadlineS);
    ASSERT_TRUE(succeeded(r)) << r.err;
    EXPECT_EQ(r.out.find(", recompute unit in 3 of 4 blocks") != std::string::npos, m == 1)
        << r.out;
    runs.push_back(read_metrics(metrics));
    ASSERT_EQ(runs.back().size(), 2u) << m;
  }
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(runs[1][i]["loss"].get<double>(), runs[0][i]["loss"].get<double>()) << i;
    EXPECT_LT(runs[1][i]["peak_mem_bytes"].get<double>(),
              runs[0][i]["peak_mem_bytes"].get<double>());
    EXPECT_GT(runs[1][i]["peak_mem_bytes"].get<double>(),
              runs[2][i]["peak_mem_bytes"].get<double>());
  }
  EXPECT_TRUE(one_error_line(run_tandem(args({"--recompute-blocks", "2"})), 1,
                             {"--recompute-blocks 2", "--recompute attention or unit"}));
  EXPECT_TRUE(one_error_line(run_tandem(args({"--recompute", "unit", "--recompute-blocks", "5"})),
                             1, {"--recompute-blocks 5", "4 blocks"}));
  EXPECT_TRUE(one_error_line(run_tandem(args({"--recompute", "unit", "--recompute-blocks", "-1"})),
                             1, {"--recompute-blocks", "negative"}));

  // The plan's peak for each count of blocks recomputing (1 keeps as much as none: the one
  // block recomputes into its own tensors), then a memory size that 2 blocks fit with the
  // advice's 3% free and keeping everything does not.
  const auto plan = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = {"plan", "--model", "gpt2-tiny", "--strategy",
                                  "full", "--seq",   "64",        "--json"};
    a.insert(a.end(), extra.begin(), extra.end());
    const RunResult r = run_tandem(a);
    EXPECT_TRUE(succeeded(r)) << r.err;
    return nlohmann::json::parse(r.out);
  };
  std::vector<double> peak;
  for (int k = 1; k <= 4; ++k) {
    const nlohmann::json j = plan({"--recompute", "unit", "--recompute-blocks", std::to_string(k)});
    EXPECT_EQ(j["recompute_blocks"], k);
    peak.push_back(j["strategies"][0]["peak_mem_bytes"].get<double>());
  }
  const double none = plan({})["strategies"][0]["peak_mem_bytes"].get<double>();
  EXPECT_EQ(peak[0], none);
  for (size_t k = 1; k < peak.size(); ++k) EXPECT_LT(peak[k], peak[k - 1]) << k + 1;
  const double gib = peak[1] / 0.97 * (1 + 1e-6) / (1 << 30);
  ASSERT_LT(gib * (1 << 30), none);
  const std::string mem = fmt::format("{:.9f}", gib);
  const nlohmann::json every = plan({"--recompute", "unit", "--mem-GiB", mem});
  ASSERT_EQ(every["recommended"], "full");
  bool named = false;
  for (const auto& n : every["notes"])
    named |= n.get<std::string>().find("2 of the 4 blocks recomputing is the fewest") !=
                 std::string::npos &&
             n.get<std::string>().find("--recompute-blocks 2") != std::string::npos;
  EXPECT_TRUE(named) << every["notes"].dump();
  const nlohmann::json kept = plan({"--mem-GiB", mem});
  EXPECT_TRUE(kept["recommended"].is_null());
  EXPECT_NE(kept["why"].get<std::string>().find("--recompute unit --recompute-blocks 2"),
            std::string::npos)
      << kept["why"];
  // Memory enough to keep everything: the advice is to drop --recompute.
  const nlohmann::json roomy = plan({"--recompute", "unit"});
  bool drop = false;
  for (const auto& n : roomy["notes"])
    drop |= n.get<std::string>().find("drop --recompute") != std::string::npos;
  EXPECT_TRUE(drop) << roomy["notes"].dump();
  EXPECT_TRUE(
      one_error_line(run_tandem({"plan", "--model", "gpt2-tiny", "--recompute-blocks", "2"}), 1,
                     {"--recompute-blocks 2", "--recompute attention or unit"}));

  // tandem train itself says so under a bound (--mem-limit here) when recomputing every block:
  // the same peaks as the plan's at batch 2, one rank, one micro-step.
  std::vector<double> train_peak;
  for (int k = 1; k <= 4; ++k)
    train_peak.push_back(plan({"--batch", "2", "--recompute", "unit", "--recompute-blocks",
                               std::to_string(k)})["strategies"][0]["peak_mem_bytes"]
                             .get<double>());
  const std::string limit = std::to_string(static_cast<uint64_t>(train_peak[1] / 0.97) + 1);
  const RunResult noted = run_tandem(args({"--recompute", "unit", "--mem-limit", limit}));
  ASSERT_TRUE(succeeded(noted)) << noted.err;
  EXPECT_NE(noted.out.find("note: 2 of the 4 blocks recomputing would fit --mem-limit"),
            std::string::npos)
      << noted.out;
  EXPECT_NE(noted.out.find("--recompute-blocks 2"), std::string::npos) << noted.out;
  const RunResult roomy_run = run_tandem(args({"--recompute", "unit", "--mem-limit", "1GiB"}));
  ASSERT_TRUE(succeeded(roomy_run)) << roomy_run.err;
  EXPECT_NE(roomy_run.out.find("note: the run fits --mem-limit without --recompute"),
            std::string::npos)
      << roomy_run.out;
  // Without --recompute the run does not fit that bound, and the refusal names the fix; under
  // a bound nothing fits, it says so.
  EXPECT_TRUE(one_error_line(
      run_tandem(args({"--mem-limit", limit})), 1,
      {"over by", "Recomputing 2 of the 4 blocks fits", "--recompute unit --recompute-blocks 2"}));
  EXPECT_TRUE(one_error_line(run_tandem(args({"--mem-limit", "4096"})), 1,
                             {"over by", "recomputing every block does not fit either"}));
  // With the blocks given, no note.
  const RunResult quiet =
      run_tandem(args({"--recompute", "unit", "--recompute-blocks", "2", "--mem-limit", limit}));
  ASSERT_TRUE(succeeded(quiet)) << quiet.err;
  EXPECT_EQ(quiet.out.find("note:"), std::string::npos) << quiet.out;

  // --recompute-blocks auto takes that advice itself: 2 blocks under the same bound, with the
  // losses of keeping everything; none under a roomy bound; every block and the engine's
  // refusal where nothing fits; and its errors.
  const std::string auto_metrics = dir / "auto.jsonl";
  const RunResult chose = run_tandem(args({"--recompute", "unit", "--recompute-blocks", "auto",
                                           "--mem-limit", limit, "--metrics", auto_metrics}));
  ASSERT_TRUE(succeeded(chose)) << chose.err;
  for (const char* part : {"note: --recompute-blocks auto: 2 of the 4 blocks recompute, the "
                           "fewest that fit --mem-limit with 3% of it free",
                           ", recompute unit in 2 of 4 blocks"})
    EXPECT_NE(chose.out.find(part), std::string::npos) << part << "\n" << chose.out;
  const std::vector<nlohmann::json> chosen = read_metrics(auto_metrics);
  ASSERT_EQ(chosen.size(), 2u);
  for (size_t i = 0; i < 2; ++i)
    EXPECT_EQ(chosen[i]["loss"].get<double>(), runs[0][i]["loss"].get<double>()) << i;
  const RunResult none_needed = run_tandem(
      args({"--recompute", "unit", "--recompute-blocks", "auto", "--mem-limit", "1GiB"}));
  ASSERT_TRUE(succeeded(none_needed)) << none_needed.err;
  EXPECT_NE(none_needed.out.find("note: --recompute-blocks auto: the run fits --mem-limit without "
                                 "recompute"),
            std::string::npos)
      << none_needed.out;
  EXPECT_EQ(none_needed.out.find(", recompute"), std::string::npos) << none_needed.out;
  // Every block recomputing fits the bound itself but not with the headroom free: every block
  // recomputes, and the note says the headroom is short.
  const std::string tight = std::to_string(static_cast<uint64_t>(train_peak[3]) + 1);
  const RunResult all =
      run_tandem(args({"--recompute", "unit", "--recompute-blocks", "auto", "--mem-limit", tight}));
  ASSERT_TRUE(succeeded(all)) << all.err;
  for (const char* part : {"note: --recompute-blocks auto: every block recomputes, and even so "
                           "less than 3% of --mem-limit stays free",
                           ", recompute unit |"})
    EXPECT_NE(all.out.find(part), std::string::npos) << part << "\n" << all.out;
  EXPECT_TRUE(one_error_line(run_tandem(args({"--recompute", "unit", "--recompute-blocks", "auto",
                                              "--mem-limit", "4096"})),
                             1, {"over by", "recomputing every block does not fit either"}));
  EXPECT_TRUE(
      one_error_line(run_tandem(args({"--recompute", "unit", "--recompute-blocks", "auto"})), 1,
                     {"--recompute-blocks auto", "--mem-limit"}));
  EXPECT_TRUE(one_error_line(run_tandem(args({"--recompute-blocks", "auto"})), 1,
                             {"--recompute-blocks auto", "--recompute attention or unit"}));
  EXPECT_TRUE(
      one_error_line(run_tandem(args({"--recompute", "unit", "--recompute-blocks", "some"})), 1,
                     {"recompute-blocks", "auto", "some"}));
}

// [Chunked loss] from the command: the losses of the whole loss within fp32 summation order
// (the head's weight gradient sums its rows chunk by chunk), less memory, and the flag's
// errors.
TEST(CliSharded, AChunkedLossTrainsTheSameStepsInLessMemory) {
  TempDir dir;
  const std::string data = token_file(dir);
  std::vector<std::vector<nlohmann::json>> runs;
  for (const char* chunk : {"0", "5"}) {
    const std::string metrics = dir / (std::string(chunk) + ".jsonl");
    ASSERT_TRUE(succeeded(run_tandem(
        train_args(data, 1, {"--loss-chunk", chunk, "--metrics", metrics}), kDeadlineS)));
    runs.push_back(read_metrics(metrics));
    ASSERT_EQ(runs.back().size(), 3u) << chunk;
  }
  for (size_t i = 0; i < 3; ++i) {
    const double want = runs[0][i]["loss"];
    EXPECT_NEAR(runs[1][i]["loss"].get<double>(), want, 1e-5 * want) << "step " << i + 1;
    EXPECT_LT(runs[1][i]["peak_mem_bytes"].get<double>(),
              runs[0][i]["peak_mem_bytes"].get<double>());
  }
  EXPECT_TRUE(one_error_line(run_tandem(train_args(data, 1, {"--loss-chunk", "-1"})), 1,
                             {"--loss-chunk", "negative"}));
  const RunResult plan = run_tandem(
      {"plan", "--model", "gpt2-tiny", "--strategy", "full", "--loss-chunk", "32", "--json"});
  ASSERT_TRUE(succeeded(plan)) << plan.err;
  const RunResult whole =
      run_tandem({"plan", "--model", "gpt2-tiny", "--strategy", "full", "--json"});
  ASSERT_TRUE(succeeded(whole)) << whole.err;
  const nlohmann::json a = nlohmann::json::parse(plan.out), b = nlohmann::json::parse(whole.out);
  EXPECT_EQ(a["loss_chunk"], 32);
  EXPECT_LT(a["strategies"][0]["peak_mem_bytes"].get<double>(),
            b["strategies"][0]["peak_mem_bytes"].get<double>());
  EXPECT_TRUE(one_error_line(
      run_tandem({"plan", "--model", "gpt2-tiny", "--task", "generate", "--loss-chunk", "8"}), 1,
      {"--loss-chunk", "training"}));
}

// [Step graph] from the command: a CPU run refuses --cuda-graph before training, in one line
// naming the flag and the device it needs; --no-cuda-graph and a config file's "auto" train,
// and the start line names no graph.
TEST(CliSharded, CudaGraphIsRefusedOnTheCpu) {
  TempDir dir;
  const std::string data = token_file(dir);
  EXPECT_TRUE(one_error_line(run_tandem(train_args(data, 1, {"--cuda-graph"})), 1,
                             {"--cuda-graph", "it needs --device cuda"}));
  const RunResult off = run_tandem(train_args(data, 1, {"--no-cuda-graph"}));
  EXPECT_TRUE(succeeded(off));
  EXPECT_EQ(off.out.find("CUDA graph"), std::string::npos) << off.out;
  const std::string config = dir / "graph.json";
  std::ofstream(config) << R"({"cuda-graph": "auto"})";
  EXPECT_TRUE(succeeded(run_tandem(train_args(data, 1, {"--config", config}))));
  // The last of the two flags wins, as with every repeated flag.
  EXPECT_TRUE(one_error_line(run_tandem(train_args(data, 1, {"--no-cuda-graph", "--cuda-graph"})),
                             1, {"--cuda-graph", "it needs --device cuda"}));
}

// [Update at gather] from the command: --update-at-gather trains at 1 and 2 ranks to the
// step end's losses bit for bit, the start line says so, and the checkpoint written at the end
// (the last update applied first) holds the same bytes. `tandem plan` prints the update ops
// and says so in its JSON.
TEST(CliSharded, UpdateAtGatherTrainsAndSavesTheSameBits) {
  TempDir dir;
  const std::string data = token_file(dir);
  for (const int ranks : {1, 2}) {
    std::vector<std::vector<nlohmann::json>> runs;
    std::vector<std::string> shards;
    for (const bool at_gather : {false, true}) {
      const std::string name = fmt::format("{}{}", at_gather ? "gather" : "end", ranks);
      std::vector<std::string> extra = {"--metrics", dir / (name + ".jsonl"), "--save", dir / name};
      if (at_gather) extra.push_back("--update-at-gather");
      const RunResult r = run_tandem(train_args(data, ranks, extra), kDeadlineS);
      ASSERT_TRUE(succeeded(r)) << r.err;
      EXPECT_EQ(r.out.find("each update at the unit's next gather") != std::string::npos, at_gather)
          << r.out;
      runs.push_back(read_metrics(dir / (name + ".jsonl")));
      std::string bytes;
      for (int rank = 0; rank < ranks; ++rank) {
        std::ifstream in(dir / fmt::format("{}/step-00000003-shard{}-of-{}.bin", name, rank, ranks),
                         std::ios::binary);
        ASSERT_TRUE(in.good()) << name << " rank " << rank;
        bytes += std::string(std::istreambuf_iterator<char>(in), {});
      }
      shards.push_back(bytes);
    }
    ASSERT_EQ(runs[0].size(), 3u);
    ASSERT_EQ(runs[1].size(), 3u);
    for (size_t s = 0; s < 3; ++s)
      EXPECT_EQ(runs[1][s]["loss"].get<double>(), runs[0][s]["loss"].get<double>())
          << ranks << " rank(s), step " << s + 1;
    EXPECT_FALSE(shards[0].empty());
    EXPECT_TRUE(shards[1] == shards[0]) << "the checkpoints differ at " << ranks << " rank(s)";
  }
  const RunResult plan = run_tandem({"plan", "--model", "gpt2-tiny", "--ranks", "2", "--strategy",
                                     "full", "--update-at-gather", "--json"});
  ASSERT_TRUE(succeeded(plan)) << plan.err;
  EXPECT_TRUE(nlohmann::json::parse(plan.out)["update_at_gather"].get<bool>());
  const RunResult schedule = run_tandem({"plan", "--model", "gpt2-tiny", "--strategy", "full",
                                         "--update-at-gather", "--print-schedule"});
  ASSERT_TRUE(succeeded(schedule)) << schedule.err;
  EXPECT_NE(schedule.out.find(" update "), std::string::npos) << schedule.out;
  EXPECT_EQ(schedule.out.find(" adamw "), std::string::npos) << schedule.out;
}

// [Reduce dtype] from the command: --reduce-dtype bf16 trains at 1 and 2 ranks (MPI's bf16
// sum) and the start line says so; the first loss precedes every update, so it is one
// rank's f32 loss (bit for bit at 1 rank, within the loss-sum order at 2, as in
// CliStrategies); at 1 rank the bf16 scratch (a unit and its shard, 2 bytes each) takes the
// bytes of the fp32 shard it replaces. The plan halves the reduce bytes, and bad values fail.
TEST(CliSharded, Bf16ReductionTrainsAndPlansHalfTheBytes) {
  TempDir dir;
  const std::string data = token_file(dir);
  std::vector<std::vector<nlohmann::json>> runs;
  for (const auto& [dtype, ranks] :
       {std::pair<std::string, int>{"f32", 1}, {"bf16", 1}, {"bf16", 2}}) {
    const std::string metrics = dir / (dtype + std::to_string(ranks) + ".jsonl");
    const RunResult r = run_tandem(
        train_args(data, ranks, {"--reduce-dtype", dtype, "--metrics", metrics}), kDeadlineS);
    ASSERT_TRUE(succeeded(r)) << r.err;
    EXPECT_EQ(r.out.find(", gradients reduced in bf16") != std::string::npos, dtype == "bf16")
        << r.out;
    runs.push_back(read_metrics(metrics));
    ASSERT_EQ(runs.back().size(), 3u) << dtype << " at " << ranks;
  }
  const double first = runs[0][0]["loss"];
  EXPECT_EQ(runs[1][0]["loss"].get<double>(), first);
  EXPECT_NEAR(runs[2][0]["loss"].get<double>(), first, 1e-5 * first);
  EXPECT_EQ(runs[1][0]["peak_mem_bytes"].get<double>(), runs[0][0]["peak_mem_bytes"].get<double>());
  EXPECT_TRUE(one_error_line(run_tandem(train_args(data, 1, {"--reduce-dtype", "f16"})), 1,
                             {"--reduce-dtype must be f32 or bf16", "f16"}));

  std::vector<nlohmann::json> plans;
  for (const char* dtype : {"f32", "bf16"}) {
    const RunResult r = run_tandem({"plan", "--model", "gpt2-tiny", "--ranks", "4", "--strategy",
                                    "full", "--reduce-dtype", dtype, "--json"});
    ASSERT_TRUE(succeeded(r)) << r.err;
    plans.push_back(nlohmann::json::parse(r.out));
    EXPECT_EQ(plans.back()["reduce_dtype"], dtype);
  }
  const nlohmann::json &a = plans[0]["strategies"][0], &b = plans[1]["strategies"][0];
  EXPECT_DOUBLE_EQ(b["reduce_bytes"].get<double>(), a["reduce_bytes"].get<double>() / 2);
  EXPECT_GT(b["peak_mem_bytes"].get<double>(), a["peak_mem_bytes"].get<double>());
  const RunResult text =
      run_tandem({"plan", "--model", "gpt2-tiny", "--ranks", "4", "--reduce-dtype", "bf16"});
  ASSERT_TRUE(succeeded(text)) << text.err;
  EXPECT_NE(text.out.find(", gradients reduced in bf16"), std::string::npos) << text.out;
  EXPECT_TRUE(one_error_line(run_tandem({"plan", "--model", "gpt2-tiny", "--reduce-dtype", "fp8"}),
                             1, {"--reduce-dtype", "fp8"}));
  EXPECT_TRUE(one_error_line(
      run_tandem({"plan", "--model", "gpt2-tiny", "--task", "generate", "--reduce-dtype", "bf16"}),
      1, {"--reduce-dtype", "training"}));
}

TEST(CliSharded, PlanPrintsOpsOnEveryStream) {
  const RunResult r = run_tandem(
      {"plan", "--model", "gpt2-tiny", "--ranks", "4", "--strategy", "full", "--print-schedule"});
  ASSERT_TRUE(succeeded(r));
  // Op lines: "<index> <stream> <kind> ...".
  std::set<std::string> streams;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::string index, stream;
    words >> index >> stream;
    if (!index.empty() && index.find_first_not_of("0123456789") == std::string::npos)
      streams.insert(stream);
  }
  EXPECT_EQ(streams, (std::set<std::string>{"compute", "all-gather", "reduce-scatter"})) << r.out;
  EXPECT_EQ(count_of(r.out, "\nchecked: "), 1u) << r.out;
}

// ---------------------------------------------------------------------------------------
// Training at several ranks.

struct StrategyCase {
  const char* strategy;
  int ranks;
  int shard_group;  // 0: none given
};

void PrintTo(const StrategyCase& c, std::ostream* os) {
  *os << c.strategy << " at " << c.ranks << " ranks";
  if (c.shard_group > 0) *os << ", shard group " << c.shard_group;
}

class CliStrategies : public testing::TestWithParam<StrategyCase> {};

// Every strategy trains, communicates every step, reports consistent timings, and starts
// with the losses of one rank on the same 4 sequences per step.
TEST_P(CliStrategies, TrainsLikeOneRank) {
  const StrategyCase c = GetParam();
  TempDir dir;
  const std::string data = token_file(dir);
  const std::string one_metrics = dir / "one.jsonl", many_metrics = dir / "many.jsonl";
  ASSERT_TRUE(succeeded(run_tandem(train_args(data, 1, {"--metrics", one_metrics}), kDeadlineS)));
  std::vector<std::string> extra = {"--strategy", c.strategy, "--metrics", many_metrics};
  if (c.shard_group > 0)
    extra.insert(extra.end(), {"--shard-group", std::to_string(c.shard_group)});
  ASSERT_TRUE(succeeded(run_tandem(train_args(data, c.ranks, extra), kDeadlineS)));

  const std::vector<nlohmann::json> one = read_metrics(one_metrics);
  const std::vector<nlohmann::json> many = read_metrics(many_metrics);
  ASSERT_EQ(one.size(), 3u);
  ASSERT_EQ(many.size(), 3u) << "one metrics line per step, from rank 0 only";
  const std::set<std::string> keys = {
      "step",    "loss",       "lr",      "grad_norm",       "tokens_per_s",
      "step_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "peak_mem_bytes"};
  for (size_t i = 0; i < many.size(); ++i) {
    const nlohmann::json& m = many[i];
    std::set<std::string> got;
    for (const auto& [k, v] : m.items()) got.insert(k);
    EXPECT_EQ(got, keys);
    EXPECT_EQ(m["step"], static_cast<int>(i) + 1);
    const double step = m["step_ms"], compute = m["compute_ms"], comm = m["comm_ms"],
                 exposed = m["exposed_comm_ms"];
    EXPECT_GT(comm, 0) << m.dump();
    EXPECT_GT(compute, 0) << m.dump();
    EXPECT_GE(exposed, 0) << m.dump();
    // The compute stream's op time and its time blocked on communication are disjoint
    // intervals within the step.
    EXPECT_LE(compute + exposed, step) << m.dump();
    EXPECT_GT(m["peak_mem_bytes"].get<double>(), 0) << m.dump();
  }
  for (size_t i = 0; i < 2; ++i) {
    const double want = one[i]["loss"];
    EXPECT_NEAR(many[i]["loss"].get<double>(), want, 1e-5 * want) << "step " << i + 1;
  }
}

std::string case_name(const testing::TestParamInfo<StrategyCase>& param) {
  std::string name = param.param.strategy;
  for (char& ch : name)
    if (ch == '-') ch = '_';
  return name + "_" + std::to_string(param.param.ranks) + "ranks";
}

INSTANTIATE_TEST_SUITE_P(Strategies, CliStrategies,
                         testing::Values(StrategyCase{"full", 2, 0}, StrategyCase{"grad-op", 2, 0},
                                         StrategyCase{"none", 2, 0}, StrategyCase{"hybrid", 4, 2}),
                         case_name);

// A checkpoint written by 2 ranks exports to a safetensors file with the tensors of a fresh
// export, holding the weights a one-rank run of the same steps arrives at.
TEST(CliSharded, ExportOfTwoRankCheckpoint) {
  TempDir dir;
  const std::string data = token_file(dir);
  const std::string ckpt2 = dir / "ckpt2", ckpt1 = dir / "ckpt1";
  ASSERT_TRUE(succeeded(run_tandem(train_args(data, 2, {"--save", ckpt2}), kDeadlineS)));
  ASSERT_TRUE(succeeded(run_tandem(train_args(data, 1, {"--save", ckpt1}), kDeadlineS)));
  const std::string from2 = dir / "from2.safetensors", from1 = dir / "from1.safetensors",
                    fresh = dir / "fresh.safetensors";
  ASSERT_TRUE(succeeded(run_tandem({"export", "--checkpoint", ckpt2, "--out", from2})));
  ASSERT_TRUE(succeeded(run_tandem({"export", "--checkpoint", ckpt1, "--out", from1})));
  ASSERT_TRUE(succeeded(run_tandem({"export", "--model", "gpt2-tiny", "--out", fresh})));

  const SafeTensorsFile a = safetensors_read(from2), b = safetensors_read(fresh),
                        one = safetensors_read(from1);
  ASSERT_FALSE(a.tensors.empty());
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  ASSERT_EQ(a.tensors.size(), one.tensors.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const SafeTensor& t = a.tensors[i];
    EXPECT_EQ(t.name, b.tensors[i].name);
    EXPECT_EQ(t.shape, b.tensors[i].shape) << t.name;
    EXPECT_EQ(t.dtype, b.tensors[i].dtype) << t.name;
    const SafeTensor& u = one.get(t.name);
    ASSERT_EQ(t.dtype, "F32") << t.name;
    ASSERT_EQ(t.data.size(), u.data.size()) << t.name;
    const auto* x = reinterpret_cast<const float*>(t.data.data());
    const auto* y = reinterpret_cast<const float*>(u.data.data());
    for (int64_t k = 0; k < t.numel(); ++k) {
      num += (static_cast<double>(x[k]) - y[k]) * (static_cast<double>(x[k]) - y[k]);
      den += static_cast<double>(y[k]) * y[k];
    }
  }
  // fp32 reduction order differs between 1 and 2 ranks; see [Equivalence tolerance] in
  // tests/dist/test_dist_training.cpp.
  EXPECT_LT(std::sqrt(num / den), 1e-4);
}

TEST(CliSharded, ProgressLinesPrintedOncePerStep) {
  TempDir dir;
  const RunResult r = run_tandem(
      train_args(token_file(dir), 2, {"--progress", "lines", "--log-every", "1"}), kDeadlineS);
  ASSERT_TRUE(succeeded(r));
  for (const char* step : {"step 1/3 ", "step 2/3 ", "step 3/3 "})
    EXPECT_EQ(count_of(r.out, step), 1u) << step << "\n" << r.out;
  EXPECT_EQ(count_of(r.out, "model gpt2-tiny"), 1u) << r.out;
  EXPECT_EQ(count_of(r.out, "done: step 3"), 1u) << r.out;
}

}  // namespace
}  // namespace tandem::cli_test
