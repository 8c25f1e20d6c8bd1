// `tandem probe overlap`: does a GEMM on a compute stream overlap an all-gather on a
// communication stream, for each configuration of stream kinds and stream lifetimes?
//
// [Overlap measurement] Per configuration and iteration (after warm-up), every rank times,
// with timing events on the streams, the GEMM alone, the all-gather alone, and both issued
// together (compute first), each phase starting after a barrier. t_both runs from the
// earliest start event to the latest end event of the two streams. With the medians over the
// measured iterations, overlap = (t_compute + t_comm - t_both) / min(t_compute, t_comm),
// clipped to [0, 1]: 1 when the shorter part hides entirely behind the longer, 0 when they
// run one after the other. Each rank computes its own; the report shows the rank with the
// lowest overlap.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "plan/probe_backend.h"
#include "plan/trace.h"

namespace tandem {

enum class StreamLifetime { reused, per_iteration };
const char* stream_lifetime_name(StreamLifetime lifetime);  // "reused", "new-each-iteration"

struct OverlapConfig {
  StreamKind compute = StreamKind::dedicated;  // shared: compute and comm on one stream
  StreamKind comm = StreamKind::dedicated;     // shared exactly when compute is
  StreamLifetime lifetime = StreamLifetime::reused;
  // "compute dedicated, comm dedicated, streams reused"
  std::string label() const;
};

// Every configuration of the backend's stream kinds x both lifetimes, then the `shared`
// control (one stream for both, reused), which serialises by construction.
std::vector<OverlapConfig> overlap_configs(const ProbeBackend& backend);

struct OverlapOptions {
  int gemm_n = 0;         // n of the n x n fp32 GEMM; 0: calibrate to target_ms
  size_t bytes = 0;       // all-gather output size (every rank's part together); 0: calibrate
  double target_ms = 20;  // calibration goal for each part alone
  int warmup = 2;
  int iters = 6;
  // Make the comm stream wait for the same iteration's GEMM (an event), in every
  // configuration: serialised by construction, the probe's own zero.
  bool serialize = false;
  // Test hooks: a sleep of this many ms inside each GEMM / all-gather (on its stream, timed
  // with it), so that both parts take known time whatever the machine's load.
  double compute_pad_ms = 0;
  double comm_pad_ms = 0;
  std::vector<OverlapConfig> configs;  // empty: overlap_configs(backend)
  Trace* trace = nullptr;              // when set, every GEMM and all-gather is recorded
};

struct OverlapRow {
  OverlapConfig config;
  double t_compute_ms = 0, t_comm_ms = 0, t_both_ms = 0;
  double overlap = 0;
  std::string verdict;
  int rank = 0;  // the rank these numbers are from (the lowest overlap)
  // The largest interquartile range / median of the three phases over the measured
  // iterations: above kOverlapNoisy the machine's load moved the timings and the overlap
  // is not to be trusted.
  double noise = 0;
};

constexpr double kOverlapNoisy = 0.25;

struct OverlapReport {
  std::string device;
  DeviceKind device_kind = DeviceKind::cpu;  // CUDA: the world is NCCL (comm_world)
  int ranks = 1;
  int gemm_n = 0;
  size_t bytes = 0;  // all-gather output bytes actually moved per call
  bool gemm_calibrated = false, bytes_calibrated = false;
  int warmup = 0, iters = 0;
  bool serialize = false;
  double compute_pad_ms = 0, comm_pad_ms = 0;
  std::string caveat;  // ProbeBackend::timing_caveat
  std::vector<OverlapRow> rows;
};

// (t_compute + t_comm - t_both) / min(t_compute, t_comm), clipped to [0, 1]; 0 when a part
// took no time.
double overlap_fraction(double t_compute_ms, double t_comm_ms, double t_both_ms);
// (q75 - q25) / median of the values (linear interpolation between order statistics); 0
// for fewer than 2 values or a zero median.
double relative_iqr(std::vector<double> values);
// "overlaps" (>= 0.7), "partial overlap" (>= 0.3), "no overlap" (below). The probe's rows
// say "too short to judge" instead when either part took under 0.5 ms.
std::string overlap_verdict(double overlap);

// Collective over world: every rank runs every configuration; every rank returns the report.
OverlapReport probe_overlap(ProbeBackend& backend, Communicator& world,
                            const OverlapOptions& options);

// {"device", "ranks", "gemm_n", "bytes", ..., "configurations": [{"compute_stream",
// "comm_stream", "streams", "t_compute_ms", "t_comm_ms", "t_both_ms", "overlap", "verdict",
// "rank", "noise"}]}
nlohmann::json overlap_to_json(const OverlapReport& report);
// The human report: a header, one verdict line per configuration, and what overlap can gain.
std::string overlap_format(const OverlapReport& report);

}  // namespace tandem
