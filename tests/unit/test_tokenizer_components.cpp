// Each tokenizer.json component on a hand-built file small enough to predict by hand: the
// Split behaviours, ByteLevel's prefix space, merges as pairs, byte fallback and unk
// fusion, ignore_merges, added-token flags, normalizers and decoders; and data_prepare's
// cuts, which must not change the tokens.
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/prepare.h"
#include "io/regex.h"
#include "io/tokenizer.h"
#include "io/tokenizer_kinds.h"
#include "io/tokens.h"
#include "tokenizer_fixtures.h"

namespace tandem::tok_test {
namespace {

using Ids = std::vector<uint32_t>;

// A tokenizer.json around a BPE model of `vocab` and `merges`, written to a fresh file.
class JsonTokenizer {
 public:
  explicit JsonTokenizer(json vocab, json merges = json::array()) {
    j_ = {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"model", {{"type", "BPE"}, {"vocab", std::move(vocab)}, {"merges", std::move(merges)}}}};
  }
  json& operator[](const char* key) { return j_[key]; }
  // Another file beside tokenizer.json (tokenizer_config.json).
  void beside(const std::string& name, json j) { beside_.emplace_back(name, std::move(j)); }
  std::unique_ptr<Tokenizer> load() {
    static int counter = 0;
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
    dir_ = fs::temp_directory_path() / fmt::format("tandem_tokc_{}_{}", ::getpid(), counter++);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "tokenizer.json") << j_.dump();
    for (const auto& [name, j] : beside_) std::ofstream(dir_ / name) << j.dump();
    return tokenizer_load((dir_ / "tokenizer.json").string());
  }
  ~JsonTokenizer() {
    std::error_code ec;
    if (!dir_.empty()) fs::remove_all(dir_, ec);
  }

 private:
  json j_;
  std::vector<std::pair<std::string, json>> beside_;
  fs::path dir_;
};

json small_vocab() {
  return {{"a", 0}, {"b", 1}, {"-", 2}, {"a-", 3}, {"-b", 4}, {"--", 5}, {" ", 6}};
}

Ids split_ids(const std::string& behavior, const std::string& text) {
  JsonTokenizer t(small_vocab(), {"a -", "- b", "- -"});
  t["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", false}};
  return t.load()->encode(text);
}

TEST(TokenizerSplit, EveryBehavior) {
  // Without a pre-tokenizer the whole text is one word: "a -" (rank 0) wins.
  JsonTokenizer whole(small_vocab(), {"a -", "- b", "- -"});
  EXPECT_EQ(whole.load()->encode("a-b"), (Ids{3, 1}));
  EXPECT_EQ(split_ids("Isolated", "a-b"), (Ids{0, 2, 1}));
  EXPECT_EQ(split_ids("Removed", "a-b"), (Ids{0, 1}));
  EXPECT_EQ(split_ids("MergedWithPrevious", "a-b"), (Ids{3, 1}));
  EXPECT_EQ(split_ids("MergedWithNext", "a-b"), (Ids{0, 4}));
  EXPECT_EQ(split_ids("Isolated", "a--b"), (Ids{0, 2, 2, 1}));
  EXPECT_EQ(split_ids("Contiguous", "a--b"), (Ids{0, 5, 1}));
  EXPECT_EQ(split_ids("Contiguous", "--a-"), (Ids{5, 0, 2}));
}

TEST(TokenizerSplit, RegexPatternAndSequence) {
  if (!Regex::available()) GTEST_SKIP() << "built without PCRE2";
  JsonTokenizer t(small_vocab(), {"a -", "- b", "- -"});
  t["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "Removed"}},
        {{"type", "Split"}, {"pattern", {{"Regex", "-+"}}}, {"behavior", "Isolated"}}}}};
  EXPECT_EQ(t.load()->encode("a--b  a-"), (Ids{0, 5, 1, 0, 2}));
}

// GPT-2's vocabulary as a tokenizer.json, merges in the [a, b] form.
JsonTokenizer gpt2_json(bool add_prefix_space) {
  const json vocab = json::parse(slurp(fixture_dir() + "/gpt2/vocab.json"));
  json merges = json::array();
  for (const std::string& line : lines_of(fixture_dir() + "/gpt2/merges.txt")) {
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t sp = line.find(' ');
    merges.push_back({line.substr(0, sp), line.substr(sp + 1)});
  }
  JsonTokenizer t(vocab, merges);
  t["pre_tokenizer"] = {{"type", "ByteLevel"},
                        {"add_prefix_space", add_prefix_space},
                        {"trim_offsets", true},
                        {"use_regex", true}};
  t["decoder"] = {{"type", "ByteLevel"}};
  t["added_tokens"] = {added(50256, "<|endoftext|>")};
  return t;
}

TEST(TokenizerByteLevel, PairMergesMatchTheNodeReference) {
  if (!Regex::available()) GTEST_SKIP() << "built without PCRE2";
  JsonTokenizer j = gpt2_json(false);
  const auto t = j.load();
  for (const RefCase& c : reference_cases(node_reference()["gpt2"]))
    EXPECT_EQ(t->encode(c.text), c.ids) << c.text;
}

TEST(TokenizerByteLevel, AddPrefixSpaceOnEachSegment) {
  if (!Regex::available()) GTEST_SKIP() << "built without PCRE2";
  JsonTokenizer j = gpt2_json(true);
  const auto t = j.load();
  EXPECT_EQ(t->encode("Hello"), (Ids{18435}));   // " Hello"
  EXPECT_EQ(t->encode(" Hello"), (Ids{18435}));  // already there: not doubled
  EXPECT_EQ(t->encode("Hello<|endoftext|>Hello"), (Ids{18435, 50256, 18435}));
  EXPECT_EQ(t->decode(Ids{18435}), " Hello");
}

TEST(TokenizerAdded, LongestFirstStripAndNormalizedFlags) {
  JsonTokenizer j({{"a", 0}, {"b", 1}, {" ", 2}, {"_", 3}, {"_a", 4}}, {"_ a"});
  auto strip = added(10, "<m>");
  strip["lstrip"] = true;
  strip["rstrip"] = true;
  auto longer = added(11, "<m>>", false);
  auto norm = added(12, "_b", false);
  norm["normalized"] = true;
  j["added_tokens"] = {strip, longer, norm};
  j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "_"}};
  const auto t = j.load();
  // lstrip/rstrip take the spaces around the token; the longest token wins.
  EXPECT_EQ(t->encode("a  <m> b"), (Ids{0, 10, 1}));
  EXPECT_EQ(t->encode("a<m>>b"), (Ids{0, 11, 1}));
  // "_b" is matched after normalization (" b" becomes "_b"), "_a" is the model's merge.
  EXPECT_EQ(t->encode(" b a"), (Ids{12, 4}));
  EXPECT_EQ(t->special_ids(), (Ids{10}));
  EXPECT_EQ(t->decode(Ids{0, 10, 11}), "a <m> <m>>");  // no decoder: joined by spaces
  EXPECT_EQ(t->token_to_id("<m>>"), 11u);
}

TEST(TokenizerBpe, ByteFallbackAndUnk) {
  const json vocab = {{"<unk>", 0}, {"a", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}};
  JsonTokenizer fallback(vocab);
  fallback["model"]["byte_fallback"] = true;
  fallback["model"]["unk_token"] = "<unk>";
  fallback["decoder"] = {{"type", "ByteFallback"}};
  auto t = fallback.load();
  EXPECT_EQ(t->encode("a\xc3\xa9"), (Ids{1, 2, 3}));   // é: both bytes exist
  EXPECT_EQ(t->encode("a\xe2\x82\xac"), (Ids{1, 0}));  // €: its bytes do not
  EXPECT_EQ(t->decode(Ids{2, 3}), "\xc3\xa9");
  EXPECT_EQ(t->decode(Ids{2, 1}),
            "\xEF\xBF\xBD"
            "a");  // a lone byte decodes to U+FFFD

  JsonTokenizer fused(vocab);
  fused["model"]["unk_token"] = "<unk>";
  fused["model"]["fuse_unk"] = true;
  EXPECT_EQ(fused.load()->encode("xya"), (Ids{0, 1}));
  JsonTokenizer unfused(vocab);
  unfused["model"]["unk_token"] = "<unk>";
  EXPECT_EQ(unfused.load()->encode("xya"), (Ids{0, 0, 1}));

  JsonTokenizer no_unk(vocab);
  const auto bare = no_unk.load();
  try {
    bare->encode("x");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("no unk token"), std::string::npos) << e.message();
  }
}

TEST(TokenizerBpe, IgnoreMerges) {
  const json vocab = {{"a", 0}, {"b", 1}, {"c", 2}, {"ab", 3}, {"abc", 4}};
  JsonTokenizer merged(vocab, {"a b"});
  EXPECT_EQ(merged.load()->encode("abc"), (Ids{3, 2}));
  JsonTokenizer whole(vocab, {"a b"});
  whole["model"]["ignore_merges"] = true;
  EXPECT_EQ(whole.load()->encode("abc"), (Ids{4}));
}

TEST(TokenizerDecoders, Llama2Chain) {
  JsonTokenizer j({{"\xE2\x96\x81hi", 0}, {"\xE2\x96\x81", 1}, {"<0x0A>", 2}, {"x", 3}});
  j["decoder"] = {
      {"type", "Sequence"},
      {"decoders",
       {{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
        {{"type", "ByteFallback"}},
        {{"type", "Fuse"}},
        {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}};
  const auto t = j.load();
  EXPECT_EQ(t->decode(Ids{0, 1, 2, 3}), "hi \nx");  // one leading space stripped
  EXPECT_EQ(t->decode(Ids{1, 1, 0}), "  hi");
}

TEST(TokenizerDecoders, WithoutDecoderTokensJoinWithSpaces) {
  JsonTokenizer j(json{{"a", 0}, {"b", 1}});
  EXPECT_EQ(j.load()->decode(Ids{0, 1}), "a b");
}

TEST(TokenizerNormalizer, PrependOnlyToNonEmptySegments) {
  JsonTokenizer j({{"_", 0}, {"a", 1}, {"_a", 2}, {"<s>", 3}}, {"_ a"});
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers",
                      {{{"type", "Prepend"}, {"prepend", "_"}},
                       {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "_"}}}}};
  j["added_tokens"] = {added(3, "<s>")};
  j["post_processor"] = template_bos("<s>", 3);
  const auto t = j.load();
  EXPECT_EQ(t->encode("a a"), (Ids{2, 2}));
  EXPECT_EQ(t->encode(""), Ids{});
  EXPECT_EQ(t->encode("a", true), (Ids{3, 2}));
  EXPECT_EQ(t->encode("<s>a"), (Ids{3, 2}));  // each segment is normalized on its own
  EXPECT_EQ(t->bos_id(), 3u);
}

json replace_step(const std::string& pattern, const std::string& content) {
  return {{"type", "Replace"}, {"pattern", {{"String", pattern}}}, {"content", content}};
}

// An empty Replace pattern would match everywhere (and loop forever on an unguarded scan);
// it is refused in a normalizer and in a decoder, naming where.
TEST(TokenizerNormalizer, EmptyReplacePatternIsRefused) {
  for (const char* key : {"normalizer", "decoder"}) {
    JsonTokenizer j(json{{"a", 0}});
    j[key] = replace_step("", "x");
    try {
      j.load();
      ADD_FAILURE() << key << ": an empty Replace pattern loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("non-empty pattern"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(std::string("/") + key), std::string::npos) << e.what();
    }
    j[key] = replace_step("a", "");
    EXPECT_NO_THROW(j.load()) << key;
  }
}

// Replace chains that could grow a text past 1024 times its length are refused at load;
// one within the bound (ten doublings, exactly 1024) loads and does what it says.
TEST(TokenizerNormalizer, RunawayReplaceChainIsRefused) {
  const auto chain = [](int steps) {
    json list = json::array();
    for (int k = 0; k < steps; ++k) list.push_back(replace_step("a", "aa"));
    return list;
  };
  for (const auto& [key, list_key] :
       {std::pair{"normalizer", "normalizers"}, std::pair{"decoder", "decoders"}}) {
    JsonTokenizer j(json{{"a", 0}});
    j[key] = {{"type", "Sequence"}, {list_key, chain(11)}};
    try {
      j.load();
      ADD_FAILURE() << key << ": eleven doublings loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("2.05e+03 times"), std::string::npos) << e.what();
    }
    j[key] = {{"type", "Sequence"}, {list_key, chain(10)}};
    const auto t = j.load();
    if (std::string(key) == "normalizer") {
      EXPECT_EQ(t->encode("a"), Ids(1024, 0));
    } else {
      EXPECT_EQ(t->decode(Ids{0}), std::string(1024, 'a'));
    }
  }
}

// The model's tokens are indexed by id: a vocabulary whose ids run far past its count is
// refused with the numbers, before anything is sized by it; ids below twice the count plus
// 65536 load. Added tokens are kept by id, so theirs may sit anywhere (compact vocabularies keep
// their specials' real ids).
TEST(TokenizerBpe, SparseIdsAreRefused) {
  const auto message = [](JsonTokenizer& j) -> std::string {
    try {
      j.load();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  JsonTokenizer stray(json{{"a", 0}, {"b", 114224417}});
  const std::string m = message(stray);
  EXPECT_NE(m.find("the largest is 114224417 for 2 tokens"), std::string::npos) << m;
  EXPECT_NE(m.find("/model"), std::string::npos) << m;
  JsonTokenizer edge(json{{"a", 0}, {"b", 2 * 2 + 65535}});
  EXPECT_EQ(message(edge), "");
  JsonTokenizer past(json{{"a", 0}, {"b", 2 * 2 + 65536}});
  EXPECT_NE(message(past).find("the largest is 65540 for 2 tokens"), std::string::npos);

  JsonTokenizer far(json{{"a", 0}, {"b", 1}});
  far["added_tokens"] = {added(1000000, "<x>")};
  EXPECT_EQ(message(far), "");
  EXPECT_EQ(far.load()->encode("a<x>"), (Ids{0, 1000000}));
}

// GPT-NeoX (Pythia) tokenizers compose text (NFC) before anything else: "e" + U+0301
// (combining acute) becomes U+00E9, the token the vocabulary has.
TEST(TokenizerNormalizer, NfcComposesBeforeTheModel) {
  const std::string composed = "\xC3\xA9", decomposed = "e\xCC\x81";
  JsonTokenizer j({{composed, 0}, {"e", 1}, {"\xCC\x81", 2}, {std::string(1, '\0'), 3}});
  EXPECT_EQ(j.load()->encode(decomposed), (Ids{1, 2}));  // no normalizer: as written
  j["normalizer"] = {{"type", "NFC"}};
  if (!tokenizer_nfc_available()) {
    EXPECT_THROW(j.load(), Error);
    GTEST_SKIP() << "built without utf8proc: the NFC normalizer is refused";
  }
  const auto t = j.load();
  EXPECT_EQ(t->encode(decomposed), (Ids{0}));
  EXPECT_EQ(t->encode(composed), (Ids{0}));
  EXPECT_EQ(t->encode(decomposed + std::string(1, '\0') + decomposed),
            (Ids{0, 3, 0}));  // a NUL does not end the text
}

TEST(TokenizerConfig, BosAndEosFromTokenizerConfig) {
  JsonTokenizer j({{"a", 0}, {"<s>", 1}, {"</s>", 2}, {"<eot>", 3}});
  j["added_tokens"] = {added(1, "<s>"), added(2, "</s>"), added(3, "<eot>")};
  auto t = j.load();
  EXPECT_EQ(t->bos_id(), 1u);  // guessed from the names
  EXPECT_EQ(t->eos_id(), 2u);
  j.beside("tokenizer_config.json", {{"bos_token", {{"content", "<s>"}}}, {"eos_token", "<eot>"}});
  t = j.load();
  EXPECT_EQ(t->bos_id(), 1u);
  EXPECT_EQ(t->eos_id(), 3u);
}

// [Prepare chunks]: data_prepare's cuts change no token of byte-level BPE, at any thread
// count.
TEST(TokenizerPrepare, CutsChangeNoTokenAndThreadsChangeNothing) {
  if (!Regex::available()) GTEST_SKIP() << "built without PCRE2";
  const auto t = tokenizer_load(fixture_dir() + "/gpt2/vocab.json");
  const auto l3 = tokenizer_load(llama3_file());
  std::string text;
  for (const RefCase& c : reference_cases(node_reference()["gpt2"])) text += c.text + "\n";
  for (int i = 0; i < 5; ++i) text += text;
  const fs::path dir = fs::temp_directory_path() / fmt::format("tandem_prep_{}", ::getpid());
  fs::create_directories(dir);
  std::ofstream(dir / "a.txt") << text;
  std::ofstream(dir / "b.txt") << "second document";
  for (const Tokenizer* tok : {t.get(), l3.get()}) {
    Ids expected = tok->encode(text);
    expected.push_back(*tok->eos_id());
    const Ids second = tok->encode("second document");
    expected.insert(expected.end(), second.begin(), second.end());
    for (int threads : {1, 2, 3}) {
      PrepareOptions o;
      o.tokenizer = tok;
      o.threads = threads;
      o.chunk_bytes = 200;
      ASSERT_GT(prepare_cut_points(text, o.chunk_bytes).size(), 10u);
      const std::string out = (dir / "out.tok").string();
      const PrepareReport r =
          data_prepare({(dir / "a.txt").string(), (dir / "b.txt").string()}, out, o);
      EXPECT_EQ(r.threads, threads);
      const TokenData data = tokens_read(out);
      EXPECT_EQ(data.tokens, expected) << tok->kind() << ", " << threads << " threads";
      EXPECT_EQ(data.token_bytes, tok->vocab_size() > 65536 ? 4 : 2);
    }
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem::tok_test
