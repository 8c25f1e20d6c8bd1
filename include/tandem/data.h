// Training data: token files (docs/formats.md) from text, with the byte tokenizer of the
// byte-level models (gpt2-tiny, llama-tiny, pythia-tiny) or a real tokenizer, or from ids.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string_view>
#include <vector>

#include "tandem/error.h"
#include "tandem/tokenizer.h"

namespace tandem::api {

struct PrepareReport {
  std::size_t files = 0;   // text files read
  std::size_t bytes = 0;   // bytes read from them
  std::size_t tokens = 0;  // tokens written
};

// What `tandem data prepare` does: concatenates the text files (a '\n' between two that
// lack one), byte-tokenizes them and writes the token file `out`. Throws tandem::Error
// naming an unreadable file, and when the files hold no bytes at all.
PrepareReport prepare_text_files(const std::vector<std::filesystem::path>& text_files,
                                 const std::filesystem::path& out);

// What `tandem data prepare --tokenizer` does: each non-empty file is one document, encoded
// by `tokenizer` on `threads` threads (0: one per core), documents separated by its EOS
// token; the token width is the narrowest that holds the vocabulary. Throws tandem::Error
// as above, and when the tokenizer has no EOS.
PrepareReport prepare_text_files(const std::vector<std::filesystem::path>& text_files,
                                 const std::filesystem::path& out, const Tokenizer& tokenizer,
                                 int threads = 0);

// The byte tokenizer: token i is byte value i, so any text round-trips (vocabulary 256).
std::vector<uint32_t> byte_tokens(std::string_view text);

// Writes token ids as a token file, in the narrowest width that holds the largest (replacing
// `out` only once complete). Throws tandem::Error when tokens is empty or out is not writable.
void write_token_file(const std::filesystem::path& out, const std::vector<uint32_t>& tokens);

}  // namespace tandem::api

#if !defined(TANDEM_BUILDING_LIBRARY)
namespace tandem {
using namespace api;  // NOLINT(build/namespaces): the re-export (see tandem/error.h)
}  // namespace tandem
#endif
