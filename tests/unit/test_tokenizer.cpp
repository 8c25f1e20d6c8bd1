// Tokenizers against independent references: GPT-2, Llama 2 and Llama 3 vocabularies encoded
// by their own JavaScript encoders (tests/fixtures/tokenizers/expected_node.json), decode ∘
// encode on random UTF-8, invalid bytes, threads; and the real Hugging Face files once
// tools/make_tokenizer_json.py has made them.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "core/error.h"
#include "io/regex.h"
#include "io/tokenizer.h"
#include "io/tokenizer_kinds.h"
#include "io/utf8.h"
#include "tokenizer_fixtures.h"

namespace tandem::tok_test {
namespace {

#define NEED_PCRE2() \
  if (!Regex::available()) GTEST_SKIP() << "built without PCRE2 (install libpcre2-dev)"

std::string show(const std::string& text) {
  std::string s;
  for (unsigned char c : text)
    s += (c >= 0x20 && c < 0x7f) ? std::string(1, static_cast<char>(c))
                                 : fmt::format("\\x{:02x}", c);
  return s;
}

void expect_reference(const Tokenizer& t, const json& list) {
  const auto cases = reference_cases(list);
  ASSERT_GT(cases.size(), 30u);
  for (const RefCase& c : cases) EXPECT_EQ(t.encode(c.text), c.ids) << "text: " << show(c.text);
}

void expect_round_trip(const Tokenizer& t, const json& list) {
  for (const RefCase& c : reference_cases(list))
    EXPECT_EQ(t.decode(t.encode(c.text)), utf8_lossy(c.text)) << "text: " << show(c.text);
}

std::unique_ptr<Tokenizer> gpt2() {
  return tokenizer_load(fixture_dir() + "/gpt2/vocab.json");
}

TEST(Utf8, LossyReplacesEachMaximalInvalidSubpart) {
  EXPECT_EQ(utf8_lossy("a\xff"
                       "b"),
            "a\xEF\xBF\xBD"
            "b");
  // A cut three-byte sequence is one U+FFFD; an overlong or surrogate lead is one per byte.
  EXPECT_EQ(utf8_lossy("\xe2\x82 x"), "\xEF\xBF\xBD x");
  EXPECT_EQ(utf8_lossy("\xc0\xaf"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(utf8_lossy("\xed\xa0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  std::string four;
  for (int i = 0; i < 4; ++i) four += "\xEF\xBF\xBD";
  EXPECT_EQ(utf8_lossy("\xf4\x90\x80\x80"), four);  // past U+10FFFF
  EXPECT_TRUE(utf8_valid("caf\xc3\xa9 \xf0\x9f\x98\x80"));
  EXPECT_FALSE(utf8_valid("\xf0\x9f\x98"));
}

TEST(TokenizerGpt2, MatchesNodeEncoder) {
  NEED_PCRE2();
  const auto t = gpt2();
  EXPECT_EQ(t->kind(), "GPT-2 BPE");
  EXPECT_EQ(t->vocab_size(), 50257u);
  EXPECT_EQ(t->eos_id(), 50256u);
  expect_reference(*t, node_reference()["gpt2"]);
  expect_round_trip(*t, node_reference()["gpt2"]);
}

TEST(TokenizerGpt2, EncoderJsonSpelling) {
  NEED_PCRE2();
  const fs::path dir = fs::temp_directory_path() / fmt::format("tandem_tok_enc_{}", ::getpid());
  fs::create_directories(dir);
  fs::copy_file(fixture_dir() + "/gpt2/vocab.json", dir / "encoder.json",
                fs::copy_options::overwrite_existing);
  fs::copy_file(fixture_dir() + "/gpt2/merges.txt", dir / "vocab.bpe",
                fs::copy_options::overwrite_existing);
  const auto t = tokenizer_load(dir.string());  // a directory: found by name
  EXPECT_EQ(t->encode("Hello world"), (std::vector<uint32_t>{15496, 995}));
  fs::remove_all(dir);
}

TEST(TokenizerLlama3, MatchesNodeEncoder) {
  NEED_PCRE2();
  const auto t = tokenizer_load(llama3_file());
  EXPECT_EQ(t->vocab_size(), 128256u);
  EXPECT_EQ(t->bos_id(), 128000u);
  EXPECT_EQ(t->eos_id(), 128001u);
  expect_reference(*t, node_reference()["llama3"]);
  expect_round_trip(*t, node_reference()["llama3"]);
  // The template adds BOS only when asked.
  EXPECT_EQ(t->encode("Hello world", true), (std::vector<uint32_t>{128000, 9906, 1917}));
  EXPECT_EQ(t->decode(std::vector<uint32_t>{128000, 9906, 1917}, true), "Hello world");
  EXPECT_EQ(t->decode(std::vector<uint32_t>{128000, 9906}), "<|begin_of_text|>Hello");
}

TEST(TokenizerLlama2, MatchesNodeEncoder) {
  const auto t = tokenizer_load(llama2_file());
  EXPECT_EQ(t->vocab_size(), 32000u);
  EXPECT_EQ(t->bos_id(), 1u);
  EXPECT_EQ(t->eos_id(), 2u);
  expect_reference(*t, node_reference()["llama2"]);
  expect_round_trip(*t, node_reference()["llama2"]);
  EXPECT_EQ(t->encode("Hello world", true), (std::vector<uint32_t>{1, 15043, 3186}));
  // <s> in text is the special token.
  EXPECT_EQ(t->encode("<s>Hello"), (std::vector<uint32_t>{1, 15043}));
}

// Random text from every plane: decode(encode(x)) == x for byte-level BPE.
std::string random_utf8(std::mt19937& rng, size_t chars) {
  std::string s;
  std::uniform_int_distribution<int> kind(0, 9);
  for (size_t i = 0; i < chars; ++i) {
    uint32_t cp = 0;
    switch (kind(rng)) {
      case 0:
        cp = std::uniform_int_distribution<uint32_t>(0x1, 0x7f)(rng);
        break;
      case 1:
        cp = std::uniform_int_distribution<uint32_t>(0x80, 0x7ff)(rng);
        break;
      case 2:
        cp = std::uniform_int_distribution<uint32_t>(0x800, 0xd7ff)(rng);
        break;
      case 3:
        cp = std::uniform_int_distribution<uint32_t>(0xe000, 0xffff)(rng);
        break;
      case 4:
        cp = std::uniform_int_distribution<uint32_t>(0x10000, 0x10ffff)(rng);
        break;
      case 5:
        cp = " \t\n\r"[std::uniform_int_distribution<int>(0, 3)(rng)];
        break;
      default:
        cp = std::uniform_int_distribution<uint32_t>('a', 'z')(rng);
        break;
    }
    utf8_append(s, cp);
  }
  return s;
}

TEST(TokenizerRoundTrip, ByteLevelIsTheIdentityOnValidUtf8) {
  NEED_PCRE2();
  const auto g = gpt2();
  const auto l3 = tokenizer_load(llama3_file());
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) {
    const std::string text = random_utf8(rng, 1 + static_cast<size_t>(i));
    ASSERT_EQ(g->decode(g->encode(text)), text) << show(text);
    ASSERT_EQ(l3->decode(l3->encode(text)), text) << show(text);
  }
}

TEST(TokenizerRoundTrip, ByteTokenizerKeepsInvalidBytes) {
  ByteTokenizer t;
  const std::string bytes = "a\xff\xfe\x80z";
  EXPECT_EQ(t.decode(t.encode(bytes)), bytes);
}

TEST(TokenizerThreads, ConcurrentEncodesAgree) {
  NEED_PCRE2();
  const auto t = gpt2();
  std::mt19937 rng(3);
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back(random_utf8(rng, 200));
  std::vector<std::vector<uint32_t>> serial;
  for (const auto& s : texts) serial.push_back(t->encode(s));
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 3; ++rep)
        for (size_t i = 0; i < texts.size(); ++i) bad[k] += t->encode(texts[i]) != serial[i];
    });
  for (auto& th : threads) th.join();
  for (int b : bad) EXPECT_EQ(b, 0);
}

// The files Hugging Face's own libraries write (tools/make_tokenizer_json.py, run where
// `tokenizers`, `transformers` and `sentencepiece` are installed), with the ids those
// libraries give for the same cases.
std::string hf_dir() {
  return fixture_dir() + "/hf";
}

#define NEED_HF(file)                                                                \
  if (!fs::exists(hf_dir() + "/" + (file)))                                          \
  GTEST_SKIP() << hf_dir() << "/" << (file)                                          \
               << " is missing; make it with: python3 tools/make_tokenizer_json.py " \
                  "(needs pip install tokenizers transformers sentencepiece protobuf)"

void expect_hf(const std::string& name, const std::string& file) {
  const json ref = json::parse(slurp(hf_dir() + "/expected_hf.json"));
  ASSERT_TRUE(ref.contains(name)) << name;
  const auto t = tokenizer_load(hf_dir() + "/" + file);
  expect_reference(*t, ref[name]);
}

TEST(TokenizerHf, Gpt2TokenizerJson) {
  NEED_PCRE2();
  NEED_HF("gpt2/tokenizer.json");
  expect_hf("gpt2", "gpt2/tokenizer.json");
}

TEST(TokenizerHf, Llama3TokenizerJson) {
  NEED_PCRE2();
  NEED_HF("llama3/tokenizer.json");
  expect_hf("llama3", "llama3/tokenizer.json");
}

TEST(TokenizerHf, Llama2TokenizerJson) {
  NEED_HF("llama2/tokenizer.json");
  expect_hf("llama2", "llama2/tokenizer.json");
}

TEST(TokenizerHf, Llama2SentencePieceModel) {
  if (!tokenizer_spm_available()) GTEST_SKIP() << "built without SentencePiece";
  NEED_HF("llama2/tokenizer.model");
  expect_hf("llama2_spm", "llama2/tokenizer.model");
  // The same text through both Llama 2 tokenizers.
  const auto spm = tokenizer_load(hf_dir() + "/llama2/tokenizer.model");
  EXPECT_EQ(spm->vocab_size(), 32000u);
  EXPECT_EQ(spm->bos_id(), 1u);
}

}  // namespace
}  // namespace tandem::tok_test
