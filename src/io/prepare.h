// data_prepare: turns text files into a tandem token file, the input of `tandem train`:
// with the byte tokenizer of the byte-level models, or with a real tokenizer, in parallel.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace tandem {

struct PrepareReport {
  size_t files = 0;     // text files read
  size_t bytes = 0;     // bytes read from them
  size_t tokens = 0;    // tokens written (separators included)
  int token_bytes = 2;  // width of the file written
  int threads = 1;      // threads that encoded
  double seconds = 0;   // encoding time (reading and writing the files aside)
};

struct PrepareOptions {
  // nullptr: the byte tokenizer, files joined by '\n' (see data_prepare).
  const Tokenizer* tokenizer = nullptr;
  int threads = 0;  // encoding threads; 0: one per core
  // Target size of the pieces a file is cut into for the threads (see [Prepare chunks]).
  size_t chunk_bytes = size_t{1} << 20;
  // Called from the calling thread now and then while encoding, and once at the end.
  std::function<void(size_t bytes_done, size_t bytes_total)> progress;
};

// Reads the text files in order and writes their tokens to `out` (written to out.tmp, then
// renamed over out).
//
// Byte tokenizer (options.tokenizer == nullptr): the files' bytes are concatenated, with one
// '\n' between a non-empty file and the next non-empty one when it does not end in '\n'
// (empty files contribute nothing), and written with width 2.
//
// Any other tokenizer: each non-empty file is a document; documents are encoded without
// added special tokens and separated by the tokenizer's EOS token (an error when it has
// none). Invalid UTF-8 reads as U+FFFD. The width is the narrowest that holds every id of
// the vocabulary, and the output does not depend on the number of threads.
//
// Throws tandem::Error naming any unreadable file, and when there are no files or they
// hold no bytes at all.
PrepareReport data_prepare(const std::vector<std::string>& text_files, const std::string& out,
                           const PrepareOptions& options = {});

// [Prepare chunks] Where a file of text is cut for the threads: at the first line break at
// or after every chunk_bytes that has an ASCII letter or digit before it and a byte other
// than white space after it. Byte-level BPE pre-tokenizers (GPT-2's and Llama 3's patterns)
// never join such a line break to its neighbours, so the cut changes no token; tokenizers
// that prefix each text with a space (Llama 2) see each piece as a new text. Returns the
// offsets of the cuts, ascending, without 0 and text.size().
std::vector<size_t> prepare_cut_points(std::string_view text, size_t chunk_bytes);

}  // namespace tandem
