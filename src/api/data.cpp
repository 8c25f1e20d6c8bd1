// Token files for the public API.
#include <tandem/data.h>

#include <algorithm>
#include <string>

#include "api/errors.h"
#include "io/prepare.h"
#include "io/tokenizer.h"
#include "io/tokens.h"

namespace tandem::api {

PrepareReport prepare_text_files(const std::vector<std::filesystem::path>& text_files,
                                 const std::filesystem::path& out) {
  return translate_errors([&] {
    std::vector<std::string> files;
    for (const std::filesystem::path& p : text_files) files.push_back(p.string());
    const ::tandem::PrepareReport r = ::tandem::data_prepare(files, out.string());
    PrepareReport report;
    report.files = r.files;
    report.bytes = r.bytes;
    report.tokens = r.tokens;
    return report;
  });
}

std::vector<uint32_t> byte_tokens(std::string_view text) {
  return translate_errors([&] { return ::tandem::ByteTokenizer().encode(text); });
}

void write_token_file(const std::filesystem::path& out, const std::vector<uint32_t>& tokens) {
  translate_errors([&] {
    const uint32_t largest = tokens.empty() ? 0 : *std::max_element(tokens.begin(), tokens.end());
    ::tandem::tokens_write(out.string(), tokens, ::tandem::tokens_min_width(largest));
  });
}

}  // namespace tandem::api
