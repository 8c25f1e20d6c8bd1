// Cached decoding on the GPU: the CUDA decoder against the CPU one (bf16 against fp32), the
// graph replay against the plain replay (bit for bit), a ragged batch against each sequence
// alone, and greedy tokens against transformers' model.generate on the tiny Hugging Face
// fixtures, wherever bf16 cannot flip the reference's decision.
//
// Tolerances. The GPU keeps weights and activations in bf16 (unit roundoff u = 2^-8) and
// sums in fp32; each block rounds its input, its products and its residual sum, about ten
// roundings per block, which add like a random walk: the normwise relative error of the
// logits of a 2-block model is about sqrt(10 * 2) * u ~ 2e-2 of their norm. The tests allow
// 5e-2; a wrong position or a stale cache entry moves the logits by more than 0.3 (the CPU
// test's negative control).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "device/device.h"
#include "gpu_test_util.h"
#include "infer/decoder.h"
#include "io/model_source.h"
#include "model/config.h"
#include "plan/hardware.h"
#include "plan/plan.h"
#include "plan/prediction.h"
#include "shard/flat.h"
#include "unit/decode_test_util.h"

namespace tandem {
namespace {

using namespace decode_test;

ModelConfig tiny(const std::string& preset_name) {
  return decode_test::tiny(preset_name, 64, 2, 64);
}

struct Decoded {
  std::vector<std::vector<int32_t>> ids;
  std::vector<float> logits;
  bool graphs = false;
};

Decoded decode(Device& device, const ModelLayout& model,
               const std::vector<std::vector<float>>& params,
               const std::vector<std::vector<int32_t>>& prompts, int tokens, SamplingParams sp,
               bool graphs, int max_seq = 0) {
  DecoderOptions o;
  o.batch = static_cast<int>(prompts.size());
  o.max_seq = max_seq;
  o.graphs = graphs;
  Decoder d(model, device, params, o);
  GenerateRequest r;
  r.prompts = prompts;
  r.tokens = tokens;
  r.sampling = sp;
  const GenerateResult g = d.generate(r);
  return {g.ids, d.last_logits(), d.graphs_used()};
}

class CudaDecoder : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (gpu_test::gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU is visible to this process";
  }
};

// Teacher-forced: the CPU decodes the tokens the GPU chose, so both see the same contexts
// and their last logits compare; the graph and the plain replay agree bit for bit.
TEST_P(CudaDecoder, MatchesCpuAndGraphReplayMatchesPlainReplay) {
  const ModelConfig c = tiny(GetParam());
  const ModelLayout model(c);
  const auto params = init_params(model, 3);
  const auto gpu = device_create(DeviceKind::cuda);
  const auto cpu = device_create(DeviceKind::cpu);
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(9, c.vocab, 1),
                                                     prompt_of(4, c.vocab, 2)};
  for (const SamplingParams sp : {SamplingParams{0}, SamplingParams{0.8f, 10, 0.9f, 3}}) {
    const Decoded graph = decode(*gpu, model, params, prompts, 24, sp, true, 40);
    const Decoded plain = decode(*gpu, model, params, prompts, 24, sp, false, 40);
    EXPECT_TRUE(graph.graphs);
    EXPECT_FALSE(plain.graphs);
    EXPECT_EQ(graph.ids, plain.ids);
    EXPECT_EQ(graph.logits, plain.logits);
    // The CPU, given the GPU's tokens but the last as its prompts' continuation.
    std::vector<std::vector<int32_t>> forced = prompts;
    for (size_t s = 0; s < prompts.size(); ++s)
      forced[s].insert(forced[s].end(), graph.ids[s].begin(), graph.ids[s].end() - 1);
    const Decoded ref = decode(*cpu, model, params, forced, 1, SamplingParams{0}, false, 40);
    EXPECT_LT(rel_diff(graph.logits, ref.logits), 5e-2);
  }
}

TEST_P(CudaDecoder, RaggedBatchEqualsEachSequenceAlone) {
  const ModelConfig c = tiny(GetParam());
  const ModelLayout model(c);
  const auto params = init_params(model, 3);
  const auto gpu = device_create(DeviceKind::cuda);
  const std::vector<std::vector<int32_t>> prompts = {
      prompt_of(7, c.vocab, 1), prompt_of(3, c.vocab, 2), prompt_of(7, c.vocab, 3)};
  const Decoded batch = decode(*gpu, model, params, prompts, 10, SamplingParams{0}, true, 20);
  for (size_t s = 0; s < prompts.size(); ++s) {
    const Decoded alone =
        decode(*gpu, model, params, {prompts[s]}, 10, SamplingParams{0}, true, 20);
    // Teacher-force the comparison of logits: the last step's context must be the same.
    if (batch.ids[s] != alone.ids[0]) {
      ADD_FAILURE() << "sequence " << s << " differs from its run alone (bf16 near-tie?)";
      continue;
    }
    const std::vector<float> row(batch.logits.begin() + int64_t(s) * c.vocab,
                                 batch.logits.begin() + int64_t(s + 1) * c.vocab);
    EXPECT_LT(rel_diff(row, alone.logits), 5e-2) << "sequence " << s;
  }
}

// Every inference layout at one rank on the GPU: fsdp gathers each unit (a copy through the
// one-rank NCCL communicator) on its own stream and tp runs each block in halves over a rank
// model of its own; both are the same bf16 arithmetic as replicate, so they draw the same
// tokens and end with the same logits, bit for bit; sampled draws too (row offset 0).
TEST_P(CudaDecoder, EveryLayoutAtOneRankEqualsReplicate) {
  const ModelConfig c = tiny(GetParam());
  const ModelLayout model(c);
  const auto params = init_params(model, 3);
  const auto gpu = device_create(DeviceKind::cuda);
  const std::vector<std::vector<int32_t>> prompts = {prompt_of(7, c.vocab, 1),
                                                     prompt_of(3, c.vocab, 2)};
  for (const SamplingParams sp : {SamplingParams{0}, SamplingParams{0.8f, 10, 0.9f, 3}}) {
    const Decoded base = decode(*gpu, model, params, prompts, 12, sp, true, 24);
    for (InferLayout layout : {InferLayout::fsdp, InferLayout::tp, InferLayout::pipeline}) {
      SCOPED_TRACE(infer_layout_name(layout));
      DecoderOptions o;
      o.batch = static_cast<int>(prompts.size());
      o.max_seq = 24;
      o.layout = layout;
      // One rank: fsdp's shard is the whole padded unit, tp's model is the whole model.
      std::vector<std::vector<float>> p = params;
      if (layout == InferLayout::fsdp) {
        const FlatLayout flat(model, 1);
        for (int u = 0; u < model.num_units(); ++u)
          p[static_cast<size_t>(u)].resize(static_cast<size_t>(flat.unit(u).shard), 0.0f);
      }
      Decoder d(model, *gpu, p, o);
      GenerateRequest r;
      r.prompts = prompts;
      r.tokens = 12;
      r.sampling = sp;
      EXPECT_EQ(d.generate(r).ids, base.ids);
      EXPECT_EQ(d.last_logits(), base.logits);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Families, CudaDecoder,
                         ::testing::Values("gpt2-tiny", "llama-tiny", "pythia-tiny"), param_name);

// The planner on one GPU, as `tandem generate` plans: the device's preset with a block of
// the model timed at the rows (prediction_measure_decode), against the decoder's measured
// rate for each layout (all replicate at one rank), batch 1 and 8, within a fifth. Eight
// Llama-2-7B blocks (3.2 GB of bf16 weights) keep the step's weight reads in charge.
TEST(CudaDecoderPlan, PredictedRateWithinAFifthOfMeasured) {
  if (gpu_test::gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU is visible to this process";
  const auto gpu = device_create(DeviceKind::cuda);
  const std::string preset_name = hardware_preset_for_device(gpu->name());
  if (preset_name.empty()) GTEST_SKIP() << "no hardware preset for " << gpu->name();
  ModelConfig c = preset("llama2-7b");
  c.n_layer = 8;
  c.context = 256;
  const ModelLayout model(c);
  std::vector<std::vector<float>> params;
  for (int u = 0; u < model.num_units(); ++u)
    params.emplace_back(static_cast<size_t>(model.unit(u).numel), 0.01f);
  for (int batch : {1, 8}) {
    DecoderOptions o;
    o.batch = batch;
    o.max_seq = 160;
    Decoder d(model, *gpu, params, o);
    GenerateRequest r;
    for (int b = 0; b < batch; ++b) r.prompts.push_back(prompt_of(32, c.vocab, 1 + b));
    r.tokens = 96;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    (void)d.generate(r);  // warm-up: the graph's capture
    double measured = 0;
    for (int i = 0; i < 3; ++i) measured = std::max(measured, d.generate(r).decode_tokens_per_s());
    PlanRequest req;
    req.task = PlanTask::generate;
    req.model = c;
    req.ranks = 1;
    req.batch = batch;
    req.seq = 80;  // the cache a step reads, on average over the run
    req.hw = hardware_preset(preset_name);
    prediction_apply_decode(req.hw, prediction_measure_decode(*gpu, c, batch, o.max_seq, 100));
    for (const char* name : {"replicate", "fsdp", "tp", "pipeline"}) {
      const StrategyPlan p = plan_generate_strategy(req, name);
      const double off = measured / p.tokens_per_s - 1;
      std::printf(
          "[prediction] %s, batch %d, one GPU: predicted %.1f tokens/s, measured %.1f, "
          "off by %+.0f%%\n",
          name, batch, p.tokens_per_s, measured, 100 * off);
      EXPECT_LE(std::fabs(off), 0.20) << name << " at batch " << batch;
    }
  }
}

// Greedy on the GPU against transformers' float64 generate, teacher-forced: every step is
// fed the reference's previous tokens, so each of the 40 choices is made from the
// reference's own context. A choice must equal the reference's wherever the reference's gap
// between its two largest logits exceeds what bf16 can move a logit: 2.5e-2 of the largest
// logit's magnitude (the error model above, applied to the logits' scale). The number of
// choices compared is printed; at least half of them must be.
class CudaDecoderHf : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaDecoderHf, GreedyEqualsTransformersGenerate) {
  if (gpu_test::gpu_count() == 0) GTEST_SKIP() << "no CUDA GPU is visible to this process";
  const std::string dir = std::string(TANDEM_TEST_DATA_DIR) + "/fixtures/hf/" + GetParam();
  std::ifstream in(dir + ".generate.json");
  ASSERT_TRUE(in.good()) << dir << ".generate.json is missing";
  const nlohmann::json ref = nlohmann::json::parse(in);
  const auto source = ModelSource::open(dir);
  const ModelLayout model(source->config());
  const auto params = source->load_params();
  const auto gpu = device_create(DeviceKind::cuda);
  for (const auto& run : ref.at("runs")) {
    const auto prompt = run.at("prompt").get<std::vector<int32_t>>();
    const auto want = run.at("ids").get<std::vector<int32_t>>();
    const auto margin = run.at("margins").get<std::vector<double>>();
    const auto top = run.at("top").get<std::vector<double>>();
    DecoderOptions o;
    Decoder d(model, *gpu, params, o);
    GenerateRequest r;
    r.prompts = {prompt};
    r.tokens = static_cast<int>(want.size());
    r.sampling.temperature = 0;
    r.forced = {want};
    const GenerateResult got = d.generate(r);
    ASSERT_EQ(got.ids[0].size(), want.size());
    size_t compared = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (margin[i] < 2.5e-2 * std::max(1.0, std::abs(top[i]))) continue;
      ++compared;
      EXPECT_EQ(got.ids[0][i], want[i])
          << "new token " << i << " (reference gap " << margin[i] << ")";
    }
    std::printf("[ %s ] prompt of %zu: %zu of %zu greedy choices compared\n", GetParam().c_str(),
                prompt.size(), compared, want.size());
    EXPECT_GE(2 * compared, want.size());
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaDecoderHf,
                         ::testing::Values("gpt2", "llama", "llama-tied-bf16-sharded", "neox",
                                           "neox-fp16"),
                         param_name);

}  // namespace
}  // namespace tandem
