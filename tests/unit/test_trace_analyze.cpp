// tandem trace analyze on synthetic traces with closed-form answers: a PyTorch trace with
// compute on the legacy default stream beside an NCCL stream over two profiler steps, a
// tandem trace whose waits are not work, extra communication patterns, gzipped files, and
// what is not a trace; and on real PyTorch traces from one H200 (tests/fixtures/traces,
// made by tools/torch_traces.py), against an interval computation of the test's own.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cli_runner.h"
#include "core/error.h"
#include "io/tokens.h"
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

// An op of a tandem trace as the step trace writes it: its phase as the category ("" for
// none), its step in the arguments.
nlohmann::json tandem_op(const std::string& name, int64_t tid, double from_ms, double to_ms,
                         int64_t step, const std::string& cat = "") {
  nlohmann::json e = {{"ph", "X"},
                      {"name", name},
                      {"pid", 0},
                      {"tid", tid},
                      {"ts", from_ms * 1e3},
                      {"dur", (to_ms - from_ms) * 1e3},
                      {"args", {{"step", step}}}};
  if (!cat.empty()) e["cat"] = cat;
  return e;
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
  // As the step trace writes them: each op's phase is its category.
  ev.push_back(tandem_op("forward block.0", 0, 0, 4, 1, "forward"));
  ev.push_back(tandem_op("gather block.1", 1, 2, 6, 1, "gather"));
  ev.push_back(tandem_op("wait for communication", 0, 4, 6, 1, "exposed"));
  ev.push_back(tandem_op("forward block.1", 0, 6, 10, 1, "forward"));
  ev.push_back(tandem_op("gather block.0", 1, 10, 11, 2));  // and without one
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

// [Update at gather] An update op on the all-gather track is busy time of that track but
// neither compute nor communication, as in the step's own report: it covers no other
// track's communication. Without its category the same event is compute, and does.
TEST(TraceAnalyze, TandemUpdateOpsAreNeither) {
  for (const bool categorised : {true, false}) {
    SCOPED_TRACE(categorised ? "update" : "no category");
    nlohmann::json ev = nlohmann::json::array();
    ev.push_back(thread_name(0, 0, "compute"));
    ev.push_back(thread_name(0, 1, "all-gather"));
    ev.push_back(thread_name(0, 2, "reduce-scatter"));
    // forward [0, 4); update [4, 10) on the all-gather track; a reduce [5, 9) beside it.
    ev.push_back(tandem_op("forward block.0", 0, 0, 4, 1, "forward"));
    ev.push_back(tandem_op("update block.1", 1, 4, 10, 1, categorised ? "update" : ""));
    ev.push_back(tandem_op("reduce-scatter block.0", 2, 5, 9, 1, "reduce-scatter"));
    const TraceAnalysis a = trace_analyze({{"traceEvents", ev}});
    ASSERT_EQ(a.streams.size(), 3u);
    const TraceStream& gather = a.streams[1];
    EXPECT_EQ(gather.name, "all-gather");
    EXPECT_DOUBLE_EQ(gather.times.busy_ms, 6);
    EXPECT_DOUBLE_EQ(gather.times.comm_ms, 0);
    EXPECT_DOUBLE_EQ(gather.times.compute_ms, categorised ? 0 : 6);
    EXPECT_DOUBLE_EQ(a.total.comm_ms, 4);
    EXPECT_DOUBLE_EQ(a.total.exposed_ms, categorised ? 4 : 0);
    ASSERT_EQ(a.events.size(), 3u);
    EXPECT_EQ(a.events[1].neither, categorised);
    EXPECT_FALSE(a.events[1].comm);
  }
}

// A trace that `tandem train --trace` wrote (two ranks, full sharding, two traced steps):
// every rank's three streams are found, the gathers and reduces are communication and the
// forwards and backwards compute, and the steps are the traced ones.
TEST(TraceAnalyze, ATraceTandemTrainWrote) {
  cli_test::TempDir dir;
  std::vector<uint32_t> tokens(800);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 32 + static_cast<uint32_t>(i * 13 % 90);
  const std::string data = dir / "data.tok", trace = dir / "trace.json";
  tokens_write(data, tokens, 2);
  const cli_test::RunResult r = cli_test::run_tandem(
      {"train", "--model",        "gpt2-tiny", "--data",        data, "--seq",   "16", "--batch",
       "1",     "--global-batch", "4",         "--steps",       "3",  "--ranks", "2",  "--progress",
       "none",  "--trace",        trace,       "--trace-steps", "2:3"},
      180);
  ASSERT_TRUE(cli_test::succeeded(r)) << r.err;
  const TraceAnalysis a = trace_analyze(trace_read(trace));
  EXPECT_EQ(a.format, "tandem");
  std::set<std::pair<std::string, std::string>> streams;
  for (const TraceStream& st : a.streams) {
    streams.insert({st.process, st.name});
    EXPECT_GT(st.times.busy_ms, 0) << st.process << " " << st.name;
    if (st.name == "compute") {
      EXPECT_GT(st.times.compute_ms, 0) << st.process;
      EXPECT_EQ(st.times.comm_events, 0) << st.process;
    } else {
      EXPECT_GT(st.times.comm_events, 0) << st.process << " " << st.name;
    }
  }
  EXPECT_EQ(streams, (std::set<std::pair<std::string, std::string>>{{"rank 0", "compute"},
                                                                    {"rank 0", "all-gather"},
                                                                    {"rank 0", "reduce-scatter"},
                                                                    {"rank 1", "compute"},
                                                                    {"rank 1", "all-gather"},
                                                                    {"rank 1", "reduce-scatter"}}));
  ASSERT_EQ(a.steps.size(), 2u);
  EXPECT_EQ(a.steps[0].name, "step 2");
  EXPECT_EQ(a.steps[1].name, "step 3");
  EXPECT_LE(a.total.exposed_ms, a.total.comm_ms);
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

// --- real PyTorch traces ------------------------------------------------------------------

std::string fixture(const std::string& name) {
  return std::string(TANDEM_TEST_DATA_DIR) + "/fixtures/traces/" + name;
}

const TraceStream* find_stream(const TraceAnalysis& a, int64_t tid) {
  for (const TraceStream& s : a.streams)
    if (s.tid == tid) return &s;
  return nullptr;
}

bool has_warning(const TraceAnalysis& a, const std::string& text) {
  for (const std::string& w : a.warnings)
    if (w.find(text) != std::string::npos) return true;
  return false;
}

// What must hold of any analysis: communication is overlapped or exposed, a union is no
// longer than its parts together and no shorter than either.
void expect_identities(const TraceTimes& t, const std::string& who) {
  SCOPED_TRACE(who);
  constexpr double eps = 1e-6;  // ms; the traces' times are microseconds with 3 decimals
  EXPECT_NEAR(t.exposed_ms + t.overlapped_ms, t.comm_ms, eps);
  EXPECT_GE(t.exposed_ms, -eps);
  EXPECT_GE(t.overlapped_ms, -eps);
  EXPECT_GE(t.busy_ms + eps, t.compute_ms);
  EXPECT_GE(t.busy_ms + eps, t.comm_ms);
  EXPECT_LE(t.busy_ms, t.compute_ms + t.comm_ms + eps);
  EXPECT_LE(t.comm_events, t.events);
}

void expect_identities(const TraceAnalysis& a) {
  for (const TraceStream& s : a.streams) expect_identities(s.times, "stream " + s.name);
  for (const TraceStep& s : a.steps) expect_identities(s.times, s.name);
  expect_identities(a.total, "total");
  // Every device event of these traces lies in a profiler step, so the steps add up to the
  // whole.
  int events = 0;
  double comm = 0, exposed = 0;
  for (const TraceStep& s : a.steps) {
    events += s.times.events;
    comm += s.times.comm_ms;
    exposed += s.times.exposed_ms;
  }
  EXPECT_EQ(events, a.total.events);
  EXPECT_EQ(static_cast<size_t>(a.total.events), a.events.size());
  EXPECT_NEAR(comm, a.total.comm_ms, 1e-6);
  EXPECT_NEAR(exposed, a.total.exposed_ms, 1e-6);
}

// The test's own reading of a PyTorch trace, independent of the analyzer: device rows by
// stream, straight from the JSON.
struct Span {
  double a, b;  // ms
};
struct RawTrace {
  std::vector<Span> comm, compute;  // the communication stream's rows, the others'
  std::vector<double> step_starts;  // ProfilerStep#N on the host, sorted
};

RawTrace raw_rows(const nlohmann::json& doc, int64_t comm_tid) {
  RawTrace r;
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "X") continue;
    const std::string cat = e.value("cat", ""), name = e.value("name", "");
    const double a = e["ts"].get<double>() / 1e3, b = a + e["dur"].get<double>() / 1e3;
    if (cat == "user_annotation" && name.rfind("ProfilerStep#", 0) == 0) r.step_starts.push_back(a);
    if (cat != "kernel" && cat != "gpu_memcpy" && cat != "gpu_memset") continue;
    // Communication on this trace's communication stream is its copies (the one-rank
    // all-gather and the explicit copy); everything on the other stream computes.
    if (e["tid"].get<int64_t>() == comm_tid) {
      EXPECT_EQ(cat, "gpu_memcpy") << name;
      r.comm.push_back({a, b});
    } else {
      r.compute.push_back({a, b});
    }
  }
  std::sort(r.step_starts.begin(), r.step_starts.end());
  return r;
}

bool inside(const std::vector<Span>& v, double t) {
  return std::any_of(v.begin(), v.end(), [t](const Span& s) { return s.a <= t && t < s.b; });
}

// The time within [from, to) covered by `of`, and of that the part `under` also covers: every
// elementary segment between two consecutive endpoints, tested at its midpoint.
std::pair<double, double> covered(const std::vector<Span>& of, const std::vector<Span>& under,
                                  double from, double to) {
  std::set<double> cuts{from, to};
  for (const auto* v : {&of, &under})
    for (const Span& s : *v) {
      if (s.a > from && s.a < to) cuts.insert(s.a);
      if (s.b > from && s.b < to) cuts.insert(s.b);
    }
  double all = 0, both = 0;
  for (auto it = cuts.begin(); std::next(it) != cuts.end(); ++it) {
    const double a = *it, b = *std::next(it), mid = (a + b) / 2;
    if (!inside(of, mid)) continue;
    all += b - a;
    if (inside(under, mid)) both += b - a;
  }
  return {all, both};
}

// Communication on a blocking stream issued before GEMMs on the legacy default stream: the
// two wait for each other, so none of the copies runs under a GEMM.
TEST(TraceAnalyze, PyTorchFixtureLegacyDefault) {
  const TraceAnalysis a = trace_analyze(trace_read(fixture("pytorch_legacy_default.json.gz")));
  EXPECT_EQ(a.format, "pytorch");
  ASSERT_EQ(a.streams.size(), 2u);
  const TraceStream* gemm = find_stream(a, 7);
  const TraceStream* comm = find_stream(a, 144);
  ASSERT_TRUE(gemm && comm);
  EXPECT_EQ(gemm->pid, 0);
  EXPECT_EQ(gemm->name, "stream 7");  // PyTorch writes "stream 7 "
  EXPECT_EQ(gemm->process, "GPU 0");  // the device's label, not the program's name
  EXPECT_TRUE(gemm->legacy_default);
  EXPECT_FALSE(comm->legacy_default);
  EXPECT_EQ(comm->name, "stream 144");
  // 8 GEMMs per step, each after a cuBLAS workspace memset; 2 copies per step.
  EXPECT_EQ(gemm->times.events, 32);
  EXPECT_EQ(gemm->times.comm_events, 0);
  EXPECT_EQ(comm->times.events, 4);
  EXPECT_EQ(comm->times.comm_events, 4);
  EXPECT_NEAR(comm->times.overlapped_ms, 0, 1e-9);
  EXPECT_NEAR(comm->times.exposed_ms, comm->times.comm_ms, 1e-9);
  EXPECT_GT(comm->times.comm_ms, 1.0);  // 2 x (256 MiB + 1 GiB) at about 2 TB/s
  EXPECT_TRUE(has_warning(a,
                          "compute runs on the legacy default stream (stream 7) while stream "
                          "144 communicates"))
      << trace_analysis_text(a);
  ASSERT_EQ(a.steps.size(), 2u);
  EXPECT_EQ(a.steps[0].name, "ProfilerStep#2");
  EXPECT_EQ(a.steps[1].name, "ProfilerStep#3");
  expect_identities(a);
}

// The same with the GEMMs on a non-blocking stream: the streams no longer wait for each other
// and the copies run partly under GEMMs (the copy holds SMs the first GEMM of each step waits
// for, so not wholly). The numbers against the test's own interval computation.
TEST(TraceAnalyze, PyTorchFixtureNonBlockingAgainstOwnIntervals) {
  const nlohmann::json doc = trace_read(fixture("pytorch_nonblocking.json.gz"));
  const TraceAnalysis a = trace_analyze(doc);
  ASSERT_EQ(a.streams.size(), 2u);
  const TraceStream* gemm = find_stream(a, 20);
  const TraceStream* comm = find_stream(a, 144);
  ASSERT_TRUE(gemm && comm);
  EXPECT_FALSE(gemm->legacy_default);
  EXPECT_FALSE(comm->legacy_default);
  EXPECT_EQ(find_stream(a, 7), nullptr);  // named in the trace, but idle
  EXPECT_TRUE(a.warnings.empty()) << trace_analysis_text(a);
  EXPECT_EQ(gemm->times.comm_events, 0);
  EXPECT_EQ(comm->times.comm_events, 4);

  const RawTrace raw = raw_rows(doc, 144);
  ASSERT_EQ(raw.comm.size(), 4u);
  ASSERT_EQ(raw.compute.size(), 32u);
  ASSERT_EQ(raw.step_starts.size(), 2u);
  const double inf = std::numeric_limits<double>::infinity();
  const auto [comm_ms, overlapped_ms] = covered(raw.comm, raw.compute, -inf, inf);
  const double compute_ms = covered(raw.compute, {}, -inf, inf).first;
  EXPECT_GT(overlapped_ms, 0.1);
  EXPECT_LT(overlapped_ms, comm_ms - 0.5);
  EXPECT_NEAR(comm->times.comm_ms, comm_ms, 1e-6);
  EXPECT_NEAR(comm->times.overlapped_ms, overlapped_ms, 1e-6);
  EXPECT_NEAR(comm->times.exposed_ms, comm_ms - overlapped_ms, 1e-6);
  EXPECT_NEAR(gemm->times.compute_ms, compute_ms, 1e-6);
  EXPECT_NEAR(a.total.exposed_ms, comm_ms - overlapped_ms, 1e-6);
  // Per step: from each ProfilerStep#N on the host to the next.
  ASSERT_EQ(a.steps.size(), 2u);
  const double bounds[] = {raw.step_starts[0], raw.step_starts[1], inf};
  for (int i = 0; i < 2; ++i) {
    // Each copy starts and ends within its step here, so clipping to the step is counting
    // by start.
    const auto [c, o] = covered(raw.comm, raw.compute, bounds[i], bounds[i + 1]);
    EXPECT_NEAR(a.steps[i].times.comm_ms, c, 1e-6) << a.steps[i].name;
    EXPECT_NEAR(a.steps[i].times.overlapped_ms, o, 1e-6) << a.steps[i].name;
  }
  expect_identities(a);
}

// An FSDP2 step at one rank: its reduce-scatters are one-rank NCCL copies on FSDP's own stream,
// inside FSDP::post_backward_reduce; the model computes on the legacy default stream.
TEST(TraceAnalyze, PyTorchFixtureFsdp2Steps) {
  const nlohmann::json doc = trace_read(fixture("pytorch_fsdp2.json.gz"));
  const TraceAnalysis a = trace_analyze(doc);
  ASSERT_EQ(a.steps.size(), 2u);
  EXPECT_EQ(a.steps[0].name, "ProfilerStep#2");
  EXPECT_EQ(a.steps[1].name, "ProfilerStep#3");
  EXPECT_LT(a.steps[0].end_ms, a.steps[1].start_ms + 1e-9);
  for (const TraceStep& s : a.steps) {
    EXPECT_GT(s.times.compute_ms, 0) << s.name;
    EXPECT_GT(s.times.comm_ms, 0) << s.name;
  }
  ASSERT_EQ(a.streams.size(), 2u);
  const TraceStream* model = find_stream(a, 7);
  const TraceStream* reduce = find_stream(a, 25);
  ASSERT_TRUE(model && reduce);
  EXPECT_TRUE(model->legacy_default);
  EXPECT_EQ(reduce->times.events, 6);
  EXPECT_EQ(reduce->times.comm_events, 6);
  EXPECT_TRUE(has_warning(a, "while stream 25 communicates")) << trace_analysis_text(a);
  // Every device event inside an FSDP::post_backward_reduce span of its stream is
  // communication; kernels are communication only when NCCL's (none at one rank).
  std::vector<std::pair<int64_t, Span>> reduce_spans;
  for (const auto& e : doc["traceEvents"])
    if (e.value("cat", "") == "gpu_user_annotation" &&
        e.value("name", "").rfind("FSDP::post_backward_reduce", 0) == 0) {
      const double t = e["ts"].get<double>() / 1e3;
      reduce_spans.push_back({e["tid"].get<int64_t>(), {t, t + e["dur"].get<double>() / 1e3}});
    }
  ASSERT_FALSE(reduce_spans.empty());
  int in_reduce = 0;
  for (const TraceEvent& e : a.events) {
    EXPECT_EQ(e.comm, e.name.rfind("Memcpy", 0) == 0) << e.name;
    for (const auto& [tid, s] : reduce_spans)
      if (tid == e.tid && e.start_ms >= s.a && e.end_ms <= s.b && tid == 25) {
        EXPECT_TRUE(e.comm) << e.name;
        ++in_reduce;
      }
  }
  EXPECT_GT(in_reduce, 0);
  expect_identities(a);
}

}  // namespace
}  // namespace tandem
