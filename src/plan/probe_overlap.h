// `tandem probe overlap`: for each configuration of stream kinds and stream lifetimes, does
// compute on a compute stream overlap communication on a communication stream, as a
// training step with prefetch issues them?
//
// [Overlap measurement] Per configuration and iteration (after warm-up), every rank times,
// with timing events on the streams, each phase after a barrier:
//  - the communication alone (an all-gather; at one rank see [One-rank communication]);
//  - for each of two loads, the compute alone, then both: the communication issued first
//    and the compute right after it, as a step issues its prefetch before the layer it
//    overlaps. The compute is
//      stream semantics: one sleep as long as `train` GEMMs (CUDA: a one-thread kernel on the
//        GPU's timer; CPU: the stream's thread sleeps), which holds no compute units, so
//        nothing but the streams' ordering rules can keep the two apart;
//      sharing: a train of `train` GEMMs (n x n, bf16 where the device has it), which
//        contend with the communication for compute units and memory bandwidth (CPU: cores).
// t_both runs from the earliest start event to the latest end event of the two streams.
// With the medians over the measured iterations, overlap = (t_compute + t_comm - t_both) /
// min(t_compute, t_comm), clipped to [0, 1]: 1 when the shorter part hides entirely behind
// the longer, 0 when they run one after the other. Each rank computes its own; the report
// shows, per load, the rank with the lowest overlap. A configuration whose stream-semantics
// verdict is not "overlaps" is limited by its streams; one that overlaps there but not
// under sharing is limited by contention.
//
// [One-rank communication] At one rank nothing crosses a link. Where the backend can move
// bytes off the device on a copy engine ([Probe offload] in probe_backend.h: CUDA), the
// communication is that copy of the calibrated size, which, like a transfer to another
// rank, leaves the compute units to the GEMMs; NCCL's one-rank all-gather would be a copy
// kernel spread over every SM, which no stream rule could overlap with anything. Elsewhere
// (CPU) it is the one-rank all-gather, a copy on the communication stream's own thread.
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
  int gemm_n = 0;         // n of each n x n GEMM of the train; 0: calibrate to target_ms / train
  int train = 8;          // GEMMs of each sharing compute phase (the sleep lasts as long)
  size_t bytes = 0;       // communication size (all-gather output, every rank's part); 0: calibrate
  double target_ms = 20;  // calibration goal for the whole train and for the communication
  int warmup = 2;
  int iters = 6;
  // Make the compute stream wait for the same iteration's communication (an event), in every
  // configuration: serialised by construction, the probe's own zero.
  bool serialize = false;
  // Test hooks: a sleep of this many ms at the start of each compute train / communication
  // (on its stream, timed with it), so that both parts take known time whatever the load.
  double compute_pad_ms = 0;
  double comm_pad_ms = 0;
  std::vector<OverlapConfig> configs;  // empty: overlap_configs(backend)
  Trace* trace = nullptr;              // when set, every train and communication is recorded
};

enum class OverlapLoad { semantics, sharing };
const char* overlap_load_name(OverlapLoad load);  // "stream semantics", "sharing"

// One load of one configuration, from the rank with the lowest overlap.
struct OverlapMeasure {
  double t_compute_ms = 0, t_comm_ms = 0, t_both_ms = 0;
  double overlap = 0;
  std::string verdict;
  int rank = 0;
  // The largest interquartile range / median of the three phases over the measured
  // iterations: above kOverlapNoisy the machine's load moved the timings and the overlap
  // is not to be trusted.
  double noise = 0;
};

struct OverlapRow {
  OverlapConfig config;
  OverlapMeasure semantics, sharing;
  std::string limited_by;  // overlap_limit(semantics, sharing)
};

constexpr double kOverlapNoisy = 0.25;

struct OverlapReport {
  std::string device;
  DeviceKind device_kind = DeviceKind::cpu;  // CUDA: the world is NCCL (comm_world)
  int ranks = 1;
  int gemm_n = 0;
  bool gemm_bf16 = false;  // the GEMMs' type: bf16 where the device has it, else fp32
  int train = 0;
  double sleep_ms = 0;  // one GEMM's time (slowest rank); the sleep is train times this
  size_t bytes = 0;     // communication bytes actually moved per call
  // "all-gather", or at one rank "copy to host" / "one-rank all-gather" ([One-rank
  // communication]).
  std::string comm;
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
// What keeps a configuration from overlapping: "streams" when its stream-semantics verdict
// is "no overlap" or "partial overlap" (the stream rules keep the parts apart); "contention"
// when the streams allow overlap and the real GEMMs' verdict is not "overlaps"; "" when
// both overlap, or when the verdict that decides is "too short to judge".
std::string overlap_limit(const OverlapMeasure& semantics, const OverlapMeasure& sharing);

// Collective over world: every rank runs every configuration; every rank returns the report.
OverlapReport probe_overlap(ProbeBackend& backend, Communicator& world,
                            const OverlapOptions& options);

// {"device", "ranks", "gemm_n", "gemm_dtype", "train", "sleep_ms", "bytes", "comm", ...,
// "configurations": [{"compute_stream", "comm_stream", "streams", "semantics": {...},
// "sharing": {"t_compute_ms", "t_comm_ms", "t_both_ms", "overlap", "verdict", "rank",
// "noise"}, "limited_by"}]}
nlohmann::json overlap_to_json(const OverlapReport& report);
// The human report: a header, a table per load with one verdict line per configuration, what
// limits each configuration, and what overlap can gain.
std::string overlap_format(const OverlapReport& report);

}  // namespace tandem
