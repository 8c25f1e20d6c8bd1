// The tokenizer fixtures of tests/fixtures/tokenizers/ (tools/make_tokenizer_fixtures.mjs):
// the reference ids of the node encoders, and Llama 2 and Llama 3 tokenizer.json files built
// from the compact vocabularies the way their published tokenizer.json files are laid out.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tandem::tok_test {

namespace fs = std::filesystem;
using nlohmann::json;

inline std::string fixture_dir() {
  return std::string(TANDEM_TEST_DATA_DIR) + "/fixtures/tokenizers";
}

inline std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

inline std::vector<std::string> lines_of(const std::string& path) {
  const std::string text = slurp(path);
  std::vector<std::string> lines;
  for (size_t i = 0; i < text.size();) {
    size_t e = text.find('\n', i);
    if (e == std::string::npos) e = text.size();
    lines.push_back(text.substr(i, e - i));
    i = e + 1;
  }
  return lines;
}

struct RefCase {
  std::string text;  // the bytes given to the encoder
  std::vector<uint32_t> ids;
};

inline std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

inline const json& node_reference() {
  static const json j = json::parse(slurp(fixture_dir() + "/expected_node.json"));
  return j;
}

inline std::vector<RefCase> reference_cases(const json& list) {
  std::vector<RefCase> cases;
  for (const json& c : list) {
    RefCase r;
    r.text = c.contains("text") ? c["text"].get<std::string>() : from_hex(c["hex"]);
    r.ids = c["ids"].get<std::vector<uint32_t>>();
    cases.push_back(std::move(r));
  }
  return cases;
}

// vocab.txt (id = line number) and merges.txt ("a b" lines) of a compact fixture.
inline json compact_model(const std::string& name) {
  json vocab = json::object();
  const auto tokens = lines_of(fixture_dir() + "/" + name + "/vocab.txt");
  for (size_t i = 0; i < tokens.size(); ++i) vocab[tokens[i]] = i;
  json merges = json::array();
  for (const std::string& m : lines_of(fixture_dir() + "/" + name + "/merges.txt"))
    merges.push_back(m);
  return json{{"vocab", vocab}, {"merges", merges}};
}

inline json added(uint32_t id, const std::string& content, bool special = true) {
  return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
              {"rstrip", false}, {"normalized", false}, {"special", special}};
}

inline json template_bos(const std::string& bos, uint32_t id) {
  return json{{"type", "TemplateProcessing"},
              {"single", json::array({json{{"SpecialToken", {{"id", bos}, {"type_id", 0}}}},
                                      json{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
              {"pair", json::array()},
              {"special_tokens", {{bos, {{"id", bos}, {"ids", {id}}, {"tokens", {bos}}}}}}};
}

inline const char* llama3_pattern() {
  return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
}

// Llama 3's tokenizer.json: Split by its pattern, ByteLevel without the GPT-2 split, BPE
// with ignore_merges, 256 special tokens, BOS added by a template.
inline json llama3_tokenizer_json() {
  json model = compact_model("llama3");
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = nullptr;
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = false;
  model["byte_fallback"] = false;
  model["ignore_merges"] = true;
  json added_tokens = json::array();
  const auto specials = node_reference()["llama3_specials"].get<std::vector<std::string>>();
  for (size_t i = 0; i < specials.size(); ++i)
    added_tokens.push_back(added(static_cast<uint32_t>(128000 + i), specials[i]));
  json pre = {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"},
                 {"pattern", {{"Regex", llama3_pattern()}}},
                 {"behavior", "Isolated"},
                 {"invert", false}},
                {{"type", "ByteLevel"},
                 {"add_prefix_space", false},
                 {"trim_offsets", true},
                 {"use_regex", false}}}}};
  json post = {{"type", "Sequence"},
               {"processors",
                {{{"type", "ByteLevel"},
                  {"add_prefix_space", true},
                  {"trim_offsets", false},
                  {"use_regex", true}},
                 template_bos("<|begin_of_text|>", 128000)}}};
  return json{{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", added_tokens},
              {"normalizer", nullptr},
              {"pre_tokenizer", pre},
              {"post_processor", post},
              {"decoder",
               {{"type", "ByteLevel"},
                {"add_prefix_space", true},
                {"trim_offsets", true},
                {"use_regex", true}}},
              {"model", model}};
}

// Llama 2's tokenizer.json as Hugging Face's converter writes it: "▁" prepended and spaces
// replaced by the normalizer, no pre-tokenizer, BPE with byte fallback, and the decoder
// chain that undoes it.
inline json llama2_tokenizer_json() {
  json model = compact_model("llama2");
  model["type"] = "BPE";
  model["dropout"] = nullptr;
  model["unk_token"] = "<unk>";
  model["continuing_subword_prefix"] = nullptr;
  model["end_of_word_suffix"] = nullptr;
  model["fuse_unk"] = true;
  model["byte_fallback"] = true;
  json norm = {
      {"type", "Sequence"},
      {"normalizers",
       {{{"type", "Prepend"}, {"prepend", "\xE2\x96\x81"}},
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\xE2\x96\x81"}}}}};
  json dec = {{"type", "Sequence"},
              {"decoders",
               {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                {{"type", "ByteFallback"}},
                {{"type", "Fuse"}},
                {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  return json{{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", {added(0, "<unk>"), added(1, "<s>"), added(2, "</s>")}},
              {"normalizer", norm},
              {"pre_tokenizer", nullptr},
              {"post_processor", template_bos("<s>", 1)},
              {"decoder", dec},
              {"model", model}};
}

// Directories removed when the test process ends.
struct ProcessDirs {
  std::vector<fs::path> dirs;
  ~ProcessDirs() {
    std::error_code ec;
    for (const auto& d : dirs) fs::remove_all(d, ec);
  }
};

// Writes j once per process to a file under the temporary directory and returns its path.
inline std::string written_once(const std::string& name, const json& (*make)()) {
  static ProcessDirs cleanup;
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("tandem_tok_{}_{}", name, ::getpid());
  const fs::path file = dir / "tokenizer.json";
  if (!fs::exists(file)) {
    fs::create_directories(dir);
    std::ofstream(file) << make().dump();
    cleanup.dirs.push_back(dir);
  }
  return file.string();
}

inline const json& llama3_json_once() {
  static const json j = llama3_tokenizer_json();
  return j;
}
inline const json& llama2_json_once() {
  static const json j = llama2_tokenizer_json();
  return j;
}

inline std::string llama3_file() {
  return written_once("llama3", llama3_json_once);
}
inline std::string llama2_file() {
  return written_once("llama2", llama2_json_once);
}

}  // namespace tandem::tok_test
