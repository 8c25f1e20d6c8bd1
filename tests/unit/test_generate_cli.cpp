// `tandem generate` at the command line: the JSON it prints, batches of prompts, prompts as
// ids, stop text, the cap of --tokens by --max-seq, and one clear error for each request
// that cannot run (a prompt longer than --max-seq, --tokens 0, --top-p outside (0, 1], a
// batch that does not fit, text for a model without a tokenizer).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "plan/trace.h"

namespace tandem::cli_test {
namespace {

const std::string kLlama = std::string(TANDEM_TEST_DATA_DIR) + "/fixtures/hf/llama";
// Runs through mpirun start several processes: time enough for a slow machine.
constexpr int kDeadlineS = 120;

nlohmann::json json_of(const RunResult& r) {
  EXPECT_TRUE(succeeded(r)) << r.describe();
  return nlohmann::json::parse(r.out);
}

TEST(GenerateCli, JsonHoldsIdsTimingsAndMemory) {
  const auto j =
      json_of(run_tandem({"generate", "--checkpoint", kLlama, "--prompt-ids", "5,6,7", "--tokens",
                          "9", "--temperature", "0", "--json", "--ignore-eos"}));
  EXPECT_EQ(j.at("prompt_ids"), nlohmann::json({5, 6, 7}));
  EXPECT_EQ(j.at("ids").size(), 9u);
  EXPECT_EQ(j.at("finish"), "length");
  for (const char* k : {"time_to_first_token_ms", "prefill_tokens_per_s", "decode_tokens_per_s"})
    EXPECT_GT(j.at(k).get<double>(), 0) << k;
  EXPECT_GT(j.at("peak_mem_bytes").get<double>(), 0);
  // The reference path draws the same tokens.
  const auto ref =
      json_of(run_tandem({"generate", "--checkpoint", kLlama, "--prompt-ids", "5,6,7", "--tokens",
                          "9", "--temperature", "0", "--json", "--ignore-eos", "--recompute"}));
  EXPECT_EQ(ref.at("ids"), j.at("ids"));
}

TEST(GenerateCli, RaggedPromptsGiveListsAndEqualTheirRunsAlone) {
  const auto j = json_of(run_tandem({"generate", "--checkpoint", kLlama, "--prompt-ids", "5,6,7",
                                     "--prompt-ids", "9", "--tokens", "6", "--temperature", "0.7",
                                     "--top-k", "20", "--seed", "3", "--json", "--ignore-eos"}));
  ASSERT_EQ(j.at("ids").size(), 2u);
  EXPECT_EQ(j.at("prompt_ids")[1], nlohmann::json({9}));
  // Sequence 0 alone draws as sequence 0 of the batch (the noise is keyed by the sequence).
  const auto alone = json_of(run_tandem(
      {"generate", "--checkpoint", kLlama, "--prompt-ids", "5,6,7", "--tokens", "6",
       "--temperature", "0.7", "--top-k", "20", "--seed", "3", "--json", "--ignore-eos"}));
  EXPECT_EQ(alone.at("ids"), j.at("ids")[0]);
  // One prompt copied to a batch of 3.
  const auto copies = json_of(run_tandem({"generate", "--checkpoint", kLlama, "--prompt-ids", "4",
                                          "--batch", "3", "--tokens", "2", "--json"}));
  EXPECT_EQ(copies.at("ids").size(), 3u);
}

// A byte-level model speaks text without a tokenizer; --stop ends a sequence once its new
// text holds the stop text.
TEST(GenerateCli, StopTextEndsTheSequence) {
  TempDir dir;
  const std::string m = dir / "m";
  ASSERT_TRUE(
      succeeded(run_tandem({"export", "--model", "gpt2-tiny", "--format", "hf", "--out", m})));
  const auto full = json_of(run_tandem({"generate", "--checkpoint", m, "--prompt", "ab", "--tokens",
                                        "30", "--temperature", "0", "--json", "--ignore-eos"}));
  const std::vector<int> ids = full.at("ids").get<std::vector<int>>();
  size_t at = 1;
  while (at < ids.size() && !(ids[at] >= 'a' && ids[at] <= 'z')) ++at;
  if (at == ids.size()) GTEST_SKIP() << "no letter among the greedy bytes";
  const std::string stop(1, static_cast<char>(ids[at]));
  const size_t first =
      static_cast<size_t>(std::find(ids.begin(), ids.end(), ids[at]) - ids.begin());
  const auto cut =
      json_of(run_tandem({"generate", "--checkpoint", m, "--prompt", "ab", "--tokens", "30",
                          "--temperature", "0", "--json", "--ignore-eos", "--stop", stop}));
  EXPECT_EQ(cut.at("finish"), "stop");
  const std::vector<int> got = cut.at("ids").get<std::vector<int>>();
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(got.size(), first + 1);  // the prompt's own text does not count
  EXPECT_EQ(std::vector<int>(ids.begin(), ids.begin() + static_cast<long>(got.size())), got);
}

// A byte-level model's text need not be UTF-8: --json still prints one valid object, the
// stray bytes replaced, and the ids as they were drawn (this seeded llama-tiny draws bytes
// that are not UTF-8 from this prompt).
TEST(GenerateCli, JsonOfBytesThatAreNotUtf8) {
  TempDir dir;
  const std::string m = dir / "m";
  ASSERT_TRUE(
      succeeded(run_tandem({"export", "--model", "llama-tiny", "--format", "hf", "--out", m})));
  const auto j =
      json_of(run_tandem({"generate", "--checkpoint", m, "--prompt-ids",
                          "37,148,219,208,198,19,68,33,129,197,118,123,169,100,204,56", "--tokens",
                          "64", "--temperature", "0", "--json", "--ignore-eos"}));
  EXPECT_EQ(j.at("ids").size(), 64u);
  EXPECT_NE(j.at("text").get<std::string>().find("\xEF\xBF\xBD"), std::string::npos);
}

TEST(GenerateCli, TokensAreCappedByMaxSeqWithANote) {
  const RunResult r = run_tandem({"generate", "--checkpoint", kLlama, "--prompt-ids", "5,6,7",
                                  "--tokens", "50", "--max-seq", "10", "--json", "--ignore-eos"});
  const auto j = json_of(r);
  EXPECT_EQ(j.at("ids").size(), 7u);
  EXPECT_NE(r.err.find("--tokens 50 capped to 7"), std::string::npos) << r.err;
}

TEST(GenerateCli, EachBadRequestIsOneClearError) {
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", kLlama, "--prompt-ids",
                                         "1,2,3,4,5", "--max-seq", "4"}),
                             1, {"5 tokens", "--max-seq"}));
  EXPECT_TRUE(one_error_line(
      run_tandem({"generate", "--checkpoint", kLlama, "--prompt-ids", "1", "--tokens", "0"}), 1,
      {"--tokens must be in [1,"}));
  for (const char* p : {"0", "1.5", "-0.1"})
    EXPECT_TRUE(one_error_line(
        run_tandem({"generate", "--checkpoint", kLlama, "--prompt-ids", "1", "--top-p", p}), 1,
        {"--top-p must be in (0, 1]"}))
        << p;
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", kLlama, "--prompt-ids", "1",
                                         "--batch", "64", "--mem-limit", "64KB"}),
                             1, {"needs", "KV cache", "--mem-limit allows", "short"}));
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", kLlama, "--prompt", "hello"}),
                             1, {"holds no tokenizer", "--prompt-ids"}));
  EXPECT_TRUE(
      one_error_line(run_tandem({"generate", "--checkpoint", kLlama, "--prompt-ids", "1,x"}), 1,
                     {"'x' is not a token id"}));
  EXPECT_TRUE(one_error_line(
      run_tandem({"generate", "--checkpoint", kLlama, "--prompt-ids", "1", "--prompt", "a"}), 1,
      {"give the prompt one way"}));
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", kLlama, "--prompt-ids", "1",
                                         "--device", "cpu", "--recompute", "--batch", "2"}),
                             1, {"--recompute"}));
}

// --ranks 2 through the local launcher: every strategy draws what one rank draws, for a
// ragged batch, greedy and sampled; and each layout that cannot run says why, once.
TEST(GenerateCli, EveryStrategyAtTwoRanksDrawsWhatOneRankDraws) {
  const std::vector<std::string> base = {"generate",    "--checkpoint", kLlama, "--prompt-ids",
                                         "5,6,7",       "--prompt-ids", "9",    "--prompt-ids",
                                         "4,4",         "--tokens",     "6",    "--json",
                                         "--ignore-eos"};
  for (const std::vector<std::string>& sampling :
       {std::vector<std::string>{"--temperature", "0"},
        std::vector<std::string>{"--temperature", "0.8", "--top-k", "20", "--top-p", "0.9"}}) {
    std::vector<std::string> one = base;
    one.insert(one.end(), sampling.begin(), sampling.end());
    const auto ref = json_of(run_tandem(one));
    for (const char* strategy : {"replicate", "fsdp", "tp", "pipeline"}) {
      std::vector<std::string> args = one;
      args.insert(args.end(), {"--ranks", "2", "--strategy", strategy});
      const RunResult r = run_tandem(args, kDeadlineS);
      const auto j = json_of(r);
      EXPECT_EQ(j.at("ids"), ref.at("ids")) << strategy << " " << sampling.size();
      EXPECT_EQ(j.at("strategy"), strategy);
      EXPECT_EQ(j.at("ranks"), 2);
      // A named layout measures nothing for a decode this short (--calibrate-after 20).
      EXPECT_FALSE(j.contains("predicted_decode_tokens_per_s")) << strategy;
    }
  }
}

// With a named layout the machine is measured for the predicted rate after the decode, and
// only when the decode took --calibrate-after seconds or more: 0 always measures, the default
// says in the summary why there is no prediction, and a negative value is one error.
TEST(GenerateCli, NamedLayoutPredictsAfterLongEnoughDecodes) {
  const std::vector<std::string> args = {"generate",   "--checkpoint",
                                         kLlama,       "--prompt-ids",
                                         "5,6,7",      "--tokens",
                                         "4",          "--temperature",
                                         "0",          "--ignore-eos",
                                         "--ranks",    "2",
                                         "--strategy", "tp"};
  std::vector<std::string> always = args;
  always.insert(always.end(), {"--calibrate-after", "0", "--json"});
  const RunResult measured = run_tandem(always, kDeadlineS);
  EXPECT_GT(json_of(measured).at("predicted_decode_tokens_per_s").get<double>(), 0);
  const RunResult plain = run_tandem(args, kDeadlineS);
  ASSERT_EQ(plain.exit_code, 0) << plain.describe();
  EXPECT_NE(plain.err.find("(no prediction: "), std::string::npos) << plain.err;
  EXPECT_NE(plain.err.find("under --calibrate-after 20)"), std::string::npos) << plain.err;
  EXPECT_EQ(plain.err.find("predicted"), std::string::npos) << plain.err;
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", kLlama, "--prompt-ids", "5",
                                         "--calibrate-after", "-1"}),
                             1, {"--calibrate-after", "-1"}));
}

// --trace writes every rank's timed ops, a track per stream: the prefill (step 0) and the
// decode steps of the window, with the pipeline's sends and receives on their own track.
TEST(GenerateCli, TraceShowsEveryRanksOpsOfTheWindow) {
  const std::string path = testing::TempDir() + "generate_trace.json";
  for (int ranks : {1, 2}) {
    SCOPED_TRACE(fmt::format("{} rank(s)", ranks));
    std::remove(path.c_str());
    std::vector<std::string> args = {"generate",
                                     "--checkpoint",
                                     kLlama,
                                     "--prompt-ids",
                                     "5,6,7",
                                     "--prompt-ids",
                                     "9",
                                     "--tokens",
                                     "6",
                                     "--temperature",
                                     "0",
                                     "--ignore-eos",
                                     "--trace",
                                     path,
                                     "--trace-steps",
                                     "0:2"};
    if (ranks > 1) args.insert(args.end(), {"--ranks", "2", "--strategy", "pipeline"});
    const RunResult r = run_tandem(args, kDeadlineS);
    ASSERT_EQ(r.exit_code, 0) << r.describe();
    std::ifstream in(path);
    ASSERT_TRUE(in.good()) << r.err;
    const nlohmann::json doc = nlohmann::json::parse(in);
    EXPECT_TRUE(trace_check(doc).empty());
    std::set<int64_t> steps, pids;
    std::set<std::string> names, tracks;
    for (const auto& e : doc.at("traceEvents")) {
      if (e.at("ph") == "M") {
        if (e.at("name") == "thread_name") tracks.insert(e.at("args").at("name"));
        continue;
      }
      steps.insert(e.at("args").at("step").get<int64_t>());
      pids.insert(e.at("pid").get<int64_t>());
      names.insert(e.at("name").get<std::string>());
      EXPECT_GE(e.at("dur").get<double>(), 0.0);
    }
    EXPECT_EQ(steps, (std::set<int64_t>{0, 1, 2}));
    EXPECT_EQ(static_cast<int>(pids.size()), ranks);
    EXPECT_TRUE(names.count("forward block.0") && names.count("forward head") &&
                names.count("sample"))
        << doc.dump().substr(0, 400);
    if (ranks > 1) {
      EXPECT_TRUE(names.count("send") && names.count("recv"));
      EXPECT_TRUE(tracks.count("pipeline"));
    }
  }
  const RunResult bad = run_tandem({"generate", "--checkpoint", kLlama, "--prompt-ids", "5",
                                    "--trace", path, "--trace-steps", "3:1"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--trace-steps '3:1'"), std::string::npos) << bad.err;
}

// --strategy auto (the default) at 2 ranks says what it chose and why before the first
// token, never fsdp while another layout fits, draws what one rank draws, and prints the
// planner's rate beside the measured one.
TEST(GenerateCli, AutoSaysWhatItChoseAndWhy) {
  const std::vector<std::string> args = {"generate", "--checkpoint", kLlama,  "--prompt-ids",
                                         "5,6,7",    "--tokens",     "6",     "--temperature",
                                         "0",        "--ignore-eos", "--json"};
  const auto ref = json_of(run_tandem(args));
  std::vector<std::string> two = args;
  two.insert(two.end(), {"--ranks", "2"});
  const RunResult r = run_tandem(two, kDeadlineS);
  const auto j = json_of(r);
  EXPECT_EQ(j.at("ids"), ref.at("ids"));
  const std::string chosen = j.at("strategy");
  EXPECT_TRUE(chosen == "replicate" || chosen == "tp" || chosen == "pipeline") << chosen;
  EXPECT_NE(r.err.find("tandem: --strategy auto: " + chosen + " is the fastest layout that fits"),
            std::string::npos)
      << r.err;
  EXPECT_GT(j.at("predicted_decode_tokens_per_s").get<double>(), 0);
}

// A failure at several ranks: mpirun reports the ranks it ended first, and tandem's line is
// the last one a user sees ([Launcher flags] in src/cli/launch.cpp).
::testing::AssertionResult last_error_line(const RunResult& r,
                                           std::initializer_list<std::string> needles) {
  if (r.timed_out || r.signal != 0 || r.exit_code == 0)
    return ::testing::AssertionFailure() << "expected a failed run\n" << r.describe();
  std::string err = r.err;
  while (!err.empty() && err.back() == '\n') err.pop_back();
  const std::string line =
      err.substr(err.rfind('\n') == std::string::npos ? 0 : err.rfind('\n') + 1);
  if (line.rfind("tandem: error: ", 0) != 0)
    return ::testing::AssertionFailure() << "the last line is not tandem's error\n" << r.describe();
  for (const auto& needle : needles)
    if (line.find(needle) == std::string::npos)
      return ::testing::AssertionFailure() << "the error does not mention '" << needle << "'\n"
                                           << r.describe();
  return ::testing::AssertionSuccess();
}

TEST(GenerateCli, ALayoutThatCannotRunSaysWhy) {
  const std::vector<std::string> base = {"generate", "--checkpoint", kLlama, "--prompt-ids",
                                         "1",        "--tokens",     "2"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  // 4 query heads and 2 key/value heads do not split 3 ways.
  EXPECT_TRUE(last_error_line(run_tandem(with({"--ranks", "3", "--strategy", "tp"}), kDeadlineS),
                              {"tp over 3 ranks", "(4)"}));
  EXPECT_TRUE(one_error_line(run_tandem(with({"--strategy", "zero"})), 1,
                             {"unknown inference layout 'zero'"}));
  EXPECT_TRUE(last_error_line(run_tandem(with({"--ranks", "2", "--strategy", "tp", "--temperature",
                                               "0.7", "--top-p", "0.9"}),
                                         kDeadlineS),
                              {"--top-p", "--top-k"}));
  EXPECT_TRUE(one_error_line(run_tandem(with({"--strategy", "fsdp", "--max-gathered", "1"})), 1,
                             {"--max-gathered must be at least 2"}));
  // Two blocks make at most two stages.
  EXPECT_TRUE(
      last_error_line(run_tandem(with({"--ranks", "3", "--strategy", "pipeline"}), kDeadlineS),
                      {"pipeline over 3 ranks", "2 blocks"}));
  EXPECT_TRUE(last_error_line(
      run_tandem(with({"--ranks", "2", "--strategy", "fsdp", "--mem-limit", "16KB"}), kDeadlineS),
      {"fsdp over 2 ranks", "short"}));
}

}  // namespace
}  // namespace tandem::cli_test
