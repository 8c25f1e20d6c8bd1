// The loaders of each tokenizer kind, behind tokenizer_load (io/tokenizer.h).
#pragma once

#include <memory>
#include <string>

#include "io/tokenizer.h"

namespace tandem {

// A Hugging Face tokenizer.json with a BPE model (io/tokenizer_bpe.cpp).
std::unique_ptr<Tokenizer> tokenizer_json_load(const std::string& path);
// GPT-2's vocab.json and merges.txt, as the byte-level BPE of GPT-2 (io/tokenizer_bpe.cpp).
std::unique_ptr<Tokenizer> tokenizer_gpt2_load(const std::string& vocab_path,
                                               const std::string& merges_path);
// A SentencePiece model file (io/tokenizer_spm.cpp).
std::unique_ptr<Tokenizer> tokenizer_spm_load(const std::string& path);

// Whether this build has SentencePiece.
bool tokenizer_spm_available();
// Whether this build has utf8proc, which the NFC normalizer of tokenizer.json needs.
bool tokenizer_nfc_available();

}  // namespace tandem
