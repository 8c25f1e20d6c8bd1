// data_prepare: turns text files into a tandem token file with the byte tokenizer, the
// input of `tandem train` for the byte-level models.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace tandem {

struct PrepareReport {
  size_t files = 0;   // text files read
  size_t bytes = 0;   // bytes read from them
  size_t tokens = 0;  // tokens written (bytes plus the '\n' separators inserted)
};

// Reads the text files in order and concatenates their bytes; when a non-empty file is
// followed by another non-empty one and does not end in '\n', one '\n' is inserted between
// them (empty files contribute nothing). The result is byte-tokenized and written to `out`
// as a tandem token file of width 2. Throws tandem::Error naming any unreadable file, and
// when there are no files or they hold no bytes at all.
PrepareReport data_prepare(const std::vector<std::string>& text_files, const std::string& out);

}  // namespace tandem
