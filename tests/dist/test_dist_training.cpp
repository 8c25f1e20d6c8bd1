// Distributed training equivalence under mpirun: N ranks reproduce one rank for every
// strategy (losses and final parameters within fp32 reduction-order error), gradient
// accumulation equals the large batch, and checkpoints continue bit for bit at the same
// world size and within tolerance at another.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "comm/comm_internal.h"
#include "core/error.h"
#include "dist/dist_env.h"
#include "io/dataset.h"
#include "io/shard_checkpoint.h"
#include "plan/trace.h"
#include "shard/engine.h"
#include "shard/engine_exec.h"

namespace tandem::dist {
namespace {

ModelConfig tiny(Family f) {
  ModelConfig c = preset(f == Family::gpt2    ? "gpt2-tiny"
                         : f == Family::llama ? "llama-tiny"
                                              : "pythia-tiny");
  // Sizes that are no multiple of 8 or of any world size: every unit needs padding.
  c.vocab = c.vocab_padded = 61;
  c.context = 16;
  c.d_model = 20;
  c.n_layer = 2;
  // Llama: two query heads share one key/value head (rotary needs an even head size).
  // GPT-NeoX: two heads of 10 channels, 4 of which rotate (rotary_pct 0.4).
  c.n_head = f == Family::gpt2 ? 4 : 2;
  c.n_kv_head = f == Family::llama ? 1 : c.n_head;
  if (f == Family::neox) c.rotary_pct = 0.4f;
  c.d_ff = 36;
  return c;
}

Dataset make_data(int T) {
  std::vector<uint32_t> tokens(3000);
  uint64_t s = 12345;
  for (auto& t : tokens)
    t = static_cast<uint32_t>(((s = s * 6364136223846793005ull + 1) >> 33) % 61);
  return Dataset(std::move(tokens), T, 7);
}

EngineConfig config(Strategy s, int batch, int shard_group = 0) {
  EngineConfig c;
  c.strategy = s;
  c.shard_group = shard_group;
  c.batch = batch;
  c.seq = 16;
  c.global_batch = 12;
  c.total_steps = 20;
  c.seed = 3;
  c.optim.lr = 3e-3f;
  c.optim.warmup = 3;
  return c;
}

const Dataset& data16() {
  static const Dataset data = make_data(16);
  return data;
}

// One optimizer step of e on this rank's share of the step's sequences.
StepResult run_step(Engine& e, const EngineConfig& c, Communicator& comm, int64_t step) {
  std::vector<int32_t> inputs, targets;
  data16().rank_batch(step, c.global_batch, c.batch, e.micro_steps(), comm.size(), comm.rank(),
                      inputs, targets);
  return e.step(step, StepBatch{inputs.data(), targets.data(), inputs.size()});
}

struct TrainRun {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;
};

TrainRun train(const ModelLayout& m, const EngineConfig& c, Communicator& comm, int steps,
               int64_t first = 0, Engine* reuse = nullptr) {
  std::unique_ptr<Engine> own;
  Engine* e = reuse;
  if (e == nullptr) {
    own = std::make_unique<Engine>(m, c, device(), comm);
    e = own.get();
  }
  TrainRun r;
  for (int64_t s = first; s < first + steps; ++s) r.losses.push_back(run_step(*e, c, comm, s).loss);
  r.params = e->gather_params();
  return r;
}

// Normalised difference ||a - b|| / ||b|| over all units.
double param_error(const TrainRun& a, const TrainRun& b) {
  double num = 0, den = 0;
  for (size_t u = 0; u < b.params.size(); ++u)
    for (size_t i = 0; i < b.params[u].size(); ++i) {
      const double d = static_cast<double>(a.params[u][i]) - b.params[u][i];
      num += d * d;
      den += static_cast<double>(b.params[u][i]) * b.params[u][i];
    }
  return std::sqrt(num / den);
}

// [Equivalence tolerance] N ranks sum each gradient element over ranks and micro-batches
// in another order than one rank: a relative difference of about eps32 * sqrt(terms),
// ~1e-6 for 12 sequences. AdamW divides each gradient by its running RMS, so a relative
// gradient error becomes a similar relative error of each update; over 20 steps of
// updates of size ~lr the parameters then differ by at most ~20 * lr * 1e-6 per element
// against parameters of size ~0.02-1, i.e. < 1e-5 normalised. Elements whose gradient is
// exactly zero in one order and rounding noise in another (the GPT-2 key bias) move by
// up to lr * noise / eps per step, which the normalisation over a whole unit absorbs. We
// allow 1e-4 for parameters and 1e-5 relative for losses: ten times the estimate.
constexpr double kParamTol = 1e-4, kLossTol = 1e-5;

void expect_close(const TrainRun& n, const TrainRun& one, const std::string& what) {
  ASSERT_EQ(n.losses.size(), one.losses.size());
  for (size_t s = 0; s < one.losses.size(); ++s)
    EXPECT_NEAR(n.losses[s], one.losses[s], kLossTol * one.losses[s]) << what << " step " << s;
  EXPECT_LT(param_error(n, one), kParamTol) << what;
}

class DistTraining : public testing::TestWithParam<Family> {};

TEST_P(DistTraining, EveryStrategyMatchesOneRank) {
  Communicator& w = world();
  const ModelLayout m(tiny(GetParam()));
  auto self = comm_self(device(), "reference");
  const TrainRun one = train(m, config(Strategy::full, 1), *self, 20);
  std::vector<std::pair<Strategy, int>> cases = {
      {Strategy::full, 0}, {Strategy::grad_op, 0}, {Strategy::none, 0}};
  if (w.size() % 2 == 0) cases.push_back({Strategy::hybrid, w.size() / 2});
  if (w.size() == 1) cases.push_back({Strategy::hybrid, 1});
  for (auto [s, group] : cases) {
    const TrainRun n = train(m, config(s, 1, group), w, 20);
    expect_close(n, one, fmt::format("{} at {} ranks", strategy_name(s), w.size()));
  }
}

TEST_P(DistTraining, GradientAccumulationEqualsTheLargeBatch) {
  Communicator& w = world();
  const ModelLayout m(tiny(GetParam()));
  // 12 sequences per step: one micro-batch of 12 / W per rank, against 12 / W
  // micro-batches of one sequence.
  const TrainRun big = train(m, config(Strategy::full, 12 / w.size()), w, 5);
  const TrainRun acc = train(m, config(Strategy::full, 1), w, 5);
  expect_close(acc, big, "accumulation");
}

// [Activation recompute] Recomputing attention or whole blocks in the backward runs the same
// kernels on the same inputs, so on CPU the run is the same bit for bit (losses and final
// parameters) at this world size, gradient accumulation included (2 micro-steps per rank);
// and the activation buffer the program plans shrinks to what the table keeps. The same for
// the first two of three blocks recomputing ([Partial recompute]), whose buffer lies between
// keeping everything and every block recomputing.
TEST_P(DistTraining, RecomputeEqualsKeepingEverything) {
  Communicator& w = world();
  // The run against the one keeping everything: bit for bit on CPU.
  auto expect_same = [&](const TrainRun& again, const TrainRun& kept, const std::string& what) {
    if (device().kind() != DeviceKind::cpu) return expect_close(again, kept, what);
    ASSERT_EQ(again.losses.size(), kept.losses.size()) << what;
    for (size_t s = 0; s < kept.losses.size(); ++s)
      EXPECT_EQ(again.losses[s], kept.losses[s]) << what << " step " << s;
    ASSERT_EQ(again.params.size(), kept.params.size()) << what;
    for (size_t u = 0; u < kept.params.size(); ++u)
      EXPECT_EQ(again.params[u], kept.params[u]) << what << " unit " << u;
  };
  // The activation buffer of the program an engine of this configuration runs.
  auto planned = [&](const ModelLayout& m, const EngineConfig& c) {
    const Engine e(m, c, device(), w);
    size_t bytes = 0;
    for (const Buffer& b : e.program().buffers)
      if (b.kind == BufferKind::activations) bytes = b.bytes;
    return bytes;
  };
  const ModelLayout m(tiny(GetParam()));
  EngineConfig c = config(Strategy::full, 12 / w.size() / 2);
  c.recompute = Recompute::none;
  const TrainRun kept = train(m, c, w, 4);
  const size_t kept_bytes = planned(m, c);
  ASSERT_GT(kept_bytes, 0u);
  size_t previous = kept_bytes;
  for (Recompute r : {Recompute::attention, Recompute::unit}) {
    c.recompute = r;
    const std::string what = fmt::format("--recompute {}", recompute_name(r));
    expect_same(train(m, c, w, 4), kept, what);
    const size_t bytes = planned(m, c);
    EXPECT_EQ(bytes, engine_activation_bytes(device().kind(), AttentionImpl::automatic, m.config(),
                                             c.batch, c.seq, r))
        << what;
    EXPECT_LT(bytes, previous) << what << " keeps less than the mode before it";
    previous = bytes;
  }
  // Three blocks, the first two recomputing: one block's tensors fewer than keeping all.
  ModelConfig three = m.config();
  three.n_layer = 3;
  const ModelLayout m3(three);
  c.recompute = Recompute::none;
  const TrainRun kept3 = train(m3, c, w, 4);
  const size_t kept3_bytes = planned(m3, c);
  for (Recompute r : {Recompute::attention, Recompute::unit}) {
    c.recompute = r;
    c.recompute_blocks = 0;
    const size_t every = planned(m3, c);
    c.recompute_blocks = 2;
    const std::string what =
        fmt::format("--recompute {} --recompute-blocks 2 of 3", recompute_name(r));
    expect_same(train(m3, c, w, 4), kept3, what);
    const size_t bytes = planned(m3, c);
    EXPECT_EQ(bytes, engine_activation_bytes(device().kind(), AttentionImpl::automatic, three,
                                             c.batch, c.seq, r, 0, 2))
        << what;
    EXPECT_LT(bytes, kept3_bytes) << what;
    EXPECT_GT(bytes, every) << what;
  }
}

// [Chunked loss] Making the logits in chunks in the head's backward gives the same losses
// and weights up to fp32 summation order (the head's weight gradient sums its rows chunk by
// chunk), within the tolerances above; the activation buffer holds one chunk of logits.
TEST_P(DistTraining, AChunkedLossEqualsTheWholeLoss) {
  Communicator& w = world();
  const ModelLayout m(tiny(GetParam()));
  EngineConfig c = config(Strategy::full, 12 / w.size() / 2);
  const TrainRun whole = train(m, c, w, 6);
  // 5 rows: no divisor of a micro-batch's rows (16 per sequence), so the last chunk is short.
  c.loss_chunk = 5;
  const TrainRun chunked = train(m, c, w, 6);
  expect_close(chunked, whole, "--loss-chunk 5");
  EXPECT_LT(engine_activation_bytes(device().kind(), AttentionImpl::automatic, m.config(), c.batch,
                                    c.seq, Recompute::none, 5),
            engine_activation_bytes(device().kind(), AttentionImpl::automatic, m.config(), c.batch,
                                    c.seq));
}

// [Reduce dtype] Tests of --reduce-dtype bf16 against f32 feed every rank and every
// micro-step the same sequences (those of rank 0's first micro-batch of the step), so every
// rank's local gradient of a micro-step is the same x, bit for bit. The error bound of
// docs/design.md ("bf16 gradient reduction") is |g_bf16 - g_f32| <= ((1 + u)^k - 1) Σ|x_i|
// over the W·M contributions, with u = 2^-8 (bf16's unit roundoff: 8 significant bits,
// round to nearest even) and k the bf16 roundings on one contribution's path; with equal
// contributions Σ|x_i| = W·M·|x| = |g|, so the bound is elementwise relative to the
// gradient itself.
StepBatch same_batch(const EngineConfig& c, int micro_steps, int64_t step,
                     std::vector<int32_t>& inputs, std::vector<int32_t>& targets) {
  std::vector<int32_t> in(static_cast<size_t>(c.batch) * c.seq), tg(in.size());
  data16().batch(step, c.global_batch, 0, c.batch, in.data(), tg.data());
  inputs.clear();
  targets.clear();
  for (int m = 0; m < micro_steps; ++m) {
    inputs.insert(inputs.end(), in.begin(), in.end());
    targets.insert(targets.end(), tg.begin(), tg.end());
  }
  return StepBatch{inputs.data(), targets.data(), inputs.size()};
}

// The bf16 roundings on one contribution's path: its cast, at most S - 1 pairwise sums of
// the reduce-scatter (any order of combining S values puts one value through at most S - 1
// of them), and with replicas the cast of the shard and at most R - 1 sums of the all-reduce.
int bf16_roundings(const Program& p) {
  return p.shard_size + (p.replicas > 1 ? p.replicas : 0);
}

// The elementwise relative bound for k bf16 roundings, W ranks and M micro-steps: the bf16
// path's ((1 + u)^k - 1), grown by the fp32 roundings on both paths (micro-step adds and
// the fp32 sums of the reference: at most M + W - 1 each, u32 = 2^-24), and divided by
// (1 - that fp32 error) because the reference |g_f32| stands in for the exact |g|.
double bf16_relative_bound(int k, int W, int M) {
  const double u = std::ldexp(1.0, -8), f32 = std::pow(1 + std::ldexp(1.0, -24), M + W) - 1;
  return ((std::pow(1 + u, k) * (1 + f32) - 1) + f32) / (1 - f32);
}

uint32_t bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// The strategies this world size runs: full, grad-op, none, and hybrid with groups of W/2
// ranks at even W (1 rank at W = 1), as EveryStrategyMatchesOneRank does.
std::vector<std::pair<Strategy, int>> reduce_cases(int W) {
  std::vector<std::pair<Strategy, int>> cases = {
      {Strategy::full, 0}, {Strategy::grad_op, 0}, {Strategy::none, 0}};
  if (W % 2 == 0) cases.push_back({Strategy::hybrid, W / 2});
  if (W == 1) cases.push_back({Strategy::hybrid, 1});
  return cases;
}

// One step with 2 micro-steps per rank under every strategy: the bf16 gradient shards lie
// within the bound of every f32 one, element by element; every bf16 element is a bf16
// value (the last thing that wrote it was the widening of a bf16 sum, or the fp32 sum of
// two equal ones), and some differ from f32, so the bf16 path did run.
TEST_P(DistTraining, Bf16ReductionStaysWithinItsRoundingBound) {
  Communicator& w = world();
  const ModelLayout m(tiny(GetParam()));
  constexpr int M = 2;
  for (auto [s, group] : reduce_cases(w.size())) {
    EngineConfig c = config(s, 2, group);
    c.global_batch = c.batch * w.size() * M;
    std::vector<std::vector<float>> shards[2];
    int k = 0;
    for (DType d : {DType::f32, DType::bf16}) {
      c.reduce_dtype = d;
      Engine e(m, c, device(), w);
      ASSERT_EQ(e.micro_steps(), M);
      std::vector<int32_t> inputs, targets;
      e.step(0, same_batch(c, M, 0, inputs, targets));
      shards[d == DType::bf16] = e.grad_shards();
      k = bf16_roundings(e.program());
    }
    const double rel = bf16_relative_bound(k, w.size(), M);
    // Below bf16's smallest normal (2^-126) rounding is absolute: half a step of 2^-133 per
    // rounding, at most k per contribution.
    const double abs = w.size() * M * k * std::ldexp(1.0, -134);
    const std::string what = fmt::format("{} at {} ranks", strategy_name(s), w.size());
    size_t differ = 0, outside = 0, not_bf16 = 0;
    double worst = 0;
    for (size_t u = 0; u < shards[0].size(); ++u) {
      ASSERT_EQ(shards[1][u].size(), shards[0][u].size());
      for (size_t i = 0; i < shards[0][u].size(); ++i) {
        const float f = shards[0][u][i], b = shards[1][u][i];
        const double err = std::fabs(static_cast<double>(b) - f);
        differ += b != f;
        outside += !(err <= rel * std::fabs(f) + abs);
        not_bf16 += bf16_to_f32(bf16_from_f32(b)) != b;
        if (f != 0) worst = std::max(worst, err / std::fabs(f));
      }
    }
    EXPECT_EQ(outside, 0u) << what << ": worst relative error " << worst << ", bound " << rel;
    EXPECT_EQ(not_bf16, 0u) << what;
    EXPECT_GT(differ, 0u) << what << ": the bf16 gradients equal the f32 ones";
  }
}

// On one rank with one micro-step the reduce-scatter is a copy: the bf16 gradient shard is
// the fp32 one rounded to bf16 (nearest even), bit for bit, under every strategy; the
// engine's memory beside the program is the scratch reduce_scratch_bytes counts.
TEST_P(DistTraining, Bf16ReductionOnOneRankIsTheRoundedGradient) {
  const ModelLayout m(tiny(GetParam()));
  auto self = comm_self(device(), "reference");
  for (auto [s, group] : reduce_cases(1)) {
    EngineConfig c = config(s, 2, group);
    c.global_batch = c.batch;
    std::vector<std::vector<float>> shards[2];
    for (DType d : {DType::f32, DType::bf16}) {
      c.reduce_dtype = d;
      Engine e(m, c, device(), *self);
      run_step(e, c, *self, 0);
      shards[d == DType::bf16] = e.grad_shards();
      // The CPU executor's only memory beside the program: the reduce scratch.
      EXPECT_EQ(e.peak_bytes(),
                e.program().peak_bytes() + reduce_scratch(e.flat(), e.program()).bytes());
    }
    const std::string what = fmt::format("{} at 1 rank", strategy_name(s));
    size_t wrong = 0, rounded = 0;
    for (size_t u = 0; u < shards[0].size(); ++u) {
      ASSERT_EQ(shards[1][u].size(), shards[0][u].size());
      for (size_t i = 0; i < shards[0][u].size(); ++i) {
        const float want = bf16_to_f32(bf16_from_f32(shards[0][u][i]));
        wrong += bits(shards[1][u][i]) != bits(want);
        rounded += want != shards[0][u][i];
      }
    }
    EXPECT_EQ(wrong, 0u) << what;
    EXPECT_GT(rounded, 0u) << what << ": no gradient element needed rounding";
  }
}

// Training with bf16 reduction tracks f32 reduction (same sequences on every rank and
// micro-step, so each gradient element's relative error is at most
// δ = bf16_relative_bound). The first loss is computed before any update: equal. After
// that, to first order: clipping scales a step's gradients by clip / |g|, which moves by
// at most δ too, so clipped gradients are off by at most 2δ. AdamW's m̂/(√v̂ + eps) does
// not depend on the gradients' scale; relative errors of at most 2δ move m̂/√v̂ by at most
// 2δ·√((1-β1)²/((1-β2)(1-β1²/β2))) = 2.34δ through m̂ (Cauchy-Schwarz over the
// exponentially weighted history, β1 = 0.9, β2 = 0.95) and as much again through √v̂: we
// take 5δ·lr per element and update. After updates at learning rates lr_1..lr_j the
// parameters differ by at most 5δ·Σlr per element, so the loss differs by at most
// |∇L|₁·5δ·Σlr <= √P·|∇L|₂·5δ·Σlr (P parameters; |∇L|₂ the f32 run's gradient norm at that
// step, before clipping).
TEST_P(DistTraining, Bf16ReductionTracksF32Training) {
  Communicator& w = world();
  const ModelLayout m(tiny(GetParam()));
  constexpr int M = 2, kSteps = 5;
  EngineConfig c = config(Strategy::full, 2);
  c.global_batch = c.batch * w.size() * M;
  std::vector<StepResult> runs[2];
  int k = 0;
  for (DType d : {DType::f32, DType::bf16}) {
    c.reduce_dtype = d;
    Engine e(m, c, device(), w);
    k = bf16_roundings(e.program());
    for (int64_t step = 0; step < kSteps; ++step) {
      std::vector<int32_t> inputs, targets;
      runs[d == DType::bf16].push_back(e.step(step, same_batch(c, M, step, inputs, targets)));
    }
  }
  double P = 0;
  for (int u = 0; u < m.num_units(); ++u) P += static_cast<double>(m.unit(u).numel);
  const double delta = bf16_relative_bound(k, w.size(), M);
  EXPECT_EQ(runs[1][0].loss, runs[0][0].loss) << "the first loss precedes every update";
  double lr_sum = 0;
  for (int s = 1; s < kSteps; ++s) {
    lr_sum += runs[0][static_cast<size_t>(s - 1)].lr;
    const double tol =
        std::sqrt(P) * runs[0][static_cast<size_t>(s)].grad_norm * 5 * delta * lr_sum;
    EXPECT_NEAR(runs[1][static_cast<size_t>(s)].loss, runs[0][static_cast<size_t>(s)].loss, tol)
        << "step " << s << " at " << w.size() << " ranks";
  }
}

// A checkpoint directory of this job alone: ctest runs the same test at several world sizes
// at once, so the name carries rank 0's process id (every rank takes rank 0's).
std::string job_dir(const char* what) {
  // A parameterised test's name is "Test/param": one path component.
  std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::replace(test.begin(), test.end(), '/', '-');
  const std::string mine =
      fmt::format("/tmp/tandem-dist-{}-{}-{}", what, static_cast<int>(::getpid()), test);
  return all_gather_text(world(), device(), mine).front();
}

// Once every rank is done with it (the gather is a barrier), rank 0 removes it.
void remove_job_dir(const std::string& dir) {
  all_gather_text(world(), device(), "");
  if (world().rank() == 0) std::filesystem::remove_all(dir);
}

// Saves e's shards (the last update applied) as the checkpoint after `steps` steps of c.
void save_after(Engine& e, const ModelLayout& m, const EngineConfig& c, Communicator& w,
                const std::string& dir, int steps) {
  CheckpointMeta meta;
  meta.model = m.config();
  meta.step = steps;
  meta.seed = c.seed;
  meta.world_size = w.size();
  meta.strategy = strategy_name(c.strategy);
  meta.shard_size = e.program().shard_size;
  meta.align = e.flat().align();
  checkpoint_save(dir, meta, e.flat(), e.shard_rank(), e.shards(), w, device(), e.comm_stream());
}

// Six steps of c unbroken, against three, a checkpoint (in job_dir(what)), a fresh engine
// loading it and three more: the same losses and parameters bit for bit.
void expect_resume_bitwise(const ModelLayout& m, const EngineConfig& c, Communicator& w,
                           const char* what) {
  const TrainRun unbroken = train(m, c, w, 6);
  Engine first(m, c, device(), w);
  for (int s = 0; s < 3; ++s) run_step(first, c, w, s);
  EXPECT_EQ(first.pending_update(), c.update_at_gather ? 2 : -1);
  const std::string dir = job_dir(what);
  if (w.rank() == 0) std::filesystem::remove_all(dir);
  save_after(first, m, c, w, dir, 3);
  EXPECT_EQ(first.pending_update(), -1);

  Engine second(m, c, device(), w);
  second.set_shards(checkpoint_load_shard(dir, second.flat(), second.shard_rank()));
  const TrainRun rest = train(m, c, w, 3, 3, &second);
  for (int s = 0; s < 3; ++s)
    EXPECT_EQ(rest.losses[static_cast<size_t>(s)], unbroken.losses[static_cast<size_t>(s) + 3]);
  EXPECT_EQ(rest.params, unbroken.params);
  remove_job_dir(dir);
}

TEST_P(DistTraining, ResumeContinuesBitwiseAtTheSameWorldSize) {
  const ModelLayout m(tiny(GetParam()));
  expect_resume_bitwise(m, config(Strategy::full, 1), world(), "resume");
}

// [Update at gather] Each unit's update before its gather in the next step gives the step
// end's losses and parameters bit for bit, for every strategy at this world size (the same
// per-element arithmetic on either device); a checkpoint saved after step 3 holds that step's
// update, so the resumed run continues the unbroken one bit for bit.
TEST_P(DistTraining, UpdateAtGatherIsTheStepEndsBitsAndResumes) {
  Communicator& w = world();
  const ModelLayout m(tiny(GetParam()));
  for (const Strategy s : {Strategy::full, Strategy::none, Strategy::grad_op, Strategy::hybrid}) {
    EngineConfig c = config(s, 1, s == Strategy::hybrid ? 1 : 0);
    const std::string what = strategy_name(s);
    const TrainRun at_end = train(m, c, w, 4);
    c.update_at_gather = true;
    const TrainRun at_gather = train(m, c, w, 4);
    EXPECT_EQ(at_gather.losses, at_end.losses) << what;
    EXPECT_EQ(at_gather.params, at_end.params) << what;
  }
  EngineConfig c = config(Strategy::full, 1);
  c.update_at_gather = true;
  expect_resume_bitwise(m, c, w, "resume-at-gather");
}

TEST_P(DistTraining, SaveAtThisWorldSizeLoadsAtSmallerOnes) {
  Communicator& w = world();
  const ModelLayout m(tiny(GetParam()));
  const EngineConfig c = config(Strategy::full, 1);
  Engine e(m, c, device(), w);
  for (int s = 0; s < 3; ++s) run_step(e, c, w, s);
  const std::string dir = job_dir("reshard");
  CheckpointMeta meta;
  meta.model = m.config();
  meta.step = 3;
  meta.seed = c.seed;
  meta.world_size = w.size();
  meta.strategy = "full";
  meta.shard_size = e.program().shard_size;
  meta.align = e.flat().align();
  checkpoint_save(dir, meta, e.flat(), e.shard_rank(), e.shards(), w, device(), e.comm_stream());
  const TrainRun reference = train(m, c, w, 3, 3, &e);
  // Continue on groups of every smaller size: ranks below `size` form one group.
  for (int size = 1; size < w.size(); ++size) {
    auto group = w.split(w.rank() < size ? 0 : 1, w.rank(), "resharded");
    if (w.rank() >= size) continue;
    Engine f(m, c, device(), *group);
    f.set_shards(checkpoint_load_shard(dir, f.flat(), f.shard_rank()));
    const TrainRun cont = train(m, c, *group, 3, 3, &f);
    expect_close(cont, reference, fmt::format("saved at {} ranks, loaded at {}", w.size(), size));
  }
  remove_job_dir(dir);
}

// EngineConfig::free_memory, the smallest free memory of the ranks' devices as the Trainer
// gathers it on CUDA: every rank checks its plan against that one figure, so one byte under
// the plan's peak makes every rank refuse, with the same message, before any communicator
// exists (a rank refusing alone would leave the others waiting in their setup), and the
// peak itself builds and trains.
TEST_P(DistTraining, EveryRankRefusesAPlanOverTheGatheredFreeMemory) {
  Communicator& w = world();
  const ModelLayout m(tiny(GetParam()));
  EngineConfig c = config(Strategy::full, 2);
  c.global_batch = 2 * w.size();  // one micro-step at every world size
  const uint64_t peak =
      program_build(m, Engine::program_spec(m, c, device().kind(), w.size())).peak_bytes();
  c.free_memory = peak - 1;
  std::string refusal = "built";
  try {
    Engine e(m, c, device(), w);
  } catch (const Error& err) {
    refusal = err.message();
  }
  for (const char* part : {"over by 1 B", w.size() > 1 ? "the smallest free memory of the ranks' "
                                                         "devices is"
                                                       : "device has"})
    EXPECT_NE(refusal.find(part), std::string::npos) << part << ": " << refusal;
  c.free_memory = peak;
  Engine e(m, c, device(), w);
  EXPECT_EQ(e.memory_bound(), peak);
  EXPECT_TRUE(std::isfinite(run_step(e, c, w, 0).loss));
}

INSTANTIATE_TEST_SUITE_P(Families, DistTraining,
                         testing::Values(Family::gpt2, Family::llama, Family::neox),
                         [](const testing::TestParamInfo<Family>& i) {
                           return std::string(family_name(i.param));
                         });

}  // namespace
}  // namespace tandem::dist
