// UTF-8 helpers of the tokenizers: decoding one code point, encoding one, and the lossy
// conversion that replaces invalid bytes by U+FFFD.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem {

// The code point that starts at text[i] and its length in bytes; an invalid sequence gives
// {-1, n} with n the length of its maximal invalid subpart (at least 1).
struct Utf8Char {
  int32_t cp;
  size_t len;
};
Utf8Char utf8_next(std::string_view text, size_t i);

void utf8_append(std::string& out, uint32_t cp);

// True when text is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool utf8_valid(std::string_view text);

// text with every maximal invalid subsequence replaced by U+FFFD: what a WHATWG TextDecoder,
// Rust's from_utf8_lossy and Python's errors="replace" produce, so text read from bytes
// reaches the tokenizers exactly as it reaches their reference encoders.
std::string utf8_lossy(std::string_view text);

}  // namespace tandem
