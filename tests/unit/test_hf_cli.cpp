// Hugging Face directories at the command line: every refused input (an architecture or a
// config field tandem cannot honour, an unknown key, a missing, extra or misshapen tensor,
// a damaged file, a lying header, duplicate names, a bad index) ends with one
// "tandem: error: ..." line naming the file and the tensor or field; and the commands that
// take one (export --format hf, train --init-from, plan, generate) work end to end.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "hf_test_util.h"
#include "io/safetensors.h"
#include "io/tokens.h"

namespace tandem::cli_test {
namespace {

namespace fs = std::filesystem;
using namespace hf_test;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// one_error_line (exit 1) with needles held in a vector.
::testing::AssertionResult error_naming(const RunResult& r,
                                        const std::vector<std::string>& needles) {
  ::testing::AssertionResult base = one_error_line(r, 1, {});
  if (!base) return base;
  for (const std::string& n : needles)
    if (r.err.find(n) == std::string::npos)
      return ::testing::AssertionFailure() << "the error line does not mention '" << n << "'\n"
                                           << r.describe();
  return ::testing::AssertionSuccess();
}

// `tandem export --format hf` of a directory: reads and validates all of it.
RunResult export_of(const std::string& dir, const std::string& out) {
  return run_tandem({"export", "--format", "hf", "--checkpoint", dir, "--out", out});
}

// A valid directory of `config` with one config change applied, then exported.
RunResult with_config(const TempDir& dir, ordered_json config, const Shapes& shapes,
                      const std::function<void(ordered_json&)>& edit) {
  edit(config);
  write_dir(dir / "m", config, random_tensors(shapes, "F32"));
  return export_of(dir / "m", dir / "out");
}

TEST(HfCli, RefusesConfigFieldsTandemCannotHonour) {
  struct Bad {
    const char* what;
    ordered_json config;
    std::function<void(ordered_json&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Bad> bad = {
      {"architecture",
       gpt2_config(),
       [](ordered_json& c) { c["architectures"] = {"BertModel"}; },
       {"config.json", "BertModel", "not supported"}},
      {"rope_scaling",
       llama_config(),
       [](ordered_json& c) {
         c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
       },
       {"config.json", "rope_scaling", "llama3"}},
      {"rope_parameters",
       llama_config(),
       [](ordered_json& c) {
         c["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 10000.0}};
       },
       {"config.json", "rope_parameters", "linear"}},
      {"sliding_window",
       llama_config(),
       [](ordered_json& c) { c["sliding_window"] = 4096; },
       {"config.json", "sliding_window"}},
      {"attention_bias",
       llama_config(),
       [](ordered_json& c) { c["attention_bias"] = true; },
       {"config.json", "attention_bias"}},
      {"mlp_bias",
       llama_config(),
       [](ordered_json& c) { c["mlp_bias"] = true; },
       {"config.json", "mlp_bias"}},
      {"pretraining_tp",
       llama_config(),
       [](ordered_json& c) { c["pretraining_tp"] = 2; },
       {"config.json", "pretraining_tp"}},
      {"layer scaling",
       gpt2_config(),
       [](ordered_json& c) { c["scale_attn_by_inverse_layer_idx"] = true; },
       {"config.json", "scale_attn_by_inverse_layer_idx"}},
      {"cross attention",
       gpt2_config(),
       [](ordered_json& c) { c["add_cross_attention"] = true; },
       {"config.json", "add_cross_attention"}},
      {"hidden_act",
       llama_config(),
       [](ordered_json& c) { c["hidden_act"] = "relu"; },
       {"config.json", "hidden_act", "relu"}},
      {"activation_function",
       gpt2_config(),
       [](ordered_json& c) { c["activation_function"] = "quick_gelu"; },
       {"config.json", "activation_function", "quick_gelu"}},
      {"head_dim",
       llama_config(),
       [](ordered_json& c) { c["head_dim"] = 8; },
       {"config.json", "head_dim"}},
      {"unknown key",
       neox_config(),
       [](ordered_json& c) { c["use_flash_magic"] = true; },
       {"config.json", "unknown key", "use_flash_magic"}},
      {"neox without attention biases",
       neox_config(),
       [](ordered_json& c) { c["attention_bias"] = false; },
       {"config.json", "attention_bias"}},
      {"odd rotary",
       neox_config(),
       [](ordered_json& c) { c["rotary_pct"] = 0.125; },
       {"config.json", "rotary share"}},
      {"missing size",
       neox_config(),
       [](ordered_json& c) { c.erase("hidden_size"); },
       {"config.json", "hidden_size"}},
      {"model_type",
       llama_config(),
       [](ordered_json& c) { c["model_type"] = "mistral"; },
       {"config.json", "model_type", "mistral"}},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    TempDir dir;
    const Shapes shapes = b.config["model_type"] == "gpt2"    ? gpt2_shapes(b.config)
                          : b.config["model_type"] == "llama" ? llama_shapes(b.config)
                                                              : neox_shapes(b.config);
    const RunResult r = with_config(dir, b.config, shapes, b.edit);
    EXPECT_TRUE(error_naming(r, b.needles));
    EXPECT_FALSE(fs::exists(dir / "out"));
  }
}

TEST(HfCli, DuplicateKeyInConfigJson) {
  TempDir dir;
  const ordered_json c = gpt2_config();
  write_dir(dir / "m", c, random_tensors(gpt2_shapes(c), "F32"));
  std::string text = read_file(dir / "m/config.json");
  text.insert(1, "\"n_layer\": 3,");
  write_text(dir / "m/config.json", text);
  EXPECT_TRUE(one_error_line(export_of(dir / "m", dir / "out"), 1,
                             {"config.json", "has the key 'n_layer' twice"}));
}

TEST(HfCli, DropoutIsOneNoteNotAnError) {
  TempDir dir;
  ordered_json c = neox_config();
  c["attention_dropout"] = 0.1;
  c["hidden_dropout"] = 0.1;
  write_dir(dir / "m", c, random_tensors(neox_shapes(c), "F32"));
  const RunResult r = export_of(dir / "m", dir / "out");
  ASSERT_TRUE(succeeded(r));
  size_t notes = 0;
  for (size_t at = r.out.find("note:"); at != std::string::npos; at = r.out.find("note:", at + 1))
    ++notes;
  EXPECT_EQ(notes, 1u) << r.out;
  EXPECT_NE(r.out.find("without dropout"), std::string::npos) << r.out;
}

// Directories whose tensors are wrong, each with the words its error must say.
TEST(HfCli, RefusesWrongTensors) {
  const ordered_json c = gpt2_config();
  const Shapes shapes = gpt2_shapes(c);
  struct Bad {
    const char* what;
    std::function<void(std::vector<SafeTensor>&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Bad> bad = {
      {"missing",
       [](auto& ts) { ts.erase(ts.begin() + 3); },
       {"lacks tensor", "transformer.h.0.ln_1.bias"}},
      {"extra",
       [](auto& ts) { ts.push_back(random_tensor("transformer.h.0.attn.extra", {2}, "F32")); },
       {"model.safetensors", "transformer.h.0.attn.extra"}},
      {"misshapen",
       [](auto& ts) {
         ts[4] = random_tensor("transformer.h.0.attn.c_attn.weight", {48, 16}, "F32");
       },
       {"model.safetensors", "transformer.h.0.attn.c_attn.weight", "[48, 16]", "[16, 48]"}},
      {"integer dtype",
       [](auto& ts) {
         SafeTensor t = ts[2];
         t.dtype = "I32";
         ts[2] = t;
       },
       {"model.safetensors", "transformer.h.0.ln_1.weight", "I32"}},
      {"tied copy that differs",
       [](auto& ts) {
         ts.push_back(random_tensor("lm_head.weight", {100, 16}, "F32", 99));
       },
       {"model.safetensors", "lm_head.weight", "differs"}},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    TempDir dir;
    std::vector<SafeTensor> ts = random_tensors(shapes, "F32");
    b.edit(ts);
    write_dir(dir / "m", c, ts);
    EXPECT_TRUE(error_naming(export_of(dir / "m", dir / "out"), b.needles));
  }
}

// A safetensors file written by hand: 8-byte length, header, data.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i)
    bytes[static_cast<size_t>(i)] = static_cast<char>(header.size() >> (8 * i));
  bytes += header;
  bytes.append(data_bytes, '\0');
  write_text(path, bytes);
}

TEST(HfCli, RefusesDamagedFilesAndLyingHeaders) {
  TempDir dir;
  const ordered_json c = gpt2_config();
  write_dir(dir / "m", c, random_tensors(gpt2_shapes(c), "F32"));
  const std::string file = dir / "m/model.safetensors";
  const std::string good = read_file(file);
  // Truncated: the data section ends early.
  write_text(file, good.substr(0, good.size() - 100));
  EXPECT_TRUE(one_error_line(export_of(dir / "m", dir / "out"), 1, {file, "out of range"}));
  // Headers that lie.
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  write_raw(file, "{" + a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12);
  EXPECT_TRUE(one_error_line(export_of(dir / "m", dir / "out"), 1, {file, "overlap"}));
  write_raw(file, "{" + a + R"(,"b":{"dtype":"F32","shape":[3],"data_offsets":[8,16]}})", 16);
  EXPECT_TRUE(
      one_error_line(export_of(dir / "m", dir / "out"), 1, {file, "'b'", "needs 12 bytes"}));
  write_raw(file, "{" + a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[8,99]}})", 16);
  EXPECT_TRUE(one_error_line(export_of(dir / "m", dir / "out"), 1, {file, "'b'", "out of range"}));
  write_raw(file, "{" + a + "," + a + "}", 8);
  EXPECT_TRUE(
      one_error_line(export_of(dir / "m", dir / "out"), 1, {file, "has the key 'a' twice"}));
  write_text(file, "abc");
  EXPECT_TRUE(one_error_line(export_of(dir / "m", dir / "out"), 1, {file, "truncated"}));
}

TEST(HfCli, RefusesBadShardIndexes) {
  const ordered_json c = llama_config();
  const std::vector<SafeTensor> ts = random_tensors(llama_shapes(c), "BF16");
  const std::string first = "model-00001-of-00002.safetensors";
  const std::string second = "model-00002-of-00002.safetensors";
  struct Bad {
    const char* what;
    std::function<void(const std::string& dir, nlohmann::json& index)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Bad> bad = {
      {"missing file",
       [&](const std::string&, nlohmann::json& ix) {
         ix["weight_map"]["model.norm.weight"] = "model-00009-of-00009.safetensors";
       },
       {"model-00009-of-00009.safetensors", "does not exist"}},
      {"tensor the file lacks",
       [&](const std::string&, nlohmann::json& ix) { ix["weight_map"]["model.extra"] = second; },
       {"model.safetensors.index.json", "model.extra", "does not hold it"}},
      {"tensor the index does not list",
       [&](const std::string&, nlohmann::json& ix) {
         ix["weight_map"].erase("model.layers.0.mlp.up_proj.weight");
       },
       {first, "model.layers.0.mlp.up_proj.weight", "does not list"}},
      {"duplicate across shards",
       [&](const std::string& dir, nlohmann::json&) {
         std::vector<SafeTensor> part = safetensors_read(dir + "/" + second).tensors;
         part.push_back(by_name(ts, "model.embed_tokens.weight"));
         safetensors_write(dir + "/" + second, part, {{"format", "pt"}});
       },
       {"model.embed_tokens.weight", first, second, "both"}},
      {"index key",
       [&](const std::string&, nlohmann::json& ix) { ix["extra"] = 1; },
       {"model.safetensors.index.json", "unknown key", "extra"}},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    TempDir dir;
    write_dir(dir / "m", c, ts, 2);
    nlohmann::json index = nlohmann::json::parse(read_file(dir / "m/model.safetensors.index.json"));
    b.edit(dir / "m", index);
    write_text(dir / "m/model.safetensors.index.json", index.dump(2));
    EXPECT_TRUE(error_naming(export_of(dir / "m", dir / "out"), b.needles));
  }
}

TEST(HfCli, ExportRefusesWhatNoClassExpressesAndExistingDirs) {
  TempDir dir;
  write_text(dir / "rotary.json", R"({"preset": "gpt2-tiny", "rotary_pct": 0.5})");
  EXPECT_TRUE(one_error_line(run_tandem({"export", "--format", "hf", "--model", dir / "rotary.json",
                                         "--out", dir / "out"}),
                             1, {"GPT2LMHeadModel", "rotary"}));
  EXPECT_FALSE(fs::exists(dir / "out"));
  fs::create_directories(dir / "full");
  write_text(dir / "full/x", "x");
  EXPECT_TRUE(one_error_line(
      run_tandem({"export", "--format", "hf", "--model", "gpt2-tiny", "--out", dir / "full"}), 1,
      {dir / "full", "not an empty directory"}));
  EXPECT_TRUE(one_error_line(run_tandem({"export", "--model", "gpt2-tiny", "--dtype", "bf16",
                                         "--out", dir / "x.safetensors"}),
                             1, {"--dtype", "--format hf"}));
}

std::string token_file(const TempDir& dir) {
  std::vector<uint32_t> tokens(600);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 13 % 70);
  const std::string path = dir / "data.tok";
  tokens_write(path, tokens, 2);
  return path;
}

// Fine-tuning: train --init-from an HF directory, export back, read it again; and the
// checks of --init-from against --model and --resume.
TEST(HfCli, TrainFromHfWeightsAndExportBack) {
  TempDir dir;
  const ordered_json c = llama_config(true);
  write_dir(dir / "m", c, random_tensors(llama_shapes(c), "BF16"), 2);
  const std::string data = token_file(dir);
  const std::vector<std::string> base = {"train", "--init-from", dir / "m", "--data",     data,
                                         "--seq", "16",          "--batch", "2",          "--steps",
                                         "2",     "--progress",  "none",    "--hardware", "none"};
  std::vector<std::string> args = base;
  args.insert(args.end(), {"--save", dir / "ckpt", "--metrics", dir / "m.jsonl"});
  const RunResult r = run_tandem(args, 120);
  ASSERT_TRUE(succeeded(r));
  EXPECT_NE(r.out.find("starting from the weights of"), std::string::npos) << r.out;
  ASSERT_TRUE(succeeded(run_tandem({"export", "--format", "hf", "--checkpoint", dir / "ckpt",
                                    "--dtype", "bf16", "--out", dir / "tuned"})));
  const RunResult plan = run_tandem({"plan", "--model", dir / "tuned", "--ranks", "2"});
  EXPECT_TRUE(succeeded(plan));
  EXPECT_TRUE(fs::exists(dir / "tuned/model.safetensors"));

  // --model must name the same model; --resume and --init-from exclude each other.
  std::vector<std::string> wrong = base;
  wrong.insert(wrong.end(), {"--model", "llama-tiny"});
  EXPECT_TRUE(one_error_line(run_tandem(wrong), 1, {"--init-from", dir / "m", "llama-tiny"}));
  std::vector<std::string> both = base;
  both.insert(both.end(), {"--resume", dir / "ckpt"});
  EXPECT_TRUE(one_error_line(run_tandem(both), 1, {"--init-from", "--resume"}));
}

// Every rank reads its own shard of the Hugging Face weights: two ranks under full sharding
// start from the same model as one rank, so their losses agree (up to summation order).
TEST(HfCli, InitFromAtTwoRanksMatchesOneRank) {
  TempDir dir;
  const ordered_json c = neox_config();
  write_dir(dir / "m", c, random_tensors(neox_shapes(c), "F16"), 3);
  const std::string data = token_file(dir);
  std::vector<double> losses[2];
  for (int ranks : {1, 2}) {
    const std::string metrics = dir / ("m" + std::to_string(ranks) + ".jsonl");
    std::vector<std::string> args = {
        "train", "--init-from", dir / "m", "--data",         data,   "--seq",
        "16",    "--batch",     "1",       "--global-batch", "2",    "--steps",
        "2",     "--progress",  "none",    "--hardware",     "none", "--metrics",
        metrics, "--strategy",  "full"};
    if (ranks > 1) args.insert(args.end(), {"--ranks", std::to_string(ranks)});
    ASSERT_TRUE(succeeded(run_tandem(args, 120)));
    std::istringstream in(read_file(metrics));
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("loss")) losses[ranks - 1].push_back(j["loss"].get<double>());
    }
  }
  ASSERT_EQ(losses[0].size(), 2u);
  ASSERT_EQ(losses[1].size(), 2u);
  for (size_t s = 0; s < 2; ++s) EXPECT_NEAR(losses[0][s], losses[1][s], 1e-5 * losses[0][s]);
}

TEST(HfCli, GenerateFromHfDirectory) {
  TempDir dir;
  ordered_json c = gpt2_config();
  c["vocab_size"] = 256;
  write_dir(dir / "m", c, random_tensors(gpt2_shapes(c), "F16"));
  const RunResult r = run_tandem({"generate", "--checkpoint", dir / "m", "--prompt", "ab",
                                  "--tokens", "4", "--temperature", "0"});
  EXPECT_TRUE(succeeded(r));
  // A vocabulary other than the byte tokenizer's is refused by name.
  TempDir other;
  const ordered_json g = gpt2_config();
  write_dir(other / "m", g, random_tensors(gpt2_shapes(g), "F32"));
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", other / "m"}), 1,
                             {"vocabulary of 100"}));
}

}  // namespace
}  // namespace tandem::cli_test
