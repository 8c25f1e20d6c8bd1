// The byte-level tokenizer: encode maps each byte to its value, decode maps back and
// rejects tokens outside the 256-entry vocabulary.
#include "io/tokenizer.h"

#include "core/error.h"

namespace tandem {

std::vector<uint32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<uint32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string ByteTokenizer::decode(std::span<const uint32_t> tokens) const {
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

}  // namespace tandem
