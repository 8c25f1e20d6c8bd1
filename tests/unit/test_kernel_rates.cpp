// The planner's per-kernel cost: the calls a unit makes (recorded from the composition),
// their prices from kernel tables (exact, interpolated, the ceilings), the tables' JSON, and
// the plan without tables as before.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "plan/hardware.h"
#include "plan/kernel_rates.h"
#include "plan/plan.h"
#include "shard/flat.h"
#include "shard/program.h"

namespace tandem {
namespace {

// gpt2-tiny with one block at B = 2, T = 32: N = 64 rows, C = 128, Q = 384, F = 512, 4 heads
// of 32, vocabulary 256.
ModelConfig gpt2_one_block() {
  ModelConfig c = preset("gpt2-tiny");
  c.n_layer = 1;
  return c;
}

ModelConfig llama_one_block() {
  ModelConfig c = preset("llama-tiny");
  c.n_layer = 1;
  return c;
}

KernelCall call(KernelOp op, std::vector<int64_t> shape) {
  return {op, std::move(shape)};
}

std::vector<std::string> texts(const std::vector<KernelCall>& calls) {
  std::vector<std::string> t;
  for (const KernelCall& c : calls) t.push_back(kernel_call_text(c));
  return t;
}

Hardware cpu_hw(std::shared_ptr<const KernelRates> k) {
  Hardware hw = hardware_preset("cpu-local");
  hw.kernels = std::move(k);
  return hw;
}

TEST(PlanKernels, Gpt2BlockCallsFollowTheComposition) {
  const ModelLayout m(gpt2_one_block());
  const KernelTraits fp32 = kernel_traits_for(false, 4, 32);
  const std::vector<KernelCall> forward = unit_kernel_calls(m, 1, false, 2, 32, fp32);
  const std::vector<KernelCall> expected_forward = {
      call(KernelOp::layernorm_forward, {64, 128, 1}),
      call(KernelOp::linear_forward, {64, 128, 384, 1}),
      call(KernelOp::attention_forward, {2, 32, 4, 4, 32}),
      call(KernelOp::linear_residual_forward, {64, 128, 128, 1, 1}),
      call(KernelOp::layernorm_forward, {64, 128, 1}),
      call(KernelOp::linear_gelu_forward, {64, 128, 512, 1, 0}),
      call(KernelOp::linear_residual_forward, {64, 512, 128, 1, 1}),
  };
  EXPECT_EQ(texts(forward), texts(expected_forward));
  // The backward is not twice the forward: the MLP first, no GELU forward, and no zeros
  // ([Written input gradients]: GELU's and attention's input gradients are written).
  const std::vector<KernelCall> backward = unit_kernel_calls(m, 1, true, 2, 32, fp32);
  const std::vector<KernelCall> expected_backward = {
      call(KernelOp::linear_backward, {64, 512, 128, 1, 0}),
      call(KernelOp::gelu_backward, {64 * 512, 0}),
      call(KernelOp::linear_backward, {64, 128, 512, 1, 0}),
      call(KernelOp::layernorm_backward, {64, 128, 1}),
      call(KernelOp::linear_backward, {64, 128, 128, 1, 0}),
      call(KernelOp::attention_backward, {2, 32, 4, 4, 32}),
      call(KernelOp::linear_backward, {64, 128, 384, 1, 0}),
      call(KernelOp::layernorm_backward, {64, 128, 1}),
  };
  EXPECT_EQ(texts(backward), texts(expected_backward));
  // The embedding (learned positions) and the tied head with its loss.
  EXPECT_EQ(texts(unit_kernel_calls(m, 0, false, 2, 32, fp32)),
            texts({call(KernelOp::embedding_forward, {2, 32, 128, 256, 1})}));
  EXPECT_EQ(texts(unit_kernel_calls(m, 2, false, 2, 32, fp32)),
            texts({call(KernelOp::layernorm_forward, {64, 128, 1}),
                   call(KernelOp::linear_forward, {64, 128, 256, 0})}));
  EXPECT_EQ(texts(unit_kernel_calls(m, 2, true, 2, 32, fp32)),
            texts({call(KernelOp::crossentropy_fused_backward, {64, 256, 256}),
                   call(KernelOp::linear_backward, {64, 128, 256, 0, 0}),
                   call(KernelOp::zero, {64 * 128 * 4}),
                   call(KernelOp::layernorm_backward, {64, 128, 1})}));
  // bf16 halves the zeros' bytes and nothing else.
  const std::vector<KernelCall> bf16 =
      unit_kernel_calls(m, 2, true, 2, 32, kernel_traits_for(true, 2, 32));
  EXPECT_EQ(kernel_call_text(bf16[2]), kernel_call_text(call(KernelOp::zero, {64 * 128 * 2})));
}

// [Activation recompute] A block's backward under recompute runs its forward (unit) or
// attention's forward (attention) first, then the same backward; other units do not change.
TEST(PlanKernels, RecomputeRunsTheForwardAgainFirst) {
  for (const ModelConfig& c : {gpt2_one_block(), llama_one_block()}) {
    const ModelLayout m(c);
    const KernelTraits fp32 = kernel_traits_for(false, 4, 32);
    const std::vector<std::string> forward = texts(unit_kernel_calls(m, 1, false, 2, 32, fp32));
    const std::vector<std::string> backward = texts(unit_kernel_calls(m, 1, true, 2, 32, fp32));
    std::vector<std::string> unit = forward;
    unit.insert(unit.end(), backward.begin(), backward.end());
    EXPECT_EQ(texts(unit_kernel_calls(m, 1, true, 2, 32, fp32, Recompute::unit)), unit) << c.name;
    std::vector<std::string> attention;
    const std::string name = std::string(kernel_op_name(KernelOp::attention_forward)) + " ";
    for (const std::string& f : forward)
      if (f.rfind(name, 0) == 0) attention.push_back(f);
    ASSERT_EQ(attention.size(), 1u) << c.name;
    attention.insert(attention.end(), backward.begin(), backward.end());
    EXPECT_EQ(texts(unit_kernel_calls(m, 1, true, 2, 32, fp32, Recompute::attention)), attention)
        << c.name;
    for (int u : {0, 2})
      EXPECT_EQ(texts(unit_kernel_calls(m, u, true, 2, 32, fp32, Recompute::unit)),
                texts(unit_kernel_calls(m, u, true, 2, 32, fp32)))
          << c.name << " unit " << u;
  }
}

// [Chunked loss] The head's forward is its norm alone; its backward makes, scores and
// differentiates the logits chunk by chunk (the last chunk short), then the norm's backward.
TEST(PlanKernels, AChunkedLossMakesTheLogitsInTheBackward) {
  const ModelLayout m(gpt2_one_block());  // 2 x 32 = 64 rows, width 128, vocabulary 256
  const KernelTraits fp32 = kernel_traits_for(false, 4, 32);
  EXPECT_EQ(texts(unit_kernel_calls(m, 2, false, 2, 32, fp32, Recompute::none, 24)),
            texts({call(KernelOp::layernorm_forward, {64, 128, 1})}));
  std::vector<KernelCall> backward;
  for (int n : {24, 24, 16})
    for (const KernelCall& c : {call(KernelOp::linear_forward, {n, 128, 256, 0}),
                                call(KernelOp::crossentropy_fused_backward, {n, 256, 256}),
                                call(KernelOp::linear_backward, {n, 128, 256, 0, 0})})
      backward.push_back(c);
  backward.push_back(call(KernelOp::zero, {64 * 128 * 4}));
  backward.push_back(call(KernelOp::layernorm_backward, {64, 128, 1}));
  EXPECT_EQ(texts(unit_kernel_calls(m, 2, true, 2, 32, fp32, Recompute::none, 24)),
            texts(backward));
  // Blocks do not change.
  EXPECT_EQ(texts(unit_kernel_calls(m, 1, true, 2, 32, fp32, Recompute::none, 24)),
            texts(unit_kernel_calls(m, 1, true, 2, 32, fp32)));
}

TEST(PlanKernels, LlamaBlockCallsRotateAndGate) {
  const ModelLayout m(llama_one_block());  // 4 heads of 32, 2 KV heads, d_ff 352
  const KernelTraits fp32 = kernel_traits_for(false, 4, 32);
  EXPECT_EQ(texts(unit_kernel_calls(m, 1, false, 2, 32, fp32)),
            texts({
                call(KernelOp::rmsnorm_forward, {64, 128}),
                call(KernelOp::linear_forward, {64, 128, 256, 0}),
                call(KernelOp::rope_forward, {2, 32, 6, 32, 32, 256}),
                call(KernelOp::attention_forward, {2, 32, 4, 2, 32}),
                call(KernelOp::linear_residual_forward, {64, 128, 128, 0, 1}),
                call(KernelOp::rmsnorm_forward, {64, 128}),
                call(KernelOp::linear_forward, {64, 128, 704, 0}),
                call(KernelOp::swiglu_forward, {64, 352}),
                call(KernelOp::linear_residual_forward, {64, 352, 128, 0, 1}),
            }));
}

// Known rates: every call of the block's forward measured, so the unit costs their sum.
TEST(PlanKernels, UnitTimeIsTheSumOfItsMeasuredCalls) {
  const ModelLayout m(gpt2_one_block());
  const KernelTraits fp32 = kernel_traits_for(false, 4, 32);
  auto k = std::make_shared<KernelRates>();
  k->compute_bytes = 4;
  k->launch_us = 1000;  // a measured call is charged as measured, launch included
  double expected = 0, ms = 0.5;
  for (const KernelCall& c : unit_kernel_calls(m, 1, false, 2, 32, fp32)) {
    bool seen = false;  // the two layernorms share one shape, hence one entry
    for (const KernelEntry& e : k->entries) seen = seen || e.call == c;
    if (!seen) k->entries.push_back({c, ms += 0.5});
    for (const KernelEntry& e : k->entries)
      if (e.call == c) expected += e.ms;
  }
  // layernorm 1.0 + qkv 1.5 + attention 2.0 + proj 2.5 + layernorm 1.0 + fc 3.0 + fc2 3.5
  EXPECT_DOUBLE_EQ(expected, 14.5);
  const Hardware hw = cpu_hw(k);
  const KernelCost cost = unit_kernel_cost(m, 1, false, 2, 32, hw);
  EXPECT_DOUBLE_EQ(cost.ms, 14.5);
  EXPECT_EQ(cost.calls, 7);
  EXPECT_EQ(cost.measured, 7);
  EXPECT_EQ(cost.interpolated + cost.ceiling, 0);

  // The program charges it to the block's forward op.
  PlanRequest r;
  r.model = gpt2_one_block();
  r.batch = 2;
  r.seq = 32;
  r.hw = hw;
  const Program p = program_build(m, plan_program_spec(r, Strategy::none));
  const std::vector<OpCost> costs = program_costs(m, p, hw, 2, 32);
  int forwards = 0;
  for (size_t i = 0; i < p.ops.size(); ++i)
    if (p.ops[i].kind == OpKind::forward && p.ops[i].unit == 1) {
      EXPECT_DOUBLE_EQ(costs[i].ms, 14.5);
      ++forwards;
    }
  EXPECT_EQ(forwards, 1);
}

TEST(PlanKernels, InterpolationByWork) {
  KernelRates k;
  k.compute_bytes = 4;
  k.launch_us = 100;                                                            // 0.1 ms
  const KernelCall small = call(KernelOp::linear_forward, {64, 128, 128, 0});   // W FLOPs
  const KernelCall large = call(KernelOp::linear_forward, {192, 128, 128, 0});  // 3 W
  k.entries = {{small, 1.0}, {large, 2.0}};
  double ms = 0;
  EXPECT_EQ(k.estimate(small, &ms), KernelRates::Fit::measured);
  EXPECT_DOUBLE_EQ(ms, 1.0);
  // 2 W, between the two: linear in time.
  EXPECT_EQ(k.estimate(call(KernelOp::linear_forward, {128, 128, 128, 0}), &ms),
            KernelRates::Fit::interpolated);
  EXPECT_DOUBLE_EQ(ms, 1.5);
  // A different shape of the same work counts by its work; flags do not matter.
  EXPECT_EQ(k.estimate(call(KernelOp::linear_forward, {64, 256, 128, 1}), &ms),
            KernelRates::Fit::interpolated);
  EXPECT_DOUBLE_EQ(ms, 1.5);
  // 6 W, above the largest: at its rate.
  EXPECT_EQ(k.estimate(call(KernelOp::linear_forward, {384, 128, 128, 0}), &ms),
            KernelRates::Fit::interpolated);
  EXPECT_DOUBLE_EQ(ms, 4.0);
  // W / 2, below the smallest: from one launch up to it.
  EXPECT_EQ(k.estimate(call(KernelOp::linear_forward, {32, 128, 128, 0}), &ms),
            KernelRates::Fit::interpolated);
  EXPECT_DOUBLE_EQ(ms, 0.1 + 0.9 * 0.5);
  // Another kernel is not borrowed.
  EXPECT_EQ(k.estimate(call(KernelOp::linear_backward, {64, 128, 128, 0, 0}), &ms),
            KernelRates::Fit::none);

  // Memory kernels by bytes; never below one launch.
  k.entries = {{call(KernelOp::add, {1000}), 0.5}, {call(KernelOp::add, {3000}), 1.5}};
  EXPECT_EQ(k.estimate(call(KernelOp::add, {2000}), &ms), KernelRates::Fit::interpolated);
  EXPECT_DOUBLE_EQ(ms, 1.0);
  k.entries = {{call(KernelOp::add, {1000}), 0.05}};
  EXPECT_EQ(k.estimate(call(KernelOp::add, {10}), &ms), KernelRates::Fit::interpolated);
  EXPECT_DOUBLE_EQ(ms, 0.1);

  // Attention keeps to its head size where it has one.
  k.entries = {{call(KernelOp::attention_forward, {1, 128, 4, 4, 64}), 1.0},
               {call(KernelOp::attention_forward, {1, 128, 4, 4, 128}), 10.0}};
  EXPECT_EQ(k.estimate(call(KernelOp::attention_forward, {2, 128, 4, 4, 64}), &ms),
            KernelRates::Fit::interpolated);
  EXPECT_DOUBLE_EQ(ms, 2.0);  // twice the D = 64 entry's work, at its rate
}

TEST(PlanKernels, UnmeasuredKernelsCostTheCeilingsPlusALaunch) {
  auto k = std::make_shared<KernelRates>();
  k->launch_us = 50;
  const Hardware hw = cpu_hw(k);  // 0.1 TFLOP/s, 10 GB/s
  const KernelCall c = call(KernelOp::linear_forward, {64, 128, 256, 0});
  KernelRates::Fit fit = KernelRates::Fit::measured;
  const double ms = kernel_call_ms(c, hw, &fit);
  EXPECT_EQ(fit, KernelRates::Fit::none);
  const double flops = 2.0 * 64 * 128 * 256, bytes = (64 * 128 + 128 * 256 + 64 * 256) * 4.0;
  EXPECT_DOUBLE_EQ(kernel_call_flops(c), flops);
  EXPECT_DOUBLE_EQ(kernel_call_bytes(c, 4), bytes);
  EXPECT_NEAR(ms, flops / 0.1e12 * 1e3 + bytes / 10e9 * 1e3 + 0.05, 1e-12);
}

TEST(PlanKernels, WithoutTablesThePlanIsAsBefore) {
  PlanRequest r;
  r.model = gpt2_one_block();
  r.batch = 2;
  r.seq = 32;
  r.hw = hardware_preset("cpu-local");
  const ModelLayout m(r.model);
  const Program p = program_build(m, plan_program_spec(r, Strategy::none));
  const std::vector<OpCost> costs = program_costs(m, p, r.hw, 2, 32);
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const Op& op = p.ops[i];
    if (op.kind != OpKind::forward && op.kind != OpKind::backward) continue;
    const UnitCost u = unit_forward_cost(m, op.unit, 2, 32, r.hw);
    const double forward = r.hw.flop_ms(u.flops) + r.hw.memory_ms(u.bytes);
    EXPECT_DOUBLE_EQ(costs[i].ms, op.kind == OpKind::forward ? forward : 2 * forward);
  }
  const PlanResult plan = plan_run(r);
  EXPECT_FALSE(plan.kernel_cost.has_value());
  EXPECT_TRUE(plan_to_json(plan).at("kernel_cost").is_null());
}

TEST(PlanKernels, TablesRoundTripThroughTheComputeFile) {
  KernelRates k;
  k.device = "cuda";
  k.compute_bytes = 2;
  k.launch_us = 4.5;
  k.model = "gpt2-124m";
  k.batch = 16;
  k.seq = 1024;
  k.flash_backward = FlashBackward::one_pass;
  k.entries = {{call(KernelOp::linear_backward, {16384, 768, 2304, 1, 0}), 0.8},
               {call(KernelOp::attention_forward, {16, 1024, 12, 12, 64}), 0.3},
               {call(KernelOp::layernorm_forward, {16384, 768, 1}), 0.02}};
  const nlohmann::json kj = kernel_rates_to_json(k);
  EXPECT_EQ(kj.at("dtype"), "bf16");
  EXPECT_EQ(kj.at("flash_backward"), "one-pass");
  EXPECT_EQ(kj.at("gemm").size(), 1u);
  EXPECT_EQ(kj.at("attention").size(), 1u);
  EXPECT_EQ(kj.at("memory").size(), 1u);
  EXPECT_EQ(kj.at("gemm")[0].at("shape").at("out"), 2304);
  EXPECT_NEAR(kj.at("memory")[0].at("GBps").get<double>(), 2.0 * 16384 * 768 * 2 / 0.02e-3 / 1e9,
              1e-6);
  const nlohmann::json file = {{"device", "cuda"},  {"tflops_f32", 50}, {"tflops_bf16", 700},
                               {"copy_GBps", 4000}, {"mem_GiB", 139.8}, {"kernels", kj}};
  Hardware hw = hardware_preset("cpu-local");
  hardware_apply_compute(hw, file);
  ASSERT_TRUE(hw.kernels != nullptr);
  EXPECT_EQ(hw.kernels->compute_bytes, 2u);
  EXPECT_DOUBLE_EQ(hw.kernels->launch_us, 4.5);
  EXPECT_EQ(hw.kernels->model, "gpt2-124m");
  EXPECT_EQ(hw.kernels->flash_backward, FlashBackward::one_pass);
  ASSERT_EQ(hw.kernels->entries.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    // The file lists by class; every entry comes back.
    bool found = false;
    for (const KernelEntry& e : hw.kernels->entries)
      found = found || (e.call == k.entries[i].call && e.ms == k.entries[i].ms);
    EXPECT_TRUE(found) << kernel_call_text(k.entries[i].call);
  }
  // A file without tables (or null) leaves none, whatever was there.
  nlohmann::json plain = file;
  plain["kernels"] = nullptr;
  hardware_apply_compute(hw, plain);
  EXPECT_TRUE(hw.kernels == nullptr);

  // Files written before the form was recorded measured the default.
  nlohmann::json older = file;
  older["kernels"].erase("flash_backward");
  hardware_apply_compute(hw, older);
  ASSERT_TRUE(hw.kernels != nullptr);
  EXPECT_EQ(hw.kernels->flash_backward, FlashBackward::automatic);

  nlohmann::json bad = file;
  bad["kernels"]["flash_backward"] = "one_pass";
  EXPECT_THROW(hardware_apply_compute(hw, bad), Error);
  bad = file;
  bad["kernels"]["gemm"][0]["kernel"] = "linear_sideways";
  EXPECT_THROW(hardware_apply_compute(hw, bad), Error);
  bad = file;
  bad["kernels"]["gemm"][0]["shape"].erase("out");
  EXPECT_THROW(hardware_apply_compute(hw, bad), Error);
  bad = file;
  bad["kernels"]["memory"][0]["ms"] = 0;
  EXPECT_THROW(hardware_apply_compute(hw, bad), Error);
  bad = file;
  bad["kernels"]["grad_norm"] = {{"elements", 10}, {"GBps", -1}};
  EXPECT_THROW(hardware_apply_compute(hw, bad), Error);
  // Wrong types are refused as tandem errors, not JSON library ones.
  bad = file;
  bad["kernels"]["optimizer"] = {{"elements", "many"}, {"GBps", 1}};
  EXPECT_THROW(hardware_apply_compute(hw, bad), Error);
  bad = file;
  bad["kernels"]["model"] = {{"name", "gpt2"}, {"batch", "16"}};
  EXPECT_THROW(hardware_apply_compute(hw, bad), Error);
}

// A CPU's tables carry AdamW's and the gradient norm's rates; both come back from the file,
// files without them leave them unmeasured, and the plan prices the ops at them.
TEST(PlanKernels, OptimizerAndGradientNormRates) {
  KernelRates k;
  k.device = "cpu";
  k.entries = {{call(KernelOp::layernorm_forward, {64, 128, 1}), 0.02}};
  k.optimizer_elements = 1000;
  k.optimizer_GBps = 7;
  k.grad_norm_GBps = 3;
  const nlohmann::json kj = kernel_rates_to_json(k);
  EXPECT_EQ(kj.at("grad_norm").at("elements"), 1000);
  const nlohmann::json file = {{"device", "cpu"}, {"tflops_f32", 0.1}, {"tflops_bf16", nullptr},
                               {"copy_GBps", 10}, {"mem_GiB", 16},     {"kernels", kj}};
  Hardware hw = hardware_preset("cpu-local");
  hardware_apply_compute(hw, file);
  ASSERT_TRUE(hw.kernels != nullptr);
  EXPECT_DOUBLE_EQ(hw.kernels->optimizer_GBps, 7);
  EXPECT_DOUBLE_EQ(hw.kernels->grad_norm_GBps, 3);
  EXPECT_EQ(hw.kernels->optimizer_elements, 1000);

  // Two ranks, so that the gradient shards are cleared (one rank accumulates in the shard)
  // and the clear is seen to stay at the copy bandwidth.
  PlanRequest r;
  r.model = gpt2_one_block();
  r.ranks = 2;
  r.batch = 2;
  r.seq = 32;
  r.hw = hw;
  const ModelLayout m(r.model);
  const Program p = program_build(m, plan_program_spec(r, Strategy::full));
  const double elements = static_cast<double>(FlatLayout(m, p.shard_size).shard_total());
  for (const bool measured : {true, false}) {
    SCOPED_TRACE(measured ? "measured" : "files without the rates");
    if (!measured) {
      nlohmann::json older = file;
      older["kernels"].erase("grad_norm");
      older["kernels"]["optimizer"] = nullptr;
      hardware_apply_compute(r.hw, older);
      ASSERT_TRUE(r.hw.kernels != nullptr);
      EXPECT_EQ(r.hw.kernels->grad_norm_GBps, 0);
      EXPECT_EQ(r.hw.kernels->optimizer_GBps, 0);
    }
    const std::vector<OpCost> costs = program_costs(m, p, r.hw, 2, 32);
    int priced = 0;
    for (size_t i = 0; i < p.ops.size(); ++i) {
      if (p.ops[i].kind == OpKind::grad_norm) {
        EXPECT_DOUBLE_EQ(costs[i].ms, measured ? elements * 4 / 3e6 : r.hw.memory_ms(elements * 4));
        ++priced;
      }
      if (p.ops[i].kind == OpKind::optimizer) {
        EXPECT_DOUBLE_EQ(costs[i].ms,
                         measured ? elements * 28 / 7e6 : r.hw.memory_ms(elements * 28));
        ++priced;
      }
      if (p.ops[i].kind == OpKind::zero_grad_shards) {
        EXPECT_DOUBLE_EQ(costs[i].ms, r.hw.memory_ms(elements * 4));
        ++priced;
      }
    }
    EXPECT_EQ(priced, 3);
  }
}

TEST(PlanKernels, PlanSaysHowItsCallsWerePriced) {
  PlanRequest r;
  r.model = gpt2_one_block();
  r.batch = 2;
  r.seq = 32;
  r.strategy = "none";
  auto k = std::make_shared<KernelRates>();
  k->compute_bytes = 4;
  // Only the layernorms measured, and one GEMM interpolated from another shape.
  k->entries = {{call(KernelOp::layernorm_forward, {64, 128, 1}), 0.01},
                {call(KernelOp::linear_forward, {64, 128, 128, 1}), 0.2}};
  r.hw = cpu_hw(k);
  const PlanResult plan = plan_run(r);
  ASSERT_TRUE(plan.kernel_cost.has_value());
  // embedding 1 + block 7 + 8 + head 2 + 4 + embedding backward 1.
  EXPECT_EQ(plan.kernel_cost->calls, 23);
  EXPECT_EQ(plan.kernel_cost->measured, 3);      // two in the block, one in the head
  EXPECT_EQ(plan.kernel_cost->interpolated, 2);  // qkv and the head's product
  EXPECT_EQ(plan.kernel_cost->ceiling, 18);
  const nlohmann::json j = plan_to_json(plan);
  EXPECT_EQ(j.at("kernel_cost").at("measured"), 3);
  bool noted = false;
  for (const std::string& n : plan.notes)
    noted = noted || n.find("units priced by the kernel tables") == 0;
  EXPECT_TRUE(noted);
}

}  // namespace
}  // namespace tandem
