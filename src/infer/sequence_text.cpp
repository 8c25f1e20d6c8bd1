#include "infer/sequence_text.h"

#include <algorithm>
#include <utility>

namespace tandem {

std::string whole_text(const Tokenizer& tok, const std::vector<uint32_t>& ids) {
  std::string text = tok.decode(ids, true);
  if (tok.kind() != "byte" && text.size() >= 3 &&
      text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0)
    text.resize(text.size() - 3);
  return text;
}

SequenceText::SequenceText(const Tokenizer& tok, const std::vector<std::vector<int32_t>>& prompts,
                           std::string stop, std::vector<int32_t> eos)
    : tok_(tok), stop_(std::move(stop)), eos_(std::move(eos)) {
  for (const auto& p : prompts) {
    ids_.emplace_back(p.begin(), p.end());
    text_.push_back(whole_text(tok_, ids_.back()));
    prompt_.push_back(text_.back().size());
    taken_.push_back(0);
  }
}

bool SequenceText::add(int s, int32_t t) {
  const auto i = static_cast<size_t>(s);
  ids_[i].push_back(static_cast<uint32_t>(t));
  if (std::find(eos_.begin(), eos_.end(), t) != eos_.end()) return true;
  // Text already seen was searched before, except where a stop string may straddle it.
  const size_t seen = text_[i].size();
  text_[i] = whole_text(tok_, ids_[i]);
  if (stop_.empty()) return true;
  const size_t from = std::max(seen >= stop_.size() ? seen - stop_.size() : 0, prompt_[i]);
  return text_[i].find(stop_, from) == std::string::npos;
}

std::string SequenceText::take(int s) {
  const auto i = static_cast<size_t>(s);
  if (text_[i].size() <= taken_[i]) return {};
  std::string out = text_[i].substr(taken_[i]);
  taken_[i] = text_[i].size();
  return out;
}

std::string SequenceText::new_text(int s) const {
  const auto i = static_cast<size_t>(s);
  return text_[i].size() > prompt_[i] ? text_[i].substr(prompt_[i]) : std::string();
}

}  // namespace tandem
