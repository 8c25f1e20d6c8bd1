// Shared helpers of the decoding tests (tests/unit/test_decode.cpp on the CPU,
// tests/gpu/test_cuda_decoder.cpp on the GPU, tests/dist on CPU ranks): tiny models of each
// family with parameters large enough that the logits have a spread, deterministic prompts,
// a normwise relative difference, the name of a parameterised test's model, and one rank's
// parameters under each inference layout.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/model.h"
#include "model/tensor_parallel.h"
#include "shard/flat.h"
#include "shard/program.h"

namespace tandem::decode_test {

// A two-block model of the preset's family with vocabulary 61 (padded to 64).
inline ModelConfig tiny(const std::string& preset_name, int d_model, int heads, int context) {
  ModelConfig c = preset(preset_name);
  c.vocab = 61;
  c.vocab_padded = 64;
  c.context = context;
  c.d_model = d_model;
  c.n_layer = 2;
  c.n_head = heads;
  c.n_kv_head = c.family == Family::llama ? heads / 2 : heads;
  c.d_ff = d_model * 3 / 2;
  return c;
}

// The seeded initialisation times 4, norm gains and biases moved off 1 and 0.
inline std::vector<std::vector<float>> init_params(const ModelLayout& model, uint64_t seed) {
  std::vector<std::vector<float>> params;
  for (int u = 0; u < model.num_units(); ++u) {
    const int64_t n = model.unit(u).numel;
    std::vector<float> p(static_cast<size_t>(n));
    model.init_slice(u, seed, 0, n, p.data());
    for (float& x : p) x *= 4.0f;
    for (const ParamSpec& s : model.unit(u).params)
      if (s.init == ParamSpec::Init::ones || s.init == ParamSpec::Init::zeros)
        for (int64_t i = 0; i < s.numel; ++i)
          p[static_cast<size_t>(s.offset + i)] = (s.init == ParamSpec::Init::ones ? 1.0f : 0.0f) +
                                                 0.1f * std::sin(static_cast<float>(i + u));
    params.push_back(std::move(p));
  }
  return params;
}

// n ids below vocab from a linear congruential sequence of the seed.
// Rank `rank` of `world`'s parameters under `layout`, cut from the whole model's `all`
// (`local`: the rank's own model, tp_local_config's under tp, else `global`).
inline std::vector<std::vector<float>> params_for(InferLayout layout, const ModelLayout& global,
                                                  const ModelLayout& local,
                                                  const std::vector<std::vector<float>>& all,
                                                  int world, int rank) {
  if (layout == InferLayout::replicate || world == 1) return all;
  std::vector<std::vector<float>> out;
  if (layout == InferLayout::pipeline) {  // the stage's units, nothing of the others
    const std::vector<bool> held = pipeline_units(global, world, rank);
    for (int u = 0; u < global.num_units(); ++u)
      out.push_back(held[static_cast<size_t>(u)] ? all[static_cast<size_t>(u)]
                                                 : std::vector<float>{});
    return out;
  }
  if (layout == InferLayout::tp) {
    for (int u = 0; u < global.num_units(); ++u)
      out.push_back(tp_cut(all[static_cast<size_t>(u)], tp_unit_pieces(global, local, u)));
    return out;
  }
  const FlatLayout flat(global, world);
  for (int u = 0; u < global.num_units(); ++u) {
    std::vector<float> shard(static_cast<size_t>(flat.unit(u).shard), 0.0f);
    const std::vector<float>& p = all[static_cast<size_t>(u)];
    for (int64_t i = 0; i < flat.unit(u).shard; ++i) {
      const int64_t at = flat.shard_begin(u, rank) + i;
      if (at < static_cast<int64_t>(p.size()))
        shard[static_cast<size_t>(i)] = p[static_cast<size_t>(at)];
    }
    out.push_back(std::move(shard));
  }
  return out;
}

inline std::vector<int32_t> prompt_of(int n, int vocab, uint64_t seed) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    p.push_back(static_cast<int32_t>((seed >> 33) % static_cast<uint64_t>(vocab)));
  }
  return p;
}

// ||a - b|| / ||b||.
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// "llama-tiny" -> "llama_tiny", for INSTANTIATE_TEST_SUITE_P.
inline std::string param_name(const ::testing::TestParamInfo<std::string>& p) {
  std::string n = p.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

}  // namespace tandem::decode_test
