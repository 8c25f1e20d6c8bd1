// UTF-8 decoding with the "maximal subpart" rule for invalid input (Unicode 15, ch. 3.9).
#include "io/utf8.h"

namespace tandem {

Utf8Char utf8_next(std::string_view text, size_t i) {
  const auto b = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t c = b(i);
  if (c < 0x80) return {c, 1};
  size_t need = 0;
  uint32_t cp = 0;
  uint8_t lo = 0x80, hi = 0xBF;  // the range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    cp = c & 0x0F;
    if (c == 0xE0) lo = 0xA0;  // no overlong forms
    if (c == 0xED) hi = 0x9F;  // no surrogates
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    cp = c & 0x07;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;  // nothing past U+10FFFF
  } else {
    return {-1, 1};
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= text.size()) return {-1, k};
    const uint8_t t = b(i + k);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (t < l || t > h) return {-1, k};
    cp = cp << 6 | (t & 0x3F);
  }
  return {static_cast<int32_t>(cp), need + 1};
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | cp >> 6));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | cp >> 12));
    out.push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | cp >> 18));
    out.push_back(static_cast<char>(0x80 | (cp >> 12 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp >> 6 & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool utf8_valid(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    if (static_cast<uint8_t>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const Utf8Char c = utf8_next(text, i);
    if (c.cp < 0) return false;
    i += c.len;
  }
  return true;
}

std::string utf8_lossy(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const Utf8Char c = utf8_next(text, i);
    if (c.cp < 0) {
      out += "\xEF\xBF\xBD";
    } else {
      out.append(text.substr(i, c.len));
    }
    i += c.len;
  }
  return out;
}

}  // namespace tandem
