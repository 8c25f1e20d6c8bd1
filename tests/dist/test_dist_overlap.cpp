// Communication overlap under mpirun: when compute dominates (EngineConfig::compute_delay_ms)
// the gathers and reduce-scatters of strategy full run while compute runs, so little of
// their time is exposed. Also reports, without asserting, the comm-bound contrast.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <vector>

#include "dist/dist_env.h"
#include "io/dataset.h"
#include "shard/engine.h"

namespace tandem::dist {
namespace {

Dataset make_data(int vocab, int T) {
  std::vector<uint32_t> tokens(4000);
  uint64_t s = 977;
  for (auto& t : tokens)
    t = static_cast<uint32_t>(((s = s * 6364136223846793005ull + 1) >> 33) % vocab);
  return Dataset(std::move(tokens), T, 11);
}

ModelConfig small_model(int d_model, int n_layer) {
  ModelConfig c = preset("gpt2-tiny");
  c.context = 16;
  c.d_model = d_model;
  c.n_layer = n_layer;
  c.n_head = 8;
  c.n_kv_head = 8;
  c.d_ff = 4 * d_model;
  return c;
}

EngineConfig full_config(double delay_ms) {
  EngineConfig c;
  c.strategy = Strategy::full;
  c.batch = 1;
  c.seq = 16;
  c.global_batch = world().size();
  c.total_steps = 10;
  c.seed = 5;
  c.compute_delay_ms = delay_ms;
  return c;
}

struct Totals {
  double step_ms = 0, compute_ms = 0, comm_ms = 0, exposed_ms = 0;
};

// Runs `steps` steps and sums the metrics of the last `counted` of them (the first step
// pays one-off costs: page faults in the arena, MPI connection setup), then over all
// ranks, so that every rank reaches the same verdict.
Totals run_steps(const ModelConfig& mc, const EngineConfig& ec, int steps, int counted) {
  const ModelLayout layout(mc);
  const Dataset data = make_data(mc.vocab, ec.seq);
  Engine engine(layout, ec, device(), world());
  std::vector<int32_t> inputs, targets;
  float sums[4] = {0, 0, 0, 0};
  for (int s = 0; s < steps; ++s) {
    data.rank_batch(s, ec.global_batch, ec.batch, engine.micro_steps(), world().size(),
                    world().rank(), inputs, targets);
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult r = engine.step(s, StepBatch{inputs.data(), targets.data(), inputs.size()});
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s < steps - counted) continue;
    sums[0] += static_cast<float>(ms);
    sums[1] += static_cast<float>(r.compute_ms);
    sums[2] += static_cast<float>(r.comm_ms);
    sums[3] += static_cast<float>(r.exposed_comm_ms);
  }
  auto stream = device().stream_create("overlap totals");
  world().all_reduce(*stream, sums, sums, 4, DType::f32, "overlap totals");
  device().stream_sync(*stream);
  return {sums[0], sums[1], sums[2], sums[3]};
}

void report(const char* what, const Totals& t) {
  if (world().rank() != 0) return;
  std::printf(
      "[overlap] %s at %d ranks, last 2 steps summed over ranks: step %.1f ms, "
      "compute %.1f ms, comm %.1f ms, exposed comm %.1f ms (%.0f%% of comm)\n",
      what, world().size(), t.step_ms, t.compute_ms, t.comm_ms, t.exposed_ms,
      t.comm_ms > 0 ? 100.0 * t.exposed_ms / t.comm_ms : 0.0);
  std::fflush(stdout);
}

TEST(DistOverlap, CommunicationHidesBehindDominantCompute) {
  if (world().size() < 2) GTEST_SKIP() << "needs at least 2 ranks (skipped on every rank)";
  // gpt2-tiny's width with 6 blocks: 8 units, every compute op sleeps 20 ms, so each
  // gather and reduce-scatter has a whole op's time to finish behind the compute.
  const Totals t = run_steps(small_model(128, 6), full_config(20), 3, 2);
  report("compute-bound (20 ms per compute op)", t);
  ASSERT_GT(t.comm_ms, 0);
  // The premise: compute dominates. On an idle machine comm is a fraction of compute; when
  // other processes starve the ranks' threads, MPI's shared-memory transfers (which need
  // both peers scheduled) slow down until they outlast the compute, and nothing could hide
  // them. A serialising engine keeps comm short, so this does not mask lost overlap.
  if (t.comm_ms >= t.compute_ms)
    GTEST_SKIP() << "the machine is too loaded for the premise: comm " << t.comm_ms
                 << " ms >= compute " << t.compute_ms << " ms";
  EXPECT_LT(t.exposed_ms, 0.5 * t.comm_ms)
      << t.exposed_ms << " ms of " << t.comm_ms
      << " ms of communication exposed although compute dominates";
}

// The contrast: wide units (d_model 512: ~3M parameters per block), no delay. The
// gathers take longer than the compute they could hide behind; reported only.
TEST(DistOverlap, ReportCommBoundContrast) {
  if (world().size() < 2) GTEST_SKIP() << "needs at least 2 ranks (skipped on every rank)";
  const Totals t = run_steps(small_model(512, 2), full_config(0), 3, 2);
  report("comm-bound (d_model 512, no delay)", t);
  EXPECT_GT(t.comm_ms, 0);
}

}  // namespace
}  // namespace tandem::dist
