// The step program: the checker accepts every strategy at every world size and unit
// count, and catches deliberately broken programs; the schedule has the prefetch and the
// memory bound of `--max-gathered` (at most that many gathered units alive at once).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "core/error.h"
#include "shard/program.h"

using namespace tandem;

namespace {

ModelConfig small(Family family, int layers) {
  ModelConfig c = preset(family == Family::gpt2 ? "gpt2-tiny" : "llama-tiny");
  c.n_layer = layers;
  return c;
}

ProgramSpec spec_for(Strategy s, int world, int micro = 1) {
  ProgramSpec spec;
  spec.strategy = s;
  spec.world = world;
  spec.micro_steps = micro;
  spec.shard_group = s == Strategy::hybrid ? (world % 2 == 0 ? 2 : 1) : 0;
  spec.activation_bytes = 1 << 20;
  return spec;
}

int count(const Program& p, OpKind k, int unit = -1) {
  return static_cast<int>(std::count_if(p.ops.begin(), p.ops.end(), [&](const Op& op) {
    return op.kind == k && (unit < 0 || op.unit == unit);
  }));
}

Program full_program(const ModelLayout& m, int world = 2) {
  return program_build(m, spec_for(Strategy::full, world));
}

}  // namespace

TEST(Program, CheckerAcceptsEveryStrategyWorldSizeAndUnitCount) {
  for (Family f : {Family::gpt2, Family::llama})
    for (int layers : {1, 2, 5})
      for (Strategy s : {Strategy::full, Strategy::grad_op, Strategy::none, Strategy::hybrid})
        for (int world : {1, 2, 3, 4, 8})
          for (int micro : {1, 3}) {
            ModelLayout m(small(f, layers));
            Program p = program_build(m, spec_for(s, world, micro));
            SCOPED_TRACE(fmt::format("{} L={} {} W={} M={}", family_name(f), layers,
                                     strategy_name(s), world, micro));
            EXPECT_NO_THROW(program_check(m, p));
            const int U = m.num_units();
            EXPECT_EQ(count(p, OpKind::forward), U * micro);
            EXPECT_EQ(count(p, OpKind::backward), U * micro);
            const bool local = s == Strategy::none || s == Strategy::grad_op;
            // [Gradients in the shard] where the shard group is one rank and the sums keep
            // their order: no unsharded gradients, no reduce-scatter, no step-wide clear.
            const bool in_shard = p.shard_size == 1 && (local || micro == 1);
            EXPECT_EQ(p.grads_in_shard, in_shard);
            EXPECT_EQ(count(p, OpKind::reduce), in_shard ? 0 : U * (local ? 1 : micro));
            EXPECT_EQ(count(p, OpKind::zero_grad_shards), in_shard ? 0 : 1);
            EXPECT_EQ(count(p, OpKind::replicate_reduce), p.replicas > 1 ? U : 0);
            EXPECT_EQ(count(p, OpKind::optimizer), 1);
            // The switch's other side is the general path, also safe.
            ProgramSpec general = spec_for(s, world, micro);
            general.grads_in_shard = false;
            Program q = program_build(m, general);
            EXPECT_NO_THROW(program_check(m, q));
            EXPECT_FALSE(q.grads_in_shard);
            EXPECT_EQ(count(q, OpKind::reduce), U * (local ? 1 : micro));
          }
}

// [Reduce dtype] The engine's reduce scratch follows what the program's reduces do: f32 needs
// one fp32 largest shard only where a windowed strategy's later micro-steps add through it;
// bf16 casts each unit's gradient into a bf16 largest padded unit where something is
// reduce-scattered, and the reduce-scatter or the replica all-reduce works in a bf16 largest
// shard.
TEST(Program, ReduceScratchIsWhatTheReducesUse) {
  const ModelLayout m(small(Family::llama, 2));
  struct Case {
    Strategy s;
    int world, micro;
    DType d;
    bool f32, unit16, shard16;
  };
  for (const Case k : {
           Case{Strategy::full, 1, 1, DType::f32, false, false, false},  // in the shard
           Case{Strategy::full, 2, 1, DType::f32, false, false, false},  // writes the shard
           Case{Strategy::full, 2, 2, DType::f32, true, false, false},   // m1 adds
           Case{Strategy::full, 1, 2, DType::f32, true, false, false},   // general path at M=2
           Case{Strategy::none, 2, 2, DType::f32, false, false, false},  // in the shard
           Case{Strategy::grad_op, 2, 2, DType::f32, false, false, false},
           Case{Strategy::none, 1, 1, DType::bf16, false, true, true},   // the rounding copy
           Case{Strategy::none, 2, 1, DType::bf16, false, false, true},  // all-reduce only
           Case{Strategy::full, 2, 1, DType::bf16, false, true, true},
       }) {
    ProgramSpec spec = spec_for(k.s, k.world, k.micro);
    spec.reduce_dtype = k.d;
    const Program p = program_build(m, spec);
    const FlatLayout flat(m, p.shard_size);
    const ReduceScratch r = reduce_scratch(flat, p);
    SCOPED_TRACE(fmt::format("{} W={} M={} {}", strategy_name(k.s), k.world, k.micro,
                             k.d == DType::f32 ? "f32" : "bf16"));
    EXPECT_EQ(r.f32_shard, k.f32 ? flat.largest_shard() : 0);
    EXPECT_EQ(r.bf16_unit, k.unit16 ? flat.largest_padded() : 0);
    EXPECT_EQ(r.bf16_shard, k.shard16 ? flat.largest_shard() : 0);
    EXPECT_EQ(r.bytes(), uint64_t(4 * r.f32_shard + 2 * (r.bf16_unit + r.bf16_shard)));
  }
}

// [Gradients in the shard] For `none` at one rank every unsharded gradient buffer lives from
// its unit's first backward to the end of the step, beside everything else, so keeping the
// gradients in the shards takes exactly those buffers (each rounded up to the arena's 256
// bytes) out of the arena; the persistent shards are unchanged. The checker refuses a
// shard-held gradient that the first backward does not clear.
TEST(Program, GradientsInTheShardLeaveTheUnshardedBuffersOut) {
  ModelLayout m(small(Family::llama, 3));
  ProgramSpec on = spec_for(Strategy::none, 1, 2), off = on;
  off.grads_in_shard = false;
  const Program a = program_build(m, on), b = program_build(m, off);
  size_t grad_bytes = 0;
  for (const Buffer& buf : b.buffers)
    if (buf.kind == BufferKind::grad_full) grad_bytes += (buf.bytes + 255) / 256 * 256;
  EXPECT_GT(grad_bytes, 0u);
  for (const Buffer& buf : a.buffers) EXPECT_NE(buf.kind, BufferKind::grad_full) << buf.name;
  EXPECT_EQ(b.arena_bytes - a.arena_bytes, grad_bytes);
  EXPECT_EQ(a.persistent_bytes, b.persistent_bytes);

  // bf16 reduction on one rank keeps its reduce (the rounding), and with replicas it does not.
  ProgramSpec bf16 = spec_for(Strategy::none, 1, 2);
  bf16.reduce_dtype = DType::bf16;
  EXPECT_FALSE(program_build(m, bf16).grads_in_shard);
  bf16.world = 2;
  EXPECT_TRUE(program_build(m, bf16).grads_in_shard);

  Program broken = a;
  for (Op& op : broken.ops)
    if (op.kind == OpKind::backward) op.zero_first.clear();
  try {
    program_check(m, broken);
    ADD_FAILURE() << "the checker took a gradient shard accumulated into without a clear";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("accumulated into without being cleared"), std::string::npos)
        << e.message();
  }
}

// [Embedding backward gathers nothing] The embedding's backward reads no parameter, under
// every strategy and for a tied head too, yet writes the embedding's gradient (which the
// tied head's backward starts). Under full, an untied embedding is gathered once a
// micro-step, a tied one for its forward and for the head's.
TEST(Program, TheEmbeddingsBackwardReadsNoParameters) {
  for (Family f : {Family::gpt2, Family::llama})
    for (Strategy s : {Strategy::full, Strategy::grad_op, Strategy::none, Strategy::hybrid}) {
      ModelLayout m(small(f, 2));
      const bool tied = m.config().tied_head;
      SCOPED_TRACE(fmt::format("{} {}", tied ? "tied" : "untied", strategy_name(s)));
      const Program p = program_build(m, spec_for(s, 2, 2));
      for (const Op& op : p.ops) {
        if (op.kind != OpKind::backward || op.unit != 0) continue;
        EXPECT_TRUE(op.params.empty());
        ASSERT_EQ(op.grads.size(), 1u);
        EXPECT_EQ(op.grads[0].unit, 0);
      }
      const int head = m.num_units() - 1;
      for (const Op& op : p.ops) {
        if (op.kind == OpKind::backward && op.unit == head) {
          EXPECT_EQ(op.grads.size(), tied ? 2u : 1u);
        }
      }
      if (s == Strategy::full) {
        EXPECT_EQ(count(p, OpKind::gather, 0), (tied ? 2 : 1) * 2);  // two micro-steps
      }
    }
}

TEST(Program, FullShardingGathersTwicePerMicroStepAndBoundsGatheredUnits) {
  ModelLayout m(small(Family::llama, 4));
  Program p = full_program(m, 4);
  const int U = m.num_units();
  // Each block is gathered for its forward and again for its backward; the head's forward
  // and backward are adjacent and share one gathered copy; the (untied) embedding is gathered
  // for its forward only ([Embedding backward gathers nothing]).
  for (int u = 1; u < U - 1; ++u) EXPECT_EQ(count(p, OpKind::gather, u), 2) << u;
  EXPECT_EQ(count(p, OpKind::gather, U - 1), 1);
  EXPECT_EQ(count(p, OpKind::gather, 0), 1);
  // At no issue position are more than max_gathered gathered copies alive.
  for (size_t i = 0; i < p.ops.size(); ++i) {
    int live = 0;
    for (const Buffer& b : p.buffers)
      live += b.kind == BufferKind::gathered && b.first <= static_cast<int>(i) &&
              static_cast<int>(i) <= b.last;
    EXPECT_LE(live, 2) << "at op " << i;
  }
}

TEST(Program, PrefetchesTheNextUnitWhileComputingThisOne) {
  ModelLayout m(small(Family::gpt2, 3));
  Program p = full_program(m);
  // The gather of block 1 is issued before the forward of unit 0 completes (it does not
  // wait on it), and the forward of unit 1 waits on it.
  int fwd0 = -1, gather1 = -1, fwd1 = -1;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const Op& op = p.ops[i];
    if (op.kind == OpKind::forward && op.unit == 0) fwd0 = static_cast<int>(i);
    if (op.kind == OpKind::gather && op.unit == 1 && gather1 < 0) gather1 = static_cast<int>(i);
    if (op.kind == OpKind::forward && op.unit == 1) fwd1 = static_cast<int>(i);
  }
  ASSERT_GE(gather1, 0);
  EXPECT_LT(gather1, fwd0);  // issued ahead of the compute it overlaps
  const auto& w = p.ops[static_cast<size_t>(fwd1)].waits;
  EXPECT_NE(std::find(w.begin(), w.end(), gather1), w.end());
  // Reduce of each block is issued right after its backward, on the reduce stream.
  for (size_t i = 0; i + 1 < p.ops.size(); ++i)
    if (p.ops[i].kind == OpKind::backward && p.ops[i].unit > 0 &&
        p.ops[i].unit < m.num_units() - 1) {
      EXPECT_EQ(p.ops[i + 1].kind, OpKind::reduce);
      EXPECT_EQ(p.ops[i + 1].unit, p.ops[i].unit);
      EXPECT_EQ(p.ops[i + 1].stream, StreamRole::reduce);
    }
}

TEST(Program, MemoryFollowsTheStrategy) {
  ModelLayout m(small(Family::llama, 8));
  const size_t full = program_build(m, spec_for(Strategy::full, 4)).arena_bytes;
  const size_t gradop = program_build(m, spec_for(Strategy::grad_op, 4)).arena_bytes;
  const size_t none = program_build(m, spec_for(Strategy::none, 4)).arena_bytes;
  // grad-op and none keep every unit gathered and every gradient unsharded; full keeps two
  // units and a few gradient buffers.
  EXPECT_LT(full, gradop);
  EXPECT_LT(full, none);
  const Program pf = program_build(m, spec_for(Strategy::full, 4));
  const Program pn = program_build(m, spec_for(Strategy::none, 4));
  EXPECT_LT(pf.persistent_bytes * 3, pn.persistent_bytes);  // shards are a quarter
}

TEST(Program, RejectsInconsistentSpecs) {
  ModelLayout gpt(small(Family::gpt2, 2));
  ProgramSpec s = spec_for(Strategy::hybrid, 4);
  s.shard_group = 3;
  EXPECT_THROW(program_build(gpt, s), Error);
  s.shard_group = 0;
  EXPECT_THROW(program_build(gpt, s), Error);
  ProgramSpec k = spec_for(Strategy::full, 2);
  k.max_gathered = 1;  // the tied head reads two units at once
  EXPECT_THROW(program_build(gpt, k), Error);
  ModelLayout llama(small(Family::llama, 2));
  EXPECT_NO_THROW(program_build(llama, k));
}

TEST(Program, CatchesAMissingWait) {
  ModelLayout m(small(Family::llama, 3));
  Program p = full_program(m);
  for (Op& op : p.ops)
    if (op.kind == OpKind::forward && op.unit == 2) {
      ASSERT_FALSE(op.waits.empty());
      op.waits.clear();
      break;
    }
  try {
    program_check(m, p);
    FAIL() << "a forward without its gather's wait passed the checker";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("unordered accesses to gathered"), std::string::npos) << e.message();
  }
}

TEST(Program, CatchesABufferReusedTooEarly) {
  ModelLayout m(small(Family::llama, 4));
  // A gather that overwrites a copy while the compute stream may still read it: drop the
  // wait that makes the gather of copy j wait for the last use of copy j - K.
  Program p = full_program(m);
  bool dropped = false;
  for (Op& op : p.ops)
    if (op.kind == OpKind::gather && !op.waits.empty()) {
      op.waits.clear();
      dropped = true;
      break;
    }
  ASSERT_TRUE(dropped);
  EXPECT_THROW(program_check(m, p), Error);

  // Two copies alive at once placed at the same offset.
  Program q = full_program(m);
  int a = -1, b = -1;
  for (size_t i = 0; i < q.buffers.size() && b < 0; ++i)
    for (size_t j = i + 1; j < q.buffers.size(); ++j) {
      const Buffer &x = q.buffers[i], &y = q.buffers[j];
      if (x.kind == BufferKind::gathered && y.kind == BufferKind::gathered && x.first <= y.last &&
          y.first <= x.last) {
        a = static_cast<int>(i);
        b = static_cast<int>(j);
        break;
      }
    }
  ASSERT_GE(b, 0);
  q.buffers[static_cast<size_t>(b)].offset = q.buffers[static_cast<size_t>(a)].offset;
  try {
    program_check(m, q);
    FAIL() << "overlapping live buffers passed the checker";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("shared arena bytes"), std::string::npos) << e.message();
  }
}

TEST(Program, CatchesAUnitReducedTwice) {
  ModelLayout m(small(Family::gpt2, 2));
  Program p = full_program(m);
  size_t at = 0;
  while (p.ops[at].kind != OpKind::reduce) ++at;
  Op again = p.ops[at];
  again.waits.clear();
  p.ops.insert(p.ops.begin() + static_cast<long>(at) + 1, again);
  // Ops after the copy refer to ops shifted by one.
  for (size_t i = at + 2; i < p.ops.size(); ++i)
    for (int& w : p.ops[i].waits)
      if (w > static_cast<int>(at)) ++w;
  try {
    program_check(m, p);
    FAIL() << "a unit reduced twice passed the checker";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("reduced 2 times"), std::string::npos) << e.message();
  }
}

// [Update at gather] Every strategy, world size, micro-step count and gradient path: one
// update per unit on the gather stream right before the unit's first gather, no AdamW op at the
// end, and the checker's proof holds. Broken on purpose: an update moved past its gather, a
// unit left without one, and an update in a program that updates at its end.
TEST(Program, UpdatesAtGatherComeBeforeEachUnitsFirstGather) {
  for (Family f : {Family::gpt2, Family::llama})
    for (Strategy s : {Strategy::full, Strategy::grad_op, Strategy::none, Strategy::hybrid})
      for (int world : {1, 2, 3, 4})
        for (int micro : {1, 3})
          for (bool in_shard : {true, false}) {
            ModelLayout m(small(f, 3));
            ProgramSpec spec = spec_for(s, world, micro);
            spec.update_at_gather = true;
            spec.grads_in_shard = in_shard;
            SCOPED_TRACE(fmt::format("{} {} W={} M={} in shard {}", family_name(f),
                                     strategy_name(s), world, micro, in_shard));
            const Program p = program_build(m, spec);
            EXPECT_NO_THROW(program_check(m, p));
            const int U = m.num_units();
            EXPECT_EQ(count(p, OpKind::optimizer), 0);
            EXPECT_EQ(count(p, OpKind::update), U);
            EXPECT_EQ(count(p, OpKind::grad_norm), 1);
            std::vector<bool> seen(static_cast<size_t>(U), false);
            for (size_t i = 0; i < p.ops.size(); ++i) {
              const Op& op = p.ops[i];
              if (op.kind != OpKind::gather || seen[static_cast<size_t>(op.unit)]) continue;
              seen[static_cast<size_t>(op.unit)] = true;
              ASSERT_GT(i, 0u);
              EXPECT_EQ(p.ops[i - 1].kind, OpKind::update);
              EXPECT_EQ(p.ops[i - 1].unit, op.unit);
              EXPECT_EQ(p.ops[i - 1].stream, StreamRole::gather);
            }
          }

  ModelLayout m(small(Family::llama, 3));
  ProgramSpec spec = spec_for(Strategy::full, 2);
  spec.update_at_gather = true;
  const Program good = program_build(m, spec);
  auto expect_refused = [&](const Program& p, const std::string& what) {
    try {
      program_check(m, p);
      ADD_FAILURE() << "passed the checker: " << what;
    } catch (const Error& e) {
      EXPECT_NE(e.message().find(what), std::string::npos) << e.message();
    }
  };
  {  // the update of unit 2 and its gather swapped: the gather reads the old parameters
    Program p = good;
    size_t at = 0;
    while (!(p.ops[at].kind == OpKind::update && p.ops[at].unit == 2)) ++at;
    ASSERT_EQ(p.ops[at + 1].kind, OpKind::gather);
    std::swap(p.ops[at], p.ops[at + 1]);
    expect_refused(p, "a gather is not after the unit's update");
  }
  {  // unit 1 never updated
    Program p = good;
    for (Op& op : p.ops)
      if (op.kind == OpKind::update && op.unit == 1) op.kind = OpKind::grad_norm;
    expect_refused(p, "unit block.0 is never updated");
  }
  {  // updates in a program that says it updates at its end
    Program p = good;
    p.spec.update_at_gather = false;
    expect_refused(p, "updated at its gather in a program that updates at its end");
  }
}

TEST(Program, PrintsEveryOp) {
  ModelLayout m(small(Family::llama, 2));
  Program p = full_program(m);
  const std::string text = program_print(m, p);
  size_t lines = static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
  EXPECT_GT(lines, p.ops.size());
  EXPECT_NE(text.find("all-gather"), std::string::npos);
  EXPECT_NE(text.find("reduce-scatter"), std::string::npos);
  EXPECT_NE(text.find("memory per rank"), std::string::npos);
}

TEST(Program, LargeModelsBuildAndCheckQuickly) {
  ModelLayout m(preset("gpt2-1558m"));
  ProgramSpec s = spec_for(Strategy::full, 8, 4);
  Program p = program_build(m, s);
  EXPECT_NO_THROW(program_check(m, p));
  EXPECT_EQ(count(p, OpKind::reduce), m.num_units() * 4);
}
