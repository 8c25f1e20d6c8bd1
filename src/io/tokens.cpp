// Reading and writing token files: tandem's own format and llm.c's .bin files (read only).
// Integers are encoded byte by byte, so files are little-endian on any host.
#include "io/tokens.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/error.h"

namespace tandem {

namespace {

uint32_t load_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

uint64_t load_u64(const uint8_t* p) {
  return static_cast<uint64_t>(load_u32(p)) | static_cast<uint64_t>(load_u32(p + 4)) << 32;
}

void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

void store_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

std::string hex_bytes(const uint8_t* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += fmt::format("{}{:02x}", i ? " " : "", p[i]);
  return s;
}

}  // namespace

int tokens_min_width(uint32_t max_token) {
  return max_token < 65536u ? 2 : 4;
}

TokenData tokens_read(const std::string& path) {
  std::error_code ec;
  TD_CHECK(!std::filesystem::is_directory(path, ec), "data file '{}' is a directory", path);
  // A FIFO or device would block or never end: only regular files are data.
  TD_CHECK(!std::filesystem::exists(path, ec) || std::filesystem::is_regular_file(path, ec),
           "data file '{}' is not a regular file", path);
  std::ifstream in(path, std::ios::binary);
  TD_CHECK(in, "data file '{}' cannot be opened: {}", path, std::strerror(errno));
  const uint64_t size = std::filesystem::file_size(path, ec);
  TD_CHECK(!ec, "data file '{}': cannot get its size: {}", path, ec.message());

  // Identify the format from the first bytes, then read the rest of its header.
  uint8_t header[kLlmcHeaderBytes] = {};
  const size_t head = static_cast<size_t>(std::min<uint64_t>(size, sizeof(header)));
  in.read(reinterpret_cast<char*>(header), static_cast<std::streamsize>(head));
  TD_CHECK(in, "data file '{}': cannot read its header: {}", path, std::strerror(errno));

  TokenData data;
  uint64_t count = 0;
  size_t header_bytes = 0;
  if (size >= 8 && std::memcmp(header, kTokensMagic, 8) == 0) {
    data.format = "tandem";
    header_bytes = kTokensHeaderBytes;
    TD_CHECK(size >= header_bytes,
             "data file '{}' is {} bytes, shorter than the {}-byte tandem token header", path, size,
             header_bytes);
    const uint32_t version = load_u32(header + 8);
    TD_CHECK(version == kTokensVersion,
             "data file '{}' has unsupported tandem token file version {} (this build reads "
             "version {})",
             path, version, kTokensVersion);
    const uint32_t width = load_u32(header + 12);
    TD_CHECK(width == 2 || width == 4,
             "data file '{}' has bad token width {} bytes (must be 2 for uint16 or 4 for uint32)",
             path, width);
    data.token_bytes = static_cast<int>(width);
    count = load_u64(header + 16);
    const uint64_t reserved = load_u64(header + 24);
    TD_CHECK(reserved == 0, "data file '{}' has reserved header field {} (must be 0 in version {})",
             path, reserved, kTokensVersion);
  } else if (size >= 4 && static_cast<int32_t>(load_u32(header)) == kLlmcMagic) {
    data.format = "llm.c";
    header_bytes = kLlmcHeaderBytes;
    TD_CHECK(size >= header_bytes,
             "data file '{}' is {} bytes, shorter than the {}-byte llm.c header", path, size,
             header_bytes);
    const int32_t version = static_cast<int32_t>(load_u32(header + 4));
    TD_CHECK(version == kLlmcVersion,
             "data file '{}' has unsupported llm.c version {} (this build reads version {}, "
             "uint16 tokens)",
             path, version, kLlmcVersion);
    const int32_t n = static_cast<int32_t>(load_u32(header + 8));
    TD_CHECK(n >= 0, "data file '{}' has a negative token count {} in its llm.c header", path, n);
    data.token_bytes = 2;
    count = static_cast<uint64_t>(n);
  } else if (size < 8) {
    TD_THROW(
        "data file '{}' is {} bytes, shorter than any token file header (32 bytes for tandem, "
        "1024 for llm.c)",
        path, size);
  } else {
    TD_THROW(
        "data file '{}' has unknown magic (first bytes {}): accepted formats are tandem token "
        "files (magic \"TNDMTOK\\0\") and llm.c .bin files (int32 magic {})",
        path, hex_bytes(header, 8), kLlmcMagic);
  }

  TD_CHECK(count > 0, "data file '{}' holds zero tokens", path);
  const uint64_t width = static_cast<uint64_t>(data.token_bytes);
  const uint64_t body = size - header_bytes;
  // count * width can pass 2^64 for a lying header: say so rather than print the wrap.
  const std::string announced = count <= std::numeric_limits<uint64_t>::max() / width
                                    ? fmt::format("{} bytes", count * width)
                                    : std::string("more than 2^64 bytes");
  TD_CHECK(count <= body / width,
           "data file '{}' is truncated: header says {} tokens ({}), file holds {} bytes "
           "after the header ({} whole tokens)",
           path, count, announced, body, body / width);
  TD_CHECK(body == count * width,
           "data file '{}' has {} trailing bytes after the {} tokens its header announces", path,
           body - count * width, count);

  // Read the body in chunks straight into the token vector.
  in.seekg(static_cast<std::streamoff>(header_bytes));
  data.tokens.resize(static_cast<size_t>(count));
  std::vector<uint8_t> chunk;
  const uint64_t chunk_tokens = uint64_t{1} << 20;
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min(chunk_tokens, count - done);
    chunk.resize(static_cast<size_t>(n * width));
    in.read(reinterpret_cast<char*>(chunk.data()), static_cast<std::streamsize>(chunk.size()));
    TD_CHECK(in, "data file '{}': read failed at token {}: {}", path, done, std::strerror(errno));
    uint32_t* out = data.tokens.data() + done;
    if (width == 2) {
      for (uint64_t i = 0; i < n; ++i)
        out[i] = static_cast<uint32_t>(chunk[2 * i]) | static_cast<uint32_t>(chunk[2 * i + 1]) << 8;
    } else {
      for (uint64_t i = 0; i < n; ++i) out[i] = load_u32(chunk.data() + 4 * i);
    }
    done += n;
  }
  return data;
}

void tokens_write(const std::string& path, const std::vector<uint32_t>& tokens, int token_bytes) {
  TD_CHECK(token_bytes == 2 || token_bytes == 4,
           "cannot write data file '{}': bad token width {} bytes (must be 2 or 4)", path,
           token_bytes);
  TD_CHECK(!tokens.empty(), "cannot write data file '{}': zero tokens", path);
  if (token_bytes == 2) {
    const auto it =
        std::find_if(tokens.begin(), tokens.end(), [](uint32_t t) { return t > 0xffff; });
    TD_CHECK(it == tokens.end(),
             "cannot write data file '{}' with 2-byte tokens: token {} at position {} does not "
             "fit uint16 (use width 4)",
             path, it == tokens.end() ? 0u : *it, it - tokens.begin());
  }

  uint8_t header[kTokensHeaderBytes] = {};
  std::memcpy(header, kTokensMagic, 8);
  store_u32(header + 8, kTokensVersion);
  store_u32(header + 12, static_cast<uint32_t>(token_bytes));
  store_u64(header + 16, tokens.size());
  store_u64(header + 24, 0);

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    TD_CHECK(out, "cannot create data file '{}': {}", tmp, std::strerror(errno));
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
    std::vector<uint8_t> chunk;
    const size_t chunk_tokens = size_t{1} << 20;
    const size_t w = static_cast<size_t>(token_bytes);
    for (size_t done = 0; done < tokens.size() && out;) {
      const size_t n = std::min(chunk_tokens, tokens.size() - done);
      chunk.resize(n * w);
      for (size_t i = 0; i < n; ++i)
        for (size_t b = 0; b < w; ++b)
          chunk[i * w + b] = static_cast<uint8_t>(tokens[done + i] >> (8 * b));
      out.write(reinterpret_cast<const char*>(chunk.data()),
                static_cast<std::streamsize>(chunk.size()));
      done += n;
    }
    out.close();
    if (!out) {
      const std::string why = std::strerror(errno);
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      TD_THROW("cannot write data file '{}': {}", tmp, why);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    TD_THROW("cannot rename '{}' to data file '{}': {}", tmp, path, ec.message());
  }
}

}  // namespace tandem
