// The SentencePiece tokenizer on a small BPE model trained here with libsentencepiece's own
// trainer (Llama 2's settings: byte fallback, a dummy prefix, white space kept): loading by
// name, ids as libsentencepiece gives them, BOS on request, decode ∘ encode, invalid UTF-8.
#include <gtest/gtest.h>

#include "core/error.h"
#include "io/tokenizer.h"
#include "io/tokenizer_kinds.h"
#include "io/utf8.h"
#include "tokenizer_fixtures.h"

#if TANDEM_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#endif

namespace tandem::tok_test {
namespace {

#if TANDEM_HAVE_SENTENCEPIECE

// Trains once per process on the GPT-2 fixture cases and tandem's docs.
std::string spm_model() {
  static const std::string path = [] {
    const fs::path dir = fs::temp_directory_path() / fmt::format("tandem_spm_{}", ::getpid());
    fs::create_directories(dir);
    static ProcessDirs cleanup;
    cleanup.dirs.push_back(dir);
    std::ofstream text(dir / "train.txt");
    for (const RefCase& c : reference_cases(node_reference()["llama2"]))
      if (c.text.find('\xff') == std::string::npos) text << c.text << "\n";
    text << slurp(std::string(TANDEM_SOURCE_DIR) + "/docs/design.md");
    text.close();
    const std::string prefix = (dir / "tokenizer").string();
    const auto status = sentencepiece::SentencePieceTrainer::Train(
        "--input=" + (dir / "train.txt").string() + " --model_prefix=" + prefix +
        " --model_type=bpe --vocab_size=600 --byte_fallback=true --character_coverage=0.9995"
        " --remove_extra_whitespaces=false --split_digits=true --unk_id=0 --bos_id=1"
        " --eos_id=2 --pad_id=-1 --normalization_rule_name=identity --minloglevel=2");
    EXPECT_TRUE(status.ok()) << status.ToString();
    return prefix + ".model";
  }();
  return path;
}

TEST(TokenizerSpm, MatchesLibsentencepieceAndRoundTrips) {
  const auto t = tokenizer_load(spm_model());
  EXPECT_EQ(t->kind(), "SentencePiece");
  EXPECT_EQ(t->vocab_size(), 600u);
  EXPECT_EQ(t->bos_id(), 1u);
  EXPECT_EQ(t->eos_id(), 2u);
  sentencepiece::SentencePieceProcessor sp;
  ASSERT_TRUE(sp.Load(spm_model()).ok());
  for (const RefCase& c : reference_cases(node_reference()["llama2"])) {
    std::vector<int> ref;
    ASSERT_TRUE(sp.Encode(utf8_lossy(c.text), &ref).ok());
    const std::vector<uint32_t> ids = t->encode(c.text);
    EXPECT_EQ(ids, std::vector<uint32_t>(ref.begin(), ref.end())) << c.text;
    EXPECT_EQ(t->decode(ids), utf8_lossy(c.text)) << c.text;
  }
  const std::vector<uint32_t> with_bos = t->encode("the step", true);
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos.front(), 1u);
  EXPECT_EQ(t->decode(with_bos, true), "the step");
  EXPECT_EQ(t->token_to_id("<s>"), 1u);
  EXPECT_EQ(t->special_ids(), (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_THROW(t->decode(std::vector<uint32_t>{600}), Error);
}

#else

TEST(TokenizerSpm, RefusedWithThePackageToInstall) {
  try {
    tokenizer_spm_load("x.model");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("libsentencepiece-dev"), std::string::npos) << e.message();
  }
}

#endif

}  // namespace
}  // namespace tandem::tok_test
