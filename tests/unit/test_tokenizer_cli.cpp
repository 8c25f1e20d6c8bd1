// `tandem tokenize`, `tandem data prepare --tokenizer` and `tandem generate` with a tokenizer
// saved in the checkpoint, and malformed tokenizer files: each runs the real binary and
// expects one clear "tandem: error: ..." line naming the file and the JSON path.
#include <gtest/gtest.h>

#include "cli_runner.h"
#include "io/regex.h"
#include "io/tokens.h"
#include "tokenizer_fixtures.h"

namespace tandem::cli_test {
namespace {

namespace fs = std::filesystem;
using tok_test::fixture_dir;
using tok_test::json;

#define NEED_PCRE2() \
  if (!Regex::available()) GTEST_SKIP() << "built without PCRE2 (install libpcre2-dev)"

std::string gpt2_vocab() {
  return fixture_dir() + "/gpt2/vocab.json";
}

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// A small valid tokenizer.json; tests break one part of it.
json valid_json() {
  return {{"version", "1.0"},
          {"added_tokens", {tok_test::added(3, "</s>")}},
          {"normalizer", nullptr},
          {"pre_tokenizer", nullptr},
          {"decoder", nullptr},
          {"model",
           {{"type", "BPE"},
            {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"</s>", 3}}},
            {"merges", {"a b"}}}}};
}

RunResult tokenize_with(const TempDir& dir, const json& j) {
  const std::string path = dir / "tokenizer.json";
  write(path, j.dump());
  return run_tandem({"tokenize", "--tokenizer", path, "--text", "ab"});
}

TEST(CliTokenize, EncodeDecodeJson) {
  NEED_PCRE2();
  RunResult r = run_tandem({"tokenize", "--tokenizer", gpt2_vocab(), "--text", "Hello world"});
  ASSERT_TRUE(succeeded(r));
  EXPECT_EQ(r.out, "15496 995\n");
  r = run_tandem({"tokenize", "--tokenizer", gpt2_vocab(), "--text", "Hello", "--json"});
  EXPECT_EQ(r.out, "{\"ids\":[15496]}\n");
  r = run_tandem({"tokenize", "--tokenizer", gpt2_vocab(), "--decode", "15496,995,50256"});
  EXPECT_EQ(r.out, "Hello world<|endoftext|>\n");
  r = run_tandem(
      {"tokenize", "--tokenizer", gpt2_vocab(), "--decode", "15496,50256", "--skip-special"});
  EXPECT_EQ(r.out, "Hello\n");
  TempDir dir;
  write(dir / "t.txt", "it's");
  r = run_tandem({"tokenize", "--tokenizer", fixture_dir() + "/gpt2", "--file", dir / "t.txt"});
  EXPECT_EQ(r.out, "270 338\n");
}

TEST(CliTokenize, BadArguments) {
  NEED_PCRE2();
  EXPECT_TRUE(one_error_line(run_tandem({"tokenize", "--tokenizer", gpt2_vocab()}), 1,
                             {"--text", "--file", "--decode"}));
  EXPECT_TRUE(one_error_line(
      run_tandem({"tokenize", "--tokenizer", gpt2_vocab(), "--decode", "1,x"}), 1, {"'x'"}));
  EXPECT_TRUE(
      one_error_line(run_tandem({"tokenize", "--tokenizer", gpt2_vocab(), "--decode", "50300"}), 1,
                     {"50300", "position 0"}));
  EXPECT_TRUE(one_error_line(
      run_tandem({"tokenize", "--tokenizer", gpt2_vocab(), "--text", "a", "--decode", "1"}), 2,
      {"excludes"}));
}

TEST(CliTokenize, MissingOrUnknownFiles) {
  TempDir dir;
  EXPECT_TRUE(one_error_line(run_tandem({"tokenize", "--tokenizer", dir / "none", "--text", "a"}),
                             1, {"does not exist"}));
  EXPECT_TRUE(
      one_error_line(run_tandem({"tokenize", "--tokenizer", dir.path().string(), "--text", "a"}), 1,
                     {"holds no tokenizer"}));
  write(dir / "vocab.txt", "a\n");
  EXPECT_TRUE(
      one_error_line(run_tandem({"tokenize", "--tokenizer", dir / "vocab.txt", "--text", "a"}), 1,
                     {"vocab.txt", "not a tokenizer file"}));
  fs::copy_file(gpt2_vocab(), dir / "vocab.json");
  EXPECT_TRUE(
      one_error_line(run_tandem({"tokenize", "--tokenizer", dir / "vocab.json", "--text", "a"}), 1,
                     {"merges.txt"}));
  write(dir / "merges.txt", "#version: 0.2\nĠ t h\n");
  EXPECT_TRUE(
      one_error_line(run_tandem({"tokenize", "--tokenizer", dir / "vocab.json", "--text", "a"}), 1,
                     {"merges.txt", "line 2"}));
  write(dir / "merges.txt", "#version: 0.2\nĠ zzzz\n");
  EXPECT_TRUE(
      one_error_line(run_tandem({"tokenize", "--tokenizer", dir / "vocab.json", "--text", "a"}), 1,
                     {"merge 0", "'zzzz'", "not in the vocabulary"}));
  write(dir / "tokenizer.model", "not a model");
  const RunResult r =
      run_tandem({"tokenize", "--tokenizer", dir / "tokenizer.model", "--text", "a"});
  EXPECT_TRUE(one_error_line(r, 1, {"tokenizer.model"}));
}

// One malformed tokenizer.json per case: (what to break, the words the error must hold).
TEST(CliTokenizerJson, MalformedFilesGiveOneClearError) {
  TempDir dir;
  ASSERT_TRUE(succeeded(tokenize_with(dir, valid_json())));
  EXPECT_EQ(tokenize_with(dir, valid_json()).out, "2\n");
  struct Case {
    const char* what;
    std::function<void(json&)> edit;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"model type",
       [](json& j) { j["model"]["type"] = "WordPiece"; },
       {"/model/type", "WordPiece", "not supported"}},
      {"no model", [](json& j) { j.erase("model"); }, {"/model", "missing"}},
      {"unknown option",
       [](json& j) { j["model"]["bogus"] = 1; },
       {"/model/bogus", "unsupported option"}},
      {"unknown top key", [](json& j) { j["extra"] = 1; }, {"/extra", "unsupported option"}},
      {"dropout", [](json& j) { j["model"]["dropout"] = 0.1; }, {"/model/dropout"}},
      {"suffix",
       [](json& j) { j["model"]["end_of_word_suffix"] = "</w>"; },
       {"/model/end_of_word_suffix"}},
      {"vocab not an object",
       [](json& j) { j["model"]["vocab"] = json::array(); },
       {"/model/vocab"}},
      {"bad id", [](json& j) { j["model"]["vocab"]["a"] = -1; }, {"/model/vocab/a"}},
      {"duplicate id", [](json& j) { j["model"]["vocab"]["c"] = 0; }, {"id 0"}},
      {"merge missing token",
       [](json& j) { j["model"]["merges"] = {"a c"}; },
       {"merge 0", "'c'", "not in the vocabulary"}},
      {"merge result missing",
       [](json& j) { j["model"]["merges"] = {"b a"}; },
       {"merge 0", "'ba'"}},
      {"merge shape",
       [](json& j) { j["model"]["merges"] = {"a b c"}; },
       {"/model/merges/0", "one space"}},
      {"merge pair shape", [](json& j) { j["model"]["merges"] = {{"a"}}; }, {"/model/merges/0"}},
      {"unk missing",
       [](json& j) { j["model"]["unk_token"] = "<unk>"; },
       {"/model/unk_token", "<unk>"}},
      {"normalizer NFKC",
       [](json& j) {
         j["normalizer"] = {{"type", "NFKC"}};
       },
       {"/normalizer/type", "NFKC", "not supported"}},
      {"nested normalizer",
       [](json& j) {
         j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Lowercase"}}}}};
       },
       {"/normalizer/normalizers/0/type", "Lowercase"}},
      {"regex replace",
       [](json& j) {
         j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", "_"}};
       },
       {"/normalizer/pattern", "Regex"}},
      {"pre-tokenizer type",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       {"/pre_tokenizer/type", "Whitespace"}},
      {"split behavior",
       [](json& j) {
         j["pre_tokenizer"] = {
             {"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}};
       },
       {"/pre_tokenizer/behavior", "Sideways"}},
      {"split invert",
       [](json& j) {
         j["pre_tokenizer"] = {{"type", "Split"},
                               {"pattern", {{"String", " "}}},
                               {"behavior", "Isolated"},
                               {"invert", true}};
       },
       {"/pre_tokenizer/invert"}},
      {"decoder type",
       [](json& j) {
         j["decoder"] = {{"type", "WordPiece"}};
       },
       {"/decoder/type", "WordPiece"}},
      {"strip content",
       [](json& j) {
         j["decoder"] = {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}};
       },
       {"/decoder/content"}},
      {"post-processor type",
       [](json& j) {
         j["post_processor"] = {{"type", "BertProcessing"}};
       },
       {"/post_processor/type", "BertProcessing"}},
      {"template without text",
       [](json& j) {
         j["post_processor"] = tok_test::template_bos("</s>", 3);
         j["post_processor"]["single"].erase(1);
       },
       {"/post_processor/single", "Sequence A"}},
      {"template unknown special",
       [](json& j) {
         j["post_processor"] = tok_test::template_bos("</s>", 3);
         j["post_processor"]["special_tokens"] = json::object();
       },
       {"/post_processor/special_tokens/</s>", "missing"}},
      {"single_word",
       [](json& j) { j["added_tokens"][0]["single_word"] = true; },
       {"/added_tokens/0/single_word"}},
      {"added id clash",
       [](json& j) { j["added_tokens"][0]["id"] = 7; },
       {"/added_tokens/0/id", "</s>"}},
      {"truncation",
       [](json& j) {
         j["truncation"] = {{"max_length", 8}};
       },
       {"/truncation"}},
  };
  for (const Case& c : cases) {
    json j = valid_json();
    c.edit(j);
    std::vector<std::string> needles = c.needles;
    needles.push_back(dir / "tokenizer.json");
    const RunResult r = tokenize_with(dir, j);
    EXPECT_TRUE(one_error_line(r, 1, {})) << c.what;
    for (const std::string& n : needles)
      EXPECT_NE(r.err.find(n), std::string::npos) << c.what << ": no '" << n << "' in " << r.err;
  }
  write(dir / "tokenizer.json", "{\"model\": ");
  EXPECT_TRUE(
      one_error_line(run_tandem({"tokenize", "--tokenizer", dir / "tokenizer.json", "--text", "a"}),
                     1, {"not valid JSON"}));
}

TEST(CliTokenizerJson, BadRegex) {
  NEED_PCRE2();
  TempDir dir;
  json j = valid_json();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(a"}}}, {"behavior", "Isolated"}};
  EXPECT_TRUE(one_error_line(tokenize_with(dir, j), 1, {"/pre_tokenizer/pattern", "offset"}));
}

TEST(CliDataPrepare, TokenizerThreadsAndCheckpointDirectory) {
  NEED_PCRE2();
  TempDir dir;
  write(dir / "a.txt", "Hello world\nit's a test\n");
  write(dir / "b.txt", "second");
  const std::string out = dir / "out.tok";
  RunResult r = run_tandem({"data", "prepare", "--tokenizer", gpt2_vocab(), "--text", dir / "a.txt",
                            dir / "b.txt", "--out", out, "--threads", "2", "--progress", "lines"});
  ASSERT_TRUE(succeeded(r));
  EXPECT_NE(r.out.find("GPT-2 BPE"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tokenizing: 100%"), std::string::npos) << r.out;
  const std::vector<uint32_t> expected = {15496, 995, 198, 270, 338, 257, 1332, 198, 50256, 12227};
  EXPECT_EQ(tokens_read(out).tokens, expected);

  // A directory holding a tokenizer is used without naming the file; one without, bytes.
  fs::create_directories(dir / "model");
  fs::copy_file(gpt2_vocab(), dir / "model/vocab.json");
  fs::copy_file(fixture_dir() + "/gpt2/merges.txt", dir / "model/merges.txt");
  r = run_tandem({"data", "prepare", "--checkpoint", dir / "model", "--text", dir / "a.txt",
                  dir / "b.txt", "--out", out, "--progress", "none"});
  ASSERT_TRUE(succeeded(r));
  EXPECT_EQ(tokens_read(out).tokens, expected);
  fs::create_directories(dir / "empty");
  r = run_tandem(
      {"data", "prepare", "--checkpoint", dir / "empty", "--text", dir / "b.txt", "--out", out});
  ASSERT_TRUE(succeeded(r));
  EXPECT_EQ(tokens_read(out).tokens, (std::vector<uint32_t>{'s', 'e', 'c', 'o', 'n', 'd'}));

  EXPECT_TRUE(one_error_line(run_tandem({"data", "prepare", "--tokenizer", gpt2_vocab(), "--text",
                                         dir / "a.txt", "--out", out, "--threads", "-1"}),
                             1, {"--threads"}));
  json no_eos = valid_json();
  no_eos["added_tokens"] = json::array();
  no_eos["model"]["vocab"].erase("</s>");
  write(dir / "tokenizer.json", no_eos.dump());
  write(dir / "ab.txt", "abab");
  EXPECT_TRUE(one_error_line(run_tandem({"data", "prepare", "--tokenizer", dir / "tokenizer.json",
                                         "--text", dir / "ab.txt", "--out", out}),
                             1, {"no EOS"}));
  // A character the vocabulary lacks, with no unk token, stops the run with its name.
  write(dir / "tokenizer.json", valid_json().dump());
  EXPECT_TRUE(one_error_line(run_tandem({"data", "prepare", "--tokenizer", dir / "tokenizer.json",
                                         "--text", dir / "a.txt", "--out", out}),
                             1, {"'H'", "no unk token"}));
  EXPECT_TRUE(fs::exists(out));  // the earlier file is left as it was
}

// A model of vocabulary 300 trained on data of a 300-token tokenizer; generate finds the
// tokenizer in the checkpoint directory.
TEST(CliGenerate, UsesTheTokenizerOfTheCheckpoint) {
  TempDir dir;
  json tok = valid_json();
  json v = json::object();
  for (int c = 'a'; c <= 'z'; ++c) v[std::string(1, static_cast<char>(c))] = c - 'a';
  v[" "] = 26;
  v["</s>"] = 27;
  v["ab"] = 299;  // the vocabulary runs to 300
  tok["model"]["vocab"] = v;
  tok["model"]["merges"] = {"a b"};
  tok["added_tokens"] = {tok_test::added(27, "</s>")};
  tok["decoder"] = {{"type", "Fuse"}};
  write(dir / "tokenizer.json", tok.dump());
  std::string text;
  for (int i = 0; i < 40; ++i) text += "ab abc cab bad dab ";
  write(dir / "t.txt", text);
  ASSERT_TRUE(succeeded(run_tandem({"data", "prepare", "--tokenizer", dir / "tokenizer.json",
                                    "--text", dir / "t.txt", "--out", dir / "d.tok"})));
  write(dir / "model.json", json{{"preset", "gpt2-tiny"}, {"vocab", 300}}.dump());
  const std::string ckpt = dir / "ckpt";
  ASSERT_TRUE(succeeded(
      run_tandem({"train", "--model", dir / "model.json", "--data", dir / "d.tok", "--batch", "1",
                  "--seq", "16", "--steps", "1", "--progress", "none", "--save", ckpt})));
  fs::copy_file(dir / "tokenizer.json", fs::path(ckpt) / "tokenizer.json");
  const RunResult r = run_tandem(
      {"generate", "--checkpoint", ckpt, "--prompt", "ab", "--tokens", "4", "--temperature", "0"});
  ASSERT_TRUE(succeeded(r));
  EXPECT_EQ(r.out.rfind("ab", 0), 0u) << r.out;
  // A tokenizer larger than the model is refused.
  v["abc"] = 400;
  tok["model"]["vocab"] = v;
  write(fs::path(ckpt) / "tokenizer.json", tok.dump());
  EXPECT_TRUE(one_error_line(run_tandem({"generate", "--checkpoint", ckpt, "--tokens", "1"}), 1,
                             {"vocabulary of 300", "401"}));
}

}  // namespace
}  // namespace tandem::cli_test
