// Hugging Face models against Hugging Face transformers: directories written by
// save_pretrained (tests/fixtures/hf/<name>/) are imported, and tandem's logits and loss at
// the stored weights, then one optimizer step through the engine (the path `tandem train`
// runs), exported back to Hugging Face names, are compared with what transformers computed
// in float64 at the same weights (tests/fixtures/hf/<name>.reference.safetensors, written by
// tools/make_hf_fixtures.py).
//
// Error model: that of tests/unit/test_fixtures.cpp, whose derivation applies unchanged.
// With u = 2^-24, ops_fwd = 9 L + 2 reductions on the longest forward chain and K_max the
// longest reduction (d_model, d_ff or the vocabulary), normwise relative errors are bounded by
//   logits:  tol_fwd  = ops_fwd * sqrt(K_max) * u
//   loss:    sqrt(2/N) * tol_fwd * ||logits|| + sqrt(V) * u * loss
//   update:  tol_grad = (3 ops_fwd + 1) * sqrt(K_max) * u   (one AdamW step moves each element
//            by about lr whatever its gradient's size, so a relative gradient error e moves
//            the update by about e), plus the rounding of the float64 parameters after the step
//            to float32 in the reference file, u ||after|| / ||update||; on the elements whose
//            gradient is not at the noise floor ([Adam's first step] below)
//   loss after the step: the loss bound plus tol_grad * loss.
// The update compared is (after - before) per Hugging Face tensor, both sides from the same
// imported weights, so the check sees the step and not the weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "device/cpu/kernel_table.h"
#include "device/cpu/kernels.h"
#include "device/device.h"
#include "io/hf.h"
#include "io/model_source.h"
#include "io/safetensors.h"
#include "model/activations.h"
#include "model/compose.h"
#include "shard/engine.h"

namespace tandem {
namespace {

constexpr double kU = 0x1p-24;
// [Adam's first step] AdamW's first step moves element j by lr * g / (|g| + eps) (plus the
// decay), g the clipped gradient: about lr * sign(g) wherever |g| >> eps. Where |g| is within a
// few eps, the step follows g's value at the 1e-8 scale, below fp32's rounding of a gradient
// whose terms are ~1e-3 (GPT-2's key bias, whose exact gradient is 0 because softmax ignores
// a shift shared by all keys, and GPT-NeoX's non-rotated key-bias channels, are such
// elements): there the step is rounding noise in any fp32 implementation, and float64's
// differs from it by up to 2 lr. The step is compared on the elements whose reference
// direction |g| / (|g| + eps) is at least kSignal (|g| >= 99 eps); the others are counted.
constexpr double kSignal = 0.99;

std::string fixture_dir(const std::string& name) {
  return std::string(TANDEM_TEST_DATA_DIR) + "/fixtures/hf/" + name;
}

std::vector<float> floats(const SafeTensor& t) {
  EXPECT_EQ(t.dtype, "F32") << t.name;
  std::vector<float> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.data.data(), std::min(t.data.size(), v.size() * sizeof(float)));
  return v;
}

double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den == 0 ? (num == 0 ? 0.0 : INFINITY) : std::sqrt(num / den);
}

double norm(const std::vector<float>& a) {
  double s = 0;
  for (float x : a) s += double(x) * x;
  return std::sqrt(s);
}

struct Tolerances {
  double fwd, grad;
  explicit Tolerances(const ModelConfig& c) {
    const int ops_fwd = 9 * c.n_layer + 2;
    const double k_max = std::max({c.d_model, c.d_ff, c.vocab});
    fwd = ops_fwd * std::sqrt(k_max) * kU;
    grad = (3 * ops_fwd + 1) * std::sqrt(k_max) * kU;
  }
};

// The fp32 parameters in Hugging Face names and layouts.
std::vector<SafeTensor> hf_f32(const ModelLayout& layout,
                               const std::vector<std::vector<float>>& params,
                               const HfNaming& naming) {
  HfExportOptions o;
  o.naming = naming;
  return hf_tensors(layout, params, o);
}

void check_fixture(const std::string& name) {
  const std::string dir = fixture_dir(name);
  const SafeTensorsFile ref = safetensors_read(dir + ".reference.safetensors");
  const std::unique_ptr<ModelSource> src = ModelSource::open(dir);
  const ModelConfig& c = src->config();
  const ModelLayout layout(c);
  const std::vector<std::vector<float>> params = src->load_params();
  const int B = 2, T = 16, N = B * T;
  const int64_t V = c.vocab, Vp = c.vocab_padded;
  ASSERT_EQ(ref.get("tokens").shape, (std::vector<int64_t>{B, T}));
  std::vector<int32_t> tokens(N), targets(N);
  std::memcpy(tokens.data(), ref.get("tokens").data.data(), N * sizeof(int32_t));
  std::memcpy(targets.data(), ref.get("targets").data.data(), N * sizeof(int32_t));
  const Tolerances tol(c);

  // 1. Logits and loss at the imported weights.
  std::unique_ptr<Kernels> k = cpu_kernels();
  const std::unique_ptr<Workspace> ws = Workspace::on_host(c, B, T, activation_traits(*k, c, B, T));
  std::copy(tokens.begin(), tokens.end(), ws->tokens);
  std::copy(targets.begin(), targets.end(), ws->targets);
  UnitParams p;
  for (const auto& buf : params) p.push_back(buf.data());
  model_forward(*k, layout, p, *ws);
  const float* logits = static_cast<const float*>(ws->logits);
  const std::vector<float> ref_logits = floats(ref.get("logits"));
  ASSERT_EQ(ref.get("logits").shape, (std::vector<int64_t>{B, T, V}));
  std::vector<double> got_l, want_l;
  for (int i = 0; i < N; ++i)
    for (int64_t v = 0; v < V; ++v) {
      got_l.push_back(logits[i * Vp + v]);
      want_l.push_back(ref_logits[static_cast<size_t>(i * V + v)]);
    }
  const double e_logits = rel_err(got_l, want_l);
  EXPECT_LE(e_logits, tol.fwd) << name << ": logits";
  const double ref_loss = floats(ref.get("loss"))[0];
  const double loss_tol =
      std::sqrt(2.0 / N) * tol.fwd * norm(ref_logits) + std::sqrt(double(V)) * kU * ref_loss;

  // 2. One optimizer step through the engine on one rank, from the imported weights.
  const auto hp = nlohmann::json::parse(ref.metadata.at("optim"));
  ASSERT_EQ(hp.at("steps").get<int>(), 1);
  EngineConfig ec;
  ec.strategy = Strategy::full;
  ec.batch = B;
  ec.seq = T;
  ec.global_batch = B;
  ec.total_steps = 1;
  ec.optim.lr = hp.at("lr").get<float>();
  ec.optim.warmup = 0;
  ec.optim.beta1 = hp.at("beta1").get<float>();
  ec.optim.beta2 = hp.at("beta2").get<float>();
  ec.optim.eps = hp.at("eps").get<float>();
  ec.optim.weight_decay = hp.at("weight_decay").get<float>();
  ec.optim.grad_clip = hp.at("grad_clip").get<float>();
  std::unique_ptr<Device> device = device_create_cpu();
  std::unique_ptr<Communicator> world = comm_world(*device, {});
  Engine engine(layout, ec, *device, *world);
  ShardState st;
  st.params = src->load_param_shard(engine.flat(), engine.shard_rank());
  for (const auto& s : st.params) {
    st.m.emplace_back(s.size(), 0.0f);
    st.v.emplace_back(s.size(), 0.0f);
  }
  engine.set_shards(st);
  const StepBatch batch{tokens.data(), targets.data(), tokens.size()};
  const StepResult first = engine.step(0, batch);
  EXPECT_NEAR(first.loss, ref_loss, loss_tol) << name << ": loss at the stored weights";
  const std::vector<std::vector<float>> after = engine.gather_params();
  const StepResult second = engine.step(1, batch);  // its loss is at the weights after step 1
  const double ref_after_loss = floats(ref.get("loss_after"))[0];
  EXPECT_NEAR(second.loss, ref_after_loss, loss_tol + tol.grad * ref_after_loss)
      << name << ": loss after one step";

  // 3. The step of every tensor, in Hugging Face names: (after - before) against the
  // reference's.
  const std::vector<SafeTensor> before = hf_f32(layout, params, src->hf_naming());
  const std::vector<SafeTensor> mine = hf_f32(layout, after, src->hf_naming());
  int n_after = 0;
  for (const SafeTensor& t : ref.tensors) n_after += t.name.rfind("after.", 0) == 0;
  EXPECT_EQ(n_after, static_cast<int>(mine.size())) << name << ": tensors with a reference step";
  double worst = 0;
  std::string worst_name;
  int64_t compared = 0, noise = 0;
  const double lr = ec.optim.lr, wd = ec.optim.weight_decay;
  for (size_t i = 0; i < mine.size(); ++i) {
    const std::string key = "after." + mine[i].name;
    ASSERT_TRUE(ref.contains(key)) << name << ": the reference lacks " << key;
    const std::vector<float> b = floats(before[i]), a = floats(mine[i]), r = floats(ref.get(key));
    ASSERT_EQ(r.size(), a.size()) << key;
    const double decay = mine[i].shape.size() >= 2 ? lr * wd : 0.0;
    std::vector<double> got, want, after_kept;
    for (size_t j = 0; j < a.size(); ++j) {
      // The reference's Adam direction g / (|g| + eps) of this element, from its step.
      const double s = -(double(r[j]) - double(b[j]) * (1 - decay)) / lr;
      if (std::abs(s) < kSignal) {
        // Left out, but no AdamW step moves an element by more than lr (plus the decay).
        const double mine_s = -(double(a[j]) - double(b[j]) * (1 - decay)) / lr;
        EXPECT_LE(std::abs(mine_s), 1 + 1e-3) << name << ": " << mine[i].name << "[" << j << "]";
        ++noise;
        continue;
      }
      got.push_back(double(a[j]) - b[j]);
      want.push_back(double(r[j]) - b[j]);
      after_kept.push_back(r[j]);
    }
    compared += static_cast<int64_t>(got.size());
    ASSERT_FALSE(got.empty()) << name << ": no element of " << mine[i].name << " is compared";
    double want_norm = 0, after_norm = 0;
    for (size_t j = 0; j < want.size(); ++j) {
      want_norm += want[j] * want[j];
      after_norm += after_kept[j] * after_kept[j];
    }
    const double bound = tol.grad + kU * std::sqrt(after_norm / want_norm);
    const double e = rel_err(got, want);
    if (e > worst) worst = e, worst_name = mine[i].name;
    EXPECT_LE(e, bound) << name << ": the step of " << mine[i].name;
  }
  std::printf(
      "[ %s ] %s: logits %.2e (tol %.1e), loss %.2e / %.2e (tol %.1e), worst step %.2e %s "
      "(tol %.1e + rounding) over %lld elements, %lld at the noise floor left out\n",
      name.c_str(), src->describe().c_str(), e_logits, tol.fwd, std::abs(first.loss - ref_loss),
      std::abs(second.loss - ref_after_loss), loss_tol, worst, worst_name.c_str(), tol.grad,
      static_cast<long long>(compared), static_cast<long long>(noise));
}

class HfFixture : public testing::TestWithParam<const char*> {};

TEST_P(HfFixture, MatchesTransformers) {
  const std::string name = GetParam();
  if (!std::filesystem::exists(fixture_dir(name) + ".reference.safetensors"))
    GTEST_SKIP() << fixture_dir(name) << ".reference.safetensors is absent: it is written with "
                 << "Hugging Face transformers, on a machine that has it:\n"
                 << "  python3 tools/make_hf_fixtures.py --out tests/fixtures/hf";
  check_fixture(name);
}

INSTANTIATE_TEST_SUITE_P(Transformers, HfFixture,
                         testing::Values("gpt2", "llama", "llama-tied-bf16-sharded", "neox",
                                         "neox-fp16"),
                         [](const testing::TestParamInfo<const char*>& i) {
                           std::string n = i.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace tandem
