// tandem probe: the bandwidth and overlap formulas against hand computations, the trace
// writer's named tracks, and the three probes end to end through the real binary at one rank
// and, for overlap and links, at two ranks through --ranks (mpirun).
//
// [Probe test timing] The tests may run on as few as two cores shared with other work, under
// unknown load, so no test asserts on real GEMM or copy speed. The overlap tests pad each part
// with a 40 ms sleep on its stream (--compute-pad-ms/--comm-pad-ms) around a tiny GEMM and
// all-gather: a sleeping stream needs no core, so dedicated streams overlap whatever the load,
// and the stream configuration alone decides the result. Overlapped, t_both is ~40 ms and
// overlap ~1; serialised, t_both is ~80 ms and overlap ~0. The thresholds (>= 0.5 and <= 0.3)
// leave ~20 ms for late wake-ups in the median of 4 iterations.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <sched.h>

#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "model/config.h"
#include "plan/prediction.h"
#include "plan/probe_backend.h"
#include "plan/probe_compute.h"
#include "plan/probe_links.h"
#include "plan/probe_overlap.h"
#include "plan/trace.h"

namespace tandem {
namespace {

using cli_test::run_tandem;
using cli_test::succeeded;
using cli_test::TempDir;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(in), {}));
}

// ---- formulas ----

TEST(ProbeFormulas, BusBandwidthMatchesNcclTests) {
  // 1e9 bytes in 1000 us: algbw 1000 GB/s.
  EXPECT_DOUBLE_EQ(algbw_GBps(1'000'000'000, 1000), 1000.0);
  EXPECT_DOUBLE_EQ(busbw_GBps(Collective::all_gather, 2, 1'000'000'000, 1000), 500.0);      // x 1/2
  EXPECT_DOUBLE_EQ(busbw_GBps(Collective::reduce_scatter, 8, 1'000'000'000, 1000), 875.0);  // 7/8
  EXPECT_DOUBLE_EQ(busbw_GBps(Collective::all_reduce, 4, 1'000'000'000, 1000), 1500.0);     // 2*3/4
  EXPECT_DOUBLE_EQ(busbw_GBps(Collective::all_reduce, 2, 1'000'000'000, 1000), 1000.0);     // 2*1/2
  // 64 MiB in 25 ms: 67108864 / 0.025 / 1e9 = 2.68435456 GB/s.
  EXPECT_NEAR(algbw_GBps(64 << 20, 25'000), 2.68435456, 1e-12);
  EXPECT_NEAR(busbw_GBps(Collective::all_reduce, 3, 64 << 20, 25'000), 2.68435456 * 4 / 3, 1e-12);
  // One rank: no link, busbw 0; a zero time never divides by zero.
  EXPECT_EQ(busbw_GBps(Collective::all_gather, 1, 4096, 10), 0.0);
  EXPECT_EQ(algbw_GBps(4096, 0), 0.0);
}

TEST(ProbeFormulas, CollectiveShapesFollowNcclTestsRounding) {
  // 3 ranks, 1 KiB: 1024 / 12 = 85 elements per part, rounded down to 84 (multiple of 4).
  const CollectiveShape ag = collective_shape(Collective::all_gather, 3, 1024);
  EXPECT_EQ(ag.count, 84u);
  EXPECT_EQ(ag.send_elems, 84u);
  EXPECT_EQ(ag.recv_elems, 252u);
  EXPECT_EQ(ag.bytes, 1008u);  // the gathered output
  const CollectiveShape rs = collective_shape(Collective::reduce_scatter, 3, 1024);
  EXPECT_EQ(rs.count, 84u);
  EXPECT_EQ(rs.send_elems, 252u);
  EXPECT_EQ(rs.recv_elems, 84u);
  EXPECT_EQ(rs.bytes, 1008u);  // the input
  const CollectiveShape ar = collective_shape(Collective::all_reduce, 3, 1024);
  EXPECT_EQ(ar.count, 256u);
  EXPECT_EQ(ar.bytes, 1024u);
  EXPECT_EQ(collective_shape(Collective::all_gather, 2, 1 << 20).bytes, 1u << 20);
  EXPECT_EQ(collective_parse("all-reduce"), Collective::all_reduce);
  EXPECT_THROW(collective_parse("broadcast"), Error);
}

TEST(ProbeFormulas, OverlapFractionAndVerdict) {
  EXPECT_DOUBLE_EQ(overlap_fraction(10, 10, 12), 0.8);
  EXPECT_DOUBLE_EQ(overlap_fraction(10, 10, 20), 0.0);  // back to back
  EXPECT_DOUBLE_EQ(overlap_fraction(10, 10, 25), 0.0);  // worse than back to back: clipped
  EXPECT_DOUBLE_EQ(overlap_fraction(10, 5, 9), 1.0);    // faster than the longer part: clipped
  EXPECT_DOUBLE_EQ(overlap_fraction(30, 10, 35), 0.5);  // half of the shorter part hidden
  EXPECT_DOUBLE_EQ(overlap_fraction(0, 10, 10), 0.0);
  EXPECT_EQ(overlap_verdict(0.95), "overlaps");
  EXPECT_EQ(overlap_verdict(0.5), "partial overlap");
  EXPECT_EQ(overlap_verdict(0.05), "no overlap");
}

TEST(ProbeFormulas, OverlapLimitNamesTheStreamsOrContention) {
  auto measure = [](const char* verdict) {
    OverlapMeasure m;
    m.verdict = verdict;
    return m;
  };
  // The streams keep the parts apart: whatever the GEMMs do, the streams are the limit.
  EXPECT_EQ(overlap_limit(measure("no overlap"), measure("no overlap")), "streams");
  EXPECT_EQ(overlap_limit(measure("partial overlap"), measure("overlaps")), "streams");
  // The streams allow it; the GEMMs and the communication slow each other down.
  EXPECT_EQ(overlap_limit(measure("overlaps"), measure("no overlap")), "contention");
  EXPECT_EQ(overlap_limit(measure("overlaps"), measure("partial overlap")), "contention");
  // Nothing limits; and nothing is blamed on a verdict that could not be made.
  EXPECT_EQ(overlap_limit(measure("overlaps"), measure("overlaps")), "");
  EXPECT_EQ(overlap_limit(measure("too short to judge"), measure("no overlap")), "");
  EXPECT_EQ(overlap_limit(measure("overlaps"), measure("too short to judge")), "");
  EXPECT_EQ(overlap_limit(measure("no overlap"), measure("too short to judge")), "streams");
  EXPECT_DOUBLE_EQ(gemm_tflops(1000, 2), 1.0);            // 2e9 flops in 2 ms
  EXPECT_DOUBLE_EQ(copy_GBps(1'000'000'000, 1000), 2.0);  // read + write
  EXPECT_DOUBLE_EQ(probe_median({3, 1, 2}), 2.0);
  EXPECT_DOUBLE_EQ(probe_median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(probe_parse_bytes("4096", "--bytes"), 4096u);
  EXPECT_EQ(probe_parse_bytes("64KiB", "--bytes"), 65536u);
  EXPECT_EQ(probe_parse_bytes("1.5K", "--bytes"), 1536u);
  EXPECT_EQ(probe_parse_bytes("1 GiB", "--bytes"), size_t{1} << 30);
  EXPECT_EQ(probe_parse_bytes("16M", "--bytes"), size_t{16} << 20);
  for (const char* bad : {"", "lots", "12 parsecs", "-1K", "1.3K"})
    EXPECT_THROW(probe_parse_bytes(bad, "--bytes"), Error) << bad;
}

TEST(ProbeFormulas, CpuConfigurations) {
  auto device = device_create_cpu();
  auto backend = probe_backend_cpu(*device);
  const auto configs = overlap_configs(*backend);
  ASSERT_EQ(configs.size(), 3u);  // dedicated x {reused, new each iteration}, then shared
  EXPECT_EQ(configs[0].label(), "compute dedicated, comm dedicated, streams reused");
  EXPECT_EQ(configs[1].lifetime, StreamLifetime::per_iteration);
  EXPECT_EQ(configs[2].compute, StreamKind::shared);
  EXPECT_THROW(backend->stream_create(StreamKind::non_blocking, "x", 0), Error);
}

// ---- trace ----

TEST(ProbeTrace, EventsNeedNamedTracks) {
  Trace t(3, "rank 3");
  const int a = t.track("compute");
  const int b = t.track("all-gather");
  EXPECT_EQ(t.track("compute"), a);
  EXPECT_NE(a, b);
  EXPECT_THROW(t.track(""), Error);
  EXPECT_THROW(t.complete(b + 1, "x", 0, 1), Error);  // never named
  t.complete(a, "gemm", 10, 5, {{"n", 64}});
  t.instant(b, "mark", 12);
  const nlohmann::json doc = trace_document({t.events()});
  EXPECT_TRUE(trace_check(doc).empty());
  // A document with an event on an unnamed track is refused.
  nlohmann::json bad = doc;
  bad["traceEvents"].push_back(
      {{"ph", "X"}, {"name", "stray"}, {"pid", 3}, {"tid", 99}, {"ts", 0}, {"dur", 1}});
  const auto problems = trace_check(bad);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_NE(problems[0].find("stray"), std::string::npos);
  TempDir dir;
  EXPECT_THROW(trace_write(dir / "bad.json", bad), Error);
}

// Every non-metadata event's (pid, tid) has a non-empty thread_name; returns the names.
std::set<std::string> check_named_tracks(const nlohmann::json& doc, std::set<int>* pids) {
  std::map<std::pair<int, int>, std::string> names;
  for (const auto& e : doc.at("traceEvents"))
    if (e.at("ph") == "M" && e.at("name") == "thread_name")
      names[{e.at("pid").get<int>(), e.at("tid").get<int>()}] = e.at("args").at("name");
  std::set<std::string> used;
  size_t events = 0;
  for (const auto& e : doc.at("traceEvents")) {
    if (e.at("ph") == "M") continue;
    ++events;
    const auto key = std::make_pair(e.at("pid").get<int>(), e.at("tid").get<int>());
    EXPECT_TRUE(names.count(key) && !names[key].empty())
        << "event '" << e.value("name", "") << "' on unnamed track " << key.first << "/"
        << key.second;
    used.insert(names[key]);
    pids->insert(key.first);
  }
  EXPECT_GT(events, 0u);
  return used;
}

// ---- overlap ----

const nlohmann::json* find_config(const nlohmann::json& report, const std::string& compute,
                                  const std::string& streams) {
  for (const auto& c : report.at("configurations"))
    if (c.at("compute_stream") == compute && c.at("streams") == streams) return &c;
  return nullptr;
}

std::vector<std::string> padded_overlap_args(const std::string& trace) {
  return {"probe", "overlap",       "--gemm", "32",     "--bytes", "64KiB", "--warmup",
          "1",     "--iters",       "4",      "--json", "--trace", trace,   "--compute-pad-ms",
          "40",    "--comm-pad-ms", "40"};
}

// See [Probe test timing] for the sizes and thresholds. Both loads: the sleeps of stream
// semantics and the GEMMs of sharing (32 x 32, negligible beside the pads).
void expect_padded_verdicts(const nlohmann::json& report) {
  for (const char* streams : {"reused", "new-each-iteration"}) {
    const nlohmann::json* c = find_config(report, "dedicated", streams);
    ASSERT_NE(c, nullptr) << streams;
    for (const char* key :
         {"compute_stream", "comm_stream", "streams", "semantics", "sharing", "limited_by"})
      EXPECT_TRUE(c->contains(key)) << key;
    for (const char* load : {"semantics", "sharing"}) {
      const nlohmann::json& m = c->at(load);
      for (const char* key :
           {"t_compute_ms", "t_comm_ms", "t_both_ms", "overlap", "verdict", "rank", "noise"})
        EXPECT_TRUE(m.contains(key)) << load << " " << key;
      EXPECT_GE(m.at("overlap").get<double>(), 0.5) << load << " " << c->dump();
      EXPECT_GE(m.at("t_compute_ms").get<double>(), 39.0) << load << " " << c->dump();
      EXPECT_GE(m.at("t_comm_ms").get<double>(), 39.0) << load << " " << c->dump();
    }
  }
  const nlohmann::json* shared = find_config(report, "shared", "reused");
  ASSERT_NE(shared, nullptr);
  for (const char* load : {"semantics", "sharing"}) {
    EXPECT_LE(shared->at(load).at("overlap").get<double>(), 0.3) << load << " " << shared->dump();
    EXPECT_EQ(shared->at(load).at("verdict"), "no overlap") << load << " " << shared->dump();
  }
  EXPECT_EQ(shared->at("limited_by"), "streams");
}

TEST(ProbeOverlap, OneRankDedicatedStreamsOverlapSharedStreamDoesNot) {
  TempDir dir;
  const std::string trace = dir / "trace.json";
  const auto r = run_tandem(padded_overlap_args(trace), 120);
  ASSERT_TRUE(succeeded(r));
  const nlohmann::json report = nlohmann::json::parse(r.out);
  EXPECT_EQ(report.at("ranks"), 1);
  EXPECT_EQ(report.at("one_rank_copy"), true);
  EXPECT_EQ(report.at("gemm_n"), 32);
  EXPECT_EQ(report.at("gemm_dtype"), "fp32");
  EXPECT_EQ(report.at("train"), 8);
  EXPECT_EQ(report.at("bytes"), 65536);
  EXPECT_EQ(report.at("comm"), "one-rank all-gather");
  expect_padded_verdicts(report);

  const nlohmann::json doc = read_json(trace);
  EXPECT_TRUE(trace_check(doc).empty()) << trace_check(doc).front();
  std::set<int> pids;
  const auto tracks = check_named_tracks(doc, &pids);
  EXPECT_EQ(pids, std::set<int>{0});
  // One track per stream of each configuration.
  for (const char* name : {"compute [dedicated, reused]", "one-rank all-gather [dedicated, reused]",
                           "compute [dedicated, new-each-iteration]",
                           "one-rank all-gather [dedicated, new-each-iteration]",
                           "compute + one-rank all-gather [shared, reused]"})
    EXPECT_TRUE(tracks.count(name)) << name;
}

TEST(ProbeOverlap, SerializeGivesNoOverlap) {
  auto device = device_create_cpu();
  auto world = comm_world(*device, CommOptions{});
  auto backend = probe_backend_cpu(*device);
  OverlapOptions o;
  o.gemm_n = 32;
  o.bytes = 65536;
  o.warmup = 1;
  o.iters = 4;
  o.compute_pad_ms = 40;
  o.comm_pad_ms = 40;
  o.serialize = true;
  o.configs = {{StreamKind::dedicated, StreamKind::dedicated, StreamLifetime::reused}};
  const OverlapReport r = probe_overlap(*backend, *world, o);
  ASSERT_EQ(r.rows.size(), 1u);
  for (const OverlapMeasure* m : {&r.rows[0].semantics, &r.rows[0].sharing}) {
    EXPECT_LE(m->overlap, 0.3) << m->t_compute_ms << " " << m->t_comm_ms << " " << m->t_both_ms;
    EXPECT_GE(m->t_both_ms, 75.0);
  }
  EXPECT_EQ(r.rows[0].limited_by, "streams");
  EXPECT_NE(overlap_format(r).find("--serialize"), std::string::npos);
  EXPECT_NE(overlap_format(r).find("local copy"), std::string::npos);
}

TEST(ProbeOverlap, TwoRanksThroughMpirun) {
  TempDir dir;
  const std::string trace = dir / "trace.json";
  std::vector<std::string> args = padded_overlap_args(trace);
  args.insert(args.end(), {"--ranks", "2"});
  const auto r = run_tandem(args, 180);
  ASSERT_TRUE(succeeded(r));
  const nlohmann::json report = nlohmann::json::parse(r.out);  // rank 0 alone prints
  EXPECT_EQ(report.at("ranks"), 2);
  EXPECT_EQ(report.at("one_rank_copy"), false);
  EXPECT_EQ(report.at("comm"), "all-gather");
  expect_padded_verdicts(report);
  const nlohmann::json doc = read_json(trace);
  std::set<int> pids;
  check_named_tracks(doc, &pids);
  EXPECT_EQ(pids, (std::set<int>{0, 1}));  // one process per rank
}

TEST(ProbeOverlap, HumanReportHasOneVerdictLinePerConfiguration) {
  const auto r = run_tandem(
      {"probe", "overlap", "--gemm", "32", "--bytes", "16KiB", "--warmup", "0", "--iters", "1"});
  ASSERT_TRUE(succeeded(r));
  EXPECT_NE(r.out.find("1 rank: the communication is the one-rank all-gather, a local copy"),
            std::string::npos)
      << r.out;
  // One table per load, each with one line per configuration.
  const size_t semantics = r.out.find("\nstream semantics: ");
  const size_t sharing = r.out.find("\nsharing: ");
  ASSERT_NE(semantics, std::string::npos) << r.out;
  ASSERT_NE(sharing, std::string::npos) << r.out;
  ASSERT_LT(semantics, sharing);
  for (const std::string& table :
       {r.out.substr(semantics, sharing - semantics), r.out.substr(sharing)})
    for (const char* line : {"dedicated      dedicated      reused",
                             "dedicated      dedicated      new-each-iteration",
                             "shared         shared         reused"})
      EXPECT_NE(table.find(line), std::string::npos) << line << "\n" << r.out;
  // Parts this short are too short to judge, so nothing is blamed.
  EXPECT_EQ(r.out.find("limited by"), std::string::npos) << r.out;
}

// [Probe contention test] One core for everything (the affinity the child inherits, and
// one OpenBLAS thread): the sleeps of stream semantics leave it to the copy, so the
// dedicated streams overlap; the GEMMs of sharing take turns with the copy on it, so they do
// not, and the report must blame contention, not the streams. The GEMMs are calibrated on
// that core to 60 ms a train; the copy is 768 MiB (~50 ms). Long parts, because the sleeping
// thread still needs the core for a moment to start and to end its sleep, which with the
// core busy costs a few ms. A line marked noisy means other work took the core in between
// phases, and GEMMs far from their 60 ms alone mean it did during the calibration: then the
// numbers say nothing and the test is skipped, saying so.
TEST(ProbeOverlap, OneCoreGemmsContendWithTheCopySleepsDoNot) {
  cpu_set_t all, one;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  int first = 0;
  while (first < CPU_SETSIZE && !CPU_ISSET(first, &all)) ++first;
  ASSERT_LT(first, CPU_SETSIZE);
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const auto r = run_tandem({"probe", "overlap", "--target-ms", "60", "--train", "4", "--bytes",
                             "768MiB", "--warmup", "1", "--iters", "5", "--json"},
                            240);
  ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
  ASSERT_TRUE(succeeded(r));
  const nlohmann::json report = nlohmann::json::parse(r.out);
  for (const auto& c : report.at("configurations"))
    for (const char* load : {"semantics", "sharing"})
      if (c.at(load).at("noise").get<double>() > kOverlapNoisy)
        GTEST_SKIP() << "the core was busy with other work (a phase spread by "
                     << c.at(load).at("noise").get<double>() << "): " << c.dump();
  // The GEMMs alone should take the 60 ms they were calibrated to; far from it, the core ran
  // at another speed through the calibration than through the phases (other work took it
  // during one of them), and the overlap figures compare unlike things.
  for (const auto& c : report.at("configurations")) {
    const double alone = c.at("sharing").at("t_compute_ms").get<double>();
    if (alone < 0.7 * 60 || alone > 1.4 * 60)
      GTEST_SKIP() << "the core's speed changed between the calibration and the phases (the "
                   << "GEMMs calibrated to 60 ms took " << alone << " ms alone): " << c.dump();
  }
  for (const char* streams : {"reused", "new-each-iteration"}) {
    const nlohmann::json* c = find_config(report, "dedicated", streams);
    ASSERT_NE(c, nullptr) << streams;
    EXPECT_EQ(c->at("semantics").at("verdict"), "overlaps") << c->dump();
    EXPECT_LE(c->at("sharing").at("overlap").get<double>(), 0.3) << c->dump();
    EXPECT_EQ(c->at("limited_by"), "contention") << c->dump();
  }
  const nlohmann::json* shared = find_config(report, "shared", "reused");
  ASSERT_NE(shared, nullptr);
  EXPECT_EQ(shared->at("limited_by"), "streams") << shared->dump();
}

// ---- links ----

TEST(ProbeLinks, OneRankSweepSavesThePlannerSchema) {
  TempDir dir;
  const std::string save = dir / "links.json";
  const auto r = run_tandem({"probe", "links", "--max-bytes", "64KiB", "--save", save});
  ASSERT_TRUE(succeeded(r));
  const nlohmann::json j = read_json(save);
  std::set<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.insert(k);
  EXPECT_EQ(keys, (std::set<std::string>{"ranks", "device", "all_gather", "reduce_scatter",
                                         "all_reduce", "topology"}));
  EXPECT_EQ(j.at("ranks"), 1);
  EXPECT_EQ(j.at("device"), "cpu");
  for (const char* op : {"all_gather", "reduce_scatter", "all_reduce"}) {
    ASSERT_EQ(j.at(op).size(), 7u) << op;  // 1 KiB .. 64 KiB
    EXPECT_EQ(j.at(op)[0].at("bytes"), 1024);
    EXPECT_EQ(j.at(op)[6].at("bytes"), 65536);
    for (const auto& row : j.at(op)) {
      std::set<std::string> row_keys;
      for (const auto& [k, v] : row.items()) row_keys.insert(k);
      EXPECT_EQ(row_keys,
                (std::set<std::string>{"bytes", "time_us", "algbw_GBps", "busbw_GBps", "wrong"}));
      EXPECT_EQ(row.at("wrong"), 0);
      EXPECT_GT(row.at("time_us").get<double>(), 0);
      EXPECT_EQ(row.at("busbw_GBps").get<double>(), 0.0);  // one rank
    }
  }
  EXPECT_EQ(j.at("topology").at("ranks").size(), 1u);
  EXPECT_GE(j.at("topology").at("ranks")[0].at("cores").get<int>(), 1);
  EXPECT_NE(r.out.find("wrong values: 0"), std::string::npos);
}

TEST(ProbeLinks, CorruptionIsCountedLibrary) {
  auto device = device_create_cpu();
  auto world = comm_world(*device, CommOptions{});
  auto backend = probe_backend_cpu(*device);
  LinksOptions o;
  o.max_bytes = 4096;
  o.corrupt = links_corrupt_first(Collective::reduce_scatter, 1);
  const LinksReport r = probe_links(*backend, *world, o);
  EXPECT_EQ(r.wrong_total(), 1u);
  ASSERT_EQ(r.results.size(), 3u);
  EXPECT_EQ(r.results[1].first, Collective::reduce_scatter);
  EXPECT_EQ(r.results[1].second[0].wrong, 1u);  // the first size only
  EXPECT_EQ(r.results[1].second[1].wrong, 0u);
}

TEST(ProbeLinks, CorruptionFailsTheRunOneRank) {
  const auto r = run_tandem({"probe", "links", "--max-bytes", "4KiB", "--corrupt", "all_gather"});
  EXPECT_TRUE(cli_test::one_error_line(r, 1, {"1 wrong value"}));
  EXPECT_NE(r.out.find("wrong values: 1"), std::string::npos) << r.out;
}

TEST(ProbeLinks, CorruptionFailsTheRunTwoRanks) {
  TempDir dir;
  const std::string save = dir / "links.json";
  const auto ok =
      run_tandem({"probe", "links", "--ranks", "2", "--max-bytes", "16KiB", "--save", save}, 180);
  ASSERT_TRUE(succeeded(ok));
  const nlohmann::json j = read_json(save);
  EXPECT_EQ(j.at("ranks"), 2);
  for (const char* op : {"all_gather", "reduce_scatter", "all_reduce"})
    for (const auto& row : j.at(op)) {
      EXPECT_EQ(row.at("wrong"), 0) << op;
      const double alg = row.at("bytes").get<double>() / (row.at("time_us").get<double>() * 1e3);
      EXPECT_NEAR(row.at("algbw_GBps").get<double>(), alg, 1e-9 * alg);
      const double factor = std::string(op) == "all_reduce" ? 1.0 : 0.5;  // 2(n-1)/n, (n-1)/n
      EXPECT_NEAR(row.at("busbw_GBps").get<double>(), alg * factor, 1e-9 * alg);
    }

  const auto bad = run_tandem(
      {"probe", "links", "--ranks", "2", "--max-bytes", "4KiB", "--corrupt", "all_reduce"}, 180);
  EXPECT_FALSE(bad.timed_out);
  EXPECT_NE(bad.exit_code, 0) << bad.describe();
  EXPECT_NE(bad.out.find("wrong values: 1"), std::string::npos) << bad.describe();
  EXPECT_NE(bad.err.find("tandem: error: probe links found 1 wrong value"), std::string::npos)
      << bad.describe();
}

// ---- compute ----

TEST(ProbeCompute, SavesThePlannerSchema) {
  TempDir dir;
  const std::string save = dir / "compute.json";
  const auto r =
      run_tandem({"probe", "compute", "--sizes", "32,64", "--copy-bytes", "1MiB", "--save", save});
  ASSERT_TRUE(succeeded(r));
  const nlohmann::json j = read_json(save);
  std::set<std::string> keys;
  for (const auto& [k, v] : j.items()) keys.insert(k);
  EXPECT_EQ(keys, (std::set<std::string>{"device", "tflops_f32", "tflops_bf16", "copy_GBps",
                                         "mem_GiB", "kernels"}));
  EXPECT_EQ(j.at("device"), "cpu");
  EXPECT_GT(j.at("tflops_f32").get<double>(), 0);
  EXPECT_TRUE(j.at("tflops_bf16").is_null());
  EXPECT_GT(j.at("copy_GBps").get<double>(), 0);
  EXPECT_GT(j.at("mem_GiB").get<double>(), 0);
  EXPECT_NE(r.out.find("fp32 GEMM"), std::string::npos) << r.out;
  // Without --model: the default grid (gpt2-tiny and llama-tiny's calls on a CPU).
  const nlohmann::json& k = j.at("kernels");
  keys.clear();
  for (const auto& [key, v] : k.items()) keys.insert(key);
  EXPECT_EQ(keys, (std::set<std::string>{"dtype", "launch_us", "flash_backward", "model", "gemm",
                                         "attention", "memory", "optimizer", "grad_norm"}));
  EXPECT_EQ(k.at("flash_backward"), "automatic");
  EXPECT_GT(k.at("optimizer").at("GBps").get<double>(), 0);
  EXPECT_GT(k.at("grad_norm").at("GBps").get<double>(), 0);
  EXPECT_EQ(k.at("grad_norm").at("elements"), k.at("optimizer").at("elements"));
  EXPECT_EQ(k.at("dtype"), "fp32");
  EXPECT_TRUE(k.at("model").is_null());
  EXPECT_GE(k.at("launch_us").get<double>(), 0);
  std::set<std::string> kernels;
  for (const char* list : {"gemm", "attention", "memory"})
    for (const nlohmann::json& e : k.at(list)) {
      kernels.insert(e.at("kernel").get<std::string>());
      EXPECT_GT(e.at("ms").get<double>(), 0) << e.dump();
      EXPECT_TRUE(e.at("shape").is_object()) << e.dump();
      EXPECT_TRUE(e.contains(std::string(list) == "memory" ? "GBps" : "tflops")) << e.dump();
    }
  for (const char* name : {"linear_forward",
                           "linear_gelu_forward",
                           "linear_residual_forward",
                           "linear_backward",
                           "attention_forward",
                           "attention_backward",
                           "layernorm_forward",
                           "layernorm_backward",
                           "rmsnorm_forward",
                           "rmsnorm_backward",
                           "gelu_backward",
                           "swiglu_forward",
                           "swiglu_backward",
                           "rope_forward",
                           "rope_backward",
                           "add",
                           "zero",
                           "embedding_forward",
                           "embedding_backward",
                           "crossentropy_fused_backward"})
    EXPECT_EQ(kernels.count(name), 1u) << name;
  for (const nlohmann::json& e : k.at("attention")) {
    const nlohmann::json& s = e.at("shape");
    for (const char* f : {"B", "T", "Hq", "Hkv", "D"}) EXPECT_TRUE(s.contains(f)) << e.dump();
  }
  EXPECT_NE(r.out.find("kernels (fp32, the default grid)"), std::string::npos) << r.out;

  // --no-kernels: the file of old, with kernels null.
  const auto plain = run_tandem({"probe", "compute", "--sizes", "32", "--copy-bytes", "1MiB",
                                 "--no-kernels", "--save", save});
  ASSERT_TRUE(succeeded(plain));
  EXPECT_TRUE(read_json(save).at("kernels").is_null());
}

// A model's own shapes: every call of its step measured, and the planner prices the same
// model's units from them, at exactly those shapes, and says so.
// --kernel-ms sets how long each timed batch of one kernel's calls lasts: the library's
// defaults ([Sustained clocks]: 100 ms on a GPU, 1 ms on a CPU) and the flag's checks.
TEST(ProbeCompute, KernelBatchLength) {
  auto model = preset("gpt2-tiny");
  EXPECT_EQ(
      kernel_probe_for_model(model, 2, 32, DeviceKind::cpu, AttentionImpl::automatic).target_ms,
      1.0);
#ifdef TANDEM_HAVE_CUDA  // sizing CUDA calls needs the CUDA kernel table
  EXPECT_EQ(
      kernel_probe_for_model(model, 2, 32, DeviceKind::cuda, AttentionImpl::automatic).target_ms,
      kGpuKernelBatchMs);
  EXPECT_EQ(kernel_probe_default(DeviceKind::cuda, AttentionImpl::automatic).target_ms,
            kGpuKernelBatchMs);
#endif
  const auto ok =
      run_tandem({"probe", "compute", "--sizes", "64", "--copy-bytes", "64KiB", "--model",
                  "gpt2-tiny", "--batch", "1", "--seq", "8", "--kernel-ms", "2"});
  EXPECT_TRUE(succeeded(ok)) << ok.err;
  EXPECT_TRUE(cli_test::one_error_line(run_tandem({"probe", "compute", "--kernel-ms", "-1"}), 1,
                                       {"--kernel-ms must be in"}));
}

// The flash backward's form (TANDEM_FLASH_BACKWARD) is the probe's while it measures, goes into
// the file and its text, and the process's own setting is back afterwards; `tandem plan` says
// when the file's form is not the one a training run would take, and only then.
TEST(ProbeCompute, FlashBackwardFormIsRecordedAndPlanChecksIt) {
  kernels_set_flash_backward(FlashBackward::two_pass);
  auto device = device_create_cpu();
  KernelProbeOptions o =
      kernel_probe_for_model(preset("gpt2-tiny"), 1, 8, DeviceKind::cpu, AttentionImpl::automatic);
  o.flash_backward = FlashBackward::one_pass;
  o.reps = 1;
  o.target_ms = 0.01;
  EXPECT_EQ(probe_kernels(*device, o).flash_backward, FlashBackward::one_pass);
  EXPECT_EQ(kernels_flash_backward(), FlashBackward::two_pass);
  kernels_set_flash_backward(FlashBackward::automatic);

  TempDir dir;
  const auto probe = [&](const char* form, const std::string& save) {
    ::setenv("TANDEM_FLASH_BACKWARD", form, 1);
    const auto r = run_tandem({"probe", "compute", "--model", "gpt2-tiny", "--batch", "1", "--seq",
                               "8", "--sizes", "32", "--copy-bytes", "64KiB", "--kernel-ms", "0.1",
                               "--save", save});
    ::unsetenv("TANDEM_FLASH_BACKWARD");
    EXPECT_TRUE(succeeded(r)) << r.describe();
    return r;
  };
  const std::string one = dir / "one.json", two = dir / "two.json";
  const auto r = probe("one-pass", one);
  EXPECT_EQ(read_json(one).at("kernels").at("flash_backward"), "one-pass");
  EXPECT_NE(r.out.find("kernels (fp32, flash backward one-pass, the calls of gpt2-tiny"),
            std::string::npos)
      << r.out;
  probe("two-pass", two);
  EXPECT_EQ(read_json(two).at("kernels").at("flash_backward"), "two-pass");
  // Only a GPU's tables have a flash backward to mismatch: the same files as a GPU's.
  const auto as_gpu = [&](const std::string& file) {
    nlohmann::json j = read_json(file);
    const std::string gpu = file + ".cuda.json";
    j["device"] = "cuda";
    std::ofstream(gpu) << j.dump();
    return gpu;
  };
  const std::string one_gpu = as_gpu(one), two_gpu = as_gpu(two);

  const auto plan = [&](const char* form, const std::string& file, const char* task = "train") {
    ::setenv("TANDEM_FLASH_BACKWARD", form, 1);
    const auto p = run_tandem({"plan", "--task", task, "--model", "gpt2-tiny", "--batch", "1",
                               "--seq", "8", "--compute", file});
    ::unsetenv("TANDEM_FLASH_BACKWARD");
    EXPECT_TRUE(succeeded(p)) << p.describe();
    return p.err.find("measured with the flash backward") != std::string::npos;
  };
  EXPECT_TRUE(plan("", one_gpu));  // unset: a training run takes two passes
  EXPECT_TRUE(plan("two-pass", one_gpu));
  EXPECT_FALSE(plan("one-pass", one_gpu));
  EXPECT_FALSE(plan("", two_gpu));  // automatic is two passes
  EXPECT_TRUE(plan("one-pass", two_gpu));
  EXPECT_FALSE(plan("", one_gpu, "generate"));  // no backward to time
  EXPECT_FALSE(plan("", one));                  // a CPU's attention has no such form

  // A training run's prediction from the same file: a note for it to print, or none.
  TrainOptions t;
  t.hardware = "cpu-local";
  t.hardware_compute = one_gpu;
  const std::string note = prediction_hardware(t, "cpu").note;
  EXPECT_NE(note.find("measured with the flash backward one-pass and this training run takes "
                      "automatic"),
            std::string::npos)
      << note;
  t.hardware_compute = one;
  EXPECT_EQ(prediction_hardware(t, "cpu").note, "");
  t.hardware_compute = one_gpu;
  t.flash_backward = FlashBackward::one_pass;
  EXPECT_EQ(prediction_hardware(t, "cpu").note, "");
}

TEST(ProbeCompute, ModelTablesDriveThePlan) {
  TempDir dir;
  const std::string save = dir / "compute.json";
  const auto r = run_tandem({"probe", "compute", "--model", "gpt2-tiny", "--batch", "2", "--seq",
                             "32", "--sizes", "64", "--copy-bytes", "1MiB", "--save", save});
  ASSERT_TRUE(succeeded(r));
  const nlohmann::json k = read_json(save).at("kernels");
  EXPECT_EQ(k.at("model"), (nlohmann::json{{"name", "gpt2-tiny"}, {"batch", 2}, {"seq", 32}}));
  bool qkv = false, attention = false;
  for (const nlohmann::json& e : k.at("gemm"))
    qkv = qkv || (e.at("kernel") == "linear_forward" && e.at("shape").at("N") == 64 &&
                  e.at("shape").at("in") == 128 && e.at("shape").at("out") == 384);
  for (const nlohmann::json& e : k.at("attention"))
    attention = attention || (e.at("kernel") == "attention_backward" &&
                              e.at("shape").at("T") == 32 && e.at("shape").at("D") == 32);
  EXPECT_TRUE(qkv) << k.dump();
  EXPECT_TRUE(attention) << k.dump();

  const auto plan = run_tandem(
      {"plan", "--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--compute", save, "--json"});
  ASSERT_TRUE(succeeded(plan));
  const nlohmann::json p = nlohmann::json::parse(plan.out);
  const std::string source = p.at("hardware").at("source");
  EXPECT_NE(source.find("kernel tables"), std::string::npos) << source;
  EXPECT_NE(source.find("of gpt2-tiny at batch 2 x 32"), std::string::npos) << source;
  EXPECT_EQ(p.at("hardware").at("kernels").at("model"), "gpt2-tiny");
  const nlohmann::json& cost = p.at("kernel_cost");
  EXPECT_GT(cost.at("calls").get<int>(), 0);
  EXPECT_EQ(cost.at("measured"), cost.at("calls")) << cost.dump();
  EXPECT_GT(cost.at("ms_per_micro_step").get<double>(), 0);

  // Another batch: the same kernels at other shapes, interpolated, none at the ceilings.
  const auto other = run_tandem(
      {"plan", "--model", "gpt2-tiny", "--batch", "3", "--seq", "32", "--compute", save, "--json"});
  ASSERT_TRUE(succeeded(other));
  const nlohmann::json o = nlohmann::json::parse(other.out).at("kernel_cost");
  EXPECT_GT(o.at("interpolated").get<int>(), 0) << o.dump();
  EXPECT_EQ(o.at("ceiling"), 0) << o.dump();

  // A single compute figure sets the compute: the tables are left out, and the plan says so.
  const auto flat = run_tandem({"plan", "--model", "gpt2-tiny", "--batch", "2", "--seq", "32",
                                "--compute", save, "--tflops", "1", "--json"});
  ASSERT_TRUE(succeeded(flat));
  const nlohmann::json f = nlohmann::json::parse(flat.out);
  EXPECT_TRUE(f.at("kernel_cost").is_null());
  EXPECT_NE(f.at("hardware").at("source").get<std::string>().find("kernel tables left out"),
            std::string::npos);

  // The human plan says so too.
  const auto text = run_tandem(
      {"plan", "--model", "gpt2-tiny", "--batch", "2", "--seq", "32", "--compute", save});
  ASSERT_TRUE(succeeded(text));
  EXPECT_NE(text.out.find("note: units priced by the kernel tables"), std::string::npos)
      << text.out;
}

TEST(ProbeCli, BadInputIsOneErrorLine) {
  EXPECT_TRUE(cli_test::one_error_line(run_tandem({"probe", "links", "--max-bytes", "lots"}), 1,
                                       {"--max-bytes", "lots"}));
  EXPECT_TRUE(cli_test::one_error_line(
      run_tandem({"probe", "links", "--min-bytes", "8KiB", "--max-bytes", "4KiB"}), 1,
      {"--max-bytes"}));
  EXPECT_TRUE(
      cli_test::one_error_line(run_tandem({"probe", "overlap", "--iters", "0"}), 1, {"--iters"}));
  EXPECT_TRUE(
      cli_test::one_error_line(run_tandem({"probe", "compute", "--device", "tpu"}), 1, {"tpu"}));
  EXPECT_TRUE(
      cli_test::one_error_line(run_tandem({"probe", "links", "--ops", "gossip"}), 1, {"gossip"}));
}

}  // namespace
}  // namespace tandem
