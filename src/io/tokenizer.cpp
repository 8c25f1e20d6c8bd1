// The byte tokenizer, and tokenizer_load: which kind a path holds, and BOS/EOS from the
// configuration files beside it.
#include "io/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/tokenizer_kinds.h"

namespace tandem {

namespace fs = std::filesystem;

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<uint32_t> ids;
  encode_into(text, add_special_tokens, ids);
  return ids;
}

void ByteTokenizer::encode_into(std::string_view text, bool, std::vector<uint32_t>& out) const {
  const size_t first = out.size();
  out.resize(first + text.size());
  for (size_t i = 0; i < text.size(); ++i) out[first + i] = static_cast<unsigned char>(text[i]);
}

std::string ByteTokenizer::decode(std::span<const uint32_t> tokens, bool) const {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    TD_CHECK(tokens[i] < static_cast<uint32_t>(kVocab),
             "cannot decode token {} at position {}: the byte tokenizer's vocabulary is {} "
             "(tokens 0..{})",
             tokens[i], i, kVocab, kVocab - 1);
    text[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
  }
  return text;
}

std::optional<uint32_t> ByteTokenizer::token_to_id(std::string_view token) const {
  if (token.size() != 1) return std::nullopt;
  return static_cast<unsigned char>(token[0]);
}

std::optional<std::string> ByteTokenizer::id_to_token(uint32_t id) const {
  if (id >= static_cast<uint32_t>(kVocab)) return std::nullopt;
  return std::string(1, static_cast<char>(id));
}

namespace {

// bos_token / eos_token of a tokenizer_config.json or special_tokens_map.json: a string, an
// object with "content", or null.
void apply_special_config(const fs::path& file, Tokenizer& t) {
  std::ifstream in(file);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    TD_THROW("tokenizer configuration '{}' is not valid JSON: {}", file.string(), e.what());
  }
  TD_CHECK(j.is_object(), "tokenizer configuration '{}' must be a JSON object", file.string());
  for (const char* key : {"bos_token", "eos_token"}) {
    const auto it = j.find(key);
    if (it == j.end()) continue;
    std::optional<uint32_t> id;
    if (!it->is_null()) {
      const nlohmann::json& v = it->is_object() && it->contains("content") ? (*it)["content"] : *it;
      TD_CHECK(v.is_string(),
               "tokenizer configuration '{}': '{}' must be a string or an object "
               "with \"content\", found {}",
               file.string(), key, it->dump());
      id = t.token_to_id(v.get<std::string>());
      TD_CHECK(id.has_value(),
               "tokenizer configuration '{}': {} '{}' is not a token of the "
               "tokenizer",
               file.string(), key, v.get<std::string>());
    }
    (std::string(key) == "bos_token" ? t.set_bos(id) : t.set_eos(id));
  }
}

std::unique_ptr<Tokenizer> load_file(const fs::path& p) {
  const std::string name = p.filename().string();
  const std::string ext = p.extension().string();
  if (ext == ".model") return tokenizer_spm_load(p.string());
  if (name == "vocab.json" || name == "encoder.json") {
    const fs::path merges = p.parent_path() / (name == "vocab.json" ? "merges.txt" : "vocab.bpe");
    TD_CHECK(fs::is_regular_file(merges),
             "GPT-2 vocabulary '{}' needs its merges file '{}' beside it", p.string(),
             merges.string());
    return tokenizer_gpt2_load(p.string(), merges.string());
  }
  if (ext == ".json") return tokenizer_json_load(p.string());
  TD_THROW(
      "'{}' is not a tokenizer file tandem reads: give a tokenizer.json, a SentencePiece "
      "tokenizer.model, a GPT-2 vocab.json (with merges.txt beside it), or a directory holding "
      "one",
      p.string());
}

}  // namespace

std::string tokenizer_find(const std::string& dir) {
  for (const char* name : {"tokenizer.json", "tokenizer.model", "vocab.json", "encoder.json"}) {
    const fs::path p = fs::path(dir) / name;
    if (fs::is_regular_file(p)) return p.string();
  }
  return "";
}

std::unique_ptr<Tokenizer> tokenizer_load(const std::string& path) {
  std::error_code ec;
  TD_CHECK(fs::exists(path, ec), "tokenizer '{}' does not exist", path);
  fs::path file = path;
  if (fs::is_directory(path, ec)) {
    const std::string found = tokenizer_find(path);
    TD_CHECK(!found.empty(),
             "directory '{}' holds no tokenizer (tokenizer.json, tokenizer.model, vocab.json + "
             "merges.txt or encoder.json + vocab.bpe)",
             path);
    file = found;
  }
  TD_CHECK(fs::is_regular_file(file, ec), "tokenizer '{}' is not a regular file", file.string());
  std::unique_ptr<Tokenizer> t = load_file(file);
  // The model directory's own word on BOS and EOS, the more specific file last.
  for (const char* name : {"special_tokens_map.json", "tokenizer_config.json"}) {
    const fs::path cfg = file.parent_path() / name;
    if (fs::is_regular_file(cfg, ec)) apply_special_config(cfg, *t);
  }
  return t;
}

std::unique_ptr<Tokenizer> tokenizer_for_directory(const std::string& dir) {
  if (tokenizer_find(dir).empty()) return std::make_unique<ByteTokenizer>();
  return tokenizer_load(dir);
}

}  // namespace tandem
