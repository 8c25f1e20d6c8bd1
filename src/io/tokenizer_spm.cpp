// SentencePiece models (Llama 2's tokenizer.model) through libsentencepiece. Without it
// (TANDEM_HAVE_SENTENCEPIECE unset) loading a .model is refused with the package to install.
#include "core/error.h"
#include "io/tokenizer_kinds.h"
#include "io/utf8.h"

#if TANDEM_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace tandem {

#if TANDEM_HAVE_SENTENCEPIECE

namespace {

class SpmTokenizer : public Tokenizer {
 public:
  explicit SpmTokenizer(const std::string& path) {
    const auto status = sp_.Load(path);
    TD_CHECK(status.ok(), "cannot load SentencePiece model '{}': {}", path, status.ToString());
    const int bos = sp_.bos_id(), eos = sp_.eos_id();
    if (bos >= 0) set_bos(static_cast<uint32_t>(bos));
    if (eos >= 0) set_eos(static_cast<uint32_t>(eos));
  }
  std::string kind() const override { return "SentencePiece"; }
  size_t vocab_size() const override { return static_cast<size_t>(sp_.GetPieceSize()); }

  // As Llama's tokenizer does, add_special_tokens puts BOS first.
  void encode_into(std::string_view text, bool add_special_tokens,
                   std::vector<uint32_t>& out) const override {
    std::string fixed;
    if (!utf8_valid(text)) {
      fixed = utf8_lossy(text);
      text = fixed;
    }
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    TD_CHECK(status.ok(), "SentencePiece could not encode the text: {}", status.ToString());
    if (add_special_tokens && bos_id()) out.push_back(*bos_id());
    for (int id : ids) out.push_back(static_cast<uint32_t>(id));
  }

  std::string decode(std::span<const uint32_t> ids, bool skip_special_tokens) const override {
    std::vector<int> v;
    for (size_t i = 0; i < ids.size(); ++i) {
      TD_CHECK(ids[i] < vocab_size(),
               "cannot decode token {} at position {}: not in the vocabulary of {}", ids[i], i,
               vocab_size());
      const int id = static_cast<int>(ids[i]);
      if (skip_special_tokens && (sp_.IsControl(id) || sp_.IsUnknown(id))) continue;
      v.push_back(id);
    }
    std::string text;
    const auto status = sp_.Decode(v, &text);
    TD_CHECK(status.ok(), "SentencePiece could not decode: {}", status.ToString());
    return text;
  }

  std::optional<uint32_t> token_to_id(std::string_view token) const override {
    const int id = sp_.PieceToId(token);
    if (id < 0 || sp_.IdToPiece(id) != token) return std::nullopt;
    return static_cast<uint32_t>(id);
  }
  std::optional<std::string> id_to_token(uint32_t id) const override {
    if (id >= vocab_size()) return std::nullopt;
    return sp_.IdToPiece(static_cast<int>(id));
  }
  std::vector<uint32_t> special_ids() const override {
    std::vector<uint32_t> ids;
    for (int i = 0; i < sp_.GetPieceSize(); ++i)
      if (sp_.IsControl(i) || sp_.IsUnknown(i)) ids.push_back(static_cast<uint32_t>(i));
    return ids;
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
};

}  // namespace

std::unique_ptr<Tokenizer> tokenizer_spm_load(const std::string& path) {
  return std::make_unique<SpmTokenizer>(path);
}

bool tokenizer_spm_available() {
  return true;
}

#else

std::unique_ptr<Tokenizer> tokenizer_spm_load(const std::string& path) {
  TD_THROW(
      "'{}' is a SentencePiece model, and this build of tandem has no SentencePiece: install "
      "libsentencepiece-dev (scripts/install-deps.sh) and rebuild",
      path);
}

bool tokenizer_spm_available() {
  return false;
}

#endif

}  // namespace tandem
