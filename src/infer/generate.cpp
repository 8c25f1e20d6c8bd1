// Autoregressive sampling by full forward passes over the (cropped) context.
#include "infer/generate.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/error.h"
#include "core/rng.h"
#include "device/cpu/kernel_table.h"
#include "model/activations.h"
#include "model/compose.h"

namespace tandem {

int32_t sample_token(const float* logits, int vocab, const SampleOptions& o, uint64_t& rng_state) {
  TD_CHECK(o.temperature >= 0, "--temperature must not be negative, got {}", o.temperature);
  if (o.temperature == 0.0f)
    return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  for (int i = 0; i < vocab; ++i) order[static_cast<size_t>(i)] = i;
  const int k = o.top_k > 0 ? std::min(o.top_k, vocab) : vocab;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const double top = logits[order[0]];
  std::vector<double> p(static_cast<size_t>(k));
  double sum = 0;
  for (int i = 0; i < k; ++i) {
    p[static_cast<size_t>(i)] =
        std::exp((logits[order[static_cast<size_t>(i)]] - top) / o.temperature);
    sum += p[static_cast<size_t>(i)];
  }
  Rng rng(rng_state);
  double r = rng.uniform() * sum;
  rng_state = rng.state();
  for (int i = 0; i < k; ++i) {
    r -= p[static_cast<size_t>(i)];
    if (r <= 0) return order[static_cast<size_t>(i)];
  }
  return order[static_cast<size_t>(k - 1)];
}

std::vector<int32_t> generate(const ModelLayout& model,
                              const std::vector<std::vector<float>>& params,
                              std::vector<int32_t> prompt, const SampleOptions& o,
                              const std::function<void(int32_t)>& on_token) {
  const ModelConfig& c = model.config();
  TD_CHECK(!prompt.empty(), "the prompt is empty");
  TD_CHECK(o.tokens >= 0 && o.tokens <= kMaxNewTokens, "--tokens must be in [0, {}], got {}",
           kMaxNewTokens, o.tokens);
  TD_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
           "--temperature must be a finite number >= 0, got {}", o.temperature);
  check_token_ids(prompt.data(), prompt.size(), c.vocab, "token");
  UnitParams buffers;
  for (const auto& p : params) buffers.push_back(p.data());
  const std::unique_ptr<Kernels> k = cpu_kernels();
  uint64_t rng_state = o.seed;
  std::unique_ptr<Workspace> ws;
  for (int n = 0; n < o.tokens; ++n) {
    const int T = static_cast<int>(std::min<size_t>(prompt.size(), static_cast<size_t>(c.context)));
    if (!ws || ws->T != T) ws = Workspace::on_host(c, 1, T, activation_traits(*k, c, 1, T));
    std::copy(prompt.end() - T, prompt.end(), ws->tokens);
    model_forward(*k, model, buffers, *ws);
    const float* last =
        static_cast<const float*>(ws->logits) + static_cast<size_t>(T - 1) * c.vocab_padded;
    // Weights holding NaN or Inf give such logits: say so rather than sample garbage.
    const float* bad =
        std::find_if(last, last + c.vocab, [](float x) { return !std::isfinite(x); });
    TD_CHECK(bad == last + c.vocab,
             "the model's logits are not finite ({} for token {} at position {}): its weights "
             "hold NaN or Inf",
             *bad, bad - last, prompt.size());
    const int32_t next = sample_token(last, c.vocab, o, rng_state);
    prompt.push_back(next);
    if (on_token) on_token(next);
  }
  return prompt;
}

}  // namespace tandem
