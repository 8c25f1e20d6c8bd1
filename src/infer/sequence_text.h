// The text of generated sequences as they grow: what to stream and where a stop string
// ends a sequence, the same for the tandem command and the library API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace tandem {

// Text of ids, holding back a last character whose bytes are not all there yet (U+FFFD).
std::string whole_text(const Tokenizer& tok, const std::vector<uint32_t>& ids);

class SequenceText {
 public:
  // One sequence per prompt; `eos` ids end a sequence and add no text. With an empty
  // `stop` no sequence is ended by its text.
  SequenceText(const Tokenizer& tok, const std::vector<std::vector<int32_t>>& prompts,
               std::string stop, std::vector<int32_t> eos);
  // Appends token t to sequence s; false once the sequence's new text (the prompt's own
  // text does not count) contains the stop string.
  bool add(int s, int32_t t);
  // The text of sequence s (prompt included) not handed out yet, for streaming.
  std::string take(int s);
  // The new text of sequence s: everything past its prompt's text.
  std::string new_text(int s) const;

 private:
  const Tokenizer& tok_;
  std::string stop_;
  std::vector<int32_t> eos_;
  std::vector<std::vector<uint32_t>> ids_;
  std::vector<std::string> text_;       // whole_text of ids_, as of the last add
  std::vector<size_t> prompt_, taken_;  // text sizes: the prompt's, handed out
};

}  // namespace tandem
