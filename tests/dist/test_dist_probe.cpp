// The probes under mpirun (1-4 ranks): the links sweep returns correct values with
// nccl-tests' bandwidth formulas at this world size, a corrupted value is counted once, the
// overlap probe tells dedicated streams from serialised ones, and the trace gathers one
// process per rank with every track named.
//
// The overlap tests pad each part with a sleep on its stream; see [Probe test timing] in
// tests/unit/test_probe.cpp for why and for the thresholds.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "dist/dist_env.h"
#include "plan/probe_backend.h"
#include "plan/probe_links.h"
#include "plan/probe_overlap.h"
#include "plan/trace.h"

namespace tandem::dist {
namespace {

TEST(DistProbe, LinksValuesAndBandwidthFormulas) {
  auto backend = probe_backend_cpu(device());
  LinksOptions o;
  o.max_bytes = 64 << 10;
  const LinksReport r = probe_links(*backend, world(), o);
  const int n = world().size();
  EXPECT_EQ(r.ranks, n);
  EXPECT_EQ(r.wrong_total(), 0u);
  ASSERT_EQ(r.results.size(), 3u);
  for (const auto& [op, rows] : r.results) {
    ASSERT_EQ(rows.size(), 7u) << collective_key(op);  // 1 KiB .. 64 KiB
    // Hand-written factors: (n-1)/n for all-gather and reduce-scatter, 2(n-1)/n for all-reduce.
    const double factor = op == Collective::all_reduce ? 2.0 * (n - 1) / n : (n - 1.0) / n;
    for (const auto& row : rows) {
      EXPECT_GT(row.time_us, 0);
      const double alg = static_cast<double>(row.bytes) / (row.time_us * 1e-6) / 1e9;
      EXPECT_NEAR(row.algbw_GBps, alg, 1e-9 * alg);
      EXPECT_NEAR(row.busbw_GBps, alg * factor, 1e-9 * alg);
      EXPECT_EQ(row.bytes, collective_shape(op, n, row.bytes).bytes) << "bytes already rounded";
    }
  }
  ASSERT_EQ(r.topology.at("ranks").size(), static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) EXPECT_EQ(r.topology["ranks"][q].at("rank"), q);
  // Every rank ends with the same report.
  const auto texts = all_gather_text(world(), device(), links_to_json(r).at("topology").dump());
  for (const auto& t : texts) EXPECT_EQ(t, texts[0]);
}

TEST(DistProbe, LinksCorruptedValueIsCounted) {
  auto backend = probe_backend_cpu(device());
  LinksOptions o;
  o.max_bytes = 4096;
  o.ops = {Collective::all_reduce, Collective::all_gather};
  o.corrupt = links_corrupt_first(Collective::all_gather, world().size());
  const LinksReport r = probe_links(*backend, world(), o);
  EXPECT_EQ(r.wrong_total(), 1u);  // summed over ranks: only the last rank's copy was changed
  ASSERT_EQ(r.results.size(), 2u);
  EXPECT_EQ(r.results[0].second[0].wrong, 0u);
  EXPECT_EQ(r.results[1].second[0].wrong, 1u);
}

OverlapOptions padded() {
  OverlapOptions o;
  o.gemm_n = 32;
  o.bytes = 65536;
  o.warmup = 1;
  o.iters = 4;
  o.compute_pad_ms = 40;
  o.comm_pad_ms = 40;
  return o;
}

TEST(DistProbe, OverlapDedicatedStreamsOverlapSharedDoNot) {
  auto backend = probe_backend_cpu(device());
  Trace trace(world().rank(), "rank " + std::to_string(world().rank()));
  OverlapOptions o = padded();
  o.configs = {{StreamKind::dedicated, StreamKind::dedicated, StreamLifetime::reused},
               {StreamKind::shared, StreamKind::shared, StreamLifetime::reused}};
  o.trace = &trace;
  const OverlapReport r = probe_overlap(*backend, world(), o);
  ASSERT_EQ(r.rows.size(), 2u);
  for (const OverlapMeasure* m : {&r.rows[0].semantics, &r.rows[0].sharing})
    EXPECT_GE(m->overlap, 0.5) << m->t_compute_ms << " " << m->t_comm_ms << " " << m->t_both_ms;
  for (const OverlapMeasure* m : {&r.rows[1].semantics, &r.rows[1].sharing})
    EXPECT_LE(m->overlap, 0.3) << m->t_both_ms;
  EXPECT_EQ(r.rows[0].limited_by, "");
  EXPECT_EQ(r.rows[1].limited_by, "streams");
  EXPECT_EQ(r.comm, world().size() > 1 ? "all-gather" : "one-rank all-gather");

  const nlohmann::json doc = trace_gather(trace, world(), device());
  if (world().rank() == 0) {
    const auto problems = trace_check(doc);
    EXPECT_TRUE(problems.empty()) << problems.front();
    std::set<int> pids;
    for (const auto& e : doc.at("traceEvents"))
      if (e.at("ph") == "X") pids.insert(e.at("pid").get<int>());
    EXPECT_EQ(static_cast<int>(pids.size()), world().size());
  } else {
    EXPECT_TRUE(doc.is_null());
  }
}

TEST(DistProbe, OverlapSerializedByEventWaitDoesNotOverlap) {
  auto backend = probe_backend_cpu(device());
  OverlapOptions o = padded();
  o.serialize = true;
  o.configs = {{StreamKind::dedicated, StreamKind::dedicated, StreamLifetime::per_iteration}};
  const OverlapReport r = probe_overlap(*backend, world(), o);
  ASSERT_EQ(r.rows.size(), 1u);
  for (const OverlapMeasure* m : {&r.rows[0].semantics, &r.rows[0].sharing})
    EXPECT_LE(m->overlap, 0.3) << m->t_both_ms;
}

}  // namespace
}  // namespace tandem::dist
