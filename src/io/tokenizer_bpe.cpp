// BPE tokenizers as a pipeline of the components a Hugging Face tokenizer.json names: added
// tokens are cut out of the text, each remaining segment is normalized, split into
// pre-tokens, and each pre-token goes through the BPE model; a template may add BOS.
// Decoding maps ids to tokens and runs the decoder chain. GPT-2's vocab.json + merges.txt
// build the same pipeline. A component or option this file does not implement is refused
// with the file and the JSON path, never skipped.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "core/json.h"
#include "io/bpe.h"
#include "io/regex.h"
#include "io/tokenizer_kinds.h"
#include "io/utf8.h"

#if TANDEM_HAVE_UTF8PROC
#include <utf8proc.h>
#endif

namespace tandem {

namespace {

using nlohmann::json;

// GPT-2's pre-tokenizer pattern, which the ByteLevel pre-tokenizer applies with use_regex.
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---------------------------------------------------------------------------------------
// Byte-level alphabet: every byte maps to one printable character (bytes that are
// printable Latin-1 map to themselves, the others to U+0100 and up), so byte strings become
// text the BPE model can work on and back.

struct ByteAlphabet {
  std::array<std::string, 256> to_char;
  std::unordered_map<uint32_t, uint8_t> to_byte;
  ByteAlphabet() {
    std::vector<int> keep;
    for (int b = '!'; b <= '~'; ++b) keep.push_back(b);
    for (int b = 0xA1; b <= 0xAC; ++b) keep.push_back(b);
    for (int b = 0xAE; b <= 0xFF; ++b) keep.push_back(b);
    std::array<uint32_t, 256> cp{};
    std::vector<bool> kept(256, false);
    for (int b : keep) {
      cp[static_cast<size_t>(b)] = static_cast<uint32_t>(b);
      kept[static_cast<size_t>(b)] = true;
    }
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b)
      if (!kept[static_cast<size_t>(b)]) cp[static_cast<size_t>(b)] = next++;
    for (int b = 0; b < 256; ++b) {
      utf8_append(to_char[static_cast<size_t>(b)], cp[static_cast<size_t>(b)]);
      to_byte[cp[static_cast<size_t>(b)]] = static_cast<uint8_t>(b);
    }
  }
};

const ByteAlphabet& byte_alphabet() {
  static const ByteAlphabet a;
  return a;
}

bool unicode_space(int32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// ---------------------------------------------------------------------------------------
// Reading tokenizer.json: every object is read through Obj, which remembers the keys read,
// so that a key nobody read is refused by name.

class Obj {
 public:
  Obj(const std::string& file, const json& j, std::string path)
      : file_(file), j_(j), path_(std::move(path)) {
    if (!j.is_object()) fail("", fmt::format("expected an object, found {}", j.type_name()));
  }

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    TD_THROW("tokenizer file '{}': at {}: {}", file_, at(key), why);
  }
  std::string at(const std::string& key) const {
    const std::string p = key.empty() ? path_ : path_ + "/" + key;
    return p.empty() ? "/" : p;
  }
  const std::string& file() const { return file_; }

  // The value of key, or nullptr when absent or null.
  const json* opt(const std::string& key) {
    used_.push_back(key);
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  const json& req(const std::string& key) {
    const json* v = opt(key);
    if (v == nullptr) fail(key, "missing");
    return *v;
  }
  std::string str(const std::string& key) {
    const json& v = req(key);
    if (!v.is_string()) fail(key, fmt::format("expected a string, found {}", v.type_name()));
    return v.get<std::string>();
  }
  bool flag(const std::string& key, bool fallback) {
    const json* v = opt(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail(key, fmt::format("expected true or false, found {}", v->dump()));
    return v->get<bool>();
  }
  // A key that is read and has no effect here: options of what tandem does not compute
  // (offsets, pairs of texts).
  void accept(const std::string& key) { used_.push_back(key); }
  // Refuses every key not read.
  void finish() const {
    for (const auto& [key, value] : j_.items())
      if (std::find(used_.begin(), used_.end(), key) == used_.end())
        fail(key, fmt::format("unsupported option '{}'", key));
  }
  const json& raw() const { return j_; }

 private:
  const std::string& file_;
  const json& j_;
  std::string path_;
  std::vector<std::string> used_;
};

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  TD_CHECK(in.good(), "cannot open {} '{}'", what, path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

json parse_json(const std::string& path, const char* what) {
  // core/json: every nlohmann error (a number that overflows, too) becomes one naming the
  // file, and a key given twice is refused.
  return json_parse(read_file(path, what), fmt::format("{} '{}'", what, path));
}

// ---------------------------------------------------------------------------------------
// The pipeline.

struct AddedToken {
  std::string content;
  uint32_t id = 0;
  bool special = false, lstrip = false, rstrip = false, normalized = false;
};

// Finds added tokens in text: at the leftmost position where any matches, the longest.
class AddedMatcher {
 public:
  void add(const AddedToken* t) {
    if (t->content.empty()) return;
    auto& b = buckets_[static_cast<uint8_t>(t->content[0])];
    b.push_back(t);
    std::stable_sort(b.begin(), b.end(), [](const AddedToken* x, const AddedToken* y) {
      return x->content.size() > y->content.size();
    });
    any_ = true;
  }
  bool empty() const { return !any_; }

  // on_text(view) for the text between tokens (never empty), on_token(id) for each token.
  template <class OnText, class OnToken>
  void split(std::string_view text, OnText&& on_text, OnToken&& on_token) const {
    size_t gap = 0;
    for (size_t i = 0; i < text.size();) {
      const AddedToken* hit = nullptr;
      for (const AddedToken* t : buckets_[static_cast<uint8_t>(text[i])]) {
        if (text.compare(i, t->content.size(), t->content) == 0) {
          hit = t;
          break;
        }
      }
      if (hit == nullptr) {
        ++i;
        continue;
      }
      size_t s = i, e = i + hit->content.size();
      if (hit->lstrip) s = strip_left(text, gap, s);
      if (hit->rstrip) e = strip_right(text, e);
      if (s > gap) on_text(text.substr(gap, s - gap));
      on_token(hit->id);
      gap = i = e;
    }
    if (gap < text.size()) on_text(text.substr(gap));
  }

 private:
  static size_t strip_left(std::string_view text, size_t floor, size_t s) {
    while (s > floor) {
      size_t b = s - 1;
      while (b > floor && (static_cast<uint8_t>(text[b]) & 0xC0) == 0x80) --b;
      if (!unicode_space(utf8_next(text, b).cp)) break;
      s = b;
    }
    return s;
  }
  static size_t strip_right(std::string_view text, size_t e) {
    while (e < text.size()) {
      const Utf8Char c = utf8_next(text, e);
      if (!unicode_space(c.cp)) break;
      e += c.len;
    }
    return e;
  }

  std::array<std::vector<const AddedToken*>, 256> buckets_;
  bool any_ = false;
};

enum class SplitBehavior { isolated, removed, merged_with_previous, merged_with_next, contiguous };

struct NormStep {
  enum class Kind { prepend, replace, nfc } kind;
  std::string a, b;  // prepend: a; replace: a -> b
  NormStep(Kind k, std::string x, std::string y) : kind(k), a(std::move(x)), b(std::move(y)) {}
};

// Unicode canonical composition (NFC), as the GPT-NeoX tokenizers normalize text. The text is
// valid UTF-8 here (invalid bytes were replaced before); utf8proc refusing it leaves it as is.
std::string nfc(const std::string& s) {
#if TANDEM_HAVE_UTF8PROC
  // With the length given (not NUL-terminated), so a U+0000 in the text is kept too.
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
      &out, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0 || out == nullptr) return s;
  std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
#else
  return s;
#endif
}

struct PreStep {
  enum class Kind { byte_level, split } kind;
  explicit PreStep(Kind k) : kind(k) {}
  bool add_prefix_space = false;       // byte_level
  std::shared_ptr<const Regex> regex;  // byte_level with use_regex, or split by a regex
  std::string literal;                 // split by a string
  SplitBehavior behavior = SplitBehavior::isolated;
};

struct DecStep {
  enum class Kind { byte_level, replace, byte_fallback, fuse, strip } kind;
  std::string a, b;  // replace: a -> b; strip: a is the character
  int start = 0, stop = 0;
  explicit DecStep(Kind k, std::string x = "", std::string y = "")
      : kind(k), a(std::move(x)), b(std::move(y)) {}
};

// Pre-tokens as spans of one buffer, so splitting does not copy.
struct Pieces {
  std::string buf;
  std::vector<std::pair<uint32_t, uint32_t>> spans;  // [begin, end) into buf
};

class BpeTokenizer : public Tokenizer {
 public:
  std::string kind() const override { return kind_; }
  size_t vocab_size() const override { return vocab_size_; }
  void encode_into(std::string_view text, bool add_special_tokens,
                   std::vector<uint32_t>& out) const override;
  std::string decode(std::span<const uint32_t> ids, bool skip_special_tokens) const override;
  std::optional<uint32_t> token_to_id(std::string_view token) const override;
  std::optional<std::string> id_to_token(uint32_t id) const override;
  std::vector<uint32_t> special_ids() const override;

  // Built by the loaders below.
  std::string kind_;
  std::vector<NormStep> norm_;
  std::vector<PreStep> pre_;
  std::unique_ptr<BpeModel> model_;
  bool has_decoder_ = false;
  std::vector<DecStep> dec_;
  std::vector<std::unique_ptr<AddedToken>> added_;
  AddedMatcher raw_matcher_, normalized_matcher_;
  std::unordered_map<uint32_t, const AddedToken*> added_by_id_;
  bool has_template_ = false;
  std::vector<std::vector<uint32_t>> template_;  // empty entry: the text's ids
  size_t vocab_size_ = 0;

  void finish_added();

 private:
  void encode_segment(std::string_view segment, std::vector<uint32_t>& out) const;
  void encode_normalized(std::string_view text, std::vector<uint32_t>& out) const;
  void pre_tokenize(Pieces& p, Pieces& scratch) const;
  std::vector<std::string> run_decoders(std::vector<std::string> tokens) const;
};

void BpeTokenizer::finish_added() {
  for (const auto& t : added_) {
    added_by_id_[t->id] = t.get();
    (t->normalized && !norm_.empty() ? normalized_matcher_ : raw_matcher_).add(t.get());
    vocab_size_ = std::max(vocab_size_, size_t{t->id} + 1);
  }
  vocab_size_ = std::max(vocab_size_, model_->size());
}

void BpeTokenizer::encode_into(std::string_view text, bool add_special_tokens,
                               std::vector<uint32_t>& out) const {
  std::string fixed;
  if (!utf8_valid(text)) {
    fixed = utf8_lossy(text);
    text = fixed;
  }
  const auto body = [&] {
    raw_matcher_.split(
        text, [&](std::string_view s) { encode_segment(s, out); },
        [&](uint32_t id) { out.push_back(id); });
  };
  if (!add_special_tokens || !has_template_) {
    body();
    return;
  }
  for (const auto& item : template_) {
    if (item.empty()) {
      body();
    } else {
      out.insert(out.end(), item.begin(), item.end());
    }
  }
}

void BpeTokenizer::encode_segment(std::string_view segment, std::vector<uint32_t>& out) const {
  if (norm_.empty()) {
    encode_normalized(segment, out);
    return;
  }
  std::string s(segment);
  for (const NormStep& n : norm_) {
    if (n.kind == NormStep::Kind::prepend) {
      if (!s.empty()) s.insert(0, n.a);
      continue;
    }
    if (n.kind == NormStep::Kind::nfc) {
      s = nfc(s);
      continue;
    }
    std::string r;
    for (size_t i = 0;;) {
      const size_t j = s.find(n.a, i);
      if (j == std::string::npos) {
        r.append(s, i, std::string::npos);
        break;
      }
      r.append(s, i, j - i).append(n.b);
      i = j + n.a.size();
    }
    s = std::move(r);
  }
  normalized_matcher_.split(
      s, [&](std::string_view t) { encode_normalized(t, out); },
      [&](uint32_t id) { out.push_back(id); });
}

void BpeTokenizer::encode_normalized(std::string_view text, std::vector<uint32_t>& out) const {
  thread_local Pieces pieces, scratch;
  pieces.buf.assign(text);
  pieces.spans.assign(1, {0u, static_cast<uint32_t>(text.size())});
  pre_tokenize(pieces, scratch);
  for (const auto& [b, e] : pieces.spans)
    model_->encode_word(std::string_view(pieces.buf).substr(b, e - b), out);
}

// Splits each span of p by the matches of a regex (or a literal) per behavior.
void split_spans(const PreStep& step, Pieces& p, std::vector<std::pair<uint32_t, uint32_t>>& out) {
  out.clear();
  for (const auto& span : p.spans) {
    // Plain variables, not structured bindings: lambdas below capture them (C++20 allows
    // capturing bindings, clang 14 does not).
    const uint32_t b = span.first, e = span.second;
    const std::string_view text = std::string_view(p.buf).substr(b, e - b);
    thread_local std::vector<std::pair<uint32_t, uint32_t>> matches;
    matches.clear();
    if (step.regex) {
      step.regex->for_each_match(text, [&](size_t mb, size_t me) {
        matches.emplace_back(static_cast<uint32_t>(b + mb), static_cast<uint32_t>(b + me));
      });
    } else {
      for (size_t i = text.find(step.literal); i != std::string_view::npos && !step.literal.empty();
           i = text.find(step.literal, i + step.literal.size()))
        matches.emplace_back(static_cast<uint32_t>(b + i),
                             static_cast<uint32_t>(b + i + step.literal.size()));
    }
    const auto emit = [&](uint32_t x, uint32_t y) {
      if (y > x) out.emplace_back(x, y);
    };
    uint32_t gap = b;
    uint32_t pending = b;  // merged_with_next / contiguous: where the open piece starts
    for (size_t k = 0; k < matches.size(); ++k) {
      const auto [mb, me] = matches[k];
      switch (step.behavior) {
        case SplitBehavior::isolated:
          emit(gap, mb);
          emit(mb, me);
          break;
        case SplitBehavior::removed:
          emit(gap, mb);
          break;
        case SplitBehavior::merged_with_previous:
          emit(gap, me);
          break;
        case SplitBehavior::merged_with_next:
          emit(pending, mb);
          pending = mb;
          break;
        case SplitBehavior::contiguous:
          if (mb > gap) {
            emit(pending, gap);
            emit(gap, mb);
            pending = mb;
          }
          break;
      }
      gap = me;
    }
    if (step.behavior == SplitBehavior::merged_with_next) {
      emit(pending, e);
    } else if (step.behavior == SplitBehavior::contiguous) {
      emit(pending, gap);
      emit(gap, e);
    } else {
      emit(gap, e);
    }
  }
}

void BpeTokenizer::pre_tokenize(Pieces& p, Pieces& scratch) const {
  const ByteAlphabet& alphabet = byte_alphabet();
  for (const PreStep& step : pre_) {
    if (step.kind == PreStep::Kind::split) {
      split_spans(step, p, scratch.spans);
      std::swap(p.spans, scratch.spans);
      continue;
    }
    // ByteLevel: the optional prefix space, the GPT-2 split, then bytes to characters.
    scratch.buf.clear();
    scratch.spans.clear();
    std::string prefixed;
    for (const auto& [b, e] : p.spans) {
      std::string_view piece = std::string_view(p.buf).substr(b, e - b);
      if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) {
        prefixed = " ";
        prefixed.append(piece);
        piece = prefixed;
      }
      const auto map = [&](size_t x, size_t y) {
        const uint32_t start = static_cast<uint32_t>(scratch.buf.size());
        for (size_t i = x; i < y; ++i)
          scratch.buf += alphabet.to_char[static_cast<uint8_t>(piece[i])];
        scratch.spans.emplace_back(start, static_cast<uint32_t>(scratch.buf.size()));
      };
      if (step.regex) {
        step.regex->for_each_match(piece, map);
      } else if (!piece.empty()) {
        map(0, piece.size());
      }
    }
    std::swap(p, scratch);
  }
}

std::vector<std::string> BpeTokenizer::run_decoders(std::vector<std::string> tokens) const {
  const ByteAlphabet& alphabet = byte_alphabet();
  for (const DecStep& d : dec_) {
    std::vector<std::string> next;
    switch (d.kind) {
      case DecStep::Kind::byte_level: {
        std::string bytes;
        for (const std::string& t : tokens) {
          for (size_t i = 0; i < t.size();) {
            const Utf8Char c = utf8_next(t, i);
            const auto it = c.cp < 0 ? alphabet.to_byte.end()
                                     : alphabet.to_byte.find(static_cast<uint32_t>(c.cp));
            if (it != alphabet.to_byte.end()) {
              bytes.push_back(static_cast<char>(it->second));
            } else {
              bytes.append(t, i, c.len);
            }
            i += c.len;
          }
        }
        next.push_back(utf8_lossy(bytes));
        break;
      }
      case DecStep::Kind::replace:
        for (std::string& t : tokens) {
          std::string r;
          for (size_t i = 0;;) {
            const size_t j = t.find(d.a, i);
            if (j == std::string::npos) {
              r.append(t, i, std::string::npos);
              break;
            }
            r.append(t, i, j - i).append(d.b);
            i = j + d.a.size();
          }
          next.push_back(std::move(r));
        }
        break;
      case DecStep::Kind::byte_fallback: {
        std::string pending;
        size_t count = 0;
        const auto flush = [&] {
          if (count == 0) return;
          if (utf8_valid(pending)) {
            next.push_back(pending);
          } else {
            for (size_t k = 0; k < count; ++k) next.emplace_back("\xEF\xBF\xBD");
          }
          pending.clear();
          count = 0;
        };
        for (std::string& t : tokens) {
          const bool byte = t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
                            std::isxdigit(static_cast<unsigned char>(t[3])) &&
                            std::isxdigit(static_cast<unsigned char>(t[4]));
          if (byte) {
            pending.push_back(static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16)));
            ++count;
          } else {
            flush();
            next.push_back(std::move(t));
          }
        }
        flush();
        break;
      }
      case DecStep::Kind::fuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        next.push_back(std::move(all));
        break;
      }
      case DecStep::Kind::strip:
        for (std::string& t : tokens) {
          size_t b = 0, e = t.size();
          for (int k = 0; k < d.start && t.compare(b, d.a.size(), d.a) == 0 && b < e; ++k)
            b += d.a.size();
          for (int k = 0;
               k < d.stop && e >= b + d.a.size() && t.compare(e - d.a.size(), d.a.size(), d.a) == 0;
               ++k)
            e -= d.a.size();
          next.push_back(t.substr(b, e - b));
        }
        break;
    }
    tokens = std::move(next);
  }
  return tokens;
}

std::string BpeTokenizer::decode(std::span<const uint32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (const auto it = added_by_id_.find(ids[i]); it != added_by_id_.end()) {
      if (!(skip_special_tokens && it->second->special)) tokens.push_back(it->second->content);
      continue;
    }
    const std::string* t = model_->id_to_token(ids[i]);
    TD_CHECK(t != nullptr, "cannot decode token {} at position {}: not in the vocabulary of {}",
             ids[i], i, vocab_size_);
    tokens.push_back(*t);
  }
  std::string text;
  if (!has_decoder_) {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
    return text;
  }
  for (const std::string& t : run_decoders(std::move(tokens))) text += t;
  return text;
}

std::optional<uint32_t> BpeTokenizer::token_to_id(std::string_view token) const {
  for (const auto& t : added_)
    if (t->content == token) return t->id;
  return model_->token_to_id(token);
}

std::optional<std::string> BpeTokenizer::id_to_token(uint32_t id) const {
  if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) return it->second->content;
  if (const std::string* t = model_->id_to_token(id)) return *t;
  return std::nullopt;
}

std::vector<uint32_t> BpeTokenizer::special_ids() const {
  std::vector<uint32_t> ids;
  for (const auto& t : added_)
    if (t->special) ids.push_back(t->id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

// ---------------------------------------------------------------------------------------
// tokenizer.json components.

std::string pattern_of(Obj& o, const std::string& key, bool* is_regex) {
  Obj p(o.file(), o.req(key), o.at(key));
  const json* s = p.opt("String");
  const json* r = p.opt("Regex");
  p.finish();
  if ((s == nullptr) == (r == nullptr) || !(s ? s : r)->is_string())
    p.fail("", "expected {\"String\": ...} or {\"Regex\": ...}");
  *is_regex = r != nullptr;
  return (s ? s : r)->get<std::string>();
}

void read_normalizer(const std::string& file, const json& j, const std::string& path,
                     std::vector<NormStep>& out) {
  Obj o(file, j, path);
  const std::string type = o.str("type");
  if (type == "Sequence") {
    const json& list = o.req("normalizers");
    if (!list.is_array()) o.fail("normalizers", "expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      read_normalizer(file, list[i], o.at("normalizers") + "/" + std::to_string(i), out);
  } else if (type == "NFC") {
    if (!tokenizer_nfc_available())
      o.fail("type",
             "the NFC normalizer needs utf8proc, and this tandem was built without it "
             "(install libutf8proc-dev and rebuild)");
    out.emplace_back(NormStep::Kind::nfc, "", "");
  } else if (type == "Prepend") {
    out.emplace_back(NormStep::Kind::prepend, o.str("prepend"), "");
  } else if (type == "Replace") {
    bool regex = false;
    const std::string pattern = pattern_of(o, "pattern", &regex);
    if (regex) o.fail("pattern", "a Replace normalizer with a Regex pattern is not supported");
    if (pattern.empty()) o.fail("pattern", "a Replace normalizer needs a non-empty pattern");
    out.emplace_back(NormStep::Kind::replace, pattern, o.str("content"));
  } else {
    o.fail("type", fmt::format("normalizer type '{}' is not supported (supported: Sequence, "
                               "NFC, Prepend, Replace)",
                               type));
  }
  o.finish();
}

// A chain of Replace steps that each lengthen what they match can grow a text geometrically
// (twenty steps of " " -> "  " make one space a million); real tokenizers lengthen it by a
// small factor (Llama's " " -> U+2581 is 3x), so a chain that could exceed kMaxGrowth is
// refused at load rather than exhausting memory on the first text.
constexpr double kMaxReplaceGrowth = 1024;

template <typename Step, typename Kind>
void refuse_runaway_growth(Obj& top, const char* key, const std::vector<Step>& steps,
                           Kind replace) {
  double growth = 1;
  for (const Step& s : steps)
    if (s.kind == replace)
      growth *= std::max(1.0, static_cast<double>(s.b.size()) / static_cast<double>(s.a.size()));
  if (growth > kMaxReplaceGrowth)
    top.fail(key, fmt::format("its Replace steps can lengthen a text {:.3g} times (at most {:g} "
                              "is accepted)",
                              growth, kMaxReplaceGrowth));
}

std::shared_ptr<const Regex> gpt2_regex(const std::string& where) {
  return std::make_shared<const Regex>(kGpt2Pattern, where);
}

void read_pre_tokenizer(const std::string& file, const json& j, const std::string& path,
                        std::vector<PreStep>& out) {
  Obj o(file, j, path);
  const std::string type = o.str("type");
  if (type == "Sequence") {
    const json& list = o.req("pretokenizers");
    if (!list.is_array()) o.fail("pretokenizers", "expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(file, list[i], o.at("pretokenizers") + "/" + std::to_string(i), out);
  } else if (type == "ByteLevel") {
    PreStep s(PreStep::Kind::byte_level);
    s.add_prefix_space = o.flag("add_prefix_space", true);
    o.accept("trim_offsets");  // offsets only; tandem reports none
    if (o.flag("use_regex", true))
      s.regex = gpt2_regex(fmt::format("tokenizer file '{}': at {}", file, path));
    out.push_back(std::move(s));
  } else if (type == "Split") {
    PreStep s(PreStep::Kind::split);
    bool regex = false;
    const std::string pattern = pattern_of(o, "pattern", &regex);
    if (regex) {
      s.regex = std::make_shared<const Regex>(
          pattern, fmt::format("tokenizer file '{}': at {}", file, o.at("pattern")));
    } else {
      s.literal = pattern;
    }
    const std::string b = o.str("behavior");
    const std::pair<const char*, SplitBehavior> names[] = {
        {"Isolated", SplitBehavior::isolated},
        {"Removed", SplitBehavior::removed},
        {"MergedWithPrevious", SplitBehavior::merged_with_previous},
        {"MergedWithNext", SplitBehavior::merged_with_next},
        {"Contiguous", SplitBehavior::contiguous}};
    const auto it = std::find_if(std::begin(names), std::end(names),
                                 [&](const auto& n) { return b == n.first; });
    if (it == std::end(names))
      o.fail("behavior", fmt::format("unknown split behavior '{}' (known: Isolated, Removed, "
                                     "MergedWithPrevious, MergedWithNext, Contiguous)",
                                     b));
    s.behavior = it->second;
    if (o.flag("invert", false)) o.fail("invert", "an inverted Split is not supported");
    out.push_back(std::move(s));
  } else {
    o.fail("type", fmt::format("pre-tokenizer type '{}' is not supported (supported: Sequence, "
                               "ByteLevel, Split)",
                               type));
  }
  o.finish();
}

void read_decoder(const std::string& file, const json& j, const std::string& path,
                  std::vector<DecStep>& out) {
  Obj o(file, j, path);
  const std::string type = o.str("type");
  if (type == "Sequence") {
    const json& list = o.req("decoders");
    if (!list.is_array()) o.fail("decoders", "expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      read_decoder(file, list[i], o.at("decoders") + "/" + std::to_string(i), out);
  } else if (type == "ByteLevel") {
    // Decoding bytes back does not depend on these encoding options.
    o.accept("add_prefix_space");
    o.accept("trim_offsets");
    o.accept("use_regex");
    out.emplace_back(DecStep::Kind::byte_level);
  } else if (type == "Replace") {
    bool regex = false;
    const std::string pattern = pattern_of(o, "pattern", &regex);
    if (regex) o.fail("pattern", "a Replace decoder with a Regex pattern is not supported");
    if (pattern.empty()) o.fail("pattern", "a Replace decoder needs a non-empty pattern");
    out.emplace_back(DecStep::Kind::replace, pattern, o.str("content"));
  } else if (type == "ByteFallback") {
    out.emplace_back(DecStep::Kind::byte_fallback);
  } else if (type == "Fuse") {
    out.emplace_back(DecStep::Kind::fuse);
  } else if (type == "Strip") {
    DecStep s(DecStep::Kind::strip, o.str("content"));
    const json& start = o.req("start");
    const json& stop = o.req("stop");
    if (!start.is_number_unsigned() || !stop.is_number_unsigned())
      o.fail("start", "Strip needs non-negative integers start and stop");
    if (utf8_next(s.a, 0).len != s.a.size() || s.a.empty())
      o.fail("content", "Strip content must be one character");
    s.start = start.get<int>();
    s.stop = stop.get<int>();
    out.push_back(std::move(s));
  } else {
    o.fail("type", fmt::format("decoder type '{}' is not supported (supported: Sequence, "
                               "ByteLevel, Replace, ByteFallback, Fuse, Strip)",
                               type));
  }
  o.finish();
}

// Merges come as "a b" strings or as [a, b] pairs.
std::vector<std::pair<std::string, std::string>> read_merges(Obj& m) {
  const json& list = m.req("merges");
  if (!list.is_array()) m.fail("merges", "expected an array");
  std::vector<std::pair<std::string, std::string>> merges;
  merges.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const json& e = list[i];
    const std::string at = "merges/" + std::to_string(i);
    if (e.is_string()) {
      const std::string& s = e.get_ref<const std::string&>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        m.fail(at, fmt::format("merge '{}' is not two tokens separated by one space", s));
      merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
    } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
      merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
    } else {
      m.fail(at, fmt::format("a merge must be \"a b\" or [\"a\", \"b\"], found {}", e.dump()));
    }
  }
  return merges;
}

std::unique_ptr<BpeModel> read_model(const std::string& file, const json& j) {
  Obj m(file, j, "/model");
  const std::string type = m.str("type");
  if (type != "BPE")
    m.fail("type", fmt::format("model type '{}' is not supported (supported: BPE)", type));
  if (const json* d = m.opt("dropout"); d && !(d->is_number() && d->get<double>() == 0.0))
    m.fail("dropout", "BPE dropout is not supported (it makes encoding random)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const json* v = m.opt(key); v && !(v->is_string() && v->get<std::string>().empty()))
      m.fail(key, fmt::format("'{}' is not supported", key));
  BpeOptions options;
  options.byte_fallback = m.flag("byte_fallback", false);
  options.fuse_unk = m.flag("fuse_unk", false);
  options.ignore_merges = m.flag("ignore_merges", false);
  const json& vocab_json = m.req("vocab");
  if (!vocab_json.is_object()) m.fail("vocab", "expected an object of token: id");
  StringIdMap vocab;
  vocab.reserve(vocab_json.size());
  for (const auto& [token, id] : vocab_json.items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() > 0xFFFFFFFEu)
      m.fail("vocab/" + token, fmt::format("the id of '{}' must be an integer 0..2^32-2, found {}",
                                           token, id.dump()));
    vocab.emplace(token, id.get<uint32_t>());
  }
  if (const json* unk = m.opt("unk_token")) {
    if (!unk->is_string()) m.fail("unk_token", "expected a string");
    const auto it = vocab.find(unk->get<std::string>());
    if (it == vocab.end())
      m.fail("unk_token",
             fmt::format("unk token '{}' is not in the vocabulary", unk->get<std::string>()));
    options.unk = it->second;
  }
  const auto merges = read_merges(m);
  m.finish();
  return std::make_unique<BpeModel>(std::move(vocab), merges, options,
                                    fmt::format("tokenizer file '{}': at /model", file));
}

void read_added_tokens(const std::string& file, const json& list, BpeTokenizer& t) {
  if (!list.is_array()) TD_THROW("tokenizer file '{}': at /added_tokens: expected an array", file);
  for (size_t i = 0; i < list.size(); ++i) {
    Obj a(file, list[i], "/added_tokens/" + std::to_string(i));
    auto tok = std::make_unique<AddedToken>();
    const json& id = a.req("id");
    if (!id.is_number_unsigned() || id.get<uint64_t>() > 0xFFFFFFFEu)
      a.fail("id", fmt::format("expected an integer id, found {}", id.dump()));
    tok->id = id.get<uint32_t>();
    tok->content = a.str("content");
    if (tok->content.empty()) a.fail("content", "an added token cannot be empty");
    tok->special = a.flag("special", false);
    tok->lstrip = a.flag("lstrip", false);
    tok->rstrip = a.flag("rstrip", false);
    tok->normalized = a.flag("normalized", !tok->special);
    if (a.flag("single_word", false))
      a.fail("single_word", "added tokens with single_word are not supported");
    a.finish();
    // An added token may repeat a vocabulary entry; it must then keep the same id.
    if (const auto v = t.model_->token_to_id(tok->content); v && *v != tok->id)
      a.fail("id", fmt::format("'{}' has id {} here and {} in the vocabulary", tok->content,
                               tok->id, *v));
    t.added_.push_back(std::move(tok));
  }
}

void read_post_processor(const std::string& file, const json& j, const std::string& path,
                         BpeTokenizer& t) {
  Obj o(file, j, path);
  const std::string type = o.str("type");
  if (type == "Sequence") {
    const json& list = o.req("processors");
    if (!list.is_array()) o.fail("processors", "expected an array");
    for (size_t i = 0; i < list.size(); ++i)
      read_post_processor(file, list[i], o.at("processors") + "/" + std::to_string(i), t);
  } else if (type == "ByteLevel") {
    // On ids it changes nothing: it only adjusts offsets.
    o.accept("add_prefix_space");
    o.accept("trim_offsets");
    o.accept("use_regex");
  } else if (type == "TemplateProcessing") {
    if (t.has_template_) o.fail("", "only one TemplateProcessing is supported");
    t.has_template_ = true;
    o.accept("pair");  // pairs of texts are never encoded
    Obj specials(file, o.req("special_tokens"), o.at("special_tokens"));
    const json& single = o.req("single");
    if (!single.is_array()) o.fail("single", "expected an array");
    bool has_text = false;
    for (size_t i = 0; i < single.size(); ++i) {
      Obj item(file, single[i], o.at("single") + "/" + std::to_string(i));
      if (const json* sp = item.opt("SpecialToken")) {
        Obj st(file, *sp, item.at("SpecialToken"));
        const std::string name = st.str("id");
        st.accept("type_id");
        st.finish();
        Obj def(file, specials.req(name), specials.at(name));
        const json& ids = def.req("ids");
        def.accept("id");
        def.accept("tokens");
        def.finish();
        if (!ids.is_array() || ids.empty()) def.fail("ids", "expected an array of ids");
        std::vector<uint32_t> v;
        for (const json& x : ids) {
          if (!x.is_number_unsigned()) def.fail("ids", "expected an array of ids");
          v.push_back(x.get<uint32_t>());
        }
        t.template_.push_back(std::move(v));
      } else if (const json* sq = item.opt("Sequence")) {
        Obj seq(file, *sq, item.at("Sequence"));
        if (seq.str("id") != "A") seq.fail("id", "a single-text template can only hold sequence A");
        seq.accept("type_id");
        seq.finish();
        has_text = true;
        t.template_.emplace_back();
      } else {
        item.fail("", "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}");
      }
      item.finish();
    }
    if (!has_text) o.fail("single", "the template never places the text (Sequence A)");
  } else {
    o.fail("type", fmt::format("post-processor type '{}' is not supported (supported: "
                               "Sequence, ByteLevel, TemplateProcessing)",
                               type));
  }
  o.finish();
}

// BOS and EOS when nothing names them: the template's first special token is BOS, and the
// first of the usual end-of-text tokens present is EOS.
void guess_bos_eos(BpeTokenizer& t) {
  if (t.has_template_ && !t.template_.empty() && !t.template_.front().empty())
    t.set_bos(t.template_.front().front());
  for (const char* name : {"<|end_of_text|>", "</s>", "<|endoftext|>"}) {
    if (const auto id = t.token_to_id(name)) {
      t.set_eos(id);
      break;
    }
  }
  if (!t.bos_id())
    for (const char* name : {"<|begin_of_text|>", "<s>", "<|endoftext|>"})
      if (const auto id = t.token_to_id(name)) {
        t.set_bos(id);
        break;
      }
}

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_json_load(const std::string& path) {
  const json j = parse_json(path, "tokenizer file");
  auto t = std::make_unique<BpeTokenizer>();
  t->kind_ = "tokenizer.json BPE";
  Obj top(path, j, "");
  for (const char* key : {"truncation", "padding"})
    if (top.opt(key) != nullptr)
      top.fail(key, fmt::format("'{}' is not supported (give it as null)", key));
  top.accept("version");
  t->model_ = read_model(path, top.req("model"));
  if (const json* n = top.opt("normalizer")) {
    read_normalizer(path, *n, "/normalizer", t->norm_);
    refuse_runaway_growth(top, "normalizer", t->norm_, NormStep::Kind::replace);
  }
  if (const json* p = top.opt("pre_tokenizer"))
    read_pre_tokenizer(path, *p, "/pre_tokenizer", t->pre_);
  if (const json* d = top.opt("decoder")) {
    t->has_decoder_ = true;
    read_decoder(path, *d, "/decoder", t->dec_);
    refuse_runaway_growth(top, "decoder", t->dec_, DecStep::Kind::replace);
  }
  if (const json* a = top.opt("added_tokens")) read_added_tokens(path, *a, *t);
  if (const json* p = top.opt("post_processor"))
    read_post_processor(path, *p, "/post_processor", *t);
  top.finish();
  t->finish_added();
  guess_bos_eos(*t);
  return t;
}

std::unique_ptr<Tokenizer> tokenizer_gpt2_load(const std::string& vocab_path,
                                               const std::string& merges_path) {
  const json j = parse_json(vocab_path, "vocabulary file");
  TD_CHECK(j.is_object(), "vocabulary file '{}' must be a JSON object of token: id", vocab_path);
  StringIdMap vocab;
  vocab.reserve(j.size());
  for (const auto& [token, id] : j.items()) {
    TD_CHECK(id.is_number_unsigned() && id.get<uint64_t>() <= 0xFFFFFFFEu,
             "vocabulary file '{}': the id of '{}' must be an integer 0..2^32-2, found {}",
             vocab_path, token, id.dump());
    vocab.emplace(token, id.get<uint32_t>());
  }
  // merges.txt: an optional "#version" line, then "a b" per line in priority order.
  const std::string text = read_file(merges_path, "merges file");
  std::vector<std::pair<std::string, std::string>> merges;
  size_t line_no = 0;
  for (size_t i = 0; i < text.size();) {
    size_t e = text.find('\n', i);
    if (e == std::string::npos) e = text.size();
    std::string_view line = std::string_view(text).substr(i, e - i);
    i = e + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    TD_CHECK(sp != std::string_view::npos && line.find(' ', sp + 1) == std::string_view::npos,
             "merges file '{}', line {}: '{}' is not two tokens separated by one space",
             merges_path, line_no, line);
    merges.emplace_back(std::string(line.substr(0, sp)), std::string(line.substr(sp + 1)));
  }
  auto t = std::make_unique<BpeTokenizer>();
  t->kind_ = "GPT-2 BPE";
  t->model_ = std::make_unique<BpeModel>(std::move(vocab), merges, BpeOptions{},
                                         fmt::format("'{}' with '{}'", vocab_path, merges_path));
  PreStep byte_level(PreStep::Kind::byte_level);
  byte_level.regex = gpt2_regex(fmt::format("GPT-2 tokenizer '{}'", vocab_path));
  t->pre_.push_back(std::move(byte_level));
  t->has_decoder_ = true;
  t->dec_.emplace_back(DecStep::Kind::byte_level);
  if (const auto id = t->model_->token_to_id("<|endoftext|>")) {
    auto eot = std::make_unique<AddedToken>();
    eot->content = "<|endoftext|>";
    eot->id = *id;
    eot->special = true;
    t->added_.push_back(std::move(eot));
    t->set_bos(*id);
    t->set_eos(*id);
  }
  t->finish_added();
  return t;
}

bool tokenizer_nfc_available() {
  return TANDEM_HAVE_UTF8PROC != 0;
}

}  // namespace tandem
