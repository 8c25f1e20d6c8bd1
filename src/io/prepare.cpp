// data_prepare: text files -> one byte-tokenized tandem token file (uint16 tokens).
// Files are read whole; inputs are expected to fit in memory.
#include "io/prepare.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "io/tokenizer.h"
#include "io/tokens.h"

namespace tandem {

namespace {

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  TD_CHECK(!std::filesystem::is_directory(path, ec), "text file '{}' is a directory", path);
  std::ifstream in(path, std::ios::binary);
  TD_CHECK(in, "cannot read text file '{}': {}", path, std::strerror(errno));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TD_CHECK(!in.bad(), "cannot read text file '{}': {}", path, std::strerror(errno));
  return text;
}

}  // namespace

PrepareReport data_prepare(const std::vector<std::string>& text_files, const std::string& out) {
  TD_CHECK(!text_files.empty(), "cannot prepare data file '{}': no text files given", out);
  PrepareReport report;
  std::string all;
  for (const std::string& path : text_files) {
    const std::string text = read_text_file(path);
    report.files += 1;
    report.bytes += text.size();
    if (text.empty()) continue;
    if (!all.empty() && all.back() != '\n') all.push_back('\n');
    all += text;
  }
  TD_CHECK(!all.empty(), "cannot prepare data file '{}': the {} text file(s) given are all empty",
           out, text_files.size());
  const std::vector<uint32_t> tokens = ByteTokenizer().encode(all);
  tokens_write(out, tokens, 2);
  report.tokens = tokens.size();
  return report;
}

}  // namespace tandem
