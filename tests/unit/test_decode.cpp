// Cached decoding on the CPU: decoding with the cache equals recomputing the whole context
// (tokens exactly, logits within fp32 rounding) for the three families and a description no
// preset has; a ragged batch equals each sequence alone; greedy tokens equal transformers'
// model.generate on the tiny Hugging Face fixtures; the sampling rule draws from the right
// distribution; the inference programs pass the checker; bad requests are refused.
//
// Tolerances. Both paths compute in fp32 with the same kernels; they differ in how a row's
// attention is summed (one row over the cache vs the same row inside a T x T product) and in
// the GEMM shapes, so each logit differs by a few fp32 roundings of sums of length <= C or T:
// relative errors of order T * 2^-24 ~ 1e-6 per reduction, a few layers deep. Logits are
// compared normwise with 1e-4, far above that and ten times below what a wrong position or a
// stale cache entry gives (the negative control below: > 1e-3).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/gumbel.h"
#include "decode_test_util.h"
#include "device/cpu/kernel_table.h"
#include "device/cpu/kernels.h"
#include "device/device.h"
#include "infer/decoder.h"
#include "infer/generate.h"
#include "io/model_source.h"
#include "model/activations.h"
#include "model/compose.h"
#include "model/config.h"
#include "shard/program.h"

namespace tandem {
namespace {

using namespace decode_test;

ModelConfig tiny(const std::string& preset_name) {
  return decode_test::tiny(preset_name, 32, 4, 40);
}

// The last row's logits of a full forward pass over `context`.
std::vector<float> full_logits(const ModelLayout& model, const std::vector<std::vector<float>>& p,
                               const std::vector<int32_t>& context) {
  const ModelConfig& c = model.config();
  const auto k = cpu_kernels();
  const int T = static_cast<int>(context.size());
  auto ws = Workspace::on_host(c, 1, T, activation_traits(*k, c, 1, T));
  std::copy(context.begin(), context.end(), ws->tokens);
  UnitParams params;
  for (const auto& x : p) params.push_back(x.data());
  model_forward(*k, model, params, *ws);
  const float* last =
      static_cast<const float*>(ws->logits) + static_cast<size_t>(T - 1) * c.vocab_padded;
  return std::vector<float>(last, last + c.vocab);
}

std::vector<float> row(const std::vector<float>& all, int b, int V) {
  return std::vector<float>(all.begin() + int64_t(b) * V, all.begin() + int64_t(b + 1) * V);
}

struct Decoded {
  std::vector<std::vector<int32_t>> ids;
  std::vector<float> logits;
};

Decoded decode(const ModelLayout& model, const std::vector<std::vector<float>>& params,
               const std::vector<std::vector<int32_t>>& prompts, int tokens,
               SamplingParams sp = {0}, int max_seq = 0, int prefill_tokens = 0) {
  const std::unique_ptr<Device> device = device_create_cpu();
  DecoderOptions o;
  o.batch = static_cast<int>(prompts.size());
  o.max_seq = max_seq;
  o.prefill_tokens = prefill_tokens;
  Decoder d(model, *device, params, o);
  GenerateRequest r;
  r.prompts = prompts;
  r.tokens = tokens;
  r.sampling = sp;
  const GenerateResult g = d.generate(r);
  return {g.ids, d.last_logits()};
}

class DecodeFamily : public ::testing::TestWithParam<std::string> {};

ModelConfig family_config(const std::string& name) {
  if (name == "llama-parallel") {  // a combination no preset has
    ModelConfig c = tiny("llama-tiny");
    c.residual = ResidualKind::parallel;
    c.rotary_pct = 0.5f;
    return c;
  }
  return tiny(name);
}

TEST_P(DecodeFamily, CacheEqualsRecomputation) {
  const ModelConfig c = family_config(GetParam());
  const ModelLayout model(c);
  const auto params = init_params(model, 3);
  for (const SamplingParams sp : {SamplingParams{0}, SamplingParams{0.9f, 12, 0.85f, 77}}) {
    const std::vector<int32_t> prompt = prompt_of(6, c.vocab, 9);
    const int n = 20;
    const Decoded run = decode(model, params, {prompt}, n, sp);
    const std::vector<int32_t> ref = generate_recompute(model, params, prompt, n, sp, {});
    EXPECT_EQ(run.ids[0], ref) << "temperature " << sp.temperature;
    {  // Teacher forcing with the tokens it drew anyway changes nothing.
      const auto device = device_create_cpu();
      DecoderOptions o;
      Decoder d(model, *device, params, o);
      GenerateRequest r;
      r.prompts = {prompt};
      r.tokens = n;
      r.sampling = sp;
      r.forced = {ref};
      EXPECT_EQ(d.generate(r).ids[0], ref);
      EXPECT_EQ(d.last_logits(), run.logits);
      // Forcing other tokens feeds another context: other logits.
      r.forced = {std::vector<int32_t>(static_cast<size_t>(n), ref[0] == 0 ? 1 : 0)};
      d.generate(r);
      EXPECT_GT(rel_diff(d.last_logits(), run.logits), 1e-3);
    }
    // The last step's logits come from the context prompt + every new token but the last.
    std::vector<int32_t> context = prompt;
    context.insert(context.end(), run.ids[0].begin(), run.ids[0].end() - 1);
    EXPECT_LT(rel_diff(run.logits, full_logits(model, params, context)), 1e-4);
    // Negative control: the logits of a context one token shorter are far off.
    context.pop_back();
    EXPECT_GT(rel_diff(run.logits, full_logits(model, params, context)), 1e-3);
  }
}

TEST_P(DecodeFamily, RaggedBatchEqualsEachSequenceAlone) {
  const ModelConfig c = family_config(GetParam());
  const ModelLayout model(c);
  const auto params = init_params(model, 5);
  // Two prompts share a length (one prefill chunk) and one differs; a small prefill chunk
  // splits the shared length in two as well.
  const std::vector<std::vector<int32_t>> prompts = {
      prompt_of(7, c.vocab, 1), prompt_of(3, c.vocab, 2), prompt_of(7, c.vocab, 3)};
  const int n = 12, max_seq = 7 + n;
  for (int chunk : {0, 7}) {
    const Decoded batch = decode(model, params, prompts, n, SamplingParams{0}, max_seq, chunk);
    for (size_t s = 0; s < prompts.size(); ++s) {
      const Decoded alone = decode(model, params, {prompts[s]}, n, SamplingParams{0}, max_seq);
      EXPECT_EQ(batch.ids[s], alone.ids[0]) << "sequence " << s << " chunk " << chunk;
      EXPECT_LT(rel_diff(row(batch.logits, static_cast<int>(s), c.vocab), alone.logits), 1e-5)
          << "sequence " << s;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, DecodeFamily,
                         ::testing::Values("gpt2-tiny", "llama-tiny", "pythia-tiny",
                                           "llama-parallel"),
                         param_name);

// Greedy tokens equal transformers' model.generate(do_sample=False) in float64
// (tests/fixtures/hf/<name>.generate.json, tools/make_generate_fixtures.py), wherever the
// reference's decision is not within fp32 reach of a tie (gap between its two largest
// logits over 1e-4 of the largest's magnitude; the fixtures' smallest gaps are recorded).
class DecodeHfFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(DecodeHfFixture, GreedyEqualsTransformersGenerate) {
  const std::string dir = std::string(TANDEM_TEST_DATA_DIR) + "/fixtures/hf/" + GetParam();
  std::ifstream in(dir + ".generate.json");
  ASSERT_TRUE(in.good()) << dir << ".generate.json is missing";
  const nlohmann::json ref = nlohmann::json::parse(in);
  const auto source = ModelSource::open(dir);
  const ModelLayout model(source->config());
  const auto params = source->load_params();
  for (const auto& run : ref.at("runs")) {
    const std::vector<int32_t> prompt = run.at("prompt").get<std::vector<int32_t>>();
    const std::vector<int32_t> want = run.at("ids").get<std::vector<int32_t>>();
    const std::vector<double> margin = run.at("margins").get<std::vector<double>>();
    const std::vector<double> top = run.at("top").get<std::vector<double>>();
    const Decoded got = decode(model, params, {prompt}, static_cast<int>(want.size()));
    size_t checked = 0;
    for (; checked < want.size(); ++checked) {
      if (margin[checked] < 1e-4 * std::max(1.0, std::abs(top[checked]))) break;
      ASSERT_EQ(got.ids[0][checked], want[checked]) << "new token " << checked;
    }
    EXPECT_EQ(checked, want.size()) << "the reference has a near-tie at new token " << checked;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DecodeHfFixture,
                         ::testing::Values("gpt2", "llama", "llama-tied-bf16-sharded", "neox",
                                           "neox-fp16"),
                         param_name);

// --- The sampling rule.

// The rule of SamplingParams written plainly: sort, cut, renormalise; the draw by the same
// Gumbel noise.
int32_t sample_plain(const std::vector<float>& x, int row, int pos, const SamplingParams& p) {
  const int V = static_cast<int>(x.size());
  std::vector<int> order(x.size());
  for (int i = 0; i < V; ++i) order[static_cast<size_t>(i)] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return x[a] > x[b]; });
  std::vector<bool> keep(x.size(), true);
  std::vector<float> z(x.size());
  for (int i = 0; i < V; ++i) z[static_cast<size_t>(i)] = x[static_cast<size_t>(i)] / p.temperature;
  if (p.top_k > 0 && p.top_k < V) {
    const float kth = z[static_cast<size_t>(order[static_cast<size_t>(p.top_k - 1)])];
    for (int i = 0; i < V; ++i) keep[static_cast<size_t>(i)] = z[static_cast<size_t>(i)] >= kth;
  }
  if (p.top_p < 1) {
    double total = 0;
    const double m = z[static_cast<size_t>(order[0])];
    for (int i = 0; i < V; ++i)
      if (keep[static_cast<size_t>(i)]) total += std::exp(z[static_cast<size_t>(i)] - m);
    double mass = 0;
    float cut = z[static_cast<size_t>(order[0])];
    for (int j = 0; j < V; ++j) {
      const int i = order[static_cast<size_t>(j)];
      if (!keep[static_cast<size_t>(i)]) break;
      mass += std::exp(z[static_cast<size_t>(i)] - m);
      cut = z[static_cast<size_t>(i)];
      if (mass >= p.top_p * total) break;
    }
    for (int i = 0; i < V; ++i)
      keep[static_cast<size_t>(i)] =
          keep[static_cast<size_t>(i)] && z[static_cast<size_t>(i)] >= cut;
  }
  const uint64_t key = gumbel_row_key(p.seed, row, pos);
  int best = -1;
  float bv = 0;
  for (int i = 0; i < V; ++i) {
    if (!keep[static_cast<size_t>(i)]) continue;
    const float v = z[static_cast<size_t>(i)] + gumbel_noise(key, i);
    if (best < 0 || v > bv) {
      best = i;
      bv = v;
    }
  }
  return best;
}

TEST(Sampling, RuleEqualsThePlainStatement) {
  uint64_t s = 99;
  for (int trial = 0; trial < 300; ++trial) {
    const int V = 5 + trial % 200;
    std::vector<float> x(static_cast<size_t>(V));
    for (float& v : x) {
      s = s * 6364136223846793005ull + 1;
      v = static_cast<float>((s >> 40) % 1000) / 97.0f;  // repeated values: ties
    }
    const SamplingParams p{0.5f + static_cast<float>(trial % 7) * 0.3f,
                           trial % 3 == 0 ? 0 : 1 + trial % 9,
                           trial % 4 == 0 ? 1.0f : 0.2f + 0.1f * static_cast<float>(trial % 8),
                           static_cast<uint64_t>(trial)};
    EXPECT_EQ(
        cpu::sample_row(x.data(), V, trial % 5, trial, p.temperature, p.top_k, p.top_p, p.seed),
        sample_plain(x, trial % 5, trial, p))
        << "trial " << trial;
  }
  // Greedy: the lowest index among equal maxima.
  const std::vector<float> tie = {1, 3, 2, 3};
  EXPECT_EQ(cpu::sample_row(tie.data(), 4, 0, 0, 0.0f, 0, 1.0f, 1), 1);
}

// The Gumbel-max draw is a draw from softmax(x / T) restricted to the kept set: frequencies
// over 40000 positions (independent noise keys) match within 5 standard deviations.
TEST(Sampling, DrawsFollowTheDistribution) {
  const std::vector<float> x = {2.0f, 1.0f, 0.5f, 0.0f, -1.0f, -3.0f};
  for (const SamplingParams p : {SamplingParams{1.0f, 0, 1.0f, 5}, SamplingParams{0.7f, 3, 1.0f, 6},
                                 SamplingParams{1.3f, 0, 0.8f, 7}}) {
    // The kept set and its probabilities, by the plain rule.
    std::vector<double> w(x.size());
    double total = 0;
    for (size_t i = 0; i < x.size(); ++i) total += (w[i] = std::exp(x[i] / p.temperature));
    std::vector<bool> keep(x.size(), true);
    if (p.top_k > 0)
      for (size_t i = static_cast<size_t>(p.top_k); i < x.size(); ++i) keep[i] = false;
    if (p.top_p < 1) {
      double mass = 0;
      size_t i = 0;
      for (; i < x.size() && mass < p.top_p * total; ++i) mass += w[i];
      for (; i < x.size(); ++i) keep[i] = false;
    }
    double kept = 0;
    for (size_t i = 0; i < x.size(); ++i) kept += keep[i] ? w[i] : 0;
    const int n = 40000;
    std::vector<int> count(x.size(), 0);
    for (int t = 0; t < n; ++t)
      ++count[static_cast<size_t>(
          cpu::sample_row(x.data(), 6, 0, t, p.temperature, p.top_k, p.top_p, p.seed))];
    for (size_t i = 0; i < x.size(); ++i) {
      const double q = keep[i] ? w[i] / kept : 0.0;
      const double sd = std::sqrt(n * q * (1 - q)) + 1e-9;
      EXPECT_LE(std::abs(count[i] - n * q), 5 * sd + (q == 0 ? 0 : 1)) << "token " << i;
    }
  }
}

// --- Programs, memory and refusals.

TEST(DecodeProgram, InferenceProgramsPassTheChecker) {
  const ModelLayout model(tiny("gpt2-tiny"));
  InferenceSpec spec;
  spec.param_bytes = 4;
  spec.kv_block_bytes = 1 << 12;
  spec.prefill_ws_bytes = 1 << 16;
  spec.decode_ws_bytes = 1 << 14;
  for (InferPhase phase : {InferPhase::prefill, InferPhase::decode})
    for (int groups : {1, 3}) {
      spec.phase = phase;
      spec.prefill_groups = groups;
      const Program p = program_build_inference(model, spec);
      EXPECT_NO_THROW(program_check(model, p));
      EXPECT_EQ(p.ops.back().kind, OpKind::sample);
      // The tied head reads the embedding: drop that and the checker objects.
      Program broken = p;
      for (Op& op : broken.ops)
        if (op.kind == OpKind::forward && op.unit == model.num_units() - 1) {
          op.params.erase(op.params.begin() + 1);
          op.reads.erase(op.reads.begin() + 1);
        }
      EXPECT_THROW(program_check(model, broken), Error);
    }
}

// fsdp gathers every unit for every forward, at most max_gathered at once; tp reduces each
// block's partial sums. The checker proves both, and objects to each broken on purpose.
TEST(DecodeProgram, ShardedLayoutsPassTheCheckerAndBrokenOnesDoNot) {
  for (const char* name : {"gpt2-tiny", "llama-tiny", "pythia-tiny"}) {
    const ModelLayout model(tiny(name));
    InferenceSpec spec;
    spec.param_bytes = 4;
    spec.kv_block_bytes = 1 << 12;
    spec.prefill_ws_bytes = 1 << 16;
    spec.decode_ws_bytes = 1 << 14;
    for (InferPhase phase : {InferPhase::prefill, InferPhase::decode})
      for (int world : {1, 2, 4})
        for (int K : {2, 3}) {
          SCOPED_TRACE(fmt::format("{} {} world {} K {}", name,
                                   phase == InferPhase::decode ? "decode" : "prefill", world, K));
          spec.phase = phase;
          spec.prefill_groups = 2;
          spec.world = world;
          spec.layout = InferLayout::fsdp;
          spec.max_gathered = K;
          const Program p = program_build_inference(model, spec);
          EXPECT_NO_THROW(program_check(model, p));
          // Every forward reads gathered copies, and never more than K exist at once.
          int gathers = 0, forwards = 0;
          for (const Op& op : p.ops) {
            gathers += op.kind == OpKind::gather;
            forwards += op.kind == OpKind::forward;
          }
          EXPECT_GE(gathers, forwards);
          size_t most = 0;
          for (size_t i = 0; i < p.ops.size(); ++i) {
            size_t live = 0;
            for (const Buffer& b : p.buffers)
              live += b.kind == BufferKind::gathered && b.first <= static_cast<int>(i) &&
                      b.last >= static_cast<int>(i);
            most = std::max(most, live);
          }
          EXPECT_LE(most, static_cast<size_t>(K));
          // A forward that no longer waits for its gather races with it.
          Program broken = p;
          for (Op& op : broken.ops)
            if (op.kind == OpKind::forward && !op.waits.empty()) {
              op.waits.clear();
              break;
            }
          EXPECT_THROW(program_check(model, broken), Error);
          spec.layout = InferLayout::tp;
          const Program t = program_build_inference(model, spec);
          EXPECT_NO_THROW(program_check(model, t));
          int reduces = 0;
          for (const Op& op : t.ops) reduces += op.kind == OpKind::tp_reduce;
          const int per_block =
              world == 1 ? 0 : (model.config().residual == ResidualKind::parallel ? 1 : 2);
          const int passes = phase == InferPhase::prefill ? spec.prefill_groups : 1;
          EXPECT_EQ(reduces, per_block * model.config().n_layer * passes);
          if (reduces > 0) {
            Program missing = t;
            for (size_t i = 0; i < missing.ops.size(); ++i)
              if (missing.ops[i].kind == OpKind::tp_reduce) {
                missing.ops.erase(missing.ops.begin() + static_cast<int64_t>(i));
                break;
              }
            EXPECT_THROW(program_check(model, missing), Error);
          }
        }
  }
}

// A pipeline's stages: consecutive, the embedding first and the head last, a block each at
// least, balanced by what a decode step reads; more stages than blocks are refused.
TEST(DecodeProgram, PipelineStagesCoverTheModelInBalancedRuns) {
  ModelConfig c = tiny("llama-tiny");
  c.n_layer = 8;
  const ModelLayout model(c);
  const int U = model.num_units();
  for (int W = 1; W <= 8; ++W) {
    SCOPED_TRACE(fmt::format("{} stages", W));
    const std::vector<int> s = pipeline_stages(model, W);
    ASSERT_EQ(s.size(), static_cast<size_t>(W) + 1);
    EXPECT_EQ(s.front(), 0);
    EXPECT_EQ(s.back(), U);
    double most = 0, least = 1e300, block = static_cast<double>(model.unit(1).numel);
    for (int r = 0; r < W; ++r) {
      int blocks = 0;
      double read = 0;
      for (int u = s[static_cast<size_t>(r)]; u < s[static_cast<size_t>(r) + 1]; ++u) {
        blocks += model.unit(u).kind == UnitKind::block;
        if (model.unit(u).kind != UnitKind::embedding)
          read += static_cast<double>(model.unit(u).numel);
      }
      EXPECT_GE(blocks, 1) << "stage " << r;
      most = std::max(most, read);
      least = std::min(least, read);
      // Each stage's units, and the units they read, are what it holds.
      const std::vector<bool> held = pipeline_units(model, W, r);
      for (int u = 0; u < U; ++u)
        EXPECT_EQ(held[static_cast<size_t>(u)],
                  u >= s[static_cast<size_t>(r)] && u < s[static_cast<size_t>(r) + 1])
            << "stage " << r << " unit " << u;
    }
    // No stage reads more than one block beyond another, plus the head's matrix.
    EXPECT_LE(most - least, block + static_cast<double>(model.unit(U - 1).numel)) << W;
  }
  try {
    pipeline_stages(model, 9);
    FAIL() << "9 stages of 8 blocks accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("8 blocks"), std::string::npos) << e.what();
  }
  // Each rank plans for the fullest stage: about half the parameters and half the cache at
  // two stages (the cache of every sequence, for half the blocks).
  DecoderOptions o;
  o.batch = 4;
  o.max_seq = 32;
  const DecoderMemory whole = Decoder::plan(c, DeviceKind::cpu, o, 1);
  o.layout = InferLayout::pipeline;
  const DecoderMemory half = Decoder::plan(c, DeviceKind::cpu, o, 2);
  EXPECT_LT(half.params, whole.params * 3 / 4);
  EXPECT_GT(half.params, whole.params / 3);
  EXPECT_EQ(half.cache * 2, whole.cache);
  // A tied head reads the embedding: the last stage holds it too.
  const ModelLayout tied(tiny("gpt2-tiny"));
  const std::vector<bool> last = pipeline_units(tied, 2, 1);
  EXPECT_TRUE(last.front());
  EXPECT_TRUE(last.back());
}

// Every stage's programs pass the checker: its units over each micro-batch between a
// receive and a send, the head and the draws on the last stage. A forward that no longer
// waits for its receive, or a send that no longer waits for the forward, is caught.
TEST(DecodeProgram, PipelineStagesPassTheCheckerAndBrokenOnesDoNot) {
  for (const char* name : {"gpt2-tiny", "llama-tiny", "pythia-tiny"}) {
    ModelConfig c = tiny(name);
    c.n_layer = 4;
    const ModelLayout model(c);
    InferenceSpec spec;
    spec.layout = InferLayout::pipeline;
    spec.param_bytes = 4;
    spec.kv_block_bytes = 1 << 12;
    spec.prefill_ws_bytes = 1 << 16;
    spec.decode_ws_bytes = 1 << 14;
    spec.prefill_groups = 3;
    for (InferPhase phase : {InferPhase::prefill, InferPhase::decode})
      for (int W : {2, 3, 4})
        for (int M : {1, 3})
          for (int r = 0; r < W; ++r) {
            SCOPED_TRACE(fmt::format("{} {} stage {} of {}, {} micro-batches", name,
                                     phase == InferPhase::decode ? "decode" : "prefill", r, W, M));
            spec.phase = phase;
            spec.world = W;
            spec.rank = r;
            spec.micro_batches = M;
            const Program p = program_build_inference(model, spec);
            EXPECT_NO_THROW(program_check(model, p));
            int sends = 0, recvs = 0, samples = 0;
            for (const Op& op : p.ops) {
              sends += op.kind == OpKind::send;
              recvs += op.kind == OpKind::recv;
              samples += op.kind == OpKind::sample;
            }
            const int passes = phase == InferPhase::prefill ? spec.prefill_groups : M;
            EXPECT_EQ(sends, r + 1 < W ? passes : 0);
            EXPECT_EQ(recvs, r > 0 ? passes : 0);
            EXPECT_EQ(samples, r + 1 == W ? M : 0);
            for (OpKind kind : {OpKind::recv, OpKind::send}) {
              Program broken = p;
              bool cut = false;
              for (size_t i = 0; i < broken.ops.size() && !cut; ++i) {
                Op& op = broken.ops[i];
                // The forward after a receive, or the send itself, loses its wait.
                const bool after_recv = kind == OpKind::recv && op.kind == OpKind::forward &&
                                        i > 0 && broken.ops[i - 1].kind == OpKind::recv;
                const bool send = kind == OpKind::send && op.kind == OpKind::send;
                if (after_recv || send) {
                  op.waits.clear();
                  cut = true;
                }
              }
              if (cut) {
                EXPECT_THROW(program_check(model, broken), Error) << op_kind_name(kind);
              }
            }
          }
  }
}

TEST(DecodeMemory, RefusesWhatDoesNotFitSayingByHowMuch) {
  const ModelConfig c = tiny("llama-tiny");
  const ModelLayout model(c);
  const auto device = device_create_cpu();
  DecoderOptions o;
  o.batch = 2;
  o.max_seq = 32;
  const DecoderMemory need = Decoder::plan(c, DeviceKind::cpu, o);
  // The cache: 2 (K, V) x layers x batch x kv heads x positions x head size x 4 bytes.
  EXPECT_EQ(need.cache, uint64_t{2} * c.n_layer * 2 * c.n_kv_head * 32 * c.head_dim() * 4);
  o.mem_limit = need.total() - 1;
  try {
    Decoder d(model, *device, init_params(model, 1), o);
    FAIL() << "a plan one byte over the limit was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("short"), std::string::npos) << e.what();
  }
  o.mem_limit = need.total();
  EXPECT_NO_THROW(Decoder(model, *device, init_params(model, 1), o));
}

// [Run-ahead] Enqueuing each step before the host reads the last one's tokens hands out the
// tokens, stops and finishes of the step-by-step loop: greedy and sampled, a ragged batch,
// sequences that stop at EOS or by their callback (the step enqueued ahead is then
// dropped), and requests of one or two tokens. Inside a run-ahead generate the next step is
// already running, so last_logits() is refused there, and after one that ran a step past
// its last token; step by step it is the last token's step's.
TEST(DecodeRunAhead, HandsOutWhatTheStepByStepLoopDoes) {
  for (const std::string name : {"llama-tiny", "gpt2-tiny"}) {
    const ModelConfig c = tiny(name);
    const ModelLayout model(c);
    const auto params = init_params(model, 7);
    const std::vector<std::vector<int32_t>> prompts = {
        prompt_of(5, c.vocab, 4), prompt_of(2, c.vocab, 5), prompt_of(5, c.vocab, 6)};
    const auto device = device_create_cpu();
    auto decoder = [&](bool ahead) {
      DecoderOptions o;
      o.batch = 3;
      o.max_seq = 5 + 14;
      o.run_ahead = ahead;
      return std::make_unique<Decoder>(model, *device, params, o);
    };
    const auto on = decoder(true), off = decoder(false);
    struct Case {
      std::string what;
      SamplingParams sp;
      int tokens;
      bool eos, stop;
    };
    const std::vector<Case> cases = {
        {"greedy", SamplingParams{0}, 14, false, false},
        {"sampled", SamplingParams{0.9f, 12, 0.85f, 5}, 14, false, false},
        {"one token", SamplingParams{0}, 1, false, false},
        {"two tokens", SamplingParams{0}, 2, false, false},
        {"eos", SamplingParams{0}, 14, true, false},
        {"stop", SamplingParams{0.9f, 0, 1, 9}, 14, false, true}};
    for (const Case& k : cases) {
      SCOPED_TRACE(name + " " + k.what);
      GenerateRequest r;
      r.prompts = prompts;
      r.tokens = k.tokens;
      r.sampling = k.sp;
      if (k.eos || k.stop) {
        // Each sequence's 4th, 6th and 3rd token of the plain run ends it (by EOS, or by the
        // callback), so every sequence stops before its last token.
        const GenerateResult plain = off->generate(r);
        const std::vector<int> at = {3, 5, 2};
        std::vector<int32_t> ends;
        for (size_t s = 0; s < 3; ++s) ends.push_back(plain.ids[s][static_cast<size_t>(at[s])]);
        if (k.eos) r.eos = ends;
        if (k.stop)
          r.on_token = [ends](int s, int32_t t) { return t != ends[static_cast<size_t>(s)]; };
      }
      const GenerateResult a = on->generate(r), b = off->generate(r);
      EXPECT_EQ(a.ids, b.ids);
      EXPECT_EQ(a.finish, b.finish);
      EXPECT_EQ(a.decode_steps, b.decode_steps);
      EXPECT_EQ(a.decode_tokens, b.decode_tokens);
      if (k.eos) {
        EXPECT_NE(b.finish, std::vector<std::string>(3, "length"));
      }
      if (k.eos || k.stop) {
        EXPECT_LT(b.decode_steps, k.tokens - 1);
        EXPECT_THROW(on->last_logits(), Error);  // the step enqueued ahead ran
      } else {
        EXPECT_EQ(b.decode_steps, k.tokens - 1);
        EXPECT_EQ(on->last_logits(), off->last_logits());
      }
    }
    // Inside the callback: refused while running ahead, the step's logits step by step.
    GenerateRequest r;
    r.prompts = prompts;
    r.tokens = 4;
    int read = 0;
    bool refused = false;
    r.on_token = [&](int, int32_t) {
      try {
        (void)on->last_logits();
        ++read;
      } catch (const Error& e) {
        refused = std::string(e.what()).find("runs ahead") != std::string::npos;
      }
      return true;
    };
    on->generate(r);
    EXPECT_TRUE(refused);
    EXPECT_EQ(read, 3);  // the prefill's tokens are read before any step runs ahead
    int read_off = 0;
    r.on_token = [&](int, int32_t) {
      EXPECT_EQ(off->last_logits().size(), static_cast<size_t>(3 * c.vocab));
      ++read_off;
      return true;
    };
    off->generate(r);
    EXPECT_EQ(read_off, 12);
  }
}

TEST(DecodeMemory, RefusesRequestsBeforeAnyWork) {
  const ModelConfig c = tiny("gpt2-tiny");
  const ModelLayout model(c);
  const auto device = device_create_cpu();
  DecoderOptions o;
  o.batch = 1;
  o.max_seq = 10;
  Decoder d(model, *device, init_params(model, 1), o);
  GenerateRequest r;
  r.prompts = {prompt_of(8, c.vocab, 1)};
  r.tokens = 3;  // 8 + 3 > 10
  EXPECT_THROW(d.generate(r), Error);
  r.tokens = 0;
  EXPECT_THROW(d.generate(r), Error);
  r.tokens = 2;
  r.sampling.top_p = 0;
  EXPECT_THROW(d.generate(r), Error);
  r.sampling.top_p = 1.5f;
  EXPECT_THROW(d.generate(r), Error);
  r.sampling.top_p = 1;
  r.prompts = {{static_cast<int32_t>(c.vocab)}};
  EXPECT_THROW(d.generate(r), Error);
  r.prompts = {prompt_of(8, c.vocab, 1)};
  EXPECT_EQ(d.generate(r).ids[0].size(), 2u);
}

}  // namespace
}  // namespace tandem
