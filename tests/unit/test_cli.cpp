// Bad input at the command line: unknown flags, bad values, malformed or truncated
// config/data/checkpoint files, a checkpoint of another model, a sequence longer than the
// context. Each runs the real tandem binary and expects one clear "tandem: error: ..." line
// and a nonzero exit: never a crash, a hang or silent garbage.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "cli_runner.h"
#include "io/file.h"
#include "io/tokens.h"

namespace tandem::cli_test {
namespace {

namespace fs = std::filesystem;
using Flags = std::vector<std::pair<std::string, std::string>>;

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(read_file(path));
}

void write_json(const std::string& path, const nlohmann::json& j) {
  write_file(path, j.dump(2));
}

// A valid uint16 token file of n byte-level tokens, enough for several sequences of 16.
std::string valid_data(const TempDir& dir, size_t n = 400) {
  std::vector<uint32_t> tokens(n);
  for (size_t i = 0; i < n; ++i) tokens[i] = 32 + static_cast<uint32_t>(i * 7 % 90);
  const std::string path = dir / "data.tok";
  tokens_write(path, tokens, 2);
  return path;
}

// A hand-made tandem token file header: magic, version 1, width 2, count, reserved 0.
std::string token_header(uint64_t count) {
  std::string h(kTokensMagic, 8);
  auto put = [&](uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) h.push_back(static_cast<char>(v >> (8 * i)));
  };
  put(kTokensVersion, 4);
  put(2, 4);
  put(count, 8);
  put(0, 8);
  return h;
}

std::string uint16_body(const std::vector<uint16_t>& tokens) {
  std::string b;
  for (uint16_t t : tokens) {
    b.push_back(static_cast<char>(t & 0xff));
    b.push_back(static_cast<char>(t >> 8));
  }
  return b;
}

// `tandem train` on gpt2-tiny with tiny sizes; `set` replaces or adds flags (an empty value
// drops the flag), `extra` is appended verbatim.
std::vector<std::string> train_args(const std::string& data, const Flags& set = {},
                                    const std::vector<std::string>& extra = {}) {
  Flags flags = {{"--model", "gpt2-tiny"}, {"--data", data}, {"--batch", "1"},
                 {"--seq", "16"},          {"--steps", "1"}, {"--progress", "none"}};
  for (const auto& [k, v] : set) {
    bool found = false;
    for (auto& f : flags)
      if (f.first == k) f.second = v, found = true;
    if (!found) flags.emplace_back(k, v);
  }
  std::vector<std::string> args = {"train"};
  for (const auto& [k, v] : flags) {
    if (v.empty()) continue;
    args.push_back(k);
    args.push_back(v);
  }
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Trains gpt2-tiny for one step and saves the checkpoint to dir/name.
std::string make_checkpoint(const TempDir& dir, const std::string& name = "ckpt") {
  const std::string ckpt = dir / name;
  const RunResult r = run_tandem(train_args(valid_data(dir), {{"--save", ckpt}}));
  EXPECT_TRUE(succeeded(r));
  EXPECT_TRUE(fs::exists(fs::path(ckpt) / "index.json"));
  return ckpt;
}

std::string shard_of(const std::string& ckpt) {
  return (fs::path(ckpt) / read_json(ckpt + "/index.json")["files"][0]["name"].get<std::string>())
      .string();
}

// Rewrites the index's size and checksum of the shard after the shard was edited, so that
// the loader's deeper checks are reached.
void reseal_shard(const std::string& ckpt) {
  const std::string shard = shard_of(ckpt);
  const std::string bytes = read_file(shard);
  nlohmann::json index = read_json(ckpt + "/index.json");
  index["files"][0]["bytes"] = bytes.size();
  index["files"][0]["checksum"] =
      checksum_hex(checksum_update(checksum_init(), bytes.data(), bytes.size()));
  write_json(ckpt + "/index.json", index);
}

// ---------------------------------------------------------------------------------------
// Flags and their values.

TEST(Cli, UnknownFlag) {
  EXPECT_TRUE(one_error_line(run_tandem({"train", "--bogus", "1"}), 2, {"--bogus"}));
}

TEST(Cli, UnknownSubcommand) {
  EXPECT_TRUE(one_error_line(run_tandem({"bogus"}), 2, {"bogus"}));
}

// TANDEM_ATTENTION picks the CUDA attention kernels; a misspelt value is one error line before
// anything runs, and each known value (or none) is accepted.
TEST(Cli, UnknownAttentionKernelsAreOneError) {
  ::setenv("TANDEM_ATTENTION", "wgmma2", 1);
  const RunResult bad = run_tandem({"models"});
  for (const char* good : {"gemm", "flash", "wgmma", ""}) {
    ::setenv("TANDEM_ATTENTION", good, 1);
    const RunResult r = run_tandem({"models"});
    EXPECT_EQ(r.exit_code, 0) << good << "\n" << r.describe();
  }
  ::unsetenv("TANDEM_ATTENTION");
  EXPECT_TRUE(one_error_line(bad, 1, {"TANDEM_ATTENTION='wgmma2'", "gemm, flash or wgmma"}));
}

// TANDEM_FLASH_BACKWARD picks how the wgmma backward forms dQ; the same: a misspelt value is
// one error line, the known ones (or none) run. And `tandem train` takes it (its run names the
// form in a note; unset, no note).
TEST(Cli, UnknownFlashBackwardIsOneError) {
  ::setenv("TANDEM_FLASH_BACKWARD", "one_pass", 1);
  const RunResult bad = run_tandem({"models"});
  for (const char* good : {"one-pass", "two-pass", ""}) {
    ::setenv("TANDEM_FLASH_BACKWARD", good, 1);
    const RunResult r = run_tandem({"models"});
    EXPECT_EQ(r.exit_code, 0) << good << "\n" << r.describe();
  }
  TempDir dir;
  const std::string data = valid_data(dir);
  for (const auto& [value, note] :
       {std::pair<std::string, std::string>{"one-pass", "note: flash backward: one pass"},
        {"two-pass", "note: flash backward: two passes"},
        {"", ""}}) {
    ::setenv("TANDEM_FLASH_BACKWARD", value.c_str(), 1);
    const RunResult r = run_tandem(train_args(data));
    ASSERT_TRUE(succeeded(r)) << value << "\n" << r.describe();
    if (note.empty())
      EXPECT_EQ(r.out.find("flash backward"), std::string::npos) << r.out;
    else
      EXPECT_NE(r.out.find(note), std::string::npos) << value << "\n" << r.out;
  }
  ::unsetenv("TANDEM_FLASH_BACKWARD");
  EXPECT_TRUE(one_error_line(bad, 1, {"TANDEM_FLASH_BACKWARD='one_pass'", "one-pass or two-pass"}));
}

TEST(Cli, UnknownDataSubcommand) {
  EXPECT_TRUE(one_error_line(run_tandem({"data", "bogus"}), 2, {"bogus"}));
}

TEST(Cli, MissingRequiredFlag) {
  EXPECT_TRUE(one_error_line(run_tandem({"generate"}), 2, {"--checkpoint"}));
}

TEST(Cli, MissingModelFlag) {
  TempDir dir;
  EXPECT_TRUE(
      one_error_line(run_tandem(train_args(valid_data(dir), {{"--model", ""}})), 1, {"--model"}));
}

TEST(Cli, MissingDataFlag) {
  EXPECT_TRUE(one_error_line(run_tandem(train_args("")), 1, {"--data"}));
}

TEST(Cli, BatchZero) {
  TempDir dir;
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--batch", "0"}})), 1,
                             {"--batch", "0"}));
}

TEST(Cli, BatchNegative) {
  TempDir dir;
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--batch", "-3"}})), 1,
                             {"--batch", "-3"}));
}

TEST(Cli, BatchNotANumber) {
  TempDir dir;
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--batch", "abc"}})), 2,
                             {"--batch", "abc"}));
}

TEST(Cli, BatchOutOfRange) {
  TempDir dir;
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--batch", "4294967297"}})),
                             2, {"--batch", "4294967297"}));
}

TEST(Cli, LearningRateNegative) {
  TempDir dir;
  EXPECT_TRUE(
      one_error_line(run_tandem(train_args(valid_data(dir), {{"--lr", "-1"}})), 1, {"--lr", "-1"}));
}

TEST(Cli, StepsZero) {
  TempDir dir;
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--steps", "0"}})), 1,
                             {"--steps", "0"}));
}

TEST(Cli, UnknownDevice) {
  TempDir dir;
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--device", "tpu"}})), 1,
                             {"device", "tpu"}));
}

TEST(Cli, UnknownProgressStyle) {
  TempDir dir;
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--progress", "weird"}})), 1,
                             {"--progress", "weird"}));
}

TEST(Cli, GlobalBatchNotAMultipleOfBatch) {
  TempDir dir;
  EXPECT_TRUE(one_error_line(
      run_tandem(train_args(valid_data(dir), {{"--batch", "2"}, {"--global-batch", "3"}})), 1,
      {"--global-batch", "3", "--batch", "2"}));
}

TEST(Cli, TemperatureNegative) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  EXPECT_TRUE(one_error_line(
      run_tandem({"generate", "--checkpoint", ckpt, "--temperature", "-1", "--tokens", "1"}), 1,
      {"--temperature", "-1"}));
}

TEST(Cli, TopKNegative) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  EXPECT_TRUE(one_error_line(
      run_tandem({"generate", "--checkpoint", ckpt, "--top-k", "-2", "--tokens", "1"}), 1,
      {"--top-k", "-2"}));
}

TEST(Cli, TokensNegative) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", ckpt, "--tokens", "-1"}), 1,
                             {"--tokens", "-1"}));
}

// ---------------------------------------------------------------------------------------
// Model presets and model JSON configs.

TEST(Cli, UnknownModelPreset) {
  TempDir dir;
  EXPECT_TRUE(
      one_error_line(run_tandem(train_args(valid_data(dir), {{"--model", "gpt9-huge"}})), 1,
                     {"gpt9-huge", "gpt2-tiny"}));  // names the preset and lists the known ones
}

TEST(Cli, ModelConfigNotJson) {
  TempDir dir;
  const std::string model = dir / "model.json";
  write_file(model, "d_model = 128\n");
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--model", model}})), 1,
                             {model, "not valid JSON"}));
}

TEST(Cli, ModelConfigUnknownKey) {
  TempDir dir;
  const std::string model = dir / "model.json";
  write_json(model, {{"preset", "gpt2-tiny"}, {"colour", 3}});
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--model", model}})), 1,
                             {model, "colour"}));
}

TEST(Cli, ModelConfigBadValueType) {
  TempDir dir;
  const std::string model = dir / "model.json";
  write_json(model, {{"preset", "gpt2-tiny"}, {"d_model", "big"}});
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--model", model}})), 1,
                             {model, "d_model", "big"}));
}

TEST(Cli, ModelConfigInconsistent) {
  TempDir dir;
  const std::string model = dir / "model.json";
  write_json(model, {{"preset", "gpt2-tiny"}, {"d_model", 130}});  // n_head is 4
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--model", model}})), 1,
                             {model, "d_model", "130", "n_head", "4"}));
}

TEST(Cli, ModelConfigIntegerOutOfRange) {
  // 4294967424 is 2^32 + 128: read into an int unchecked it silently becomes 128.
  TempDir dir;
  const std::string model = dir / "model.json";
  write_json(model, nlohmann::json::parse(R"({"preset": "gpt2-tiny", "d_model": 4294967424})"));
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--model", model}})), 1,
                             {"d_model", "4294967424"}));
}

TEST(Cli, ModelConfigDuplicateKey) {
  TempDir dir;
  const std::string model = dir / "model.json";
  write_file(model, R"({"preset": "gpt2-tiny", "n_layer": 2, "d_model": 64, "n_layer": 3})");
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--model", model}})), 1,
                             {model, "has the key 'n_layer' twice"}));
}

TEST(Cli, ModelConfigMissingFile) {
  TempDir dir;
  const std::string model = dir / "absent.json";
  EXPECT_TRUE(
      one_error_line(run_tandem(train_args(valid_data(dir), {{"--model", model}})), 1, {model}));
}

// ---------------------------------------------------------------------------------------
// Training --config files.

TEST(Cli, TrainConfigDuplicateKey) {
  TempDir dir;
  const std::string config = dir / "train.json";
  write_file(config, R"({"steps": 3, "lr": 0.001, "steps": 30})");
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--config", config}})), 1,
                             {config, "has the key 'steps' twice"}));
}

TEST(Cli, TrainConfigNotJson) {
  TempDir dir;
  const std::string config = dir / "train.json";
  write_file(config, "steps: 3\n");
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--config", config}})), 1,
                             {config, "not valid JSON"}));
}

TEST(Cli, TrainConfigUnknownKey) {
  TempDir dir;
  const std::string config = dir / "train.json";
  write_json(config, {{"steps", 1}, {"colour", 1}});
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--config", config}})), 1,
                             {"colour"}));
}

TEST(Cli, TrainConfigWrongType) {
  TempDir dir;
  const std::string config = dir / "train.json";
  write_json(config, {{"batch", "three"}});
  EXPECT_TRUE(one_error_line(
      run_tandem(train_args(valid_data(dir), {{"--config", config}, {"--batch", ""}})), 1,
      {"batch", "three"}));
}

TEST(Cli, TrainConfigIntegerOutOfRange) {
  // 4294967297 is 2^32 + 1: read into an int unchecked it silently becomes a batch of 1.
  TempDir dir;
  const std::string config = dir / "train.json";
  write_json(config, nlohmann::json::parse(R"({"batch": 4294967297})"));
  EXPECT_TRUE(one_error_line(
      run_tandem(train_args(valid_data(dir), {{"--config", config}, {"--batch", ""}})), 1,
      {"batch", "4294967297"}));
}

TEST(Cli, TrainConfigMissingFile) {
  TempDir dir;
  const std::string config = dir / "absent.json";
  EXPECT_TRUE(
      one_error_line(run_tandem(train_args(valid_data(dir), {{"--config", config}})), 1, {config}));
}

TEST(Cli, FlagOverridesTrainConfig) {
  TempDir dir;
  const std::string config = dir / "train.json", metrics = dir / "metrics.jsonl";
  write_json(config, {{"model", "gpt2-tiny"},
                      {"data", valid_data(dir)},
                      {"batch", 1},
                      {"seq", 16},
                      {"steps", 3},
                      {"progress", "none"},
                      {"metrics", metrics}});
  // Lines of steps: every line but the run's summary ({"summary": true, ...}).
  auto lines = [&] {
    const std::string text = read_file(metrics);
    const auto summaries = text.find("\"summary\":true") != std::string::npos ? 1 : 0;
    return std::count(text.begin(), text.end(), '\n') - summaries;
  };
  ASSERT_TRUE(succeeded(run_tandem({"train", "--config", config})));
  EXPECT_EQ(lines(), 3) << "the config file's steps";
  ASSERT_TRUE(succeeded(run_tandem({"train", "--config", config, "--steps", "2"})));
  EXPECT_EQ(lines(), 2) << "--steps 2 on the command line overrides the config file's 3";
}

// ---------------------------------------------------------------------------------------
// Token files.

TEST(Cli, DataFileMissing) {
  TempDir dir;
  const std::string data = dir / "absent.tok";
  EXPECT_TRUE(one_error_line(run_tandem(train_args(data)), 1, {data}));
}

TEST(Cli, DataFileEmpty) {
  TempDir dir;
  const std::string data = dir / "empty.tok";
  write_file(data, "");
  EXPECT_TRUE(one_error_line(run_tandem(train_args(data)), 1, {data, "0 bytes"}));
}

TEST(Cli, DataFileWrongMagic) {
  TempDir dir;
  const std::string data = dir / "magic.tok";
  write_file(data, "NOTATOKNFILE" + std::string(100, 'x'));
  EXPECT_TRUE(one_error_line(run_tandem(train_args(data)), 1, {data, "magic"}));
}

TEST(Cli, DataFileTruncated) {
  TempDir dir;
  const std::string data = dir / "truncated.tok";
  std::vector<uint16_t> tokens(100, 65);
  std::string bytes = token_header(100) + uint16_body(tokens);
  bytes.resize(bytes.size() - 10);  // 5 tokens short
  write_file(data, bytes);
  EXPECT_TRUE(one_error_line(run_tandem(train_args(data)), 1, {data, "truncated", "100"}));
}

TEST(Cli, DataFileTrailingBytes) {
  TempDir dir;
  const std::string data = dir / "trailing.tok";
  std::vector<uint16_t> tokens(100, 65);
  write_file(data, token_header(100) + uint16_body(tokens) + "abc");
  EXPECT_TRUE(one_error_line(run_tandem(train_args(data)), 1, {data, "3 trailing bytes"}));
}

TEST(Cli, DataTokenOutsideVocabulary) {
  TempDir dir;
  const std::string data = dir / "vocab.tok";
  std::vector<uint32_t> tokens(100, 65);
  tokens[42] = 300;  // gpt2-tiny's vocabulary is 256
  tokens_write(data, tokens, 2);
  EXPECT_TRUE(one_error_line(run_tandem(train_args(data)), 1, {data, "300", "42", "256"}));
}

TEST(Cli, DataTooFewTokensForOneSequence) {
  TempDir dir;
  const std::string data = dir / "few.tok";
  tokens_write(data, std::vector<uint32_t>(10, 65), 2);
  EXPECT_TRUE(one_error_line(run_tandem(train_args(data)), 1, {data, "10 tokens", "17"}));
}

TEST(Cli, DataPrepareMissingTextFile) {
  TempDir dir;
  const std::string text = dir / "absent.txt";
  EXPECT_TRUE(one_error_line(
      run_tandem({"data", "prepare", "--text", text, "--out", dir / "out.tok"}), 1, {text}));
  EXPECT_FALSE(fs::exists(dir / "out.tok"));
}

TEST(Cli, SeqLongerThanContext) {
  TempDir dir;
  EXPECT_TRUE(one_error_line(run_tandem(train_args(valid_data(dir), {{"--seq", "300"}})), 1,
                             {"--seq", "300", "256", "gpt2-tiny"}));
}

// ---------------------------------------------------------------------------------------
// Checkpoints.

TEST(Cli, ValidCheckpointResumesAndGenerates) {
  // The positive control for the corruptions below.
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  EXPECT_TRUE(succeeded(run_tandem(
      train_args(valid_data(dir), {{"--model", ""}, {"--steps", "2"}}, {"--resume", ckpt}))));
  const RunResult g = run_tandem({"generate", "--checkpoint", ckpt, "--tokens", "3"});
  EXPECT_TRUE(succeeded(g));
  // stdout holds the text alone; stderr the one summary line.
  EXPECT_EQ(g.err.rfind("prompt 1 tokens | time to first token ", 0), 0u) << g.err;
  EXPECT_EQ(std::count(g.err.begin(), g.err.end(), '\n'), 1) << g.err;
}

TEST(Cli, CheckpointDirMissing) {
  TempDir dir;
  const std::string ckpt = dir / "absent";
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", ckpt}), 1, {ckpt}));
}

TEST(Cli, CheckpointWithoutIndex) {
  TempDir dir;
  const std::string ckpt = dir / "ckpt";
  fs::create_directories(ckpt);
  EXPECT_TRUE(
      one_error_line(run_tandem({"generate", "--checkpoint", ckpt}), 1, {ckpt, "index.json"}));
}

TEST(Cli, CheckpointIndexNotJson) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  write_file(ckpt + "/index.json", "{\"format\": \"tandem-checkpoint\",");
  EXPECT_TRUE(
      one_error_line(run_tandem(train_args(valid_data(dir), {{"--model", ""}, {"--steps", "2"}},
                                           {"--resume", ckpt})),
                     1, {ckpt, "index.json", "not valid JSON"}));
}

TEST(Cli, CheckpointIndexWrongFormat) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  nlohmann::json index = read_json(ckpt + "/index.json");
  index["format"] = "someone-elses-checkpoint";
  write_json(ckpt + "/index.json", index);
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", ckpt}), 1,
                             {ckpt, "not a tandem checkpoint"}));
}

TEST(Cli, CheckpointIndexWrongVersion) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  nlohmann::json index = read_json(ckpt + "/index.json");
  index["version"] = 99;
  write_json(ckpt + "/index.json", index);
  EXPECT_TRUE(
      one_error_line(run_tandem({"generate", "--checkpoint", ckpt}), 1, {ckpt, "version", "99"}));
}

TEST(Cli, CheckpointIndexBadModel) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  nlohmann::json index = read_json(ckpt + "/index.json");
  index["model"]["d_model"] = 130;
  write_json(ckpt + "/index.json", index);
  EXPECT_TRUE(
      one_error_line(run_tandem({"generate", "--checkpoint", ckpt}), 1, {ckpt, "d_model", "130"}));
}

TEST(Cli, CheckpointIndexFileEntryIncomplete) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  nlohmann::json index = read_json(ckpt + "/index.json");
  index["files"][0].erase("name");
  write_json(ckpt + "/index.json", index);
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", ckpt}), 1, {ckpt, "name"}));
}

TEST(Cli, CheckpointIndexWithoutFiles) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  nlohmann::json index = read_json(ckpt + "/index.json");
  index["files"] = nlohmann::json::array();
  write_json(ckpt + "/index.json", index);
  const RunResult r = run_tandem({"generate", "--checkpoint", ckpt});
  EXPECT_TRUE(one_error_line(r, 1, {ckpt}));
  // world_size is 1: blaming a multi-rank checkpoint would send the user the wrong way.
  EXPECT_EQ(r.err.find("written by 1 ranks"), std::string::npos) << r.err;
}

TEST(Cli, CheckpointShardMissing) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  const std::string shard = shard_of(ckpt);
  fs::remove(shard);
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", ckpt}), 1, {shard}));
}

TEST(Cli, CheckpointShardTruncated) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  const std::string shard = shard_of(ckpt);
  const auto size = fs::file_size(shard);
  fs::resize_file(shard, size / 2);
  EXPECT_TRUE(
      one_error_line(run_tandem(train_args(valid_data(dir), {{"--model", ""}, {"--steps", "2"}},
                                           {"--resume", ckpt})),
                     1, {shard, std::to_string(size / 2), std::to_string(size), "truncated"}));
}

TEST(Cli, CheckpointShardTruncatedWithMatchingIndex) {
  // Size and checksum in the index agree with the short file: the structural check speaks.
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  const std::string shard = shard_of(ckpt);
  fs::resize_file(shard, fs::file_size(shard) - 1000);
  reseal_shard(ckpt);
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", ckpt}), 1,
                             {fs::path(shard).filename().string(), "layout needs"}));
}

TEST(Cli, CheckpointShardCorrupted) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  const std::string shard = shard_of(ckpt);
  std::string bytes = read_file(shard);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x5a);
  write_file(shard, bytes);
  EXPECT_TRUE(
      one_error_line(run_tandem(train_args(valid_data(dir), {{"--model", ""}, {"--steps", "2"}},
                                           {"--resume", ckpt})),
                     1, {shard, "checksum"}));
}

TEST(Cli, CheckpointShardBadHeader) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  const std::string shard = shard_of(ckpt);
  std::string bytes = read_file(shard);
  bytes[0] = 'X';  // the magic
  write_file(shard, bytes);
  reseal_shard(ckpt);
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", ckpt}), 1, {shard, "header"}));
}

TEST(Cli, GenerateFromCorruptedCheckpoint) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  const std::string shard = shard_of(ckpt);
  std::string bytes = read_file(shard);
  bytes[bytes.size() - 7] = static_cast<char>(bytes[bytes.size() - 7] ^ 0x01);
  write_file(shard, bytes);
  const RunResult r = run_tandem({"generate", "--checkpoint", ckpt, "--prompt", "hello"});
  EXPECT_TRUE(one_error_line(r, 1, {shard, "checksum"}));
  EXPECT_EQ(r.out, "") << "nothing may be generated from a corrupted checkpoint";
}

TEST(Cli, ResumeCheckpointOfAnotherModel) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  EXPECT_TRUE(one_error_line(
      run_tandem(train_args(valid_data(dir), {{"--model", "llama-tiny"}, {"--steps", "2"}},
                            {"--resume", ckpt})),
      1, {"gpt2-tiny", "llama-tiny"}));
}

TEST(Cli, ResumeWithAnotherSequenceLength) {
  TempDir dir;
  const std::string ckpt = make_checkpoint(dir);
  EXPECT_TRUE(one_error_line(
      run_tandem(train_args(valid_data(dir), {{"--model", ""}, {"--steps", "2"}, {"--seq", "32"}},
                            {"--resume", ckpt})),
      1, {"16", "32"}));
}

TEST(Cli, GenerateFromCheckpointOfAnotherVocabulary) {
  // generate speaks the byte-level tokenizer; a checkpoint with vocabulary 512 is refused.
  TempDir dir;
  const std::string model = dir / "model.json", ckpt = dir / "ckpt";
  write_json(model, {{"preset", "gpt2-tiny"}, {"vocab", 512}, {"n_layer", 1}});
  ASSERT_TRUE(
      succeeded(run_tandem(train_args(valid_data(dir), {{"--model", model}, {"--save", ckpt}}))));
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", ckpt, "--tokens", "1"}), 1,
                             {"512", "256"}));
}

}  // namespace
}  // namespace tandem::cli_test
