// Byte sizes as users write them: "4096", "64KiB", "1.5G", "16 MiB" (k/M/G/T are powers of
// 1024; B, KB, KiB alike).
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

// Throws naming the flag when text is not a whole number of bytes.
uint64_t parse_size(const std::string& text, const std::string& flag);

// A size for people: "512 B", "1.0 KiB", "12.3 MiB", "1.50 GiB" (the unit that keeps the
// number below 1024; never rounds a nonzero size to zero).
std::string format_size(uint64_t bytes);

}  // namespace tandem
