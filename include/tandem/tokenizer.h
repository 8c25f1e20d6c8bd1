// Tokenizers: text to token ids and back, with the tokenizer files real models ship
// (Hugging Face tokenizer.json with a BPE model, GPT-2's vocab.json + merges.txt,
// SentencePiece tokenizer.model) or the byte tokenizer of the byte-level presets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/error.h"

namespace tandem::api {

class Tokenizer {
 public:
  // Loads a tokenizer.json, tokenizer.model, vocab.json (merges.txt beside it) or
  // encoder.json (vocab.bpe beside it), or the one a directory holds (a checkpoint or a
  // Hugging Face model directory; tokenizer.json first). BOS and EOS come from
  // tokenizer_config.json or special_tokens_map.json beside it where present. Throws
  // tandem::Error naming the file (and, for a malformed tokenizer.json, the JSON path).
  static Tokenizer from_file(const std::filesystem::path& path);
  // The byte tokenizer: token i is byte value i (vocabulary 256).
  static Tokenizer bytes();

  // Ids of text; add_special_tokens adds what the tokenizer adds around a text (Llama's
  // BOS). Invalid UTF-8 reads as U+FFFD, except with the byte tokenizer.
  std::vector<uint32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Text of ids; throws tandem::Error on an id outside the vocabulary.
  std::string decode(const std::vector<uint32_t>& ids, bool skip_special_tokens = false) const;

  // One past the largest id the tokenizer produces.
  std::size_t vocab_size() const;
  std::optional<uint32_t> bos_id() const;
  std::optional<uint32_t> eos_id() const;
  std::optional<uint32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(uint32_t id) const;
  // "byte", "tokenizer.json BPE", "GPT-2 BPE" or "SentencePiece".
  std::string kind() const;

 private:
  struct Impl;
  friend class Model;  // a loaded model's own tokenizer (tandem/inference.h)
  friend struct PrepareReport prepare_text_files(const std::vector<std::filesystem::path>&,
                                                 const std::filesystem::path&, const Tokenizer&,
                                                 int);
  explicit Tokenizer(std::shared_ptr<const Impl> impl);
  std::shared_ptr<const Impl> impl_;
};

}  // namespace tandem::api

#if !defined(TANDEM_BUILDING_LIBRARY)
namespace tandem {
using namespace api;  // NOLINT(build/namespaces): the re-export (see tandem/error.h)
}  // namespace tandem
#endif
