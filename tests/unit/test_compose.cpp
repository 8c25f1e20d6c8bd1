// The one model composition: every family (and descriptions no family has) through the CPU
// kernel table, gradients against central finite differences of the loss; the activation
// table; the Pythia presets' published parameter counts.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "device/cpu/kernel_table.h"
#include "model/activations.h"
#include "model/compose.h"
#include "model/model.h"
#include "plan/hardware.h"
#include "plan/plan.h"
#include "shard/engine_exec.h"

namespace tandem {
namespace {

ModelConfig small(const std::string& preset_name) {
  ModelConfig c = preset(preset_name);
  c.vocab = c.vocab_padded = 23;
  c.context = 8;
  c.d_model = 16;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_kv_head = c.family == Family::llama ? 1 : 2;
  c.d_ff = 24;
  return c;
}

// One micro-batch of a model on the CPU table, with its own parameters and gradients.
struct Net {
  static ActivationTraits traits(const Kernels& k, const ModelConfig& c, int B, int T,
                                 int loss_chunk) {
    ActivationTraits t = activation_traits(k, c, B, T);
    t.loss_chunk = loss_chunk;
    return t;
  }

  explicit Net(const ModelConfig& c, int B = 2, int T = 7, int loss_chunk = 0)
      : model(c),
        k(cpu_kernels()),
        ws(Workspace::on_host(c, B, T, traits(*k, c, B, T, loss_chunk))) {
    for (int u = 0; u < model.num_units(); ++u) {
      const int64_t n = model.unit(u).numel;
      std::vector<float> p(static_cast<size_t>(n));
      model.init_slice(u, 11, 0, n, p.data());
      // Norm gains and biases away from 1 and 0, so their gradients mean something.
      for (const ParamSpec& s : model.unit(u).params)
        if (s.init == ParamSpec::Init::ones || s.init == ParamSpec::Init::zeros)
          for (int64_t i = 0; i < s.numel; ++i)
            p[static_cast<size_t>(s.offset + i)] += 0.1f * std::sin(static_cast<float>(i + u));
      params.push_back(std::move(p));
      grads.emplace_back(static_cast<size_t>(n), 0.0f);
    }
    uint64_t s = 5;
    for (int i = 0; i < ws->N; ++i) {
      s = s * 6364136223846793005ull + 1;
      ws->tokens[i] = static_cast<int32_t>((s >> 33) % static_cast<uint64_t>(c.vocab));
      ws->targets[i] = static_cast<int32_t>((s >> 40) % static_cast<uint64_t>(c.vocab));
    }
  }

  UnitParams views() const {
    UnitParams v;
    for (const auto& p : params) v.push_back(p.data());
    return v;
  }

  double loss() {
    model_forward(*k, model, views(), *ws);
    k->crossentropy_forward(ws->losses, ws->logits, ws->targets, ws->N, model.config().vocab,
                            model.config().vocab_padded);
    double sum = 0;
    for (int i = 0; i < ws->N; ++i) sum += ws->losses[i];
    return sum / ws->N;
  }

  void backward() {
    for (auto& g : grads) std::fill(g.begin(), g.end(), 0.0f);
    UnitGrads gv;
    for (auto& g : grads) gv.push_back(g.data());
    model_forward(*k, model, views(), *ws);
    model_backward(*k, model, views(), gv, *ws, 1.0f / static_cast<float>(ws->N));
  }

  // [Fresh gradients] The backward as the engine runs it: each unit's gradient buffer starts
  // holding NaN, and the first backward that writes it (the head, for a tied embedding's
  // wte) is told so.
  void backward_fresh() {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (auto& g : grads) std::fill(g.begin(), g.end(), nan);
    UnitGrads gv;
    for (auto& g : grads) gv.push_back(g.data());
    model_forward(*k, model, views(), *ws);
    const size_t U = static_cast<size_t>(model.num_units());
    std::vector<bool> started(U, false);
    for (int u = model.num_units() - 1; u >= 0; --u) {
      std::vector<int> writes = model.reads(u);
      writes.push_back(u);
      std::vector<bool> fresh(U, false);
      for (int g : writes)
        if (!started[static_cast<size_t>(g)])
          fresh[static_cast<size_t>(g)] = started[static_cast<size_t>(g)] = true;
      unit_backward(*k, model, u, views(), gv, *ws, 1.0f / static_cast<float>(ws->N), fresh);
    }
  }

  ModelLayout model;
  std::unique_ptr<Kernels> k;
  std::unique_ptr<Workspace> ws;
  std::vector<std::vector<float>> params, grads;
};

// [Finite-difference tolerance] Central differences with step h on fp32 parameters: the
// truncation error is O(h^2 |L'''|) ~ 1e-5 at h = 1e-2 for these smooth losses; the loss is
// an fp32 forward summed in double, so its rounding noise is ~N·eps32·L ~ 1e-5 absolute,
// divided by 2h: ~5e-4 on the difference quotient. We test the three largest gradients of
// every parameter tensor (small gradients are all noise) against 3% + 1e-3.
void expect_gradients_match(Net& net, const std::string& what) {
  net.backward();
  const float h = 1e-2f;
  for (int u = 0; u < net.model.num_units(); ++u) {
    for (const ParamSpec& s : net.model.unit(u).params) {
      std::vector<int64_t> idx(static_cast<size_t>(s.numel));
      std::iota(idx.begin(), idx.end(), 0);
      const std::vector<float>& g = net.grads[static_cast<size_t>(u)];
      const size_t top = std::min<size_t>(3, idx.size());
      std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(top), idx.end(),
                        [&](int64_t a, int64_t b) {
                          return std::fabs(g[static_cast<size_t>(s.offset + a)]) >
                                 std::fabs(g[static_cast<size_t>(s.offset + b)]);
                        });
      for (size_t t = 0; t < top; ++t) {
        const size_t at = static_cast<size_t>(s.offset + idx[t]);
        float& p = net.params[static_cast<size_t>(u)][at];
        const float keep = p;
        p = keep + h;
        const double up = net.loss();
        p = keep - h;
        const double down = net.loss();
        p = keep;
        const double fd = (up - down) / (2.0 * h);
        EXPECT_NEAR(g[at], fd, 0.03 * std::fabs(fd) + 1e-3)
            << what << ": " << net.model.unit(u).name << "." << s.name << "[" << idx[t] << "]";
      }
    }
  }
}

class ComposeFamily : public testing::TestWithParam<const char*> {};

TEST_P(ComposeFamily, GradientsMatchFiniteDifferences) {
  Net net(small(GetParam()));
  expect_gradients_match(net, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Families, ComposeFamily,
                         testing::Values("gpt2-tiny", "llama-tiny", "pythia-tiny"),
                         [](const testing::TestParamInfo<const char*>& i) {
                           std::string n = i.param;
                           return n.substr(0, n.find('-'));
                         });

// A family is a description: combinations no preset has run through the same composition.
TEST(Compose, DescriptionsNoFamilyHasHaveCorrectGradients) {
  ModelConfig a = small("llama-tiny");  // Llama with a parallel residual and LayerNorm
  a.residual = ResidualKind::parallel;
  a.norm = NormKind::layernorm;
  a.bias = true;
  Net na(a);
  expect_gradients_match(na, "llama+parallel+layernorm");

  ModelConfig b = small("gpt2-tiny");  // GPT-2 with half rotary, erf GELU, untied head
  b.rotary_pct = 0.5f;
  b.mlp = MlpKind::gelu_erf;
  b.tied_head = false;
  b.learned_positions = false;
  Net nb(b);
  expect_gradients_match(nb, "gpt2+rotary+erf+untied");
}

// [Fresh gradients] Starting every gradient buffer from NaN and telling each first writer
// gives the bits of clearing the buffers and adding: every element is written or cleared, and
// nothing reads the old contents. Each family, the descriptions above (an untied head, no
// learned positions, biases with RMSNorm's absence) and a loss in chunks (the head's product
// writes its first chunk and adds the others).
TEST(Compose, FreshGradientsAreTheClearedAndAddedOnes) {
  ModelConfig untied = small("gpt2-tiny");
  untied.tied_head = false;
  untied.learned_positions = false;
  untied.mlp = MlpKind::gelu_erf;
  ModelConfig biased = small("llama-tiny");
  biased.norm = NormKind::layernorm;
  biased.bias = true;
  const std::pair<std::string, ModelConfig> models[] = {{"gpt2", small("gpt2-tiny")},
                                                        {"llama", small("llama-tiny")},
                                                        {"pythia", small("pythia-tiny")},
                                                        {"gpt2+untied", untied},
                                                        {"llama+layernorm+bias", biased}};
  for (const auto& [name, c] : models) {
    for (int chunk : {0, 5}) {
      Net net(c, 2, 7, chunk);
      net.backward();
      const std::vector<std::vector<float>> added = net.grads;
      net.backward_fresh();
      for (int u = 0; u < net.model.num_units(); ++u) {
        const auto& a = added[static_cast<size_t>(u)];
        const auto& f = net.grads[static_cast<size_t>(u)];
        ASSERT_EQ(a.size(), f.size());
        size_t differ = 0;
        for (size_t i = 0; i < a.size(); ++i)
          differ += std::memcmp(&a[i], &f[i], sizeof(float)) != 0;
        EXPECT_EQ(differ, 0u) << name << " chunk " << chunk << ": " << net.model.unit(u).name;
      }
    }
  }
}

// [Fresh gradients] What a first writer clears, from the calls the composition makes (the
// planner's recording table, plan/kernel_rates.h): an embedding's whole buffer, behind a tied
// head the embedding's elements other than wte, and nothing for a block or an untied head;
// without a fresh buffer, no clear at all beyond the head's of the residual gradient.
TEST(Compose, FreshClearsAreTheEmbeddingsOnly) {
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    const ModelLayout model(preset(name));
    const int U = model.num_units();
    const KernelTraits traits = kernel_traits_for(false, 4, model.config().head_dim());
    const std::vector<bool> every(static_cast<size_t>(U), true);
    auto zeroed = [&](int u, const std::vector<bool>& fresh) {
      int64_t bytes = 0;
      for (const KernelCall& c :
           unit_kernel_calls(model, u, true, 2, 8, traits, Recompute::none, 0, fresh))
        if (c.op == KernelOp::zero) bytes += c.shape.at(0);
      return bytes;
    };
    const UnitLayout& e = model.unit(0);
    EXPECT_EQ(zeroed(0, every) - zeroed(0, {}), e.numel * 4) << name;
    EXPECT_EQ(zeroed(0, {}), 0) << name;
    const int64_t head_clears = zeroed(U - 1, every) - zeroed(U - 1, {});
    if (model.config().tied_head)
      EXPECT_EQ(head_clears, (e.numel - e.param(ParamId::wte).numel) * 4) << name;
    else
      EXPECT_EQ(head_clears, 0) << name;
    for (int u = 1; u < U - 1; ++u) {
      EXPECT_EQ(zeroed(u, every), 0) << name << " " << model.unit(u).name;
      EXPECT_EQ(zeroed(u, {}), 0) << name << " " << model.unit(u).name;
    }
  }
}

// The parallel residual differs from the sequential one: same weights, other logits.
TEST(Compose, ParallelResidualIsNotSequential) {
  ModelConfig c = small("pythia-tiny");
  Net parallel(c);
  c.residual = ResidualKind::sequential;
  Net sequential(c);
  EXPECT_GT(std::fabs(parallel.loss() - sequential.loss()), 1e-6);
}

TEST(Compose, TokenIdsOutsideTheVocabularyAreNamed) {
  const int32_t ids[] = {1, 2, 40};
  try {
    check_token_ids(ids, 3, 23, "target");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target 40 at position 2"), std::string::npos) << e.what();
  }
}

// The activation table is the one source of the workspace size: the engine's CPU sizing
// and the planner's CPU estimate are the same number.
TEST(ActivationTable, EngineAndPlannerAgreeOnCpu) {
  for (const char* name : {"gpt2-tiny", "llama-tiny", "pythia-tiny"}) {
    const ModelConfig c = preset(name);
    const size_t engine =
        engine_activation_bytes(DeviceKind::cpu, AttentionImpl::automatic, c, 3, 40);
    const Hardware hw = hardware_preset("cpu-local");
    EXPECT_EQ(plan_activation_bytes(c, 3, 40, hw), static_cast<double>(engine)) << name;
    // Every tensor is there once; the saved ones scale with the layer count.
    const ActivationTraits t;
    const auto table = activation_table(c, 3, 40, t);
    size_t saved = 0;
    for (const TensorSpec& s : table) saved += s.lifetime == Lifetime::saved && s.layer == 0;
    EXPECT_EQ(saved, c.norm == NormKind::layernorm ? 12u : 10u) << name;
  }
}

// A block's bytes in a CPU training workspace (fp32, the softmax [B, H, T, T] saved, each
// tensor aligned to 256 bytes), counted from the shapes: attention's state and output, and
// every tensor of the block but its input.
struct BlockBytes {
  size_t att, block;
};
BlockBytes cpu_block_bytes(const ModelConfig& c, int B, int T) {
  const int64_t N = int64_t{B} * T;
  const bool ln = c.norm == NormKind::layernorm;
  auto aligned = [](int64_t elements) {
    return (static_cast<size_t>(elements) * 4 + 255) / 256 * 256;
  };
  const size_t att = aligned(int64_t{B} * c.n_head * T * T) + aligned(N * c.attn_dim());
  return {att, att + aligned(N * c.d_model) * 3 + aligned(N) * (ln ? 4 : 2) +
                   aligned(N * c.qkv_dim()) + aligned(N * c.mlp_in_dim()) + aligned(N * c.d_ff)};
}

// [Activation recompute] What each mode drops from the table, counted from the shapes: all
// blocks but one of every block tensor (unit), or of attention's state and output
// (attention); the workspace serves every block from the one copy kept; the planner sizes
// the same bytes as the engine.
TEST(ActivationTable, RecomputeKeepsOneCopyOfWhatItRecomputes) {
  for (const char* name : {"gpt2-tiny", "llama-tiny", "pythia-tiny"}) {
    const ModelConfig c = preset(name);
    const int B = 3, T = 40;
    const int64_t L = c.n_layer;
    const auto [att, block] = cpu_block_bytes(c, B, T);
    ActivationTraits t;
    t.attention = AttentionSaves::probabilities;
    const size_t none = activation_bytes(c, B, T, t);
    t.recompute = Recompute::attention;
    EXPECT_EQ(none - activation_bytes(c, B, T, t), static_cast<size_t>(L - 1) * att) << name;
    t.recompute = Recompute::unit;
    EXPECT_EQ(none - activation_bytes(c, B, T, t), static_cast<size_t>(L - 1) * block) << name;
    const Hardware hw = hardware_preset("cpu-local");
    for (Recompute r : {Recompute::none, Recompute::attention, Recompute::unit}) {
      t.recompute = r;
      EXPECT_EQ(plan_activation_bytes(c, B, T, hw, r),
                static_cast<double>(
                    engine_activation_bytes(DeviceKind::cpu, AttentionImpl::automatic, c, B, T, r)))
          << name << " " << recompute_name(r);
      const auto ws = Workspace::on_host(c, B, T, t);
      const Workspace::Block &first = ws->blocks.front(), &last = ws->blocks.back();
      EXPECT_EQ(first.att == last.att, r != Recompute::none) << name;
      EXPECT_EQ(first.atty == last.atty, r != Recompute::none) << name;
      EXPECT_EQ(first.qkv == last.qkv, r == Recompute::unit) << name;
      EXPECT_EQ(first.act == last.act, r == Recompute::unit) << name;
      EXPECT_NE(ws->residual.front(), ws->residual.back()) << name;
    }
  }
  EXPECT_EQ(recompute_parse("attention"), Recompute::attention);
  EXPECT_THROW(recompute_parse("blocks"), Error);
}

// [Partial recompute] With the first K blocks recomputing, K - 1 copies of what the mode
// drops are gone (counted from the shapes as above): K = L is every block, as 0 is; the
// workspace shares block 0's tensors with exactly blocks 1..K-1; the planner sizes the same
// bytes as the engine; K outside 0..L is refused.
TEST(ActivationTable, PartialRecomputeDropsTheFirstBlocksOnly) {
  for (const char* name : {"gpt2-tiny", "llama-tiny"}) {
    const ModelConfig c = preset(name);
    const int B = 2, T = 24, L = c.n_layer;
    const auto [att, block] = cpu_block_bytes(c, B, T);
    ActivationTraits t;
    t.attention = AttentionSaves::probabilities;
    const size_t none = activation_bytes(c, B, T, t);
    const Hardware hw = hardware_preset("cpu-local");
    for (Recompute r : {Recompute::attention, Recompute::unit}) {
      t.recompute = r;
      t.recompute_blocks = 0;
      const size_t every = activation_bytes(c, B, T, t);
      const size_t dropped = r == Recompute::unit ? block : att;
      for (int k = 1; k <= L; ++k) {
        const std::string what = fmt::format("{} {} in {} blocks", name, recompute_name(r), k);
        t.recompute_blocks = k;
        EXPECT_EQ(none - activation_bytes(c, B, T, t), static_cast<size_t>(k - 1) * dropped)
            << what;
        if (k == L) {
          EXPECT_EQ(activation_bytes(c, B, T, t), every) << what;
        }
        EXPECT_EQ(plan_activation_bytes(c, B, T, hw, r, 0, k),
                  static_cast<double>(engine_activation_bytes(
                      DeviceKind::cpu, AttentionImpl::automatic, c, B, T, r, 0, k)))
            << what;
        const auto ws = Workspace::on_host(c, B, T, t);
        for (int l = 1; l < L; ++l) {
          const Workspace::Block &first = ws->blocks.front(),
                                 &b = ws->blocks[static_cast<size_t>(l)];
          EXPECT_EQ(b.att == first.att, l < k) << what << " block " << l;
          EXPECT_EQ(b.qkv == first.qkv, l < k && r == Recompute::unit) << what << " block " << l;
          EXPECT_EQ(b.act == first.act, l < k && r == Recompute::unit) << what << " block " << l;
        }
        EXPECT_EQ(recompute_at(r, k, k - 1), r) << what;
        if (k < L) {
          EXPECT_EQ(recompute_at(r, k, k), Recompute::none) << what;
        }
      }
      for (int k : {-1, L + 1}) {
        t.recompute_blocks = k;
        EXPECT_THROW(activation_bytes(c, B, T, t), Error) << name << " " << k;
      }
    }
  }
  // The search: the fewest K that fits, with few evaluations; 0 when K = L does not fit.
  for (int need : {2, 3, 17, 31, 32}) {
    int calls = 0;
    EXPECT_EQ(recompute_fewest_blocks(32,
                                      [&](int k) {
                                        ++calls;
                                        return k >= need;
                                      }),
              need);
    EXPECT_LE(calls, 7) << need;  // K = 32, then a bisection of [2, 32]
  }
  EXPECT_EQ(recompute_fewest_blocks(32, [](int) { return false; }), 0);
  EXPECT_EQ(recompute_fewest_blocks(1, [](int k) { return k >= 1; }), 1);
  EXPECT_EQ(recompute_text(Recompute::unit, 0, 32), ", recompute unit");
  EXPECT_EQ(recompute_text(Recompute::unit, 32, 32), ", recompute unit");
  EXPECT_EQ(recompute_text(Recompute::attention, 12, 32),
            ", recompute attention in 12 of 32 blocks");
  EXPECT_EQ(recompute_text(Recompute::none, 12, 32), "");
}

// [Chunked loss] The logits hold one chunk's rows (all rows when the chunk is larger); the
// planner sizes the same bytes as the engine; inference tables do not change.
TEST(ActivationTable, AChunkedLossHoldsOneChunkOfLogits) {
  const ModelConfig c = preset("gpt2-tiny");
  const int B = 3, T = 40, N = B * T;
  auto aligned = [](int64_t elements) {
    return (static_cast<size_t>(elements) * 4 + 255) / 256 * 256;
  };
  ActivationTraits t;
  t.attention = AttentionSaves::probabilities;
  const size_t whole = activation_bytes(c, B, T, t);
  const Hardware hw = hardware_preset("cpu-local");
  for (int chunk : {1, 7, 64, N, 4 * N}) {
    t.loss_chunk = chunk;
    const int64_t rows = std::min(chunk, N);
    EXPECT_EQ(whole - activation_bytes(c, B, T, t),
              aligned(int64_t{N} * c.vocab_padded) - aligned(rows * c.vocab_padded))
        << chunk;
    EXPECT_EQ(plan_activation_bytes(c, B, T, hw, Recompute::none, chunk),
              static_cast<double>(engine_activation_bytes(DeviceKind::cpu, AttentionImpl::automatic,
                                                          c, B, T, Recompute::none, chunk)))
        << chunk;
  }
  ActivationTraits decode;
  decode.use = WorkspaceUse::decode;
  const size_t plain = activation_bytes(c, 2, 1, decode);
  decode.loss_chunk = 1;
  EXPECT_EQ(activation_bytes(c, 2, 1, decode), plain);
}

// GPT-NeoX as published (Pythia): total parameters, vocabulary padding rows included.
TEST(Presets, PythiaParameterCountsAreThePublishedOnes) {
  const std::pair<const char*, int64_t> published[] = {{"pythia-160m", 162322944},
                                                       {"pythia-1b", 1011781632},
                                                       {"pythia-2.8b", 2775208960},
                                                       {"pythia-6.9b", 6857302016}};
  for (const auto& [name, count] : published) {
    const ModelConfig c = preset(name);
    EXPECT_EQ(c.num_params_padded(), count) << name;
    EXPECT_EQ(ModelLayout(c).total_numel(), count) << name;
  }
  const ModelConfig p = preset("pythia-2.8b");
  EXPECT_EQ(p.d_model, 2560);
  EXPECT_EQ(p.n_layer, 32);
  EXPECT_EQ(p.n_head, 32);
  EXPECT_EQ(p.d_ff, 10240);
  EXPECT_EQ(p.vocab, 50254);
  EXPECT_EQ(p.vocab_padded, 50304);
  EXPECT_EQ(p.rotary_dim(), 20);  // a quarter of 80 channels
  EXPECT_EQ(p.rope_theta, 10000.0f);
}

TEST(Presets, DescriptionRoundTripsThroughJson) {
  ModelConfig c = preset("pythia-tiny");
  EXPECT_EQ(model_config_from_json(model_config_to_json(c)), c);
  nlohmann::json j = {{"preset", "llama-tiny"}, {"residual", "parallel"}, {"rotary_pct", 0.5}};
  const ModelConfig d = model_config_from_json(j);
  EXPECT_EQ(d.residual, ResidualKind::parallel);
  EXPECT_EQ(d.rotary_dim(), 16);
  EXPECT_EQ(d.mlp, MlpKind::swiglu);
  EXPECT_THROW(model_config_from_json({{"preset", "gpt2-tiny"}, {"mlp", "relu"}}), Error);
  EXPECT_THROW(model_config_from_json({{"preset", "gpt2-tiny"}, {"bias", 1}}), Error);
  // A config that names only the family gets the family's whole description.
  const ModelConfig n = model_config_from_json({{"family", "neox"}, {"d_model", 64}});
  EXPECT_EQ(n.residual, ResidualKind::parallel);
  EXPECT_EQ(n.mlp, MlpKind::gelu_erf);
  EXPECT_FALSE(n.tied_head);
}

}  // namespace
}  // namespace tandem
