// Generation by full forward passes over the (cropped) context.
#include "infer/generate.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "core/error.h"
#include "device/cpu/kernel_table.h"
#include "device/cpu/kernels.h"
#include "model/activations.h"
#include "model/compose.h"

namespace tandem {

std::vector<int32_t> generate_recompute(const ModelLayout& model,
                                        const std::vector<std::vector<float>>& params,
                                        std::vector<int32_t> prompt, int tokens,
                                        const SamplingParams& sp,
                                        const std::function<bool(int32_t)>& on_token) {
  const ModelConfig& c = model.config();
  TD_CHECK(!prompt.empty(), "the prompt is empty");
  TD_CHECK(tokens >= 1, "--tokens must be at least 1, got {}", tokens);
  TD_CHECK(std::isfinite(sp.temperature) && sp.temperature >= 0,
           "--temperature must be a finite number >= 0, got {}", sp.temperature);
  TD_CHECK(sp.top_p > 0 && sp.top_p <= 1, "--top-p must be in (0, 1], got {}", sp.top_p);
  check_token_ids(prompt.data(), prompt.size(), c.vocab, "token");
  UnitParams buffers;
  for (const auto& p : params) buffers.push_back(p.data());
  const std::unique_ptr<Kernels> k = cpu_kernels();
  std::unique_ptr<Workspace> ws;
  std::vector<int32_t> out;
  for (int n = 0; n < tokens; ++n) {
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
    const int32_t next = cpu::sample_row(last, c.vocab, 0, static_cast<int>(prompt.size()),
                                         sp.temperature, sp.top_k, sp.top_p, sp.seed);
    prompt.push_back(next);
    out.push_back(next);
    if (on_token && !on_token(next)) break;
  }
  return out;
}

}  // namespace tandem
