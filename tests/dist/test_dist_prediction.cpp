// Predicted next to measured under mpirun: the planner's step time for a training run on
// this machine, with the machine's figures measured in this process between the steps,
// against the measured step time, within 15%.
//
// [Prediction accuracy test] The planner prices each unit's forward and backward as the sum of
// the kernels the composition calls, each at the rate measured for its shape on this CPU (the
// kernel tables, plan/kernel_rates.h), the optimizer and copies at memory bandwidth and
// collectives by the link lines; it does not model threads time-slicing cores. So the test
//  - trains a Llama-family model whose step is ~90% matrix products on a CPU core: wide
//    blocks, short sequences and many tokens per step keep attention, SwiGLU's exp, the norms
//    and AdamW small (GPT-2's tanh GELU alone would be ~20% of a step: docs/diagnosis.md,
//    "Predicted next to measured");
//  - measures the GEMM rate at the model's width, the copy bandwidth, the kernel tables of the
//    model's step and, with several ranks, the links at the run's sizes right before each
//    measured step, on every rank at once as the ranks compute at once;
//  - measures, in each round, the step after an unmeasured one: a step right after the
//    calibration's own memory traffic runs ~4% slower on a 2-core VM, while `tandem train`'s
//    medians (and the prediction) describe steps that follow steps;
//  - judges only rounds in which every rank had the same share of its cores through the
//    calibration and through the step ([Matched rounds]: CPU time of the process over wall
//    time, within 5%), so that the figures describe the machine the step ran on, however
//    loaded; it compares the median of measured / predicted - 1 over 7 such rounds with the
//    bound, and skips, saying so, when fewer than 3 of 14 rounds matched; a median outside
//    the bound is measured once more from new rounds and judged on those ([Second run]),
//    printing first, per op kind, what the planner priced and what the steps took;
//  - runs only where every rank's compute threads and its communication thread have a core
//    (ranks x (OMP_NUM_THREADS + 1) <= cores), and skips elsewhere, on every rank alike.
// ctest runs it alone (RUN_SERIAL, tests/CMakeLists.txt): one rank without mpirun, as
// `tandem train` runs one rank, and 2 and 4 ranks under mpirun; on a 2-core machine only
// the one-rank run has the cores it needs. (Under mpirun even one rank's collectives go
// through MPI, where the planner prices the local copies of the one-rank communicator.)
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "dist/dist_env.h"
#include "infer/decoder.h"
#include "io/dataset.h"
#include "model/tensor_parallel.h"
#include "plan/plan.h"
#include "plan/prediction.h"
#include "plan/probe_backend.h"
#include "shard/engine.h"
#include "shard/flat.h"
#include "unit/decode_test_util.h"

namespace tandem::dist {
namespace {

constexpr double kBound = 0.15;
constexpr double kDecodeBound = 0.20;
// [Best of the run] Each decode round times a block of the model kTimings times, decoding
// between each two (GenerateRateWithinAFifth). A shared 2-core VM switches between a fast and
// a slow state for a second or more at a time (a block's time went from 0.51 to 1.13 ms
// within one round), so a round's best of each side may pair the fast state on one side
// with the slow state on the other. What the planner should predict is the machine without
// the interference, and the fastest time is the estimate of that which noise cannot beat: so
// the layout is judged on the fastest block and head timings of all its rounds (the
// prediction) against the fastest decoding of all its rounds (the measurement), some 35
// samples of each. A block is timed over a shorter window than a decoding, so its fastest
// sample can fall wholly inside a fast spell that no whole decoding reaches (one block round
// of 1.03 ms against 1.07-1.58 ms made a prediction 24% optimistic); the median of the
// rounds' own offsets, each pairing a round's timings with its own decodings, is not moved by
// one such sample. The layout passes when either estimate is within the bound: a planner
// that is wrong by more is wrong by both.
constexpr int kTimings = 5;
constexpr int kWarmupSteps = 2;
// Rounds judged; rounds tried at most (unmatched ones are left out); fewest judged before
// the test gives up on the machine and skips.
#ifdef TANDEM_SANITIZER_BUILD
// Instrumented builds compare nothing with the bounds (below): two rounds run the whole path
// for the sanitizers in a few minutes.
constexpr int kRounds = 2, kMaxRounds = 2, kMinRounds = 1;
#else
constexpr int kRounds = 7, kMaxRounds = 14, kMinRounds = 3;
#endif
// [Matched rounds] A round counts when the share of its cores a rank had through the
// calibration and through the step differ by at most kMaxShareGap (relative), and neither
// is below kMinShare (time slices too coarse for the windows).
constexpr double kMaxShareGap = 0.05, kMinShare = 0.5;
constexpr double kWindowMs = 100;  // per rate: the GEMM, the copy
// Per timing of a decode block, and the tokens decoded between two timings (~0.25 s each on
// a 2-core VM): long enough that a few milliseconds taken by other work weigh little.
constexpr double kDecodeWindowMs = 250;
constexpr int kDecodeTokens = 72, kDecodePrompt = 8;
// [Second run] A layout outside the bound is measured once more, from new rounds, and judged
// on that run: the 2-core VM has had slow spells of minutes (every round of a layout's decoding
// 20-30% behind its block timings, in one full suite, within 2% run alone). A planner wrong by
// more than the bound is wrong on both runs.
constexpr int kDecodeRuns = 2;
// The same for the step time: a median outside the bound is measured again from new rounds
// (one CI run's kernel tables summed 18-21% short of the step in 5 of 7 rounds and within 1%
// in the other 2, while the step itself held at 471-483 ms: a machine whose speed changed
// under the calibration, not the planner, which agreed in the rounds it was not changed).
constexpr int kStepRuns = 2;

// ~6.1M parameters: two blocks of width 640 (d_ff 640) at sequence 16, so that matrix
// products are ~90% of a step on a CPU core; 64 sequences per rank per step are ~45 GFLOP of
// them (~0.45 s on one core of a 2-core VM). A block is 11.5 MB of fp32: MPI's
// nonblocking reduce-scatter on one host slows sharply from ~12 MiB, which a link line
// cannot follow. Narrower blocks, longer sequences or fewer tokens per step give the
// unmodelled work more weight (docs/diagnosis.md, "How far to trust it on a CPU").
ModelConfig model() {
  ModelConfig c = preset("llama-tiny");
  c.name = "predict-llama";
  c.context = 16;
  c.d_model = 640;
  c.n_layer = 2;
  c.n_head = 10;
  c.n_kv_head = 10;
  c.d_ff = 640;
  return c;
}

Dataset make_data(int vocab, int T) {
  std::vector<uint32_t> tokens(20000);
  uint64_t s = 4242;
  for (auto& t : tokens)
    t = static_cast<uint32_t>(((s = s * 6364136223846793005ull + 1) >> 33) % vocab);
  return Dataset(std::move(tokens), T, 13);
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

int threads_per_rank() {
  const char* env = std::getenv("OMP_NUM_THREADS");
  const int n = env != nullptr ? std::atoi(env) : 0;
  return n > 0 ? n : usable_cores();
}

// Why W ranks of `threads` compute threads and a communication thread each would time-slice
// this machine's cores (which the planner does not model), or nothing when they would not.
std::string cores_short(int W, int threads) {
  const int cores = usable_cores();
  if (W * (threads + 1) <= cores) return "";
  return fmt::format(
      "{} rank(s) x ({} compute thread(s) + communication) on {} core(s): the ranks' threads "
      "would time-slice cores, which the planner does not model",
      W, threads, cores);
}

void barrier(Stream& s) {
  world().barrier(s, "prediction test");
  device().stream_sync(s);
}

// Wall time and the CPU time of every thread of this process over a stretch of work.
class Stopwatch {
 public:
  Stopwatch() : wall0_(std::chrono::steady_clock::now()), cpu0_(cpu_ms()) {}
  double wall_ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall0_)
        .count();
  }
  // CPU time over wall time per thread the work runs on: ~1 while this process had its
  // cores, lower for the share of the time other work held them.
  double share(int threads) const { return (cpu_ms() - cpu0_) / (wall_ms() * threads); }

 private:
  static double cpu_ms() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return 1e3 * static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           1e-3 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
  }
  std::chrono::steady_clock::time_point wall0_;
  double cpu0_;
};

// [Matched rounds] Rounds of: this machine's rates measured on every rank at once (and the
// links at `link_bytes` with several ranks), then `run`, which does the measured work and
// returns measured / predicted - 1 for the rates given; until kRounds rounds matched or
// kMaxRounds ran. Returns the matched rounds' offs, and the unmatched ones' gaps in *gaps.
// With compare_work = false only the calibration's share is judged: the work keeps a second
// stream busy part of the time (a one-rank fsdp decoder's copies), so its share per thread
// says nothing about the machine.
// `calibrate`, when given, measures more of the machine into the hardware inside the
// calibration (the kernel tables of the trained model).
std::vector<double> matched_rounds(int gemm_n, size_t link_bytes, int threads,
                                   const std::function<double(const Hardware&, int round)>& run,
                                   std::vector<double>* gaps, bool compare_work = true,
                                   const std::function<void(Hardware&)>& calibrate = nullptr) {
  const int W = world().size();
  auto sync = device().stream_create("prediction barrier");
  std::vector<double> offs;
  for (int round = 0; round < kMaxRounds && static_cast<int>(offs.size()) < kRounds; ++round) {
    barrier(*sync);
    const Stopwatch calibration;
    const CpuRates rates = prediction_measure_cpu(gemm_n, kWindowMs);
    Hardware hw = hardware_preset("cpu-local");
    prediction_apply_cpu(hw, rates);
    if (calibrate) calibrate(hw);
    const double calibration_share = calibration.share(threads);
    if (W > 1) prediction_calibrate_links(hw, link_bytes, world(), device());
    barrier(*sync);
    const Stopwatch work;
    const double off = run(hw, round);
    const double work_share = compare_work ? work.share(threads) : calibration_share;
    // The ranks agree on each round.
    const double gap =
        std::fabs(calibration_share - work_share) / std::max(calibration_share, work_share);
    // A run returns NaN for a round it cannot judge.
    float unmatched = !std::isfinite(off) || gap > kMaxShareGap ||
                              std::min(calibration_share, work_share) < kMinShare
                          ? 1.0f
                          : 0.0f;
    world().all_reduce(*sync, &unmatched, &unmatched, 1, DType::f32, "prediction test: round");
    device().stream_sync(*sync);
    if (unmatched == 0) {
      offs.push_back(off);
    } else {
      gaps->push_back(gap);
    }
    if (world().rank() == 0)
      std::printf("[prediction]   %.4f TFLOP/s, %.2f GB/s; cpu share %.2f / %.2f%s\n", rates.tflops,
                  rates.copy_GBps, calibration_share, work_share,
                  unmatched == 0 ? "" : " (unmatched: left out)");
  }
  return offs;
}

// Each part's faster timing of two decode calibrations (the block's and the head's, which
// are timed apart).
DecodeRates faster_parts(const DecodeRates& a, const DecodeRates& b) {
  DecodeRates r = a;
  if (b.block_ms < r.block_ms) {
    r.block_ms = b.block_ms;
    r.matvec_GBps = b.matvec_GBps;
  }
  if (b.head_ms < r.head_ms) {
    r.head_ms = b.head_ms;
    r.head_GBps = b.head_GBps;
  }
  return r;
}

std::string unmatched_message(const std::vector<double>& offs, const std::vector<double>& gaps) {
  return fmt::format(
      "the machine's load kept changing: in {} of {} rounds a rank had a different share of "
      "its cores through the calibration than through the measured work (largest gap {:.2f}), "
      "so its figures do not describe that work; rerun on a quieter machine",
      gaps.size(), offs.size() + gaps.size(),
      gaps.empty() ? 0.0 : *std::max_element(gaps.begin(), gaps.end()));
}

TEST(DistPrediction, StepTimeWithinFifteenPercent) {
  const int W = world().size();
  const int threads = threads_per_rank();
  if (const std::string why = cores_short(W, threads); !why.empty()) GTEST_SKIP() << why;

  const ModelConfig c = model();
  const ModelLayout layout(c);
  TrainOptions o;
  o.strategy = Strategy::full;
  o.seq = 16;
  o.batch = 64;
  o.global_batch = o.batch * W;
  o.max_gathered = 2;
  EngineConfig ec;
  ec.strategy = Strategy::full;
  ec.batch = o.batch;
  ec.seq = o.seq;
  ec.global_batch = o.global_batch;
  ec.total_steps = kWarmupSteps + 2 * kMaxRounds * kStepRuns;
  ec.seed = 21;
  const Dataset data = make_data(c.vocab, o.seq);
  Engine engine(layout, ec, device(), world());
  auto sync = device().stream_create("prediction barrier");
  // This rank's token ids of step s, filled before the step's clock starts.
  std::vector<int32_t> inputs, targets;
  auto batch = [&](int64_t s) {
    data.rank_batch(s, ec.global_batch, ec.batch, engine.micro_steps(), W, world().rank(), inputs,
                    targets);
    return StepBatch{inputs.data(), targets.data(), inputs.size()};
  };

  for (int s = 0; s < kWarmupSteps; ++s) engine.step(s, batch(s));
  for (int run = 0; run < kStepRuns; ++run) {
    std::vector<double> gaps;
    // [Op breakdown] Per op kind, predicted and measured ms of the rounds' unmeasured steps
    // (timed per op; the measured step is not), printed when the run ends outside the bound.
    std::map<std::string, std::pair<double, double>> by_kind;
    const std::vector<double> offs = matched_rounds(
        prediction_gemm_size(c), prediction_links_bytes(c), threads,
        [&](const Hardware& hw, int round) {
          const int64_t s0 = kWarmupSteps + 2 * (run * kMaxRounds + round);
          const StepResult timed = engine.step(s0, batch(s0), true);
          const std::vector<OpCost> costs =
              program_costs(layout, engine.program(), hw, o.batch, o.seq);
          for (size_t i = 0; i < costs.size() && i < timed.ops.size(); ++i) {
            auto& [predicted, measured] = by_kind[op_kind_name(engine.program().ops[i].kind)];
            predicted += costs[i].ms;
            measured += timed.ops[i].end_ms - timed.ops[i].start_ms;
          }
          const StepBatch b = batch(s0 + 1);
          barrier(*sync);
          const Stopwatch step;
          const StepResult r = engine.step(s0 + 1, b);
          const double measured = step.wall_ms();
          const StepPrediction p = prediction_plan(prediction_request(o, c, W, hw));
          const double off = measured / p.step_ms - 1;
          // For the record: the single-rate model (no kernel tables) on the same figures.
          Hardware flat = hw;
          flat.kernels.reset();
          const StepPrediction q = prediction_plan(prediction_request(o, c, W, flat));
          if (world().rank() == 0)
            std::printf(
                "[prediction] %d rank(s), round %d: predicted %.1f ms (compute %.1f, comm %.1f, "
                "exposed %.2f); measured %.1f ms (compute %.1f, comm %.1f, exposed %.2f); off "
                "by %+.0f%% (without kernel tables: %.1f ms, off by %+.0f%%)\n",
                W, round + 1, p.step_ms, p.compute_ms, p.comm_ms, p.exposed_comm_ms, measured,
                r.compute_ms, r.comm_ms, r.exposed_comm_ms, 100 * off, q.step_ms,
                100 * (measured / q.step_ms - 1));
          return off;
        },
        &gaps, true,
        [&](Hardware& hw) {
          prediction_apply_kernels(hw, prediction_measure_kernels(c, o.batch, o.seq));
        });
    if (static_cast<int>(offs.size()) < kMinRounds) GTEST_SKIP() << unmatched_message(offs, gaps);
    const double off = probe_median(offs);
    if (world().rank() == 0)
      std::printf(
          "[prediction] %d rank(s): median step time off by %+.1f%% over %zu rounds (bound "
          "%.0f%%)\n",
          W, 100 * off, offs.size(), 100 * kBound);
#ifdef TANDEM_SANITIZER_BUILD
    // Instrumented code is slowed unevenly (the engine's bookkeeping far more than the GEMMs
    // the calibration times), so the bound describes uninstrumented builds only; here the
    // whole path above has run for the sanitizers to check.
    GTEST_SKIP() << "sanitizer build: step time off by " << 100 * off
                 << "%, not compared with the bound";
#endif
    // The ranks' offs are the same figures (each round's step time is the slowest rank's
    // through the barrier), but the decision to measure again is taken together.
    float outside = std::fabs(off) > kBound ? 1.0f : 0.0f;
    world().all_reduce(*sync, &outside, &outside, 1, DType::f32, "prediction test: second run");
    device().stream_sync(*sync);
    if (outside != 0 && world().rank() == 0) {
      std::string text;
      for (const auto& [kind, ms] : by_kind)
        text += fmt::format(" {} {:.1f}/{:.1f}", kind, ms.first, ms.second);
      std::printf("[prediction] %d rank(s): by op kind, predicted/measured ms over the rounds:%s\n",
                  W, text.c_str());
    }
    if (outside != 0 && run + 1 < kStepRuns) {
      if (world().rank() == 0)
        std::printf("[prediction] %d rank(s): outside the bound; measured again\n", W);
      continue;
    }
    EXPECT_LE(std::fabs(off), kBound)
        << "at " << W << " rank(s): the median over " << offs.size()
        << " rounds of measured / predicted - 1 (run " << run + 1 << " of " << kStepRuns << ")";
    break;
  }
}

// Predicted next to measured decoding for every layout at this rank count (below), as above: the
// planner's tokens/s for a batch of one on this machine's rates (and a block of the model
// timed on its kernels, as `tandem generate` calibrates) against the rate `Decoder` reaches,
// within a fifth, each side at its fastest over the rounds ([Best of the run]). A decode step reads
// every weight once (matrix-vector products at memory bandwidth), so the model is wide enough that
// a step's ~148 MB of fp32 weights outweigh the per-op and per-message costs the planner leaves
// out; and larger than the 128 MB of block copies the calibration reads in turn, so that no
// cache keeps more of the model between tokens than of the copies between timings (a 70 MB
// model decoded 10-30% faster than its prediction on a VM with a 32 MB L3, a 209 MB one 9-15%
// slower, this one within 2%).
TEST(DistPrediction, GenerateRateWithinAFifth) {
  const int W = world().size();
  const int threads = threads_per_rank();
  if (const std::string why = cores_short(W, threads); !why.empty()) GTEST_SKIP() << why;
  ModelConfig c = decode_test::tiny("llama-tiny", 768, 8, kDecodePrompt + kDecodeTokens);
  c.n_layer = 4;
  c.n_kv_head = 8;
  c.d_ff = 2304;
  c.vocab = 8000;
  c.vocab_padded = 8192;
  const ModelLayout global(c);
  const auto all = decode_test::init_params(global, 9);
  GenerateRequest r;
  r.prompts = {decode_test::prompt_of(kDecodePrompt, c.vocab, 3)};
  r.tokens = kDecodeTokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  // At one rank tp and pipeline run replicate's work op for op (one shard, one stage), so
  // only replicate and fsdp (which still copies each unit before using it) are timed there.
  std::vector<std::string> names = {"replicate", "fsdp", "tp", "pipeline"};
  if (W == 1) names.resize(2);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const InferLayout layout = infer_layout_parse(name);
    const ModelConfig mine = layout == InferLayout::tp ? tp_local_config(c, W, world().rank()) : c;
    const ModelLayout local(mine);
    DecoderOptions o;
    o.max_seq = kDecodePrompt + kDecodeTokens;
    o.layout = layout;
    Decoder d(local, device(),
              decode_test::params_for(layout, global, local, all, W, world().rank()), o,
              {&world()});
    (void)d.generate(r);  // warm-up
    PlanRequest req;
    req.task = PlanTask::generate;
    req.model = c;
    req.ranks = W;
    req.batch = 1;
    req.seq = kDecodePrompt + kDecodeTokens / 2;  // the cache a step reads, on average
    auto sync = device().stream_create("prediction: second run");
    for (int run = 0; run < kDecodeRuns; ++run) {
      // [Best of the run] across this layout's rounds, matched or not.
      DecodeRates fastest;
      Hardware fastest_hw;
      double fastest_measured = 0;
      std::vector<double> gaps;
      const std::vector<double> offs = matched_rounds(
          prediction_gemm_size(c), prediction_links_bytes(c), threads,
          [&](const Hardware& hw, int round) {
            // As generate plans: a block of the model timed on this device, kTimings times
            // with a decoding between each two.
            DecodeRates best;
            double measured = 0;
            for (int i = 0; i < kTimings; ++i) {
              if (i > 0) measured = std::max(measured, d.generate(r).decode_tokens_per_s());
              const DecodeRates t =
                  prediction_measure_decode(device(), c, 1, o.max_seq, kDecodeWindowMs);
              best = i == 0 ? t : faster_parts(best, t);
            }
            if (fastest.rows == 0 || best.block_ms < fastest.block_ms) fastest_hw = hw;
            fastest = fastest.rows == 0 ? best : faster_parts(fastest, best);
            fastest_measured = std::max(fastest_measured, measured);
            req.hw = hw;
            prediction_apply_decode(req.hw, best);
            const StrategyPlan p = plan_generate_strategy(req, name);
            const double off = measured / p.tokens_per_s - 1;
            if (world().rank() == 0)
              std::printf(
                  "[prediction] %s at %d rank(s), round %d: predicted %.1f tokens/s (compute %.2f "
                  "ms, comm %.2f ms); measured %.1f; off by %+.0f%%; block time %.3f ms, head "
                  "%.3f ms\n",
                  name.c_str(), W, round + 1, p.tokens_per_s, p.compute_ms, p.comm_ms, measured,
                  100 * off, best.block_ms, best.head_ms);
            return off;
          },
          &gaps, layout != InferLayout::fsdp);
      if (static_cast<int>(offs.size()) < kMinRounds) GTEST_SKIP() << unmatched_message(offs, gaps);
      req.hw = fastest_hw;
      prediction_apply_decode(req.hw, fastest);
      const StrategyPlan p = plan_generate_strategy(req, name);
      const double off = fastest_measured / p.tokens_per_s - 1;
      if (world().rank() == 0)
        std::printf(
            "[prediction] %s at %d rank(s): the fastest block (%.3f ms) and head (%.3f ms) of %d "
            "rounds predict %.1f tokens/s; the fastest decoding reached %.1f; off by %+.1f%% "
            "(bound %.0f%%; median of the rounds %+.1f%%)\n",
            name.c_str(), W, fastest.block_ms, fastest.head_ms,
            static_cast<int>(offs.size() + gaps.size()), p.tokens_per_s, fastest_measured,
            100 * off, 100 * kDecodeBound, 100 * probe_median(offs));
#ifndef TANDEM_SANITIZER_BUILD
      const double median_off = probe_median(offs);
      // Every rank takes the same branch: the decodings that follow are collective.
      float outside = std::min(std::fabs(off), std::fabs(median_off)) > kDecodeBound ? 1.0f : 0.0f;
      world().all_reduce(*sync, &outside, &outside, 1, DType::f32, "prediction test: second run");
      device().stream_sync(*sync);
      if (outside != 0 && run + 1 < kDecodeRuns) {
        if (world().rank() == 0)
          std::printf("[prediction] %s at %d rank(s): outside the bound; measured again\n",
                      name.c_str(), W);
        continue;
      }
      EXPECT_LE(std::min(std::fabs(off), std::fabs(median_off)), kDecodeBound)
          << name << " at " << W << " rank(s): the fastest decoding / its prediction - 1 is " << off
          << ", the median of the rounds' " << median_off << " (run " << run + 1 << " of "
          << kDecodeRuns << ")";
#endif
      break;
    }
  }
}

// The field report on CPU ranks: a model whose units take longer to gather than to compute
// decodes slowest under fsdp (every unit re-gathered for every token), against replicate and
// tp measured in the same run; and auto, planning on this machine's measured rates, does not
// choose fsdp. The gaps are large (a block's 3 MB gathered per token against a product of
// 0.8 M multiply-adds), so the ratios hold on a shared machine too; best of 3 runs each.
// Plain builds only: see the comparison below.
TEST(DistPrediction, DecodeFsdpIsSlowestWhereGatheringCostsMore) {
  const int W = world().size();
  if (W < 2) GTEST_SKIP() << "one rank: every layout is the same";
  ModelConfig c = decode_test::tiny("llama-tiny", 256, 8, 128);
  c.n_kv_head = 4;
  c.d_ff = 768;
  const ModelLayout global(c);
  const auto all = decode_test::init_params(global, 7);
  GenerateRequest r;
  r.prompts = {decode_test::prompt_of(8, c.vocab, 1)};
  r.tokens = 24;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  auto rate = [&](InferLayout layout) {
    const ModelConfig mine = layout == InferLayout::tp ? tp_local_config(c, W, world().rank()) : c;
    const ModelLayout local(mine);
    const std::vector<std::vector<float>> p =
        decode_test::params_for(layout, global, local, all, W, world().rank());
    DecoderOptions o;
    o.max_seq = 40;
    o.layout = layout;
    Decoder d(local, device(), p, o, {&world()});
    double best = 0;
    for (int i = 0; i < 3; ++i) best = std::max(best, d.generate(r).decode_tokens_per_s());
    return best;
  };
  const double rep = rate(InferLayout::replicate), fsdp = rate(InferLayout::fsdp),
               tp = rate(InferLayout::tp);
  std::printf("decode tok/s at %d ranks: replicate %.0f, tp %.0f, fsdp %.0f\n", W, rep, tp, fsdp);
#ifndef TANDEM_SANITIZER_BUILD
  // Under a sanitizer the products run several times slower and the gathers' copies hardly
  // at all, so compute hides the gap this test is about (fsdp 0.8x tp has been seen under
  // ASan): the layouts still run end to end there, but only a plain build compares rates.
  EXPECT_LT(fsdp, 0.7 * rep);
  EXPECT_LT(fsdp, 0.7 * tp);
#endif

  PlanRequest req;
  req.task = PlanTask::generate;
  req.model = c;
  req.ranks = W;
  req.batch = 1;
  req.seq = 40;
  req.hw = hardware_preset("cpu-local");
  prediction_apply_cpu(req.hw, prediction_measure_cpu(prediction_gemm_size(c), 50));
  const LayoutChoice choice = plan_choose_layout(req, {"replicate", "fsdp", "tp"});
  EXPECT_FALSE(choice.name.empty()) << choice.why;
  EXPECT_NE(choice.name, "fsdp") << choice.why;
}

}  // namespace
}  // namespace tandem::dist
