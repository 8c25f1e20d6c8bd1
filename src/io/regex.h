// Regular expressions of the tokenizers' pre-tokenizers, through PCRE2 with its JIT: the
// patterns need Unicode classes (\p{L}, \p{N}) and look-ahead, which std::regex lacks.
// A build without PCRE2 (TANDEM_HAVE_PCRE2 unset) refuses every pattern at construction.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace tandem {

class Regex {
 public:
  // Compiles pattern (UTF-8, Unicode classes); `where` names its origin for messages
  // ("tokenizer file 'x': /pre_tokenizer/pattern"). Throws tandem::Error on a bad pattern.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls on_match(begin, end) for every match in text, left to right, without overlap;
  // an empty match is skipped. text must be valid UTF-8. Safe to call from several threads.
  void for_each_match(std::string_view text,
                      const std::function<void(size_t, size_t)>& on_match) const;

  // Whether this build has PCRE2.
  static bool available();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
