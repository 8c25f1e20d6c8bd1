// tandem trace analyze on synthetic traces with closed-form answers: a PyTorch trace with
// compute on the legacy default stream beside an NCCL stream over two profiler steps, a
// tandem trace whose waits are not work, extra communication patterns, gzipped files, and
// what is not a trace.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_runner.h"
#include "core/error.h"
#include "plan/trace_analyze.h"

namespace tandem {
namespace {

nlohmann::json kernel(const std::string& name, const std::string& cat, int64_t tid, double from_ms,
                      double to_ms) {
  return {{"ph", "X"},
          {"cat", cat},
          {"name", name},
          {"pid", 0},
          {"tid", tid},
          {"ts", from_ms * 1e3},
          {"dur", (to_ms - from_ms) * 1e3},
          {"args", {{"stream", tid}}}};
}

nlohmann::json thread_name(int64_t pid, int64_t tid, const std::string& name) {
  return {
      {"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}};
}

// Step 1 (from 0 ms): GEMMs on stream 7 at [0, 10) and [20, 30), an all-gather on stream 13
// at [5, 25): 10 ms of it overlapped, 10 exposed. Step 2 (from 40 ms): a GEMM at [40, 50),
// a device-to-device copy on stream 13 at [45, 60): 5 overlapped, 10 exposed.
nlohmann::json pytorch_trace() {
  nlohmann::json ev = nlohmann::json::array();
  ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 0}, {"args", {{"name", "GPU 0"}}}});
  ev.push_back(thread_name(0, 7, "stream 7"));
  ev.push_back(thread_name(0, 13, "stream 13"));
  ev.push_back({{"ph", "X"},
                {"cat", "user_annotation"},
                {"name", "ProfilerStep#1"},
                {"pid", 1},
                {"tid", 1},
                {"ts", 0.0},
                {"dur", 3e3}});
  ev.push_back({{"ph", "X"},
                {"cat", "user_annotation"},
                {"name", "ProfilerStep#2"},
                {"pid", 1},
                {"tid", 1},
                {"ts", 40e3},
                {"dur", 3e3}});
  ev.push_back({{"ph", "X"},
                {"cat", "cpu_op"},
                {"name", "aten::mm"},
                {"pid", 1},
                {"tid", 1},
                {"ts", 1e3},
                {"dur", 1e3}});
  ev.push_back(kernel("sm90_xmma_gemm_bf16", "kernel", 7, 0, 10));
  ev.push_back(kernel("sm90_xmma_gemm_bf16", "kernel", 7, 20, 30));
  ev.push_back(kernel("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                      "kernel", 13, 5, 25));
  ev.push_back(kernel("sm90_xmma_gemm_bf16", "kernel", 7, 40, 50));
  ev.push_back(kernel("Memcpy DtoD (Device -> Device)", "gpu_memcpy", 13, 45, 60));
  return {{"traceEvents", ev}};
}

TEST(TraceAnalyze, PyTorchStreamsStepsAndTheLegacyDefault) {
  const TraceAnalysis a = trace_analyze(pytorch_trace());
  EXPECT_EQ(a.format, "pytorch");
  ASSERT_EQ(a.streams.size(), 2u);
  const TraceStream& s7 = a.streams[0];
  const TraceStream& s13 = a.streams[1];
  EXPECT_EQ(s7.tid, 7);
  EXPECT_TRUE(s7.legacy_default);
  EXPECT_FALSE(s13.legacy_default);
  EXPECT_EQ(s7.process, "GPU 0");
  EXPECT_DOUBLE_EQ(s7.times.compute_ms, 30);
  EXPECT_DOUBLE_EQ(s7.times.comm_ms, 0);
  EXPECT_DOUBLE_EQ(s13.times.comm_ms, 35);
  EXPECT_DOUBLE_EQ(s13.times.overlapped_ms, 15);
  EXPECT_DOUBLE_EQ(s13.times.exposed_ms, 20);
  EXPECT_EQ(s13.times.comm_events, 2);
  EXPECT_DOUBLE_EQ(a.total.exposed_ms, 20);
  EXPECT_DOUBLE_EQ(a.total.busy_ms, 65);
  ASSERT_EQ(a.steps.size(), 2u);
  EXPECT_EQ(a.steps[0].name, "ProfilerStep#1");
  EXPECT_DOUBLE_EQ(a.steps[0].times.comm_ms, 20);
  EXPECT_DOUBLE_EQ(a.steps[0].times.exposed_ms, 10);
  EXPECT_DOUBLE_EQ(a.steps[1].times.comm_ms, 15);
  EXPECT_DOUBLE_EQ(a.steps[1].times.overlapped_ms, 5);
  EXPECT_DOUBLE_EQ(a.steps[1].start_ms, 40);
  EXPECT_DOUBLE_EQ(a.steps[1].end_ms, 60);
  ASSERT_EQ(a.warnings.size(), 1u);
  EXPECT_NE(a.warnings[0].find("legacy default stream (stream 7)"), std::string::npos)
      << a.warnings[0];
  EXPECT_NE(a.warnings[0].find("stream 13"), std::string::npos) << a.warnings[0];
  // The same numbers as JSON and in the text.
  const nlohmann::json j = trace_analysis_json(a);
  EXPECT_DOUBLE_EQ(j["total"]["exposed_ms"].get<double>(), 20);
  EXPECT_DOUBLE_EQ(j["steps"][1]["save_ms"].get<double>(), 10);
  EXPECT_NE(trace_analysis_text(a).find("perfect overlap could save up to 20.000 ms"),
            std::string::npos)
      << trace_analysis_text(a);
}

// Compute on a non-default stream: no warning; a stream without a name: one.
TEST(TraceAnalyze, UnnamedStreamsAreNamedInAWarning) {
  nlohmann::json t = pytorch_trace();
  for (auto& e : t["traceEvents"])
    if (e["ph"] == "X" && e["tid"] == 7) e["tid"] = 20;
  const TraceAnalysis a = trace_analyze(t);
  ASSERT_EQ(a.warnings.size(), 1u);
  EXPECT_NE(a.warnings[0].find("without a name (tid 20)"), std::string::npos) << a.warnings[0];
}

// tandem's own trace: every track is device work, waits (category exposed) are not, and
// steps come from args.step. The gather at [2, 6) overlaps the forward at [0, 4) by 2 ms.
TEST(TraceAnalyze, TandemTracesAndTheirSteps) {
  nlohmann::json ev = nlohmann::json::array();
  ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 0}, {"args", {{"name", "rank 0"}}}});
  ev.push_back(thread_name(0, 0, "compute"));
  ev.push_back(thread_name(0, 1, "all-gather"));
  auto op = [](const std::string& name, int64_t tid, double a, double b, int64_t step,
               const std::string& cat = "") {
    nlohmann::json e = {{"ph", "X"},
                        {"name", name},
                        {"pid", 0},
                        {"tid", tid},
                        {"ts", a * 1e3},
                        {"dur", (b - a) * 1e3},
                        {"args", {{"step", step}}}};
    if (!cat.empty()) e["cat"] = cat;
    return e;
  };
  ev.push_back(op("forward block.0", 0, 0, 4, 1));
  ev.push_back(op("gather block.1", 1, 2, 6, 1));
  ev.push_back(op("wait for communication", 0, 4, 6, 1, "exposed"));
  ev.push_back(op("forward block.1", 0, 6, 10, 1));
  ev.push_back(op("gather block.0", 1, 10, 11, 2));
  const TraceAnalysis a = trace_analyze({{"traceEvents", ev}});
  EXPECT_EQ(a.format, "tandem");
  ASSERT_EQ(a.streams.size(), 2u);
  EXPECT_DOUBLE_EQ(a.streams[0].times.compute_ms, 8);
  EXPECT_DOUBLE_EQ(a.streams[1].times.comm_ms, 5);
  EXPECT_DOUBLE_EQ(a.streams[1].times.overlapped_ms, 2);
  EXPECT_DOUBLE_EQ(a.total.exposed_ms, 3);
  ASSERT_EQ(a.steps.size(), 2u);
  EXPECT_EQ(a.steps[0].name, "step 1");
  EXPECT_DOUBLE_EQ(a.steps[0].times.exposed_ms, 2);
  EXPECT_DOUBLE_EQ(a.steps[1].times.exposed_ms, 1);
  EXPECT_TRUE(a.warnings.empty());
}

TEST(TraceAnalyze, MorePatternsMarkMoreCommunication) {
  nlohmann::json t = pytorch_trace();
  t["traceEvents"].push_back(kernel("fancy_collective_kernel", "kernel", 13, 60, 64));
  EXPECT_DOUBLE_EQ(trace_analyze(t).total.comm_ms, 35);
  TraceAnalyzeOptions o;
  o.comm_patterns = {"fancy_coll"};
  EXPECT_DOUBLE_EQ(trace_analyze(t, o).total.comm_ms, 39);
  o.comm_patterns = {"("};
  EXPECT_THROW(trace_analyze(t, o), Error);
}

TEST(TraceAnalyze, RefusesWhatIsNotATrace) {
  EXPECT_THROW(trace_analyze(nlohmann::json{{"events", 1}}), Error);
  nlohmann::json host_only = pytorch_trace();
  nlohmann::json kept = nlohmann::json::array();
  for (const auto& e : host_only["traceEvents"])
    if (e.value("cat", "") == "user_annotation") kept.push_back(e);
  try {
    trace_analyze(nlohmann::json{{"traceEvents", kept}});
    FAIL() << "a trace without device work was analysed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no device work"), std::string::npos) << e.what();
  }
}

// The command line, on a gzipped file (PyTorch writes .json.gz when asked to).
TEST(TraceAnalyze, CommandReadsGzippedTraces) {
  const std::string path = testing::TempDir() + "pytorch_trace.json";
  std::ofstream(path) << pytorch_trace().dump();
  ASSERT_EQ(std::system(("gzip -f " + path).c_str()), 0);
  const cli_test::RunResult r = cli_test::run_tandem({"trace", "analyze", path + ".gz", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.describe();
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_DOUBLE_EQ(j["total"]["exposed_ms"].get<double>(), 20);
  EXPECT_EQ(j["warnings"].size(), 1u);
  const cli_test::RunResult text = cli_test::run_tandem({"trace", "analyze", path + ".gz"});
  EXPECT_NE(text.out.find("[legacy default]"), std::string::npos) << text.out;
  const cli_test::RunResult bad = cli_test::run_tandem({"trace", "analyze", path + ".missing"});
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("cannot read the trace"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace tandem
