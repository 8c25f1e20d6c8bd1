// Sharded decoding under mpirun: every inference layout draws exactly the tokens one rank
// draws, for the three families, ragged batches, batches smaller than the world, and
// sampled as well as greedy decoding; and a layout that cannot split a model says why.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "dist/dist_env.h"
#include "infer/decoder.h"
#include "model/tensor_parallel.h"
#include "shard/flat.h"
#include "unit/decode_test_util.h"

namespace tandem::dist {
namespace {

// Four blocks (a pipeline stage for each of up to 4 ranks), 12 heads of 8 channels (12
// divides by every world size up to 4), an MLP of 144, and a vocabulary of 500 padded to 512,
// so tp's head rows split it for real.
ModelConfig model_of(const std::string& name) {
  ModelConfig c = decode_test::tiny(name == "llama-mqa" ? "llama-tiny" : name, 96, 12, 64);
  c.vocab = 500;
  c.vocab_padded = 512;
  c.d_ff = 144;
  c.n_layer = 4;
  if (c.family == Family::llama) c.n_kv_head = name == "llama-mqa" ? 1 : 4;
  return c;
}

std::vector<std::vector<int32_t>> prompts_of(int n, int vocab) {
  std::vector<std::vector<int32_t>> p;
  for (int s = 0; s < n; ++s) p.push_back(decode_test::prompt_of(3 + 2 * (s % 3), vocab, 11 + s));
  return p;
}

struct Case {
  std::string model;
  InferLayout layout;
};

class DistDecode : public ::testing::TestWithParam<Case> {};

GenerateResult run(const ModelLayout& model, std::vector<std::vector<float>> params,
                   const DecoderOptions& o, const DecoderComms& comms,
                   const GenerateRequest& request) {
  Decoder d(model, device(), std::move(params), o, comms);
  return d.generate(request);
}

TEST_P(DistDecode, EveryRankDrawsWhatOneRankDraws) {
  const Case& k = GetParam();
  const ModelConfig c = model_of(k.model);
  const int W = world().size(), rank = world().rank();
  if (k.layout == InferLayout::tp) {
    const bool ok =
        c.n_head % W == 0 && c.d_ff % W == 0 && (c.n_kv_head % W == 0 || W % c.n_kv_head == 0);
    if (!ok) {
      try {
        tp_check(c, W);
        FAIL() << "tp over " << W << " ranks accepted " << k.model;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("head"), std::string::npos) << e.what();
      }
      GTEST_SKIP() << k.model << " does not split " << W << " ways: refused, as checked";
    }
  }
  const ModelLayout global(c);
  const std::vector<std::vector<float>> all = decode_test::init_params(global, 5);
  const ModelConfig mine = k.layout == InferLayout::tp ? tp_local_config(c, W, rank) : c;
  const ModelLayout local(mine);
  for (int batch : {1, 5}) {
    for (int sampled : {0, 1}) {
      SCOPED_TRACE(fmt::format("{} {} batch {} {}", k.model, infer_layout_name(k.layout), batch,
                               sampled ? "sampled" : "greedy"));
      GenerateRequest r;
      r.prompts = prompts_of(batch, c.vocab);
      r.tokens = 10;
      r.ignore_eos = true;
      if (sampled) {
        r.sampling.temperature = 0.9f;
        r.sampling.top_k = 40;
        r.sampling.top_p = 0.9f;
        r.sampling.seed = 7;
      } else {
        r.sampling.temperature = 0;
      }
      DecoderOptions o;
      o.batch = batch;
      o.max_seq = 32;
      // One rank alone, on every rank.
      const GenerateResult one = run(global, all, o, {}, r);
      o.layout = k.layout;
      const GenerateResult many = run(
          local, decode_test::params_for(k.layout, global, local, all, W, rank), o, {&world()}, r);
      ASSERT_EQ(many.ids.size(), one.ids.size());
      for (size_t s = 0; s < one.ids.size(); ++s)
        EXPECT_EQ(many.ids[s], one.ids[s]) << "sequence " << s;
      EXPECT_EQ(many.decode_tokens, one.decode_tokens);
    }
  }
}

// A pipeline's first stage keeps the results and ends each micro-batch when its sequences
// end: a sequence stopped early (its first micro-batch alone) and one that hits an end
// token, as one rank ends them.
TEST(DistDecodePipeline, SequencesEndWhereOneRankEndsThem) {
  const ModelConfig c = model_of("llama-tiny");
  const int W = world().size(), rank = world().rank();
  const ModelLayout model(c);
  const std::vector<std::vector<float>> all = decode_test::init_params(model, 5);
  GenerateRequest r;
  r.prompts = prompts_of(5, c.vocab);
  r.tokens = 12;
  r.sampling.temperature = 0;
  DecoderOptions o;
  o.batch = 5;
  o.max_seq = 32;
  GenerateRequest solo = r;
  std::vector<int> seen(5, 0);  // sequence 0 stops at its third token
  solo.on_token = [&seen](int s, int32_t) { return s != 0 || ++seen[0] < 3; };
  const GenerateResult one = run(model, all, o, {}, solo);
  // The end token: sequence 4's fifth token, alone.
  r.eos = {one.ids[4][4]};
  solo.eos = r.eos;
  seen.assign(5, 0);
  const GenerateResult ref = run(model, all, o, {}, solo);
  o.layout = InferLayout::pipeline;
  std::vector<int> seen_here(5, 0);
  r.on_token = [&seen_here](int s, int32_t) { return s != 0 || ++seen_here[0] < 3; };
  const GenerateResult got =
      run(model, decode_test::params_for(o.layout, model, model, all, W, rank), o, {&world()}, r);
  ASSERT_EQ(got.ids.size(), ref.ids.size());
  for (size_t s = 0; s < ref.ids.size(); ++s) {
    EXPECT_EQ(got.ids[s], ref.ids[s]) << "sequence " << s;
    EXPECT_EQ(got.finish[s], ref.finish[s]) << "sequence " << s;
  }
  EXPECT_EQ(ref.finish[0], "stop");
  EXPECT_EQ(ref.finish[4], "eos");
  EXPECT_EQ(got.decode_tokens, ref.decode_tokens);
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* m : {"gpt2-tiny", "llama-tiny", "llama-mqa", "pythia-tiny"})
    for (InferLayout l :
         {InferLayout::replicate, InferLayout::fsdp, InferLayout::tp, InferLayout::pipeline})
      out.push_back({m, l});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Layouts, DistDecode, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           std::string n = p.param.model + "_" + infer_layout_name(p.param.layout);
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace tandem::dist
