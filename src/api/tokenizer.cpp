// The public Tokenizer: a shared handle on an immutable internal tokenizer.
#include <tandem/data.h>
#include <tandem/tokenizer.h>

#include "api/errors.h"
#include "api/tokenizer_impl.h"
#include "io/prepare.h"
#include "io/tokenizer.h"

namespace tandem::api {

Tokenizer::Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  return translate_errors([&] {
    auto impl = std::make_shared<Impl>();
    impl->t = ::tandem::tokenizer_load(path.string());
    return Tokenizer(std::move(impl));
  });
}

Tokenizer Tokenizer::bytes() {
  auto impl = std::make_shared<Impl>();
  impl->t = std::make_unique<::tandem::ByteTokenizer>();
  return Tokenizer(std::move(impl));
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  return translate_errors([&] { return impl_->t->encode(text, add_special_tokens); });
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids, bool skip_special_tokens) const {
  return translate_errors([&] { return impl_->t->decode(ids, skip_special_tokens); });
}

std::size_t Tokenizer::vocab_size() const {
  return impl_->t->vocab_size();
}
std::optional<uint32_t> Tokenizer::bos_id() const {
  return impl_->t->bos_id();
}
std::optional<uint32_t> Tokenizer::eos_id() const {
  return impl_->t->eos_id();
}
std::optional<uint32_t> Tokenizer::token_to_id(std::string_view token) const {
  return impl_->t->token_to_id(token);
}
std::optional<std::string> Tokenizer::id_to_token(uint32_t id) const {
  return impl_->t->id_to_token(id);
}
std::string Tokenizer::kind() const {
  return impl_->t->kind();
}

// Declared in tandem/data.h; here, where the internal tokenizer is visible.
PrepareReport prepare_text_files(const std::vector<std::filesystem::path>& text_files,
                                 const std::filesystem::path& out, const Tokenizer& tokenizer,
                                 int threads) {
  return translate_errors([&] {
    std::vector<std::string> files;
    for (const std::filesystem::path& p : text_files) files.push_back(p.string());
    ::tandem::PrepareOptions o;
    if (tokenizer.kind() != "byte") o.tokenizer = tokenizer.impl_->t.get();
    o.threads = threads;
    const ::tandem::PrepareReport r = ::tandem::data_prepare(files, out.string(), o);
    PrepareReport report;
    report.files = r.files;
    report.bytes = r.bytes;
    report.tokens = r.tokens;
    return report;
  });
}

}  // namespace tandem::api
