// The cost model of `tandem plan` against hand-worked arithmetic: bytes per collective
// per strategy, memory per rank, decode bytes per token (the FSDP collapse of the field
// report), the list scheduler on hand-built programs, the link fit, JSON and the CLI.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "core/error.h"
#include "plan/hardware.h"
#include "plan/plan.h"
#include "shard/flat.h"

using namespace tandem;

namespace {

// llama-tiny with one block: units embedding, block.0, head.
//   embedding: 256 x 128                                   = 32768
//   block: norms 2 x 128, qkv (4+2+2)x32 x 128 = 256 x 128, proj 128 x 128,
//          w13 704 x 128, w2 128 x 352                     = 184576
//   head: norm 128 + 256 x 128                             = 32896
// Padded to a multiple of 4 x 64 = 256 elements at W=4: 32768, 184576, 33024; to 64 at
// W=1: unchanged.
constexpr double kEmb = 32768, kBlock = 184576, kHead = 32896, kHead4 = 33024;

ModelConfig toy() {
  ModelConfig c = preset("llama-tiny");
  c.n_layer = 1;
  return c;
}

// A GPU-like machine with round numbers: bf16 gathers (2 bytes), fp32 gradients (4).
Hardware round_hw() {
  Hardware hw = hardware_preset("h100-sxm");
  hw.tflops = 100;
  hw.hbm_GBps = 1000;
  hw.mem_GiB = 80;
  for (LinkModel* l : {&hw.all_gather, &hw.reduce_scatter, &hw.all_reduce}) {
    l->GBps = 10;
    l->latency_us = 5;
  }
  return hw;
}

PlanRequest toy_request(int ranks) {
  PlanRequest r;
  r.model = toy();
  r.ranks = ranks;
  r.batch = 2;
  r.seq = 16;
  r.hw = round_hw();
  return r;
}

struct Moved {
  int gathers = 0;
  double gather = 0, reduce = 0, all_reduce = 0;
};

Moved moved(const PlanRequest& r, Strategy s) {
  const ModelLayout m(r.model);
  const Program p = program_build(m, plan_program_spec(r, s));
  const std::vector<OpCost> costs = program_costs(m, p, r.hw, r.batch, r.seq);
  Moved mv;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    if (p.ops[i].kind == OpKind::gather) {
      ++mv.gathers;
      mv.gather += costs[i].link_bytes;
    }
    if (p.ops[i].kind == OpKind::reduce) mv.reduce += costs[i].link_bytes;
    if (p.ops[i].kind == OpKind::replicate_reduce) mv.all_reduce += costs[i].link_bytes;
  }
  return mv;
}

Op op_on(OpKind k, StreamRole s, std::vector<int> waits) {
  Op op;
  op.kind = k;
  op.stream = s;
  op.waits = std::move(waits);
  return op;
}

}  // namespace

TEST(Plan, ToyModelUnitSizesMatchTheHandCount) {
  const ModelLayout m(toy());
  ASSERT_EQ(m.num_units(), 3);
  EXPECT_EQ(m.unit(0).numel, kEmb);
  EXPECT_EQ(m.unit(1).numel, kBlock);
  EXPECT_EQ(m.unit(2).numel, kHead);
  const FlatLayout f4(m, 4);
  EXPECT_EQ(f4.unit(2).padded, kHead4);
}

TEST(Plan, BytesPerCollectivePerStrategy) {
  const PlanRequest r = toy_request(4);
  // full: every unit gathered for the forward and again for the backward, except the head
  // (its forward and backward are adjacent and share one copy) and the untied embedding
  // (its backward reads no parameter): 4 gathers of 3/4 of the bf16 unit each; one
  // reduce-scatter of 3/4 of each fp32 gradient per micro-step.
  const Moved full = moved(r, Strategy::full);
  EXPECT_EQ(full.gathers, 4);
  EXPECT_DOUBLE_EQ(full.gather, (kEmb + 2 * kBlock + kHead4) * 2 * 3 / 4);  // 652416
  EXPECT_DOUBLE_EQ(full.reduce, (kEmb + kBlock + kHead4) * 4 * 3 / 4);      // 751104
  EXPECT_DOUBLE_EQ(full.all_reduce, 0);
  // grad-op: each unit gathered once per step.
  const Moved grad_op = moved(r, Strategy::grad_op);
  EXPECT_EQ(grad_op.gathers, 3);
  EXPECT_DOUBLE_EQ(grad_op.gather, (kEmb + kBlock + kHead4) * 2 * 3 / 4);
  EXPECT_DOUBLE_EQ(grad_op.reduce, full.reduce);
  // none: gathers and reduces are local copies; every gradient is all-reduced once,
  // 2(W-1)/W of the fp32 buffer per rank.
  const Moved none = moved(r, Strategy::none);
  EXPECT_DOUBLE_EQ(none.gather, 0);
  EXPECT_DOUBLE_EQ(none.reduce, 0);
  EXPECT_DOUBLE_EQ(none.all_reduce, 2 * (kEmb + kBlock + kHead) * 4 * 3 / 4);  // 1501440
  // Two micro-steps: full reduces twice, grad-op and none still once.
  PlanRequest r2 = r;
  r2.micro_steps = 2;
  EXPECT_DOUBLE_EQ(moved(r2, Strategy::full).reduce, 2 * full.reduce);
  EXPECT_DOUBLE_EQ(moved(r2, Strategy::grad_op).reduce, full.reduce);
}

TEST(Plan, CollectiveTimeIsLatencyPlusBusBytesOverBandwidth) {
  const PlanRequest r = toy_request(4);
  const ModelLayout m(r.model);
  const Program p = program_build(m, plan_program_spec(r, Strategy::full));
  const std::vector<OpCost> costs = program_costs(m, p, r.hw, r.batch, r.seq);
  for (size_t i = 0; i < p.ops.size(); ++i)
    if (p.ops[i].kind == OpKind::gather && p.ops[i].unit == 1) {
      // 5 us + 184576 x 2 x 3/4 bytes at 10 GB/s (1e7 bytes per ms), after the cast of
      // the rank's fp32 quarter into bf16 (read 4, write 2 bytes per element).
      EXPECT_NEAR(costs[i].ms, 0.005 + kBlock * 2 * 0.75 / 1e7 + r.hw.memory_ms(kBlock / 4.0 * 6),
                  1e-12);
    }
  EXPECT_NEAR(r.hw.all_reduce_ms(1e6, 4), 0.005 + 2 * 1e6 * 0.75 / 1e7, 1e-12);
  EXPECT_EQ(r.hw.all_gather_ms(1e6, 1), 0);
}

TEST(Plan, ForwardFlopsFollowTheSixNRule) {
  // Forward plus backward (3x forward) over all units = 6 x matrix parameters x tokens
  // + 12 L d T per token (llm.c's count).
  const ModelLayout m(preset("gpt2-124m"));
  const ModelConfig& c = m.config();
  const Hardware hw = round_hw();
  const int B = 2, T = 128;
  double flops = 0;
  for (int u = 0; u < m.num_units(); ++u) flops += 3 * unit_forward_cost(m, u, B, T, hw).flops;
  const double C = c.d_model, L = c.n_layer, N = B * T;
  const double matrix_params = L * (C * 3 * C + C * C + 2 * C * 4 * C) + c.vocab_padded * C;
  EXPECT_NEAR(flops / (6 * matrix_params * N + 12 * L * C * T * N), 1.0, 1e-12);
}

TEST(Plan, MemoryPerRankFullVersusNone) {
  const PlanRequest r = toy_request(4);
  const ModelLayout m(r.model);
  // Persistent per rank: fp32 parameter, gradient and two AdamW shards (16 bytes).
  const Program full = program_build(m, plan_program_spec(r, Strategy::full));
  const Program none = program_build(m, plan_program_spec(r, Strategy::none));
  EXPECT_EQ(full.persistent_bytes, (kEmb + kBlock + kHead4) / 4 * 16);  // 1001472
  EXPECT_EQ(none.persistent_bytes, (kEmb + kBlock + kHead) * 16);       // 4003840
  // The prediction is the program's planned peak plus the engine's reduce scratch: none
  // here (one micro-step: full's reduce-scatters write the shard; none's gradients are in the
  // shard), and with two micro-steps full's later reduces go through one fp32 largest shard.
  const StrategyPlan pf = plan_train_strategy(r, Strategy::full);
  const StrategyPlan pn = plan_train_strategy(r, Strategy::none);
  EXPECT_DOUBLE_EQ(pf.peak_mem_bytes, static_cast<double>(full.peak_bytes()));
  EXPECT_DOUBLE_EQ(pn.peak_mem_bytes, static_cast<double>(none.peak_bytes()));
  PlanRequest r2 = r;
  r2.micro_steps = 2;
  const Program full2 = program_build(m, plan_program_spec(r2, Strategy::full));
  EXPECT_DOUBLE_EQ(plan_train_strategy(r2, Strategy::full).peak_mem_bytes,
                   static_cast<double>(full2.peak_bytes()) + kBlock / 4 * 4);
  // none gathers every unit once and keeps each until its backward: at the head's
  // backward all of them (bf16) are live beside the activations.
  EXPECT_GE(static_cast<double>(none.arena_bytes),
            (kEmb + kBlock + kHead) * 2 +
                static_cast<double>(plan_program_spec(r, Strategy::none).activation_bytes));
  EXPECT_LT(pf.peak_mem_bytes, pn.peak_mem_bytes);
  EXPECT_TRUE(pf.fits);
  PlanRequest tight = r;
  tight.hw.mem_GiB = (pf.peak_mem_bytes + 1) / 1073741824.0;
  EXPECT_TRUE(plan_train_strategy(tight, Strategy::full).fits);
  EXPECT_FALSE(plan_train_strategy(tight, Strategy::none).fits);
}

// [Reduce dtype] bf16 gradient reduction halves what the reduce-scatters and the replica
// all-reduces move (gathers are unchanged), so the link part of each reduce's time halves;
// the reduce stream's cast and widening cost memory time; and the engine's scratch is a
// bf16 copy of the largest unit and of its shard instead of an fp32 shard.
TEST(Plan, Bf16ReductionHalvesTheReduceBytes) {
  PlanRequest r = toy_request(4);
  r.micro_steps = 2;
  r.shard_group = 2;
  PlanRequest r16 = r;
  r16.reduce_dtype = DType::bf16;
  for (Strategy s : {Strategy::full, Strategy::grad_op, Strategy::none, Strategy::hybrid}) {
    const Moved a = moved(r, s), b = moved(r16, s);
    EXPECT_DOUBLE_EQ(b.gather, a.gather) << strategy_name(s);
    EXPECT_DOUBLE_EQ(b.reduce, a.reduce / 2) << strategy_name(s);
    EXPECT_DOUBLE_EQ(b.all_reduce, a.all_reduce / 2) << strategy_name(s);
  }
  // By hand: full reduce-scatters 3/4 of each bf16 gradient twice (2 micro-steps); none
  // all-reduces 2 x 3/4 of each bf16 gradient once.
  EXPECT_DOUBLE_EQ(moved(r16, Strategy::full).reduce, 2 * (kEmb + kBlock + kHead4) * 2 * 3 / 4);
  EXPECT_DOUBLE_EQ(moved(r16, Strategy::none).all_reduce, 2 * (kEmb + kBlock + kHead) * 2 * 3 / 4);
  EXPECT_GT(moved(r16, Strategy::hybrid).all_reduce, 0);

  // The block's first reduce under full: 5 us + bus bytes at 1e7 bytes per ms, plus under
  // bf16 the cast (read fp32, write bf16) of the unit and the widening of its shard at
  // 1e9 bytes per ms.
  const ModelLayout m(r.model);
  double ms[2] = {0, 0};
  for (const PlanRequest* q : {&r, &r16}) {
    const Program p = program_build(m, plan_program_spec(*q, Strategy::full));
    const std::vector<OpCost> costs = program_costs(m, p, q->hw, q->batch, q->seq);
    for (size_t i = 0; i < p.ops.size(); ++i)
      if (p.ops[i].kind == OpKind::reduce && p.ops[i].unit == 1 && p.ops[i].micro == 0)
        ms[q == &r16] = costs[i].ms;
  }
  EXPECT_NEAR(ms[0], 0.005 + kBlock * 4 * 0.75 / 1e7, 1e-12);
  EXPECT_NEAR(ms[1], 0.005 + kBlock * 2 * 0.75 / 1e7 + (kBlock * 6 + kBlock / 4 * 6) / 1e9, 1e-12);

  // Memory: the largest unit is the block; full's shard is a quarter of it.
  const StrategyPlan f32 = plan_train_strategy(r, Strategy::full);
  const StrategyPlan bf16 = plan_train_strategy(r16, Strategy::full);
  EXPECT_DOUBLE_EQ(bf16.peak_mem_bytes - f32.peak_mem_bytes,
                   (kBlock + kBlock / 4) * 2 - kBlock / 4 * 4);
  EXPECT_LT(bf16.comm_ms, f32.comm_ms);
}

TEST(Plan, ListScheduleOfThreeOps) {
  // gather 10 ms; forward waits on it, 5 ms; reduce waits on the forward, 3 ms.
  Program p;
  p.ops = {op_on(OpKind::gather, StreamRole::gather, {}),
           op_on(OpKind::forward, StreamRole::compute, {0}),
           op_on(OpKind::reduce, StreamRole::reduce, {1})};
  const Timeline t = schedule_simulate(p, {10, 5, 3});
  EXPECT_DOUBLE_EQ(t.start_ms[1], 10);
  EXPECT_DOUBLE_EQ(t.start_ms[2], 15);
  EXPECT_DOUBLE_EQ(t.step_ms, 18);
  EXPECT_DOUBLE_EQ(t.compute_ms, 5);
  EXPECT_DOUBLE_EQ(t.comm_ms, 13);
  EXPECT_DOUBLE_EQ(t.exposed_comm_ms, 10);
}

TEST(Plan, ListScheduleOverlapsPrefetch) {
  // Two gathers back to back (10, 4 ms); forwards of 5 and 6 ms wait on them; the second
  // gather ends at 14, before the first forward ends at 15, so it is hidden. A reduce
  // (2 ms) after the second forward; the optimizer (1 ms) waits on it: 2 ms exposed.
  Program p;
  p.ops = {op_on(OpKind::gather, StreamRole::gather, {}),
           op_on(OpKind::gather, StreamRole::gather, {}),
           op_on(OpKind::forward, StreamRole::compute, {0}),
           op_on(OpKind::forward, StreamRole::compute, {1}),
           op_on(OpKind::reduce, StreamRole::reduce, {3}),
           op_on(OpKind::optimizer, StreamRole::compute, {4})};
  const Timeline t = schedule_simulate(p, {10, 4, 5, 6, 2, 1});
  EXPECT_DOUBLE_EQ(t.start_ms[3], 15);
  EXPECT_DOUBLE_EQ(t.start_ms[5], 23);
  EXPECT_DOUBLE_EQ(t.step_ms, 24);
  EXPECT_DOUBLE_EQ(t.compute_ms, 12);
  EXPECT_DOUBLE_EQ(t.comm_ms, 16);
  EXPECT_DOUBLE_EQ(t.exposed_comm_ms, 12);
}

TEST(Plan, ListScheduleSharesTheLink) {
  // A gather (10 ms alone) and a reduce (6 ms alone) start together on one link: each runs
  // at half speed until the reduce ends at 12 (6 ms of work), then the gather finishes its
  // last 4 ms alone, at 16. The forward waits on the gather.
  Program p;
  p.ops = {op_on(OpKind::gather, StreamRole::gather, {}),
           op_on(OpKind::reduce, StreamRole::reduce, {}),
           op_on(OpKind::forward, StreamRole::compute, {0})};
  const Timeline shared = schedule_simulate(p, {10, 6, 5}, {true, true, false});
  EXPECT_DOUBLE_EQ(shared.end_ms[1], 12);
  EXPECT_DOUBLE_EQ(shared.end_ms[0], 16);
  EXPECT_DOUBLE_EQ(shared.step_ms, 21);
  EXPECT_DOUBLE_EQ(shared.comm_ms, 28);
  EXPECT_DOUBLE_EQ(shared.exposed_comm_ms, 16);
  // A local copy on a comm stream does not use the link.
  const Timeline apart = schedule_simulate(p, {10, 6, 5}, {true, false, false});
  EXPECT_DOUBLE_EQ(apart.end_ms[0], 10);
  EXPECT_DOUBLE_EQ(apart.step_ms, 15);
}

TEST(Plan, ListScheduleSharesTheProcessors) {
  // A forward (10 ms alone) and an update on the gather stream (4 ms alone) start together.
  // Sharing the processors, each runs at half speed until the update ends at 8 (4 ms of
  // work), then the forward finishes its last 6 ms alone, at 14: one after the other's
  // time. Not sharing (a CPU's update on a core of its own), the forward ends at 10.
  Program p;
  p.ops = {op_on(OpKind::update, StreamRole::gather, {}),
           op_on(OpKind::forward, StreamRole::compute, {})};
  const Timeline shared = schedule_simulate(p, {4, 10}, {}, {true, false});
  EXPECT_DOUBLE_EQ(shared.end_ms[0], 8);
  EXPECT_DOUBLE_EQ(shared.end_ms[1], 14);
  EXPECT_DOUBLE_EQ(shared.step_ms, 14);
  EXPECT_DOUBLE_EQ(shared.compute_ms, 14);  // the forward as it ran, stretched
  EXPECT_DOUBLE_EQ(shared.comm_ms, 0);      // an update is not communication
  const Timeline apart = schedule_simulate(p, {4, 10});
  EXPECT_DOUBLE_EQ(apart.end_ms[0], 4);
  EXPECT_DOUBLE_EQ(apart.step_ms, 10);
}

TEST(Plan, UpdatesAtGatherShareAGpusProcessors) {
  // [Processor sharing] On a GPU the updates beside the compute cost what they would cost
  // after it: the step is at least the compute's and the updates' work, as with the
  // optimizer at the step's end. On a CPU the gather stream's thread has a core of its own,
  // and the plan is the schedule of the updates running beside the compute at full speed.
  for (const bool gpu : {true, false}) {
    SCOPED_TRACE(gpu ? "gpu" : "cpu");
    PlanRequest r = toy_request(2);
    r.update_at_gather = true;
    if (!gpu) r.hw = hardware_preset("cpu-local");
    ASSERT_EQ(r.hw.gpu, gpu);
    const ModelLayout m(r.model);
    const Program p = program_build(m, plan_program_spec(r, Strategy::full));
    const std::vector<OpCost> costs = program_costs(m, p, r.hw, r.batch, r.seq);
    std::vector<double> ms;
    std::vector<bool> link, updates;
    double work = 0, update_ms = 0;
    for (size_t i = 0; i < p.ops.size(); ++i) {
      const bool update = p.ops[i].kind == OpKind::update;
      ms.push_back(costs[i].ms);
      link.push_back(costs[i].link_bytes > 0);
      updates.push_back(update);
      if (update) update_ms += costs[i].ms;
      if (update || p.ops[i].stream == StreamRole::compute) work += costs[i].ms;
    }
    ASSERT_GT(update_ms, 0);
    const double shared = schedule_simulate(p, ms, link, updates).step_ms;
    const double alone = schedule_simulate(p, ms, link).step_ms;
    // This program's updates do overlap its compute, so the two schedules differ.
    ASSERT_GT(shared, alone);
    const StrategyPlan on = plan_train_strategy(r, Strategy::full);
    EXPECT_DOUBLE_EQ(on.step_ms, gpu ? shared : alone);
    if (gpu) {
      EXPECT_GE(on.step_ms, work * (1 - 1e-9));
    }
  }
}

TEST(Plan, TrainStepIsComputePlusExposed) {
  // The optimizer ends every program on the compute stream, so the step is the compute
  // stream's busy time plus the time it waited.
  for (Strategy s : {Strategy::full, Strategy::grad_op, Strategy::none}) {
    PlanRequest r = toy_request(4);
    r.micro_steps = 2;
    const StrategyPlan sp = plan_train_strategy(r, s);
    EXPECT_NEAR(sp.step_ms, sp.compute_ms + sp.exposed_comm_ms, 1e-9 * sp.step_ms);
    EXPECT_GT(sp.exposed_comm_ms, 0);  // at least the first gather
  }
  // With free links only compute and the comm streams' local work remain: the gathers'
  // casts of the shards to bf16 at memory bandwidth, at most all of which can be exposed.
  PlanRequest fast = toy_request(4);
  for (LinkModel* l : {&fast.hw.all_gather, &fast.hw.reduce_scatter, &fast.hw.all_reduce}) {
    l->GBps = 1e9;
    l->latency_us = 0;
  }
  const StrategyPlan sp = plan_train_strategy(fast, Strategy::full);
  const ModelLayout m(fast.model);
  const Program p = program_build(m, plan_program_spec(fast, Strategy::full));
  const std::vector<OpCost> costs = program_costs(m, p, fast.hw, fast.batch, fast.seq);
  double casts = 0;
  for (size_t i = 0; i < p.ops.size(); ++i)
    if (p.ops[i].kind == OpKind::gather) casts += costs[i].ms;
  EXPECT_GT(casts, 0);
  EXPECT_LT(sp.exposed_comm_ms, casts + 1e-3 * sp.step_ms);
}

TEST(Plan, OverlapBoundWhenTheLinkIsTheBottleneck) {
  // GPT-2 1.5B on 8 GPUs over PCIe: communication dwarfs compute, so most of it is
  // exposed, but the link is busy for nearly the whole step: overlap cannot save much.
  PlanRequest r;
  r.model = preset("gpt2-1558m");
  r.ranks = 8;
  r.batch = 2;
  r.seq = 1024;
  r.hw = hardware_preset("pcie-gen4");
  const StrategyPlan sp = plan_train_strategy(r, Strategy::grad_op);
  EXPECT_GT(sp.exposed_comm_ms, 0.5 * sp.step_ms);
  EXPECT_DOUBLE_EQ(sp.min_step_ms, sp.link_ms);
  EXPECT_LE(sp.min_step_ms, sp.step_ms);
  EXPECT_LT(sp.step_ms - sp.min_step_ms, 0.1 * sp.step_ms);
  const PlanResult res = plan_run(r);
  EXPECT_NE(res.overlap.find("the links are busy"), std::string::npos) << res.overlap;
}

TEST(Plan, DecodeFsdpCollapsesOverPcie) {
  // The run that collapsed: Llama-2-7B (13.5 GB in bf16) decoded under FSDP on 2 GPUs
  // linked at 25 GB/s. FSDP gathers half the weights per token per rank: 6.74 GB / 25 GB/s
  // = 0.27 s, at most ~3.7 tok/s (measured: 2.5); one GPU streams 13.2 GB of weights per
  // token from HBM.
  PlanRequest r;
  r.task = PlanTask::generate;
  r.model = preset("llama2-7b");
  r.ranks = 2;
  r.batch = 1;
  r.seq = 64;
  r.hw = hardware_preset("pcie-gen4");
  const ModelLayout m(r.model);
  const FlatLayout f2(m, 2);
  const StrategyPlan fsdp = plan_generate_strategy(r, "fsdp");
  EXPECT_DOUBLE_EQ(fsdp.gather_bytes, static_cast<double>(f2.padded_total()) * 2 / 2);
  EXPECT_NEAR(fsdp.gather_bytes / 1e9, 6.74, 0.01);
  EXPECT_NEAR(fsdp.step_ms, fsdp.gather_bytes / 25e6 + m.num_units() * 0.030, 1e-9);
  EXPECT_GT(fsdp.tokens_per_s_batch1, 3.0);
  EXPECT_LT(fsdp.tokens_per_s_batch1, 3.8);
  EXPECT_NE(fsdp.bottleneck.find("fsdp gathers 6.74 GB"), std::string::npos) << fsdp.bottleneck;

  const StrategyPlan rep = plan_generate_strategy(r, "replicate");
  double read = 0;
  for (int u = 1; u < m.num_units(); ++u) read += static_cast<double>(m.unit(u).numel);
  const double kv = 2.0 * 32 * 64 * 32 * 128 * 2;  // K and V, 32 layers, 64 positions, bf16
  EXPECT_NEAR(rep.step_ms, (read * 2 + kv) / 1750e6, 1e-9);
  EXPECT_GT(rep.tokens_per_s_batch1, 30 * fsdp.tokens_per_s_batch1);
  EXPECT_NEAR(rep.peak_mem_bytes / 2, fsdp.peak_mem_bytes, 0.1 * rep.peak_mem_bytes);

  const PlanResult res = plan_run(r);
  ASSERT_GE(res.recommended, 0);
  EXPECT_NE(res.strategies[static_cast<size_t>(res.recommended)].name, "fsdp");
}

TEST(Plan, DecodeLayoutsAtOneRankAgree) {
  PlanRequest r;
  r.task = PlanTask::generate;
  r.model = preset("gpt2-124m");
  r.batch = 3;
  r.seq = 256;
  r.hw = round_hw();
  const double base = plan_generate_strategy(r, "replicate").step_ms;
  for (const std::string& s : plan_generate_strategies())
    EXPECT_NEAR(plan_generate_strategy(r, s).step_ms, base, 1e-12 * base) << s;
}

TEST(Plan, DecodePipelineAtBatchOneIsNoFasterThanOneRank) {
  PlanRequest r;
  r.task = PlanTask::generate;
  r.model = preset("llama2-7b");
  r.ranks = 4;
  r.batch = 8;
  r.seq = 128;
  r.hw = hardware_preset("h200-sxm");
  const StrategyPlan pipe = plan_generate_strategy(r, "pipeline");
  const StrategyPlan rep = plan_generate_strategy(r, "replicate");
  EXPECT_LE(pipe.tokens_per_s_batch1, rep.tokens_per_s_batch1);
  EXPECT_LT(pipe.peak_mem_bytes, 0.4 * rep.peak_mem_bytes);
  // gpt2-1558m has 25 heads: tp does not split it over 2 ranks.
  r.model = preset("gpt2-1558m");
  r.ranks = 2;
  const StrategyPlan tp = plan_generate_strategy(r, "tp");
  EXPECT_FALSE(tp.applicable);
  EXPECT_NE(tp.bottleneck.find("n_head 25"), std::string::npos);
}

// --strategy auto of generate: the field report's machine (2 ranks over PCIe) must not be
// given fsdp while another layout fits; fsdp only when nothing else fits; a clear sentence
// when nothing does.
TEST(Plan, AutoLayoutAvoidsFsdpWhileAnotherFits) {
  PlanRequest r;
  r.task = PlanTask::generate;
  r.model = preset("llama2-7b");
  r.ranks = 2;
  r.batch = 1;
  r.seq = 512;
  r.hw = hardware_preset("pcie-gen4");
  const std::vector<std::string> runnable = {"replicate", "fsdp", "tp"};
  const LayoutChoice c = plan_choose_layout(r, runnable);
  ASSERT_FALSE(c.name.empty()) << c.why;
  EXPECT_NE(c.name, "fsdp");
  EXPECT_NE(c.why.find(c.name), std::string::npos);
  // The choice is the fastest of what fits, as planned one by one.
  for (const std::string& n : runnable) {
    const StrategyPlan p = plan_generate_strategy(r, n);
    if (p.applicable && p.fits && n != "fsdp") {
      EXPECT_GE(c.plan.tokens_per_s * 1.02, p.tokens_per_s) << n;
    }
  }
  // gpt2-1558m's 25 heads do not split 2 ways, so tp does not apply; with memory for a shard
  // and two gathered units but not for the whole model, only fsdp fits.
  r.model = preset("gpt2-1558m");
  r.hw = hardware_preset("pcie-gen4");
  const StrategyPlan f = plan_generate_strategy(r, "fsdp");
  const StrategyPlan rep = plan_generate_strategy(r, "replicate");
  ASSERT_FALSE(plan_generate_strategy(r, "tp").applicable);
  ASSERT_LT(f.peak_mem_bytes, rep.peak_mem_bytes);
  r.hw.mem_GiB = (f.peak_mem_bytes + rep.peak_mem_bytes) / 2 / 1073741824.0;
  EXPECT_EQ(plan_choose_layout(r, runnable).name, "fsdp");
  // A pipeline holds half the blocks per rank: it fits there too, so auto takes it.
  const StrategyPlan pipe = plan_generate_strategy(r, "pipeline");
  ASSERT_TRUE(pipe.applicable);
  EXPECT_LT(pipe.peak_mem_bytes, rep.peak_mem_bytes * 0.6);
  if (pipe.peak_mem_bytes <= r.hw.mem_bytes()) {
    EXPECT_EQ(plan_choose_layout(r, {"replicate", "fsdp", "tp", "pipeline"}).name, "pipeline");
  }
  r.hw.mem_GiB = f.peak_mem_bytes / 2 / 1073741824.0;
  const LayoutChoice none = plan_choose_layout(r, runnable);
  EXPECT_TRUE(none.name.empty());
  EXPECT_NE(none.why.find("nothing fits"), std::string::npos) << none.why;
}

TEST(Plan, LinkFitRecoversLatencyAndBandwidth) {
  // 15 us + bus bytes at 100 GB/s (1e5 bytes per us).
  std::vector<std::pair<double, double>> pts;
  for (double b = 1024; b <= 1 << 30; b *= 4) pts.push_back({b, 15 + b / 1e5});
  const LinkModel l = link_fit(pts);
  EXPECT_NEAR(l.latency_us, 15, 1e-6);
  EXPECT_NEAR(l.GBps, 100, 1e-6);
  // A links file at 4 ranks: all-gather sizes are whole buffers, bus bytes 3/4 of them;
  // all-reduce missing borrows the reduce-scatter line.
  nlohmann::json ag = nlohmann::json::array(), rs = nlohmann::json::array();
  for (double b = 4096; b <= 1 << 28; b *= 8) {
    ag.push_back({{"bytes", b}, {"time_us", 8 + b * 0.75 / 2e5}});
    rs.push_back({{"bytes", b}, {"time_us", 9 + b * 0.75 / 1e5}});
  }
  Hardware hw = hardware_preset("cpu-local");
  hardware_apply_links(hw, {{"ranks", 4}, {"all_gather", ag}, {"reduce_scatter", rs}});
  EXPECT_NEAR(hw.all_gather.GBps, 200, 1e-6);
  EXPECT_NEAR(hw.all_gather.latency_us, 8, 1e-6);
  EXPECT_NEAR(hw.reduce_scatter.GBps, 100, 1e-6);
  EXPECT_NEAR(hw.all_reduce.GBps, 100, 1e-6);
  EXPECT_EQ(hw.links_ranks, 4);
  hardware_apply_compute(hw, {{"device", "cuda"},
                              {"tflops_f32", 60},
                              {"tflops_bf16", 700},
                              {"copy_GBps", 3000},
                              {"mem_GiB", 79}});
  EXPECT_TRUE(hw.gpu);
  EXPECT_EQ(hw.tflops, 700);
  EXPECT_EQ(hw.param_bytes, 2u);
  EXPECT_THROW(hardware_apply_compute(hw, {{"device", "tpu"}}), Error);
  EXPECT_THROW(hardware_apply_links(hw, {{"ranks", 4}}), Error);
}

TEST(Plan, JsonHasTheIssueKeys) {
  for (PlanTask task : {PlanTask::train, PlanTask::generate}) {
    PlanRequest r = toy_request(2);
    r.task = task;
    const nlohmann::json j = plan_to_json(plan_run(r));
    for (const char* k : {"task", "model", "ranks", "hardware", "strategies", "recommended", "why"})
      EXPECT_TRUE(j.contains(k)) << k;
    ASSERT_EQ(j["strategies"].size(), task == PlanTask::train ? 3u : 4u);
    for (const auto& s : j["strategies"])
      for (const char* k : {"name", "fits", "peak_mem_bytes", "step_ms", "tokens_per_s",
                            "compute_ms", "comm_ms", "exposed_comm_ms", "bottleneck"})
        EXPECT_TRUE(s.contains(k)) << k;
    EXPECT_TRUE(j["recommended"].is_string());
    if (task == PlanTask::train) {
      EXPECT_NE(j["overlap"].get<std::string>().find("perfect overlap gains at most"),
                std::string::npos);
    }
  }
}

TEST(Plan, NothingFitsSaysSo) {
  PlanRequest r;
  r.model = preset("llama2-7b");  // 108 GB of fp32 shards and AdamW state on one rank
  r.ranks = 1;
  r.batch = 1;
  r.seq = 512;
  r.hw = hardware_preset("a100-80g");
  const PlanResult res = plan_run(r);
  EXPECT_EQ(res.recommended, -1);
  EXPECT_NE(res.why.find("nothing fits"), std::string::npos) << res.why;
}

namespace tandem::cli_test {

TEST(PlanCli, GenerateJsonOverPcie) {
  const RunResult r = run_tandem({"plan", "--task", "generate", "--model", "llama2-7b", "--ranks",
                                  "2", "--hardware", "pcie-gen4", "--json"});
  ASSERT_TRUE(succeeded(r));
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["task"], "generate");
  EXPECT_NE(j["recommended"], "fsdp");
  for (const auto& s : j["strategies"])
    if (s["name"] == "fsdp") {
      EXPECT_LT(s["tokens_per_s_batch1"].get<double>(), 4.0);
    }
}

TEST(PlanCli, TrainTableWithScheduleAndProbeFiles) {
  TempDir dir;
  {
    std::ofstream(dir / "compute.json") << R"({"device": "cpu", "tflops_f32": 0.2,
        "tflops_bf16": 0.1, "copy_GBps": 12, "mem_GiB": 4})";
    std::ofstream(dir / "links.json") << R"({"ranks": 2, "sizes": [1024, 1048576],
        "all_gather": [{"bytes": 1024, "time_us": 10.1, "busbw_GBps": 0.05},
                       {"bytes": 1048576, "time_us": 115, "busbw_GBps": 4.6}]})";
  }
  const RunResult r =
      run_tandem({"plan", "--model", "gpt2-tiny", "--ranks", "2", "--compute", dir / "compute.json",
                  "--links", dir / "links.json", "--print-schedule"});
  ASSERT_TRUE(succeeded(r));
  for (const char* needle : {"step program: strategy full", "checked:", "recommended:",
                             "perfect overlap gains at most", "links probe"})
    EXPECT_NE(r.out.find(needle), std::string::npos) << needle << "\n" << r.out;
  EXPECT_TRUE(one_error_line(run_tandem({"plan", "--hardware", "tpu-v9"}), 1,
                             {"unknown hardware preset 'tpu-v9'"}));
  EXPECT_TRUE(one_error_line(run_tandem({"plan", "--task", "generate", "--print-schedule"}), 1,
                             {"--print-schedule"}));
  EXPECT_TRUE(one_error_line(run_tandem({"plan", "--links", dir / "compute.json"}), 1,
                             {"links probe file", "ranks"}));
}

// The precision planned is explicit: shown, settable, and a GPU's figures laid over the CPU
// preset are pointed out rather than silently planned in fp32.
TEST(PlanCli, DtypeIsExplicitAndSetsTheBytesPlanned) {
  const std::vector<std::string> gpu_figures = {"--tflops", "700",       "--hbm-GBps",
                                                "4000",     "--mem-GiB", "140"};
  auto plan = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"plan",       "--model", "gpt2-124m",
                                     "--strategy", "none",    "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run_tandem(args);
  };
  auto with = [&](std::vector<std::string> a, std::vector<std::string> b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const RunResult fp32 = plan(gpu_figures);
  ASSERT_TRUE(succeeded(fp32)) << fp32.err;
  EXPECT_NE(fp32.err.find("--dtype bf16"), std::string::npos) << fp32.err;
  const RunResult bf16 = plan(with(gpu_figures, {"--dtype", "bf16"}));
  ASSERT_TRUE(succeeded(bf16)) << bf16.err;
  EXPECT_EQ(bf16.err.find("--dtype bf16"), std::string::npos) << bf16.err;
  const auto j32 = nlohmann::json::parse(fp32.out), j16 = nlohmann::json::parse(bf16.out);
  EXPECT_EQ(j32["hardware"]["dtype"], "fp32");
  EXPECT_EQ(j16["hardware"]["dtype"], "bf16");
  EXPECT_EQ(j32["hardware"]["param_bytes"], 4);
  EXPECT_EQ(j16["hardware"]["param_bytes"], 2);
  EXPECT_EQ(j16["hardware"]["grad_bytes"], 4);
  // Replicated weights and activations in half the bytes: less memory per rank.
  EXPECT_LT(j16["strategies"][0]["peak_mem_bytes"].get<double>(),
            j32["strategies"][0]["peak_mem_bytes"].get<double>());
  // A GPU preset plans bf16 unless told otherwise, and says which.
  const RunResult h200 = plan({"--hardware", "h200-sxm"});
  ASSERT_TRUE(succeeded(h200));
  EXPECT_EQ(nlohmann::json::parse(h200.out)["hardware"]["dtype"], "bf16");
  const RunResult table =
      run_tandem({"plan", "--model", "gpt2-124m", "--hardware", "h200-sxm", "--dtype", "fp32"});
  ASSERT_TRUE(succeeded(table));
  EXPECT_NE(table.out.find("TFLOP/s fp32"), std::string::npos) << table.out;
  EXPECT_TRUE(one_error_line(run_tandem({"plan", "--dtype", "fp16"}), 1,
                             {"--dtype must be auto, bf16 or fp32, got 'fp16'"}));
}

}  // namespace tandem::cli_test
