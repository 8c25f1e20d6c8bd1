// The byte-level tokenizer: every byte of the text is one token (vocabulary 256), so any
// byte string, valid UTF-8 or not, round-trips exactly.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

class ByteTokenizer {
 public:
  static constexpr int kVocab = 256;

  int vocab() const { return kVocab; }
  // Token i is byte value i (as unsigned char).
  std::vector<uint32_t> encode(std::string_view text) const;
  // Throws tandem::Error naming the first token >= 256 and its position.
  std::string decode(std::span<const uint32_t> tokens) const;
};

}  // namespace tandem
