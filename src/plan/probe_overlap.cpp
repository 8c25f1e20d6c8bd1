// The overlap probe: calibration of the GEMM and all-gather sizes, the three timed phases of
// every iteration of every configuration ([Overlap measurement] in probe_overlap.h), the
// per-rank results gathered to every rank, and the report.
#include "plan/probe_overlap.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "core/error.h"

namespace tandem {

namespace {

constexpr int kCommPriority = 1;  // as the engine's communication streams
// Below this, a part's time is mostly event and wake-up overhead, not work.
constexpr double kShortestJudgedMs = 0.5;

// One rank's medians for one configuration.
struct Medians {
  double compute = 0, comm = 0, both = 0;
  double noise = 0;
};

class OverlapRunner {
 public:
  OverlapRunner(ProbeBackend& backend, Communicator& world, const OverlapOptions& options)
      : backend_(backend),
        device_(backend.device()),
        world_(world),
        options_(options),
        gather_comm_(world.duplicate("probe all-gather")),
        control_(device_.stream_create("probe control")),
        ref_(device_.event_create(true)) {
    // Time zero of this rank's trace: right after a barrier, so ranks line up.
    align();
    device_.event_record(*ref_, *control_);
    device_.stream_sync(*control_);
  }

  // The largest of every rank's value (identical on every rank).
  double agree_max(double mine) {
    double out = 0;
    for (const auto& t : all_gather_text(world_, device_, nlohmann::json(mine).dump()))
      out = std::max(out, nlohmann::json::parse(t).get<double>());
    return out;
  }

  // [Calibration] Sizes grow until a part takes a quarter of the target, are scaled to the
  // target (GEMM time ~ n^3, all-gather time ~ bytes), then measured once more at that size
  // and rescaled by at most 2x either way: on a loaded machine one extrapolation from a
  // small size is often off by several times. Every decision uses the slowest rank's time,
  // so that every rank takes the same branches (the barriers must match) and the same size.
  int calibrate_gemm() {
    auto stream = backend_.stream_create(backend_.compute_stream_kinds().back(),
                                         "probe calibrate compute", 0);
    const int cap = backend_.max_gemm_n();
    auto measure = [&](int n) {
      ProbeBuffer a(device_, bytes_of(n)), b(device_, bytes_of(n)), c(device_, bytes_of(n));
      fill(a, n);
      fill(b, n);
      return agree_max(time_median(
          *stream, [&](Stream& s) { backend_.gemm_f32(s, n, a.f32(), b.f32(), c.f32()); }));
    };
    auto scale = [&](int n, double t, double lo, double hi) {
      const double want = n * std::clamp(std::cbrt(options_.target_ms / std::max(t, 1e-3)), lo, hi);
      return std::clamp(static_cast<int>(std::lround(want / 32)) * 32, 32, cap);
    };
    int n = std::min(128, cap);
    double t = measure(n);
    while (t < options_.target_ms / 4 && n < cap) {
      n = std::min(cap, n * 2);
      t = measure(n);
    }
    n = scale(n, t, 0.0, 1e9);
    return scale(n, measure(n), 0.5, 2.0);
  }

  size_t calibrate_bytes() {
    const size_t n = world_.size();
    const size_t quantum = 4096 * n;
    const size_t cap = std::max(quantum, backend_.max_overlap_bytes() / quantum * quantum);
    auto stream = backend_.stream_create(backend_.comm_stream_kinds().back(),
                                         "probe calibrate all-gather", kCommPriority);
    auto measure = [&](size_t bytes) {
      const size_t count = bytes / (4 * n);
      ProbeBuffer send(device_, count * 4), recv(device_, count * 4 * n);
      return agree_max(time_median(*stream, [&](Stream& s) {
        gather_comm_->all_gather(s, send.get(), recv.get(), count, DType::f32,
                                 "probe overlap calibration");
      }));
    };
    auto scale = [&](size_t bytes, double t, double lo, double hi) {
      const double f = std::clamp(options_.target_ms / std::max(t, 1e-3), lo, hi);
      const auto want = static_cast<size_t>(static_cast<double>(bytes) * f);
      return std::clamp(want / quantum * quantum, quantum, cap);
    };
    size_t bytes = std::clamp((size_t{1} << 20) / quantum * quantum, quantum, cap);
    double t = measure(bytes);
    while (t < options_.target_ms / 4 && bytes < cap) {
      bytes = std::min(cap, bytes * 4);
      t = measure(bytes);
    }
    bytes = scale(bytes, t, 0.0, 1e9);
    return scale(bytes, measure(bytes), 0.5, 2.0);
  }

  // One rank's medians for one configuration, recording into the trace when there is one.
  Medians run(const OverlapConfig& config, int n, size_t count) {
    ProbeBuffer a(device_, bytes_of(n)), b(device_, bytes_of(n)), c(device_, bytes_of(n));
    ProbeBuffer send(device_, count * 4), recv(device_, count * 4 * world_.size());
    fill(a, n);
    fill(b, n);
    auto c0 = device_.event_create(true), c1 = device_.event_create(true);
    auto m0 = device_.event_create(true), m1 = device_.event_create(true);

    const bool shared = config.compute == StreamKind::shared;
    const std::string where =
        fmt::format("{}, {}", shared ? "shared" : stream_kind_name(config.compute),
                    stream_lifetime_name(config.lifetime));
    const std::string compute_name = shared ? fmt::format("compute + all-gather [{}]", where)
                                            : fmt::format("compute [{}]", where);
    const std::string comm_name = fmt::format("all-gather [{}, {}]", stream_kind_name(config.comm),
                                              stream_lifetime_name(config.lifetime));
    std::unique_ptr<Stream> own_compute, own_comm;
    Stream* cs = nullptr;
    Stream* ms = nullptr;
    auto make_streams = [&] {
      own_comm.reset();
      own_compute.reset();
      if (shared) {
        own_compute =
            backend_.stream_create(backend_.compute_stream_kinds().back(), compute_name, 0);
        cs = ms = own_compute.get();
      } else {
        own_compute = backend_.stream_create(config.compute, compute_name, 0);
        own_comm = backend_.stream_create(config.comm, comm_name, kCommPriority);
        cs = own_compute.get();
        ms = own_comm.get();
      }
    };
    auto gemm = [&](Stream& s) {
      backend_.delay(s, options_.compute_pad_ms);
      backend_.gemm_f32(s, n, a.f32(), b.f32(), c.f32());
    };
    auto gather = [&](Stream& s) {
      backend_.delay(s, options_.comm_pad_ms);
      gather_comm_->all_gather(s, send.get(), recv.get(), count, DType::f32, "probe overlap");
    };
    const std::string gemm_label = fmt::format("gemm {}", n);
    const std::string gather_label = fmt::format(
        "all-gather {}", probe_bytes_text(static_cast<double>(count * 4 * world_.size())));

    std::vector<double> tc, tm, tb;
    const int total = options_.warmup + options_.iters;
    for (int it = 0; it < total; ++it) {
      if (cs == nullptr || config.lifetime == StreamLifetime::per_iteration) make_streams();
      const bool measured = it >= options_.warmup;
      auto args = [&](const char* phase) {
        return nlohmann::json{{"configuration", config.label()},
                              {"phase", phase},
                              {"iteration", it},
                              {"warmup", !measured}};
      };

      align();  // the GEMM alone
      device_.event_record(*c0, *cs);
      gemm(*cs);
      device_.event_record(*c1, *cs);
      device_.stream_sync(*cs);
      const double t_compute = device_.event_elapsed_ms(*c0, *c1);
      note(compute_name, gemm_label, *c0, *c1, args("compute alone"));

      align();  // the all-gather alone
      device_.event_record(*m0, *ms);
      gather(*ms);
      device_.event_record(*m1, *ms);
      device_.stream_sync(*ms);
      const double t_comm = device_.event_elapsed_ms(*m0, *m1);
      note(shared ? compute_name : comm_name, gather_label, *m0, *m1, args("comm alone"));

      align();  // both, compute issued first
      device_.event_record(*c0, *cs);
      gemm(*cs);
      device_.event_record(*c1, *cs);
      if (options_.serialize && ms != cs) device_.stream_wait(*ms, *c1);
      device_.event_record(*m0, *ms);
      gather(*ms);
      device_.event_record(*m1, *ms);
      device_.stream_sync(*cs);
      device_.stream_sync(*ms);
      const double start = std::min(at(*c0), at(*m0));
      const double end = std::max(at(*c1), at(*m1));
      note(compute_name, gemm_label, *c0, *c1, args("together"));
      note(shared ? compute_name : comm_name, gather_label, *m0, *m1, args("together"));

      if (measured) {
        tc.push_back(t_compute);
        tm.push_back(t_comm);
        tb.push_back(end - start);
      }
    }
    own_comm.reset();
    own_compute.reset();
    return {probe_median(tc), probe_median(tm), probe_median(tb),
            std::max({relative_iqr(tc), relative_iqr(tm), relative_iqr(tb)})};
  }

 private:
  static size_t bytes_of(int n) { return static_cast<size_t>(n) * n * sizeof(float); }

  // Small values, so that GEMMs stay finite and denormal-free.
  void fill(ProbeBuffer& buf, int n) {
    std::vector<float> host(static_cast<size_t>(n) * n);
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 17) * 0.01f;
    device_.copy_to_device(buf.get(), host.data(), host.size() * sizeof(float));
  }

  // Every rank at a barrier before a phase starts.
  void align() {
    world_.barrier(*control_, "probe overlap align");
    device_.stream_sync(*control_);
  }

  // Milliseconds of a completed event since this rank's time zero.
  double at(Event& e) { return device_.event_elapsed_ms(*ref_, e); }

  // Median ms of 3 runs of op on s after one warm-up, each after a barrier.
  template <typename Op>
  double time_median(Stream& s, Op op) {
    auto e0 = device_.event_create(true), e1 = device_.event_create(true);
    std::vector<double> times;
    for (int i = 0; i < 4; ++i) {
      align();
      device_.event_record(*e0, s);
      op(s);
      device_.event_record(*e1, s);
      device_.stream_sync(s);
      if (i > 0) times.push_back(device_.event_elapsed_ms(*e0, *e1));
    }
    return probe_median(times);
  }

  void note(const std::string& track, const std::string& name, Event& start, Event& end,
            nlohmann::json args) {
    if (options_.trace == nullptr) return;
    const double t0 = at(start);
    options_.trace->complete(options_.trace->track(track), name, t0 * 1e3, (at(end) - t0) * 1e3,
                             args, "probe");
  }

  ProbeBackend& backend_;
  Device& device_;
  Communicator& world_;
  const OverlapOptions& options_;
  std::unique_ptr<Communicator> gather_comm_;
  std::unique_ptr<Stream> control_;
  std::unique_ptr<Event> ref_;
};

}  // namespace

const char* stream_lifetime_name(StreamLifetime lifetime) {
  return lifetime == StreamLifetime::reused ? "reused" : "new-each-iteration";
}

std::string OverlapConfig::label() const {
  if (compute == StreamKind::shared)
    return fmt::format("compute and comm on one shared stream, streams {}",
                       stream_lifetime_name(lifetime));
  return fmt::format("compute {}, comm {}, streams {}", stream_kind_name(compute),
                     stream_kind_name(comm), stream_lifetime_name(lifetime));
}

std::vector<OverlapConfig> overlap_configs(const ProbeBackend& backend) {
  std::vector<OverlapConfig> out;
  for (StreamKind c : backend.compute_stream_kinds())
    for (StreamKind m : backend.comm_stream_kinds())
      for (StreamLifetime l : {StreamLifetime::reused, StreamLifetime::per_iteration})
        out.push_back({c, m, l});
  out.push_back({StreamKind::shared, StreamKind::shared, StreamLifetime::reused});
  return out;
}

double relative_iqr(std::vector<double> values) {
  if (values.size() < 2) return 0;
  std::sort(values.begin(), values.end());
  auto quantile = [&](double p) {
    const double at = p * static_cast<double>(values.size() - 1);
    const size_t i = static_cast<size_t>(at);
    const double frac = at - static_cast<double>(i);
    return i + 1 < values.size() ? values[i] + frac * (values[i + 1] - values[i]) : values[i];
  };
  const double median = quantile(0.5);
  if (!(median > 0)) return 0;
  return (quantile(0.75) - quantile(0.25)) / median;
}

double overlap_fraction(double t_compute_ms, double t_comm_ms, double t_both_ms) {
  const double shorter = std::min(t_compute_ms, t_comm_ms);
  if (!(shorter > 0)) return 0;
  const double f = (t_compute_ms + t_comm_ms - t_both_ms) / shorter;
  return std::clamp(f, 0.0, 1.0);
}

std::string overlap_verdict(double overlap) {
  if (overlap >= 0.7) return "overlaps";
  if (overlap >= 0.3) return "partial overlap";
  return "no overlap";
}

OverlapReport probe_overlap(ProbeBackend& backend, Communicator& world,
                            const OverlapOptions& options) {
  TD_CHECK(options.iters >= 1, "--iters must be at least 1, got {}", options.iters);
  TD_CHECK(options.warmup >= 0, "--warmup must not be negative, got {}", options.warmup);
  TD_CHECK(options.target_ms > 0, "--target-ms must be positive, got {}", options.target_ms);
  TD_CHECK(options.gemm_n >= 0 && options.gemm_n <= 65536, "--gemm must be 1..65536, got {}",
           options.gemm_n);
  TD_CHECK(options.compute_pad_ms >= 0 && options.comm_pad_ms >= 0,
           "pad times must not be negative");
  const std::vector<OverlapConfig> configs =
      options.configs.empty() ? overlap_configs(backend) : options.configs;
  for (const auto& c : configs)
    TD_CHECK((c.compute == StreamKind::shared) == (c.comm == StreamKind::shared),
             "configuration '{}': a shared stream is shared by both parts", c.label());

  const int n = world.size();
  OverlapReport report;
  report.device = backend.device().name();
  report.device_kind = backend.device().kind();
  report.ranks = n;
  report.warmup = options.warmup;
  report.iters = options.iters;
  report.serialize = options.serialize;
  report.compute_pad_ms = options.compute_pad_ms;
  report.comm_pad_ms = options.comm_pad_ms;

  // Ranks per host, for the caveat line.
  const std::string host = backend.local_topology().value("host", "");
  const std::vector<std::string> hosts = all_gather_text(world, backend.device(), host);
  report.caveat =
      backend.timing_caveat(static_cast<int>(std::count(hosts.begin(), hosts.end(), host)));

  std::vector<Medians> mine;
  {
    OverlapRunner runner(backend, world, options);
    report.gemm_calibrated = options.gemm_n == 0;
    report.gemm_n = report.gemm_calibrated ? runner.calibrate_gemm() : options.gemm_n;
    report.bytes_calibrated = options.bytes == 0;
    const size_t wanted = report.bytes_calibrated ? runner.calibrate_bytes() : options.bytes;
    const size_t count = std::max<size_t>(1, wanted / (4 * static_cast<size_t>(n)));
    report.bytes = count * 4 * n;
    for (const auto& config : configs) mine.push_back(runner.run(config, report.gemm_n, count));
  }

  // Every rank's medians on every rank; each configuration reports its lowest-overlap rank.
  nlohmann::json mine_json = nlohmann::json::array();
  for (const auto& m : mine) mine_json.push_back({m.compute, m.comm, m.both, m.noise});
  const std::vector<std::string> all = all_gather_text(world, backend.device(), mine_json.dump());
  std::vector<nlohmann::json> parsed;
  for (const auto& t : all) parsed.push_back(nlohmann::json::parse(t));
  for (size_t i = 0; i < configs.size(); ++i) {
    OverlapRow best;
    best.overlap = 2;  // above any real value
    for (int r = 0; r < n; ++r) {
      const auto& v = parsed[r][i];
      OverlapRow row;
      row.config = configs[i];
      row.t_compute_ms = v[0].get<double>();
      row.t_comm_ms = v[1].get<double>();
      row.t_both_ms = v[2].get<double>();
      row.noise = v[3].get<double>();
      row.overlap = overlap_fraction(row.t_compute_ms, row.t_comm_ms, row.t_both_ms);
      row.verdict = std::min(row.t_compute_ms, row.t_comm_ms) < kShortestJudgedMs
                        ? "too short to judge"
                        : overlap_verdict(row.overlap);
      row.rank = r;
      if (row.overlap < best.overlap) best = row;
    }
    report.rows.push_back(best);
  }
  return report;
}

nlohmann::json overlap_to_json(const OverlapReport& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows)
    rows.push_back({{"compute_stream", stream_kind_name(row.config.compute)},
                    {"comm_stream", stream_kind_name(row.config.comm)},
                    {"streams", stream_lifetime_name(row.config.lifetime)},
                    {"t_compute_ms", row.t_compute_ms},
                    {"t_comm_ms", row.t_comm_ms},
                    {"t_both_ms", row.t_both_ms},
                    {"overlap", row.overlap},
                    {"verdict", row.verdict},
                    {"rank", row.rank},
                    {"noise", row.noise}});
  return {{"device", r.device},
          {"ranks", r.ranks},
          {"gemm_n", r.gemm_n},
          {"bytes", r.bytes},
          {"gemm_calibrated", r.gemm_calibrated},
          {"bytes_calibrated", r.bytes_calibrated},
          {"one_rank_copy", r.ranks == 1},
          {"warmup", r.warmup},
          {"iters", r.iters},
          {"serialize", r.serialize},
          {"compute_pad_ms", r.compute_pad_ms},
          {"comm_pad_ms", r.comm_pad_ms},
          {"configurations", std::move(rows)}};
}

std::string overlap_format(const OverlapReport& r) {
  std::string out = fmt::format(
      "probe overlap: {} rank(s) on {}; GEMM {} x {} fp32 ({}) on the compute stream, all-gather "
      "of {} ({} per rank; {}) on the communication stream; {} warm-up + {} measured "
      "iterations, medians\n",
      r.ranks, r.device, r.gemm_n, r.gemm_n, r.gemm_calibrated ? "calibrated" : "--gemm",
      probe_bytes_text(static_cast<double>(r.bytes)),
      probe_bytes_text(static_cast<double>(r.bytes) / r.ranks),
      r.bytes_calibrated ? "calibrated" : "--bytes", r.warmup, r.iters);
  if (r.ranks == 1 && r.device_kind == DeviceKind::cuda)
    out +=
        "1 rank: the all-gather is a local copy on the communication stream (NCCL's one-rank "
        "all-gather, a device-to-device copy; no data leaves this GPU); run with --ranks N, one "
        "GPU per rank, for real communication\n";
  else if (r.ranks == 1)
    out +=
        "1 rank: the all-gather is a local copy on the communication stream (no data leaves "
        "this process); run with --ranks N for real communication\n";
  if (r.device_kind == DeviceKind::cuda)
    out +=
        "cuda streams: legacy-default is stream 0; a blocking stream (cudaStreamCreate) waits "
        "for stream 0's earlier work and stream 0 for its; non-blocking (cudaStreamNonBlocking, "
        "the engine's kind) waits for neither\n";
  if (r.serialize)
    out +=
        "--serialize: the communication stream waits for each GEMM, so no configuration can "
        "overlap\n";
  if (r.compute_pad_ms > 0 || r.comm_pad_ms > 0)
    out += fmt::format("padded: +{} ms sleep in each GEMM, +{} ms in each all-gather\n",
                       r.compute_pad_ms, r.comm_pad_ms);
  if (!r.caveat.empty()) out += r.caveat + "\n";
  out += "\n";
  out += fmt::format("  {:<14} {:<14} {:<20} {:>11} {:>11} {:>11} {:>8}  {}\n", "compute stream",
                     "comm stream", "streams", "compute", "comm", "both", "overlap", "verdict");
  for (const auto& row : r.rows)
    out += fmt::format(
        "  {:<14} {:<14} {:<20} {:>8.2f} ms {:>8.2f} ms {:>8.2f} ms {:>8.2f}  {}{}\n",
        stream_kind_name(row.config.compute), stream_kind_name(row.config.comm),
        stream_lifetime_name(row.config.lifetime), row.t_compute_ms, row.t_comm_ms, row.t_both_ms,
        row.overlap, row.verdict,
        (r.ranks > 1 ? fmt::format(" (rank {})", row.rank) : "") +
            (row.noise > kOverlapNoisy ? fmt::format(" [noisy: {:.0f}%]", 100 * row.noise) : ""));
  out += "\n";
  out += "overlap = (compute + comm - both) / min(compute, comm), clipped to [0, 1]";
  if (r.ranks > 1) out += "; each line shows the rank with the lowest overlap";
  out += "\n";
  if (std::any_of(r.rows.begin(), r.rows.end(),
                  [](const OverlapRow& row) { return row.noise > kOverlapNoisy; }))
    out += fmt::format(
        "[noisy: N%]: a phase's timings spread by N% (interquartile range / median) over the "
        "iterations, above {:.0f}%: the machine's load moved them, so that line's overlap is "
        "unreliable; rerun with more --iters or on a quieter machine\n",
        100 * kOverlapNoisy);
  if (!r.rows.empty()) {
    const auto& first = r.rows.front();
    const double sum = first.t_compute_ms + first.t_comm_ms;
    if (sum > 0)
      out += fmt::format(
          "at these sizes perfect overlap saves at most {:.0f}% of running both back to back "
          "(min(compute, comm) / (compute + comm)); in training the gain is bounded the same way "
          "by the smaller of compute and communication time\n",
          100.0 * std::min(first.t_compute_ms, first.t_comm_ms) / sum);
  }
  return out;
}

}  // namespace tandem
