// Tokenizers: text to token ids and back. One interface over four kinds:
//   - the byte tokenizer (token = byte value; the byte-level presets),
//   - Hugging Face tokenizer.json files with a BPE model (GPT-2, Pythia, Llama 2, Llama 3),
//   - GPT-2's vocab.json + merges.txt (also spelled encoder.json + vocab.bpe),
//   - SentencePiece .model files (Llama 2's tokenizer.model), through libsentencepiece.
// tokenizer_load picks the kind from a path. Every tokenizer is immutable once loaded and
// may be used from several threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // What was loaded, for messages: "byte", "tokenizer.json BPE", "GPT-2 BPE", "SentencePiece".
  virtual std::string kind() const = 0;
  // One past the largest id the tokenizer produces (the vocabulary a model needs).
  virtual size_t vocab_size() const = 0;

  // Appends the ids of text to out. Bytes that are not valid UTF-8 are read as U+FFFD
  // (each maximal invalid subsequence once), except by the byte tokenizer, which keeps
  // every byte. add_special_tokens adds what the tokenizer's post-processor adds (Llama's
  // BOS); special tokens written in the text are recognised either way.
  virtual void encode_into(std::string_view text, bool add_special_tokens,
                           std::vector<uint32_t>& out) const = 0;
  std::vector<uint32_t> encode(std::string_view text, bool add_special_tokens = false) const;

  // The text of ids; skip_special_tokens leaves special tokens (BOS, EOS, ...) out. Throws
  // tandem::Error naming the first id outside the vocabulary and its position.
  virtual std::string decode(std::span<const uint32_t> ids,
                             bool skip_special_tokens = false) const = 0;

  // A token's id (special tokens included), or nothing; and an id's token as the vocabulary
  // spells it (byte-level characters, "▁", "<0x0A>"), or nothing.
  virtual std::optional<uint32_t> token_to_id(std::string_view token) const = 0;
  virtual std::optional<std::string> id_to_token(uint32_t id) const = 0;

  // The special tokens' ids (control tokens, never produced from ordinary text), ascending.
  virtual std::vector<uint32_t> special_ids() const = 0;

  std::optional<uint32_t> bos_id() const { return bos_; }
  std::optional<uint32_t> eos_id() const { return eos_; }
  // For the loaders (the files beside a tokenizer may name BOS and EOS); a tokenizer is not
  // changed once tokenizer_load has returned it.
  void set_bos(std::optional<uint32_t> id) { bos_ = id; }
  void set_eos(std::optional<uint32_t> id) { eos_ = id; }

 private:
  std::optional<uint32_t> bos_, eos_;
};

// Token i is byte value i (vocabulary 256): any byte string, valid UTF-8 or not,
// round-trips. No special tokens, no BOS or EOS.
class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int kVocab = 256;

  int vocab() const { return kVocab; }
  std::string kind() const override { return "byte"; }
  size_t vocab_size() const override { return kVocab; }
  void encode_into(std::string_view text, bool add_special_tokens,
                   std::vector<uint32_t>& out) const override;
  using Tokenizer::encode;
  // Throws tandem::Error naming the first token >= 256 and its position.
  std::string decode(std::span<const uint32_t> tokens,
                     bool skip_special_tokens = false) const override;
  std::optional<uint32_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(uint32_t id) const override;
  std::vector<uint32_t> special_ids() const override { return {}; }
};

// Loads the tokenizer at path: a tokenizer.json (any *.json with a "model"), a
// SentencePiece *.model, a GPT-2 vocab.json or encoder.json (merges.txt or vocab.bpe
// beside it), or a directory holding one of these (tokenizer_find's order). BOS and EOS
// come from tokenizer_config.json or special_tokens_map.json beside the file where present.
// Throws tandem::Error naming the path and, for a malformed file, the JSON path of the
// problem; a kind this build lacks (no PCRE2 or SentencePiece) is refused with the package
// to install.
std::unique_ptr<Tokenizer> tokenizer_load(const std::string& path);

// The tokenizer file of a directory (a checkpoint or a Hugging Face model directory), in
// this order of preference: tokenizer.json, tokenizer.model, vocab.json, encoder.json; ""
// when it holds none.
std::string tokenizer_find(const std::string& dir);

// The tokenizer of a checkpoint or model directory when it holds one, else the byte
// tokenizer.
std::unique_ptr<Tokenizer> tokenizer_for_directory(const std::string& dir);

}  // namespace tandem
