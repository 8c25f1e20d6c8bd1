// Single-rank training: loss falls on data it can memorise, gradient accumulation equals
// the large batch, save/resume equals an unbroken run bit for bit, and the schedule,
// clipping, initialisation and presets hold their hand-worked values.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "device/device.h"
#include "io/tokens.h"
#include "model/model.h"
#include "optim/optim.h"
#include "shard/engine.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace tandem;

namespace {

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           ("tandem-train-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

std::string write_model(const TempDir& dir, const std::string& family) {
  nlohmann::json j = {{"name", "test-" + family},
                      {"family", family},
                      {"vocab", 64},
                      {"context", 32},
                      {"d_model", 24},
                      {"n_layer", 2},
                      {"n_head", 4},
                      {"d_ff", 40}};
  if (family == "llama") j["n_kv_head"] = 2;
  std::string path = dir / (family + ".json");
  std::ofstream(path) << j.dump();
  return path;
}

// A short random sequence repeated: a model that learns it predicts every byte.
std::string write_repeating_data(const TempDir& dir, int period, int repeats) {
  std::vector<uint32_t> pattern;
  uint64_t s = 99;
  for (int i = 0; i < period; ++i)
    pattern.push_back(
        static_cast<uint32_t>((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 58));
  std::vector<uint32_t> tokens;
  for (int r = 0; r < repeats; ++r) tokens.insert(tokens.end(), pattern.begin(), pattern.end());
  std::string path = dir / "data.tok";
  tokens_write(path, tokens, 2);
  return path;
}

std::string write_random_data(const TempDir& dir, size_t n) {
  std::vector<uint32_t> tokens(n);
  uint64_t s = 7;
  for (auto& t : tokens)
    t = static_cast<uint32_t>((s = s * 6364136223846793005ull + 1442695040888963407ull) >> 58);
  std::string path = dir / "random.tok";
  tokens_write(path, tokens, 2);
  return path;
}

TrainOptions base_options(const std::string& model, const std::string& data) {
  TrainOptions o;
  o.model = model;
  o.data = data;
  o.batch = 4;
  o.seq = 16;
  o.steps = 6;
  o.progress = ProgressMode::none;
  o.optim.lr = 3e-3f;
  o.optim.warmup = 2;
  return o;
}

double max_rel_diff(const std::vector<std::vector<float>>& a,
                    const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t u = 0; u < a.size(); ++u) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a[u].size(); ++i) {
      num += (static_cast<double>(a[u][i]) - b[u][i]) * (static_cast<double>(a[u][i]) - b[u][i]);
      den += static_cast<double>(b[u][i]) * b[u][i];
    }
    worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
  }
  return worst;
}

class TrainingFamily : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(TrainingFamily, LossFallsOnMemorisableData) {
  TempDir dir;
  TrainOptions o = base_options(write_model(dir, GetParam()), write_repeating_data(dir, 23, 40));
  o.steps = 80;
  o.optim.lr = 1e-2f;
  o.optim.warmup = 5;
  Trainer t(o);
  const StepMetrics step1 = t.step();
  const double first = step1.loss;
  // [Exposed communication] never exceeds the communication, the first step's included
  // (whose waits also cover the threads' start on a busy machine).
  EXPECT_LE(step1.exposed_comm_ms, step1.comm_ms + 1e-9);
  StepMetrics last;
  while (t.steps_done() < o.steps) {
    last = t.step();
    EXPECT_LE(last.exposed_comm_ms, last.comm_ms + 1e-9) << "step " << last.step;
  }
  // A uniform guess over 64 tokens costs ln 64 = 4.16; a memorised period-23 sequence
  // costs near 0 once the context holds a full period.
  EXPECT_GT(first, 3.5);
  EXPECT_LT(last.loss, 0.5) << "first loss " << first;
  EXPECT_TRUE(std::isfinite(last.grad_norm));
}

TEST_P(TrainingFamily, GradientAccumulationEqualsLargeBatch) {
  TempDir dir;
  const std::string model = write_model(dir, GetParam()), data = write_random_data(dir, 4000);
  TrainOptions big = base_options(model, data);
  big.batch = 16;
  big.global_batch = 16;
  TrainOptions acc = big;
  acc.batch = 4;
  Trainer a(big), b(acc);
  ASSERT_EQ(a.micro_steps(), 1);
  ASSERT_EQ(b.micro_steps(), 4);
  for (int s = 0; s < 3; ++s) {
    StepMetrics ma = a.step(), mb = b.step();
    // The two runs differ only in the order fp32 gradients are summed: 4 partial sums
    // of 4 sequences against one sum of 16. Relative rounding error of a sum is about
    // eps32 * log2(terms) ~ 1e-6; AdamW turns that into parameter differences of order
    // lr * 1e-6 / |update| ~ 1e-6 relative, and three steps compound it a little.
    EXPECT_NEAR(ma.loss, mb.loss, 1e-5 * ma.loss) << "step " << s;
    EXPECT_NEAR(ma.grad_norm, mb.grad_norm, 1e-4 * ma.grad_norm) << "step " << s;
  }
  EXPECT_LT(max_rel_diff(b.params(), a.params()), 1e-5);
}

TEST_P(TrainingFamily, ResumeIsBitwiseIdentical) {
  TempDir dir;
  const std::string model = write_model(dir, GetParam()), data = write_random_data(dir, 3000);
  TrainOptions o = base_options(model, data);
  o.global_batch = 8;  // two micro-steps
  Trainer unbroken(o);
  std::vector<double> losses;
  while (unbroken.steps_done() < o.steps) losses.push_back(unbroken.step().loss);

  TrainOptions first = o;
  first.steps = o.steps;
  Trainer part1(first);
  for (int s = 0; s < 3; ++s) ASSERT_EQ(part1.step().loss, losses[static_cast<size_t>(s)]);
  part1.save(dir / "ckpt");

  TrainOptions second = o;
  second.resume = dir / "ckpt";
  second.model.clear();  // taken from the checkpoint
  Trainer part2(second);
  ASSERT_EQ(part2.steps_done(), 3);
  for (int s = 3; s < o.steps; ++s) ASSERT_EQ(part2.step().loss, losses[static_cast<size_t>(s)]);
  ASSERT_EQ(part2.params().size(), unbroken.params().size());
  for (size_t u = 0; u < unbroken.params().size(); ++u)
    ASSERT_EQ(part2.params()[u], unbroken.params()[u]) << "unit " << u;
}

INSTANTIATE_TEST_SUITE_P(Families, TrainingFamily, ::testing::Values("gpt2", "llama"));

TEST(Training, RunStopsAtTotalStepsAndWritesMetrics) {
  TempDir dir;
  TrainOptions o = base_options(write_model(dir, "gpt2"), write_random_data(dir, 2000));
  o.steps = 3;
  o.metrics = dir / "m.jsonl";
  o.save = dir / "ckpt";
  Trainer t(o);
  StepMetrics last = t.run();
  EXPECT_EQ(last.step, 3);
  std::ifstream in(o.metrics);
  std::string line;
  int n = 0;
  const std::vector<std::string> keys = {
      "step",    "loss",       "lr",      "grad_norm",       "tokens_per_s",
      "step_ms", "compute_ms", "comm_ms", "exposed_comm_ms", "peak_mem_bytes"};
  while (std::getline(in, line)) {
    // One line per step; the summary after them is the tandem command's (test_prediction).
    auto j = nlohmann::json::parse(line);
    EXPECT_FALSE(j.contains("summary"));
    EXPECT_EQ(j.size(), keys.size());
    for (const auto& k : keys) EXPECT_TRUE(j.contains(k)) << k;
    EXPECT_EQ(j["step"].get<int>(), ++n);
    EXPECT_GT(j["peak_mem_bytes"].get<uint64_t>(), 0u);
  }
  EXPECT_EQ(n, 3);
  // The steps the run took, as the metrics file has them.
  ASSERT_EQ(t.ran().size(), 3u);
  for (int s = 0; s < 3; ++s) EXPECT_EQ(t.ran()[static_cast<size_t>(s)].step, s + 1);
  EXPECT_EQ(t.ran().back().loss, last.loss);
  // Resuming a finished run to a larger --steps continues from its step.
  TrainOptions more = o;
  more.resume = o.save;
  more.steps = 5;
  Trainer t2(more);
  EXPECT_EQ(t2.steps_done(), 3);
  EXPECT_EQ(t2.run().step, 5);
  ASSERT_EQ(t2.ran().size(), 2u);
  EXPECT_EQ(t2.ran().front().step, 4);
  // Nothing left to do: no steps.
  Trainer t3(more);
  EXPECT_EQ(t3.run().step, 0);
  EXPECT_TRUE(t3.ran().empty());
}

// [Exposed communication] A compute wait counts only while some communication op runs:
// overlapping communication counts once, a wait that outlasts it (the thread scheduled late)
// or comes after it counts nothing, and empty runs are ignored.
TEST(Training, ExposedCommunicationIsWaitingWhileCommunicationRuns) {
  EXPECT_DOUBLE_EQ(exposed_overlap_ms({{5, 6}, {0, 2}, {1, 3}}, {{1.5, 4}, {4.5, 7}}), 1.5 + 1.0);
  EXPECT_DOUBLE_EQ(exposed_overlap_ms({{0, 2}}, {{2, 5}}), 0.0);
  EXPECT_DOUBLE_EQ(exposed_overlap_ms({{0, 2}, {3, 3}}, {{-1, 9}}), 2.0);
  EXPECT_DOUBLE_EQ(exposed_overlap_ms(Intervals{}, {{0, 1}}), 0.0);
  EXPECT_DOUBLE_EQ(exposed_overlap_ms({{0, 10}}, Intervals{}), 0.0);
  EXPECT_DOUBLE_EQ(exposed_overlap_ms({{0, 10}}, {{1, 2}, {3, 4}, {9, 12}}), 3.0);
}

// TrainOptions::flash_backward is process-wide, and each trainer sets its own: a later
// trainer left at automatic does not run with an earlier one's form, and only a form that was
// asked for is named in the notes.
TEST(Training, EachTrainerSetsItsFlashBackward) {
  TempDir dir;
  TrainOptions o = base_options(write_model(dir, "gpt2"), write_random_data(dir, 2000));
  o.steps = 2;
  const auto noted = [](const Trainer& t) {
    for (const std::string& n : t.notes())
      if (n.find("flash backward") != std::string::npos) return true;
    return false;
  };
  o.flash_backward = FlashBackward::one_pass;
  {
    const Trainer t(o);
    EXPECT_EQ(kernels_flash_backward(), FlashBackward::one_pass);
    EXPECT_TRUE(noted(t));
  }
  o.flash_backward = FlashBackward::automatic;
  {
    const Trainer t(o);
    EXPECT_EQ(kernels_flash_backward(), FlashBackward::automatic);
    EXPECT_FALSE(noted(t));
  }
}

TEST(Training, GlobalBatchMustBeWhole) {
  TempDir dir;
  TrainOptions o = base_options(write_model(dir, "gpt2"), write_random_data(dir, 2000));
  o.global_batch = 10;  // not a multiple of batch 4
  EXPECT_THROW(Trainer{o}, Error);
}

// [Step graph] is a CUDA switch: on the CPU the options refuse it with the flag's name and
// the device it needs, and an Engine asked for it directly refuses it too. Its default,
// auto, is off on the CPU, so a CPU run with it trains.
TEST(Training, CudaGraphNeedsACudaDevice) {
  TempDir dir;
  TrainOptions o = base_options(write_model(dir, "gpt2"), write_random_data(dir, 2000));
  ASSERT_EQ(o.cuda_graph, CudaGraphMode::automatic);
  {
    Trainer t{o};
    EXPECT_FALSE(t.cuda_graph());
    EXPECT_TRUE(std::isfinite(t.step().loss));
  }
  o.cuda_graph = CudaGraphMode::on;
  try {
    Trainer t{o};
    ADD_FAILURE() << "a CPU run took --cuda-graph";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(),
              "--cuda-graph captures the step as a CUDA graph: it needs --device cuda");
  }
  const ModelLayout m(preset("gpt2-tiny"));
  EngineConfig c;
  c.batch = 2;
  c.seq = 16;
  c.global_batch = 2;
  c.cuda_graph = true;
  auto device = device_create_cpu();
  auto world = comm_world(*device, CommOptions{});
  try {
    Engine e(m, c, *device, *world);
    ADD_FAILURE() << "a CPU engine took cuda_graph";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("--cuda-graph needs a device that captures graphs"),
              std::string::npos)
        << e.message();
  }
}

// --cuda-graph's three sides and their spellings: auto is on only for a run of one CUDA
// rank (a captured collective is outside the watchdog, which matters only where another
// rank can die); true / false, the spelling of earlier checkpoints, read as on / off; the
// JSON a run writes reads back as the same mode.
TEST(Training, CudaGraphAutoIsOnForOneCudaRank) {
  EXPECT_TRUE(cuda_graph_resolve(CudaGraphMode::automatic, DeviceKind::cuda, 1));
  EXPECT_FALSE(cuda_graph_resolve(CudaGraphMode::automatic, DeviceKind::cuda, 2));
  EXPECT_FALSE(cuda_graph_resolve(CudaGraphMode::automatic, DeviceKind::cpu, 1));
  EXPECT_TRUE(cuda_graph_resolve(CudaGraphMode::on, DeviceKind::cuda, 4));
  EXPECT_FALSE(cuda_graph_resolve(CudaGraphMode::off, DeviceKind::cuda, 1));
  const std::pair<nlohmann::json, CudaGraphMode> spellings[] = {{"auto", CudaGraphMode::automatic},
                                                                {"on", CudaGraphMode::on},
                                                                {"off", CudaGraphMode::off},
                                                                {true, CudaGraphMode::on},
                                                                {false, CudaGraphMode::off}};
  for (const auto& [value, mode] : spellings) {
    TrainOptions o;
    train_options_apply_json(o, {{"cuda-graph", value}});
    EXPECT_EQ(o.cuda_graph, mode) << value.dump();
    TrainOptions back;
    train_options_apply_json(back, {{"cuda-graph", train_options_to_json(o).at("cuda-graph")}});
    EXPECT_EQ(back.cuda_graph, mode) << value.dump();
  }
  TrainOptions o;
  try {
    train_options_apply_json(o, {{"cuda-graph", "sometimes"}});
    ADD_FAILURE() << "took 'sometimes'";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "--cuda-graph must be auto, on or off, got 'sometimes'");
  }
  try {
    train_options_apply_json(o, {{"cuda-graph", 1}});
    ADD_FAILURE() << "took 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "option 'cuda-graph' must be \"auto\", \"on\" or \"off\", got 1");
  }
}

namespace {

// Three CPU steps of a small model under c (batch 2 x 16, global batch c.global_batch), each
// on its own ids: what two engine settings that must agree bit for bit are compared on.
struct ThreeSteps {
  std::vector<double> losses, norms;
  std::vector<std::vector<float>> grads, params;
  bool in_shard = false;
  uint64_t peak = 0;
  int64_t pending = -1;  // the step whose update was pending before the parameters were read
};
ThreeSteps three_steps(const ModelLayout& m, EngineConfig c) {
  c.batch = 2;
  c.seq = 16;
  c.total_steps = 3;
  auto device = device_create_cpu();
  auto world = comm_world(*device, CommOptions{});
  Engine e(m, c, *device, *world);
  ThreeSteps run;
  std::vector<int32_t> in(static_cast<size_t>(c.global_batch * c.seq)), tg(in.size());
  for (int64_t step = 0; step < 3; ++step) {
    for (size_t i = 0; i < in.size(); ++i) {
      in[i] = static_cast<int32_t>((i * 7 + static_cast<size_t>(step) * 13) % 97);
      tg[i] = static_cast<int32_t>((i * 11 + static_cast<size_t>(step) * 5) % 97);
    }
    const StepResult r = e.step(step, StepBatch{in.data(), tg.data(), in.size()});
    run.losses.push_back(r.loss);
    run.norms.push_back(r.grad_norm);
  }
  run.grads = e.grad_shards();
  run.pending = e.pending_update();
  run.params = e.gather_params();
  EXPECT_EQ(e.pending_update(), -1);
  run.in_shard = e.program().grads_in_shard;
  run.peak = e.peak_bytes();
  return run;
}

// Two runs that must agree bit for bit: losses, gradient norms, gradient shards, parameters.
void expect_same_bits(const ThreeSteps& a, const ThreeSteps& b) {
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.norms, b.norms);
  EXPECT_EQ(a.grads, b.grads);
  EXPECT_EQ(a.params, b.params);
}

// A switch that must not change a bit: three steps with it on and off for each case (a model, a
// strategy, micro-steps, gradients in the shard or not), compared by `check(on, off)`.
struct SwitchCase {
  const char* model;
  Strategy s;
  int micro;
  bool in_shard;
};
template <class Set, class Check>
void for_both_sides(std::initializer_list<SwitchCase> cases, Set set, Check check) {
  for (const SwitchCase& k : cases) {
    SCOPED_TRACE(
        fmt::format("{} {} M={} in shard {}", k.model, strategy_name(k.s), k.micro, k.in_shard));
    const ModelLayout m(preset(k.model));
    ThreeSteps runs[2];
    for (int side = 0; side < 2; ++side) {
      EngineConfig c;
      c.strategy = k.s;
      c.global_batch = 2 * k.micro;
      c.grads_in_shard = k.in_shard;
      set(c, side == 0);
      runs[side] = three_steps(m, c);
    }
    check(runs[0], runs[1]);
  }
}

}  // namespace

// [Gradients in the shard] Where the program accumulates gradients in the shards (a shard
// group of one rank, with the sums' order kept), three steps give the general path's losses,
// gradient norms, gradient shards and parameters bit for bit; full with several micro-steps,
// where it does not apply, keeps the general program. The peak falls by the unsharded
// gradient buffers where they lived beside everything else (none).
TEST(Training, GradientsInTheShardAreTheGeneralPathsBits) {
  const ModelLayout m(preset("llama-tiny"));
  struct Case {
    Strategy s;
    int micro;
  };
  for (const Case k : {Case{Strategy::none, 1}, Case{Strategy::none, 2}, Case{Strategy::full, 1},
                       Case{Strategy::grad_op, 2}, Case{Strategy::full, 2}}) {
    SCOPED_TRACE(fmt::format("{} M={}", strategy_name(k.s), k.micro));
    ThreeSteps runs[2];
    for (int side = 0; side < 2; ++side) {
      EngineConfig c;
      c.strategy = k.s;
      c.global_batch = 2 * k.micro;
      c.grads_in_shard = side == 0;
      runs[side] = three_steps(m, c);
    }
    const bool applies = k.s != Strategy::full || k.micro == 1;
    EXPECT_EQ(runs[0].in_shard, applies);
    EXPECT_FALSE(runs[1].in_shard);
    expect_same_bits(runs[0], runs[1]);
    if (k.s == Strategy::none) {
      EXPECT_LT(runs[0].peak, runs[1].peak);
    } else if (!applies) {
      EXPECT_EQ(runs[0].peak, runs[1].peak);
    }
  }
}

// [Fresh gradients] A buffer's first backward writing it gives the bits of clearing it whole
// and adding: losses, gradient norms, gradient shards and parameters over three steps, for
// a tied and an untied model, every strategy with one and two micro-steps (windowed
// micro-steps keep unsharded buffers, which are started the same way), and the general path
// beside the shard.
TEST(Training, FreshGradientsAreTheClearedOnesBits) {
  for_both_sides(
      {SwitchCase{"gpt2-tiny", Strategy::none, 1, true},
       SwitchCase{"gpt2-tiny", Strategy::full, 2, true},
       SwitchCase{"llama-tiny", Strategy::full, 1, true},
       SwitchCase{"llama-tiny", Strategy::grad_op, 2, true},
       SwitchCase{"llama-tiny", Strategy::none, 2, false},
       SwitchCase{"pythia-tiny", Strategy::full, 1, false}},
      [](EngineConfig& c, bool on) { c.fresh_gradients = on; },
      [](const ThreeSteps& on, const ThreeSteps& off) {
        expect_same_bits(on, off);
        EXPECT_GT(on.norms.back(), 0.0);
      });
}

// [Update at gather] Each unit's update run before its gather in the next step gives the
// step end's bits: losses, gradient norms, gradient shards and (once settled) parameters over
// three steps, for a tied and an untied model, every strategy, one and two micro-steps, and
// the general gradient path. The third step's update is pending until the parameters are read.
TEST(Training, UpdateAtGatherIsTheStepEndsBits) {
  for_both_sides(
      {SwitchCase{"gpt2-tiny", Strategy::none, 1, true},
       SwitchCase{"gpt2-tiny", Strategy::full, 2, true},
       SwitchCase{"llama-tiny", Strategy::full, 1, true},
       SwitchCase{"llama-tiny", Strategy::grad_op, 2, true},
       SwitchCase{"llama-tiny", Strategy::none, 2, false},
       SwitchCase{"llama-tiny", Strategy::full, 1, false},
       SwitchCase{"pythia-tiny", Strategy::full, 1, true}},
      [](EngineConfig& c, bool on) { c.update_at_gather = on; },
      [](const ThreeSteps& on, const ThreeSteps& off) {
        EXPECT_EQ(on.pending, 2);
        EXPECT_EQ(off.pending, -1);
        expect_same_bits(on, off);
        EXPECT_NE(on.losses[1], on.losses[2]);  // the updates changed the model
      });
}

TEST(Schedule, WarmupThenCosine) {
  OptimConfig c;
  c.lr = 1.0f;
  c.warmup = 4;
  c.min_lr_ratio = 0.1f;
  EXPECT_FLOAT_EQ(lr_at(c, 0, 14), 0.25f);
  EXPECT_FLOAT_EQ(lr_at(c, 3, 14), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(c, 4, 14), 1.0f);  // cosine starts at the peak
  EXPECT_NEAR(lr_at(c, 9, 14), 0.1f + 0.45f * (1 + std::cos(M_PI * 0.5)), 1e-6);  // midpoint
  EXPECT_NEAR(lr_at(c, 14, 14), 0.1f, 1e-6);                                      // the floor
  c.warmup = 0;
  EXPECT_FLOAT_EQ(lr_at(c, 0, 10), 1.0f);
}

TEST(Schedule, ClipScale) {
  OptimConfig c;
  c.grad_clip = 1.0f;
  EXPECT_FLOAT_EQ(clip_scale(c, 0.5), 1.0f);
  EXPECT_NEAR(clip_scale(c, 4.0), 1.0 / (4.0 + 1e-6), 1e-7);
  c.grad_clip = 0.0f;
  EXPECT_FLOAT_EQ(clip_scale(c, 100.0), 1.0f);
}

TEST(Init, DependsOnlyOnSeedAndPosition) {
  ModelLayout m(preset("llama-tiny"));
  for (int u = 0; u < m.num_units(); ++u) {
    const int64_t n = m.unit(u).numel;
    std::vector<float> whole(static_cast<size_t>(n + 5)), parts(static_cast<size_t>(n + 5));
    m.init_slice(u, 5, 0, n + 5, whole.data());
    // Split at awkward points, as shards of different world sizes would be.
    const int64_t cuts[] = {0, n / 3 + 1, n / 2 + 7, n + 5};
    for (int c = 0; c < 3; ++c) m.init_slice(u, 5, cuts[c], cuts[c + 1], parts.data() + cuts[c]);
    ASSERT_EQ(whole, parts) << m.unit(u).name;
    for (int64_t i = n; i < n + 5; ++i) EXPECT_EQ(whole[static_cast<size_t>(i)], 0.0f);
  }
  std::vector<float> a(1000), b(1000);
  m.init_slice(1, 5, 0, 1000, a.data());
  m.init_slice(1, 6, 0, 1000, b.data());
  EXPECT_NE(a, b);
}

TEST(Init, NormalWeightsHaveTheConfiguredSpread) {
  ModelLayout m(preset("gpt2-tiny"));
  const ParamSpec& p = m.unit(1).param(ParamId::fc_w);
  std::vector<float> w(static_cast<size_t>(p.numel));
  m.init_slice(1, 3, p.offset, p.offset + p.numel, w.data());
  double s = 0, s2 = 0;
  for (float x : w) s += x, s2 += static_cast<double>(x) * x;
  const double n = static_cast<double>(w.size()), mean = s / n,
               sd = std::sqrt(s2 / n - mean * mean);
  // 65536 samples: the sample standard deviation is within 1% of 0.02 with overwhelming
  // probability (its relative standard error is 1/sqrt(2n) = 0.28%).
  EXPECT_NEAR(sd, 0.02, 0.0002);
  EXPECT_NEAR(mean, 0.0, 5 * 0.02 / std::sqrt(n));
  // Norm gains start at one, biases at zero.
  float g;
  const int64_t gain = m.unit(1).param(ParamId::norm1_w).offset;
  m.init_slice(1, 3, gain, gain + 1, &g);
  EXPECT_EQ(g, 1.0f);
}

TEST(Presets, ParameterCountsMatchThePublishedModels) {
  EXPECT_EQ(preset("gpt2-124m").num_params(), 124439808);    // GPT-2 small
  EXPECT_EQ(preset("gpt2-1558m").num_params(), 1557611200);  // GPT-2 XL
  EXPECT_EQ(preset("llama2-7b").num_params(), 6738415616);   // Llama 2 7B
  EXPECT_EQ(preset("llama3-8b").num_params(), 8030261248);   // Llama 3 8B
  // The unit layout holds exactly those parameters, plus the vocabulary padding rows.
  for (const auto& name : preset_names()) {
    ModelConfig c = preset(name);
    ModelLayout m(c);
    const int64_t padding = int64_t{c.vocab_padded - c.vocab} * c.d_model * (c.tied() ? 1 : 2);
    EXPECT_EQ(m.total_numel(), c.num_params() + padding) << name;
  }
}

TEST(Presets, JsonRoundTripAndOverrides) {
  for (const auto& name : preset_names()) {
    ModelConfig c = preset(name);
    EXPECT_TRUE(model_config_from_json(model_config_to_json(c)) == c) << name;
  }
  ModelConfig c = model_config_from_json({{"preset", "llama-tiny"}, {"n_layer", 2}});
  EXPECT_EQ(c.n_layer, 2);
  EXPECT_EQ(c.n_kv_head, 2);
  EXPECT_THROW(model_config_from_json({{"preset", "llama-tiny"}, {"n_kv_head", 3}}), Error);
  EXPECT_THROW(model_config_from_json({{"d_model", 130}, {"n_head", 4}}), Error);
  EXPECT_THROW(model_config_from_json({{"colour", 1}}), Error);
}
