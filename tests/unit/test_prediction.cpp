// Predicted next to measured (plan/prediction.h): the planner request built for a run,
// the hardware `--hardware` resolves to on each device, the medians of the measured
// steps, the summary line and JSON, and `tandem train` printing and writing them.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "core/error.h"
#include "device/device.h"
#include "io/tokens.h"
#include "model/config.h"
#include "model/model.h"
#include "plan/hardware.h"
#include "plan/plan.h"
#include "plan/prediction.h"
#include "train/options.h"

namespace tandem {
namespace {

TrainOptions options(const std::string& strategy, int batch, int global_batch) {
  TrainOptions o;
  o.model = "gpt2-tiny";
  o.strategy = strategy_parse(strategy);
  o.batch = batch;
  o.global_batch = global_batch;
  o.seq = 32;
  o.max_gathered = 3;
  if (strategy == "hybrid") o.shard_group = 2;
  return o;
}

TEST(Prediction, RequestCarriesTheRun) {
  const Hardware hw = hardware_preset("h100-sxm");
  const PlanRequest r = prediction_request(options("grad-op", 2, 16), preset("gpt2-tiny"), 2, hw);
  EXPECT_EQ(r.task, PlanTask::train);
  EXPECT_EQ(r.model.name, "gpt2-tiny");
  EXPECT_EQ(r.ranks, 2);
  EXPECT_EQ(r.batch, 2);
  EXPECT_EQ(r.seq, 32);
  EXPECT_EQ(r.micro_steps, 4) << "16 sequences = 2 per rank x 2 ranks x 4 micro-steps";
  EXPECT_EQ(r.max_gathered, 3);
  EXPECT_EQ(r.strategy, "grad-op");
  EXPECT_EQ(r.shard_group, 0);
  EXPECT_EQ(r.hw.name, "h100-sxm");
}

TEST(Prediction, RequestMicroStepsAndShardGroup) {
  const Hardware hw = hardware_preset("cpu-local");
  const ModelConfig c = preset("gpt2-tiny");
  // --global-batch 0 is one micro-step of batch x world.
  EXPECT_EQ(prediction_request(options("full", 4, 0), c, 3, hw).micro_steps, 1);
  EXPECT_EQ(prediction_request(options("full", 1, 12), c, 3, hw).micro_steps, 4);
  const PlanRequest hybrid = prediction_request(options("hybrid", 1, 8), c, 4, hw);
  EXPECT_EQ(hybrid.shard_group, 2);
  EXPECT_EQ(hybrid.micro_steps, 2);
  EXPECT_THROW(prediction_request(options("full", 2, 6), c, 2, hw), Error);
}

TEST(Prediction, PlansOnlyTheRunsStrategy) {
  PlanRequest r = prediction_request(options("none", 2, 8), preset("gpt2-tiny"), 2,
                                     hardware_preset("pcie-gen4"));
  const StepPrediction p = prediction_plan(r);
  const StrategyPlan want = plan_train_strategy(r, Strategy::none);
  EXPECT_EQ(p.hardware, "pcie-gen4");
  EXPECT_EQ(p.source, "preset pcie-gen4");
  EXPECT_FALSE(p.calibrated);
  EXPECT_DOUBLE_EQ(p.step_ms, want.step_ms);
  EXPECT_DOUBLE_EQ(p.compute_ms, want.compute_ms);
  EXPECT_DOUBLE_EQ(p.comm_ms, want.comm_ms);
  EXPECT_DOUBLE_EQ(p.exposed_comm_ms, want.exposed_comm_ms);
  EXPECT_GT(p.comm_ms, 0) << "two ranks all-reduce over PCIe";
  // Another strategy is another program.
  r.strategy = "full";
  EXPECT_NE(prediction_plan(r).comm_ms, p.comm_ms);
}

// [Decode calibration] on the CPU's kernels: a block of four times the weights takes longer
// to stream, the rate is the block's bytes over its time, and applying it prices decoding's
// weight reads at it.
TEST(Prediction, DecodeCalibrationTimesABlockOfTheModel) {
  const auto device = device_create_cpu();
  ModelConfig c = preset("llama-tiny");
  c.d_model = 256;
  c.n_head = 4;
  c.n_kv_head = 4;
  c.d_ff = 512;
  // The fastest of three calibrations each: a 30 ms window on a loaded machine can be
  // several times slow.
  const auto fastest = [&](const ModelConfig& m) {
    DecodeRates best = prediction_measure_decode(*device, m, 1, 16, 30);
    for (int i = 0; i < 2; ++i) {
      const DecodeRates r = prediction_measure_decode(*device, m, 1, 16, 30);
      if (r.block_ms < best.block_ms) best = r;
    }
    return best;
  };
  const DecodeRates small = fastest(c);
  ModelConfig wide = c;
  wide.d_model = 512;
  wide.d_ff = 1024;
  const DecodeRates big = fastest(wide);
  EXPECT_GT(small.block_ms, 0);
  EXPECT_GT(big.block_ms, small.block_ms);
  const double bytes = static_cast<double>(ModelLayout(c).unit(1).numel) * 4;
  EXPECT_NEAR(small.matvec_GBps, bytes / (small.block_ms * 1e6), 1e-9 * small.matvec_GBps);
  Hardware hw = hardware_preset("cpu-local");
  prediction_apply_decode(hw, small);
  EXPECT_EQ(hw.matvec_GBps, small.matvec_GBps);
  EXPECT_NEAR(hw.matvec_ms(bytes), small.block_ms, 1e-9 * small.block_ms);
  EXPECT_NE(hw.source.find("decoding measured"), std::string::npos) << hw.source;
  // The head's product, timed alone: its bytes over its time, and what prices the head.
  const double head_bytes = static_cast<double>(c.vocab_padded) * c.d_model * 4;
  EXPECT_GT(small.head_ms, 0);
  EXPECT_NEAR(small.head_GBps, head_bytes / (small.head_ms * 1e6), 1e-9 * small.head_GBps);
  EXPECT_EQ(hw.head_matvec_GBps, small.head_GBps);
  EXPECT_NEAR(hw.head_matvec_ms(head_bytes), small.head_ms, 1e-9 * small.head_ms);
  EXPECT_THROW(prediction_measure_decode(*device, c, 0, 16, 30), Error);
}

TEST(Prediction, PresetOfEachDevice) {
  EXPECT_EQ(hardware_preset_for_device("cpu"), "cpu-local");
  EXPECT_EQ(hardware_preset_for_device("cuda:0 (NVIDIA H200)"), "h200-sxm");
  EXPECT_EQ(hardware_preset_for_device("cuda:3 (NVIDIA H100 80GB HBM3)"), "h100-sxm");
  EXPECT_EQ(hardware_preset_for_device("cuda:1 (NVIDIA A100-SXM4-80GB)"), "a100-80g");
  EXPECT_EQ(hardware_preset_for_device("cuda:0 (NVIDIA GeForce RTX 4090)"), "");
}

class PredictionFiles : public testing::Test {
 protected:
  cli_test::TempDir dir;
  std::string compute = dir / "compute.json", links = dir / "links.json";
  void SetUp() override {
    std::ofstream(compute) << R"({"device": "cpu", "tflops_f32": 0.25, "tflops_bf16": null,
        "copy_GBps": 12, "mem_GiB": 4})";
    // 10 us + bus bytes / 2 GB/s at 2 ranks (bus bytes = bytes / 2).
    std::ofstream(links) << R"({"ranks": 2,
        "all_gather": [{"bytes": 2000, "time_us": 10.5}, {"bytes": 2000000, "time_us": 510}]})";
  }
};

TEST_F(PredictionFiles, AutoResolvesPerDevice) {
  TrainOptions o;
  ASSERT_EQ(o.hardware, "auto");
  const PredictionHardware cpu = prediction_hardware(o, "cpu");
  EXPECT_TRUE(cpu.available);
  EXPECT_EQ(cpu.hw.name, "cpu-local");
  EXPECT_FALSE(cpu.hw.gpu);
  EXPECT_TRUE(cpu.measure_compute) << "cpu-local's figures are nominal: auto measures them";
  EXPECT_TRUE(cpu.measure_links);

  const PredictionHardware h200 = prediction_hardware(o, "cuda:0 (NVIDIA H200)");
  EXPECT_TRUE(h200.available);
  EXPECT_EQ(h200.hw.name, "h200-sxm");
  EXPECT_FALSE(h200.measure_compute);
  EXPECT_FALSE(h200.measure_links);

  const PredictionHardware unknown = prediction_hardware(o, "cuda:0 (NVIDIA GeForce RTX 4090)");
  EXPECT_FALSE(unknown.available);
  EXPECT_NE(unknown.why.find("RTX 4090"), std::string::npos) << unknown.why;
  EXPECT_NE(unknown.why.find("--hardware"), std::string::npos) << unknown.why;

  o.hardware = "none";
  EXPECT_FALSE(prediction_hardware(o, "cpu").available);
}

TEST_F(PredictionFiles, PresetsAndProbeFiles) {
  TrainOptions o;
  o.hardware = "a100-80g";
  const PredictionHardware named = prediction_hardware(o, "cpu");
  EXPECT_EQ(named.hw.name, "a100-80g") << "a named preset is taken as it is, on any device";
  EXPECT_FALSE(named.measure_compute);
  EXPECT_FALSE(named.measure_links);

  // auto on the CPU with probe files: the files' figures, nothing measured.
  o.hardware = "auto";
  o.hardware_compute = compute;
  EXPECT_FALSE(prediction_hardware(o, "cpu").measure_compute);
  EXPECT_TRUE(prediction_hardware(o, "cpu").measure_links);
  o.hardware_links = links;
  const PredictionHardware files = prediction_hardware(o, "cpu");
  EXPECT_FALSE(files.measure_compute);
  EXPECT_FALSE(files.measure_links);
  EXPECT_DOUBLE_EQ(files.hw.tflops, 0.25);
  EXPECT_DOUBLE_EQ(files.hw.hbm_GBps, 12);
  EXPECT_NEAR(files.hw.all_gather.latency_us, 10, 1e-6);
  EXPECT_NEAR(files.hw.all_gather.GBps, 2, 1e-6);
  EXPECT_EQ(files.hw.links_ranks, 2);
  // The same layering as `tandem plan --hardware --compute --links`.
  const Hardware plan = hardware_resolve("cpu-local", compute, links);
  EXPECT_EQ(files.hw.source, plan.source);
  EXPECT_NE(plan.source.find("compute probe"), std::string::npos) << plan.source;
  EXPECT_NE(plan.source.find("links probe"), std::string::npos) << plan.source;

  o.hardware_links = compute;  // not a links file
  EXPECT_THROW(prediction_hardware(o, "cpu"), Error);
  o.hardware_links = dir / "absent.json";
  EXPECT_THROW(prediction_hardware(o, "cpu"), Error);
}

TEST(Prediction, OptionsAreChecked) {
  TrainOptions o;
  EXPECT_NO_THROW(prediction_options_validate(o));
  o.hardware = "h200-sxm";
  EXPECT_NO_THROW(prediction_options_validate(o));
  o.hardware = "tpu-v9";
  try {
    prediction_options_validate(o);
    ADD_FAILURE() << "an unknown --hardware was accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("tpu-v9"), std::string::npos) << e.message();
    EXPECT_NE(e.message().find("h200-sxm"), std::string::npos) << e.message();
  }
  o.hardware = "none";
  o.hardware_links = "links.json";
  EXPECT_THROW(prediction_options_validate(o), Error);
  // The training loop has no use for them: its own checks let them through.
  EXPECT_NO_THROW(train_options_validate(o));
  // The JSON keys of --config files.
  TrainOptions j;
  train_options_apply_json(
      j, {{"hardware", "pcie-gen4"}, {"hardware-compute", "c.json"}, {"hardware-links", "l.json"}});
  EXPECT_EQ(j.hardware, "pcie-gen4");
  EXPECT_EQ(j.hardware_compute, "c.json");
  EXPECT_EQ(j.hardware_links, "l.json");
  EXPECT_EQ(train_options_to_json(j)["hardware-links"], "l.json");
}

std::vector<StepMetrics> steps(const std::vector<double>& step_ms, int64_t first = 1) {
  std::vector<StepMetrics> out;
  for (size_t i = 0; i < step_ms.size(); ++i) {
    StepMetrics m;
    m.step = first + static_cast<int64_t>(i);
    m.step_ms = step_ms[i];
    m.compute_ms = step_ms[i] / 2;
    m.comm_ms = 1;
    m.exposed_comm_ms = step_ms[i] / 10;
    m.tokens_per_s = 1000 / step_ms[i];
    out.push_back(m);
  }
  return out;
}

TEST(Prediction, MedianLeavesOutTheWarmUp) {
  // Steps 1 and 2 are slow (warm-up); the median of steps 3..7 is 10.
  const MeasuredSteps m = prediction_measured(steps({500, 90, 10, 12, 9, 10, 11}));
  EXPECT_EQ(m.steps, 7);
  EXPECT_EQ(m.first, 3);
  EXPECT_EQ(m.last, 7);
  EXPECT_DOUBLE_EQ(m.step_ms, 10);
  EXPECT_DOUBLE_EQ(m.compute_ms, 5);
  EXPECT_DOUBLE_EQ(m.exposed_comm_ms, 1);
  EXPECT_DOUBLE_EQ(m.comm_ms, 1);
  EXPECT_DOUBLE_EQ(m.tokens_per_s, 100);
  // A resumed run numbers its steps from the checkpoint's.
  const MeasuredSteps resumed = prediction_measured(steps({50, 40, 30, 20}, 11));
  EXPECT_EQ(resumed.first, 13);
  EXPECT_EQ(resumed.last, 14);
  EXPECT_DOUBLE_EQ(resumed.step_ms, 25);
  // Short runs leave out at most half of their steps.
  const MeasuredSteps three = prediction_measured(steps({30, 20, 10}));
  EXPECT_EQ(three.first, 2);
  EXPECT_DOUBLE_EQ(three.step_ms, 15);
  const MeasuredSteps one = prediction_measured(steps({30}));
  EXPECT_EQ(one.first, 1);
  EXPECT_EQ(one.last, 1);
  EXPECT_DOUBLE_EQ(one.step_ms, 30);
}

TEST(Prediction, SummaryLineAndJson) {
  RunSummary s;
  s.measured = prediction_measured(steps({80, 60, 50, 52, 50.2}));
  StepPrediction p;
  p.hardware = "h200-sxm";
  p.source = "preset h200-sxm";
  p.step_ms = 48.1;
  p.compute_ms = 47.5;
  p.comm_ms = 3;
  p.exposed_comm_ms = 0.3;
  s.predicted = p;
  EXPECT_NEAR(prediction_off(s), 50.2 / 48.1 - 1, 1e-12);
  EXPECT_EQ(prediction_line(s),
            "predicted (h200-sxm): step 48.1 ms, exposed communication 0.3 ms | measured "
            "(median of steps 3..5): step 50.2 ms, exposed 5.02 ms | step time off by +4%");

  const nlohmann::json j = prediction_to_json(s);
  EXPECT_EQ(j["summary"], true);
  EXPECT_EQ(j["steps"], 5);
  std::set<std::string> keys;
  for (const auto& [k, v] : j["measured"].items()) keys.insert(k);
  EXPECT_EQ(keys, (std::set<std::string>{"step_ms", "exposed_comm_ms", "compute_ms", "comm_ms",
                                         "tokens_per_s"}));
  EXPECT_DOUBLE_EQ(j["measured"]["step_ms"].get<double>(), 50.2);
  EXPECT_DOUBLE_EQ(j["measured"]["compute_ms"].get<double>(), 25.1);
  keys.clear();
  for (const auto& [k, v] : j["predicted"].items()) keys.insert(k);
  EXPECT_EQ(keys, (std::set<std::string>{"hardware", "source", "step_ms", "exposed_comm_ms",
                                         "compute_ms", "comm_ms"}));
  EXPECT_EQ(j["predicted"]["hardware"], "h200-sxm");
  EXPECT_DOUBLE_EQ(j["predicted"]["step_ms"].get<double>(), 48.1);
  EXPECT_DOUBLE_EQ(j["predicted"]["exposed_comm_ms"].get<double>(), 0.3);

  s.predicted->calibrated = true;
  s.predicted->hardware = "cpu-local";
  s.predicted->step_ms = 62.75;
  EXPECT_NE(prediction_line(s).find("predicted (cpu-local, calibrated)"), std::string::npos);
  EXPECT_NE(prediction_line(s).find("off by -20%"), std::string::npos) << prediction_line(s);

  // No prediction: null in the JSON, the reason on the line.
  s.predicted.reset();
  s.why = "--hardware none";
  EXPECT_TRUE(prediction_to_json(s)["predicted"].is_null());
  EXPECT_EQ(prediction_line(s),
            "predicted: none (--hardware none) | measured (median of steps 3..5): step 50.2 ms, "
            "exposed 5.02 ms");
}

TEST(Prediction, CalibrationMeasuresThisMachine) {
  const CpuRates r = prediction_measure_cpu(128, 20);
  EXPECT_EQ(r.gemm_n, 128);
  EXPECT_GT(r.tflops, 0);
  EXPECT_GT(r.copy_GBps, 0);
  Hardware hw = hardware_preset("cpu-local");
  prediction_apply_cpu(hw, r);
  EXPECT_EQ(hw.tflops, r.tflops);
  EXPECT_EQ(hw.hbm_GBps, r.copy_GBps);
  EXPECT_EQ(hw.name, "cpu-local");
  EXPECT_NE(hw.source.find("measured in this run"), std::string::npos) << hw.source;
  EXPECT_NE(hw.source.find("n = 128"), std::string::npos) << hw.source;
}

TEST(Prediction, CalibrationGemmSizeFollowsTheWidth) {
  auto size = [](int width) {
    ModelConfig c = preset("gpt2-tiny");
    c.d_model = width;
    return prediction_gemm_size(c);
  };
  EXPECT_EQ(size(128), 128);
  EXPECT_EQ(size(384), 384);
  EXPECT_EQ(size(500), 512);
  EXPECT_EQ(size(768), 768);
  EXPECT_EQ(size(24), 128);
  EXPECT_EQ(size(4096), 2048);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// `tandem train` end to end.

namespace cli_test {
namespace {

std::string token_file(const TempDir& dir) {
  std::vector<uint32_t> tokens(800);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 32 + static_cast<uint32_t>(i * 13 % 90);
  const std::string path = dir / "data.tok";
  tokens_write(path, tokens, 2);
  return path;
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::vector<std::string> tiny_run(const std::string& data, const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"train", "--model",    "gpt2-tiny", "--data", data,
                                   "--seq", "16",         "--batch",   "1",      "--steps",
                                   "3",     "--progress", "none"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(PredictionCli, TrainPrintsAndWritesTheSummary) {
  TempDir dir;
  const std::string data = token_file(dir), metrics = dir / "metrics.jsonl";
  const RunResult r = run_tandem(tiny_run(data, {"--metrics", metrics, "--calibrate-after", "0"}));
  ASSERT_TRUE(succeeded(r));
  EXPECT_NE(r.out.find("predicted (cpu-local, calibrated): step "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| measured (median of steps 2..3): step "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("| step time off by "), std::string::npos) << r.out;
  const std::vector<nlohmann::json> lines = read_lines(metrics);
  ASSERT_EQ(lines.size(), 4u) << "three steps and the summary";
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(lines[i].size(), 10u) << lines[i].dump();
  const nlohmann::json& s = lines.back();
  EXPECT_EQ(s["summary"], true);
  EXPECT_EQ(s["steps"], 3);
  EXPECT_EQ(s["predicted"]["hardware"], "cpu-local");
  EXPECT_EQ(s["model"], "gpt2-tiny");
  EXPECT_GT(s["predicted"]["step_ms"].get<double>(), 0);
  EXPECT_GT(s["measured"]["step_ms"].get<double>(), 0);

  // A named preset predicts for that machine, whatever this one is; none predicts nothing.
  ASSERT_TRUE(
      succeeded(run_tandem(tiny_run(data, {"--metrics", metrics, "--hardware", "h200-sxm"}))));
  EXPECT_EQ(read_lines(metrics).back()["predicted"]["hardware"], "h200-sxm");
  const RunResult none = run_tandem(tiny_run(data, {"--metrics", metrics, "--hardware", "none"}));
  ASSERT_TRUE(succeeded(none));
  EXPECT_NE(none.out.find("predicted: none (--hardware none)"), std::string::npos) << none.out;
  EXPECT_TRUE(read_lines(metrics).back()["predicted"].is_null());

  // By default a run this short is not held up by the calibration: it says so and predicts
  // nothing, the measured steps still summed up.
  const RunResult quick = run_tandem(tiny_run(data, {"--metrics", metrics}));
  ASSERT_TRUE(succeeded(quick));
  EXPECT_NE(quick.out.find("predicted: none ("), std::string::npos) << quick.out;
  EXPECT_NE(quick.out.find("too short a run to measure this machine for"), std::string::npos)
      << quick.out;
  EXPECT_NE(quick.out.find("runs of 20 s or more are measured (--calibrate-after)"),
            std::string::npos)
      << quick.out;
  EXPECT_NE(quick.out.find("| measured (median of steps 2..3): step "), std::string::npos)
      << quick.out;
  EXPECT_TRUE(read_lines(metrics).back()["predicted"].is_null());
  EXPECT_GT(read_lines(metrics).back()["measured"]["step_ms"].get<double>(), 0);
  EXPECT_TRUE(one_error_line(run_tandem(tiny_run(data, {"--calibrate-after", "-1"})), 1,
                             {"--calibrate-after", "0 or more", "-1"}));
}

TEST(PredictionCli, BadHardwareStopsBeforeTheFirstStep) {
  TempDir dir;
  const std::string data = token_file(dir), metrics = dir / "metrics.jsonl";
  EXPECT_TRUE(one_error_line(run_tandem(tiny_run(data, {"--hardware", "tpu-v9"})), 1,
                             {"--hardware", "tpu-v9"}));
  const std::string absent = dir / "absent-links.json";
  EXPECT_TRUE(
      one_error_line(run_tandem(tiny_run(data, {"--hardware-links", absent, "--metrics", metrics})),
                     1, {"links probe file", absent}));
  EXPECT_FALSE(std::filesystem::exists(metrics)) << "a step ran although the hardware is wrong";
}

}  // namespace
}  // namespace cli_test
}  // namespace tandem
