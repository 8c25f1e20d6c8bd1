// Token files: tandem's own little-endian format (32-byte header, uint16 or uint32 tokens)
// and, for reading only, llm.c's .bin files. The byte layout is described in docs/formats.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

// The 8 bytes a tandem token file starts with: "TNDMTOK" and a NUL.
inline constexpr char kTokensMagic[8] = {'T', 'N', 'D', 'M', 'T', 'O', 'K', '\0'};
inline constexpr uint32_t kTokensVersion = 1;
inline constexpr size_t kTokensHeaderBytes = 32;

// llm.c's .bin files: 256 int32 of header ([0] magic, [1] version, [2] count), uint16 tokens.
inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr int32_t kLlmcVersion = 1;
inline constexpr size_t kLlmcHeaderBytes = 256 * 4;

struct TokenData {
  std::vector<uint32_t> tokens;
  int token_bytes = 0;  // width on disk: 2 (uint16) or 4 (uint32)
  std::string format;   // "tandem" or "llm.c"
};

// Reads a whole token file of either format. Throws tandem::Error naming the file and the
// problem for a missing file, short or unknown header, bad version or width, a body
// shorter or longer than the header says, or zero tokens.
TokenData tokens_read(const std::string& path);

// Writes a tandem token file of width token_bytes (2 or 4); tokens must be non-empty and,
// for width 2, all below 65536. Writes path + ".tmp" and renames it over path.
void tokens_write(const std::string& path, const std::vector<uint32_t>& tokens, int token_bytes);

// The smallest width (2 or 4) that holds max_token.
int tokens_min_width(uint32_t max_token);

}  // namespace tandem
