// Generation without a cache: every new token recomputes the whole (cropped) context on the
// CPU. The reference the cached decoder (infer/decoder.h) is measured and tested against
// (`tandem generate --recompute`).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "device/kernels.h"
#include "model/model.h"

namespace tandem {

// Extends `prompt` by up to `tokens` tokens drawn by the rule of SamplingParams (row 0, the
// position of the new token in the noise key, as the cached decoder draws them); the
// context is cropped to the model's context length. on_token (may be empty) sees each new
// token and ends the generation by returning false. Returns the new tokens.
std::vector<int32_t> generate_recompute(const ModelLayout& model,
                                        const std::vector<std::vector<float>>& params,
                                        std::vector<int32_t> prompt, int tokens,
                                        const SamplingParams& sampling,
                                        const std::function<bool(int32_t)>& on_token);

}  // namespace tandem
