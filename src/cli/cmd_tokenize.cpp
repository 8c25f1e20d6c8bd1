// tandem tokenize: text to ids and ids to text with any tokenizer tandem reads.
#include <fmt/format.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "io/tokenizer.h"

namespace tandem {

namespace {

// "1,2,3" (spaces allowed) -> ids.
std::vector<uint32_t> parse_ids(const std::string& list) {
  std::vector<uint32_t> ids;
  size_t i = 0;
  while (i < list.size()) {
    while (i < list.size() && (list[i] == ' ' || list[i] == ',')) ++i;
    if (i == list.size()) break;
    size_t j = i;
    while (j < list.size() && list[j] >= '0' && list[j] <= '9') ++j;
    TD_CHECK(j > i && (j == list.size() || list[j] == ',' || list[j] == ' ') && j - i <= 10,
             "--decode takes token ids separated by commas, e.g. 1,2,3; '{}' is not one",
             list.substr(i, list.find(',', i) - i));
    const uint64_t v = std::stoull(list.substr(i, j - i));
    TD_CHECK(v <= 0xFFFFFFFFu, "--decode: token id {} does not fit 32 bits", v);
    ids.push_back(static_cast<uint32_t>(v));
    i = j;
  }
  return ids;
}

}  // namespace

void cli_add_tokenize(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Encode text to token ids, or decode ids to text");
  struct Args {
    std::string tokenizer, text, file, decode;
    bool json = false, add_special = false, skip_special = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--tokenizer", a->tokenizer,
                  "tokenizer.json, tokenizer.model, vocab.json, or a directory holding one")
      ->required();
  auto* text = cmd->add_option("--text", a->text, "Text to encode");
  auto* file = cmd->add_option("--file", a->file, "File whose text to encode");
  auto* decode = cmd->add_option("--decode", a->decode, "Token ids to decode, e.g. 1,2,3");
  text->excludes(file)->excludes(decode);
  file->excludes(decode);
  cmd->add_flag("--json", a->json, "Print {\"ids\": [...]} (encoding) or {\"text\": ...}");
  cmd->add_flag("--add-special", a->add_special,
                "Add what the tokenizer adds around a text (Llama's BOS)");
  cmd->add_flag("--skip-special", a->skip_special, "Decoding: leave special tokens out");
  cmd->callback([a, text, file, decode] {
    TD_CHECK(text->count() + file->count() + decode->count() == 1,
             "give one of --text, --file or --decode");
    const std::unique_ptr<Tokenizer> tok = tokenizer_load(a->tokenizer);
    if (decode->count() > 0) {
      const std::string out = tok->decode(parse_ids(a->decode), a->skip_special);
      if (a->json) {
        fmt::print("{}\n", nlohmann::json{{"text", out}}.dump(
                               -1, ' ', false, nlohmann::json::error_handler_t::replace));
      } else {
        fmt::print("{}\n", out);
      }
      return;
    }
    std::string input = a->text;
    if (file->count() > 0) {
      std::ifstream in(a->file, std::ios::binary);
      TD_CHECK(in.good(), "cannot read text file '{}'", a->file);
      input.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    const std::vector<uint32_t> ids = tok->encode(input, a->add_special);
    if (a->json) {
      fmt::print("{}\n", nlohmann::json{{"ids", ids}}.dump());
    } else {
      fmt::print("{}\n", fmt::join(ids, " "));
    }
  });
}

}  // namespace tandem
