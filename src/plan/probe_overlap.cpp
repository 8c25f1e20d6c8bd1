// The overlap probe: calibration of the GEMM and all-gather sizes, the three timed phases of
// every iteration of every configuration ([Overlap measurement] in probe_overlap.h), the
// per-rank results gathered to every rank, and the report.
#include "plan/probe_overlap.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

namespace {

constexpr int kCommPriority = 1;  // as the engine's communication streams
// Below this, a part's time is mostly event and wake-up overhead, not work.
constexpr double kShortestJudgedMs = 0.5;
constexpr OverlapLoad kLoads[] = {OverlapLoad::semantics, OverlapLoad::sharing};

// One rank's medians for one configuration and load.
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
        bf16_(backend.has_gemm_bf16()),
        offload_(world.size() == 1 && backend.has_offload()),
        gather_comm_(world.duplicate("probe all-gather")),
        control_(device_.stream_create("probe control")),
        ref_(device_.event_create(true)) {
    // Time zero of this rank's trace: right after a barrier, so ranks line up.
    align();
    device_.event_record(*ref_, *control_);
    device_.stream_sync(*control_);
  }

  bool gemm_bf16() const { return bf16_; }
  // [One-rank communication]
  const char* comm_word() const {
    if (world_.size() > 1) return "all-gather";
    return offload_ ? "copy to host" : "one-rank all-gather";
  }

  // The largest of every rank's value (identical on every rank).
  double agree_max(double mine) {
    double out = 0;
    for (const auto& t : all_gather_text(world_, device_, nlohmann::json(mine).dump()))
      out = std::max(out, nlohmann::json::parse(t).get<double>());
    return out;
  }

  // One GEMM's median time at size n, the slowest rank's.
  double gemm_ms(int n) {
    auto stream = backend_.stream_create(backend_.compute_stream_kinds().back(),
                                         "probe calibrate compute", 0);
    ProbeBuffer a(device_, bytes_of(n)), b(device_, bytes_of(n)), c(device_, bytes_of(n));
    fill(a, n);
    fill(b, n);
    return agree_max(time_median(*stream, [&](Stream& s) { gemm(s, n, a, b, c); }));
  }

  // [Calibration] Sizes grow until a part takes a quarter of its target, are scaled to the
  // target (GEMM time ~ n^3, communication time ~ bytes), then measured once more at that
  // size and rescaled by at most 2x either way: on a loaded machine one extrapolation from a
  // small size is often off by several times. Every decision uses the slowest rank's time,
  // so that every rank takes the same branches (the barriers must match) and the same size.
  // One GEMM's target is the train's over its length.
  int calibrate_gemm() {
    const int cap = backend_.max_gemm_n();
    const double target = options_.target_ms / options_.train;
    auto scale = [&](int n, double t, double lo, double hi) {
      const double want = n * std::clamp(std::cbrt(target / std::max(t, 1e-3)), lo, hi);
      return std::clamp(static_cast<int>(std::lround(want / 32)) * 32, 32, cap);
    };
    int n = std::min(128, cap);
    double t = gemm_ms(n);
    while (t < target / 4 && n < cap) {
      n = std::min(cap, n * 2);
      t = gemm_ms(n);
    }
    n = scale(n, t, 0.0, 1e9);
    return scale(n, gemm_ms(n), 0.5, 2.0);
  }

  size_t calibrate_bytes() {
    const size_t n = world_.size();
    const size_t quantum = 4096 * n;
    const size_t cap = std::max(quantum, backend_.max_overlap_bytes() / quantum * quantum);
    auto stream = backend_.stream_create(backend_.comm_stream_kinds().back(),
                                         "probe calibrate communication", kCommPriority);
    auto measure = [&](size_t bytes) {
      const size_t count = bytes / (4 * n);
      ProbeBuffer send(device_, count * 4), recv(device_, count * 4 * n);
      return agree_max(time_median(*stream, [&](Stream& s) { communicate(s, send, recv, count); }));
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

  // One rank's medians for one configuration, per load (kLoads' order), recording into the
  // trace when there is one. sleep_ms: each stream-semantics item.
  std::vector<Medians> run(const OverlapConfig& config, int n, double sleep_ms, size_t count) {
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
    const std::string compute_name = shared ? fmt::format("compute + {} [{}]", comm_word(), where)
                                            : fmt::format("compute [{}]", where);
    const std::string comm_name =
        fmt::format("{} [{}, {}]", comm_word(), stream_kind_name(config.comm),
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
    auto compute = [&](Stream& s, OverlapLoad load) {
      backend_.delay(s, options_.compute_pad_ms);
      // Stream semantics: one sleep as long as the train, so that a CPU stream's thread
      // wakes once, not once per item, and needs no core in between.
      if (load == OverlapLoad::semantics)
        backend_.delay(s, options_.train * sleep_ms);
      else
        for (int i = 0; i < options_.train; ++i) gemm(s, n, a, b, c);
    };
    auto comm = [&](Stream& s) {
      backend_.delay(s, options_.comm_pad_ms);
      communicate(s, send, recv, count);
    };
    const std::string train_label[] = {
        fmt::format("sleep {:.3g} ms", options_.train * sleep_ms),
        fmt::format("{} x gemm {} {}", options_.train, n, bf16_ ? "bf16" : "fp32")};
    const std::string comm_label = fmt::format(
        "{} {}", comm_word(), probe_bytes_text(static_cast<double>(count * 4 * world_.size())));
    const char* comm_track = shared ? compute_name.c_str() : comm_name.c_str();

    std::vector<double> tm, tc[2], tb[2];
    const int total = options_.warmup + options_.iters;
    for (int it = 0; it < total; ++it) {
      if (cs == nullptr || config.lifetime == StreamLifetime::per_iteration) make_streams();
      const bool measured = it >= options_.warmup;
      auto args = [&](const std::string& phase) {
        return nlohmann::json{{"configuration", config.label()},
                              {"phase", phase},
                              {"iteration", it},
                              {"warmup", !measured}};
      };

      align();  // the communication alone
      device_.event_record(*m0, *ms);
      comm(*ms);
      device_.event_record(*m1, *ms);
      device_.stream_sync(*ms);
      if (measured) tm.push_back(device_.event_elapsed_ms(*m0, *m1));
      note(comm_track, comm_label, *m0, *m1, args("comm alone"));

      for (int l = 0; l < 2; ++l) {
        const OverlapLoad load = kLoads[l];
        const std::string name = overlap_load_name(load);
        align();  // the compute alone
        device_.event_record(*c0, *cs);
        compute(*cs, load);
        device_.event_record(*c1, *cs);
        device_.stream_sync(*cs);
        const double t_compute = device_.event_elapsed_ms(*c0, *c1);
        note(compute_name, train_label[l], *c0, *c1, args(name + ": compute alone"));

        align();  // both: the communication first, as a step's prefetch
        device_.event_record(*m0, *ms);
        comm(*ms);
        device_.event_record(*m1, *ms);
        if (options_.serialize && ms != cs) device_.stream_wait(*cs, *m1);
        device_.event_record(*c0, *cs);
        compute(*cs, load);
        device_.event_record(*c1, *cs);
        device_.stream_sync(*ms);
        device_.stream_sync(*cs);
        const double start = std::min(at(*c0), at(*m0));
        const double end = std::max(at(*c1), at(*m1));
        note(comm_track, comm_label, *m0, *m1, args(name + ": together"));
        note(compute_name, train_label[l], *c0, *c1, args(name + ": together"));
        if (measured) {
          tc[l].push_back(t_compute);
          tb[l].push_back(end - start);
        }
      }
    }
    own_comm.reset();
    own_compute.reset();
    std::vector<Medians> out;
    for (int l = 0; l < 2; ++l)
      out.push_back({probe_median(tc[l]), probe_median(tm), probe_median(tb[l]),
                     std::max({relative_iqr(tc[l]), relative_iqr(tm), relative_iqr(tb[l])})});
    return out;
  }

 private:
  static size_t bytes_of(int n) { return static_cast<size_t>(n) * n * sizeof(float); }

  void gemm(Stream& s, int n, ProbeBuffer& a, ProbeBuffer& b, ProbeBuffer& c) {
    if (bf16_)
      backend_.gemm_bf16(s, n, a.get(), b.get(), c.get());
    else
      backend_.gemm_f32(s, n, a.f32(), b.f32(), c.f32());
  }

  // [One-rank communication]
  void communicate(Stream& s, ProbeBuffer& send, ProbeBuffer& recv, size_t count) {
    if (offload_)
      backend_.offload(s, send.get(), count * 4);
    else
      gather_comm_->all_gather(s, send.get(), recv.get(), count, DType::f32, "probe overlap");
  }

  // Small values, so that GEMMs stay finite and denormal-free; bf16 where the GEMMs are.
  void fill(ProbeBuffer& buf, int n) {
    const size_t count = static_cast<size_t>(n) * n;
    if (bf16_) {
      std::vector<uint16_t> host(count);
      for (size_t i = 0; i < count; ++i)
        host[i] = bf16_from_f32(static_cast<float>(i % 17) * 0.01f);
      device_.copy_to_device(buf.get(), host.data(), count * sizeof(uint16_t));
      return;
    }
    std::vector<float> host(count);
    for (size_t i = 0; i < count; ++i) host[i] = static_cast<float>(i % 17) * 0.01f;
    device_.copy_to_device(buf.get(), host.data(), count * sizeof(float));
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
  const bool bf16_, offload_;
  std::unique_ptr<Communicator> gather_comm_;
  std::unique_ptr<Stream> control_;
  std::unique_ptr<Event> ref_;
};

}  // namespace

const char* overlap_load_name(OverlapLoad load) {
  return load == OverlapLoad::semantics ? "stream semantics" : "sharing";
}

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

std::string overlap_limit(const OverlapMeasure& semantics, const OverlapMeasure& sharing) {
  const std::string too_short = "too short to judge";
  if (semantics.verdict == too_short) return "";
  if (semantics.verdict != "overlaps") return "streams";
  if (sharing.verdict == too_short) return "";
  if (sharing.verdict != "overlaps") return "contention";
  return "";
}

OverlapReport probe_overlap(ProbeBackend& backend, Communicator& world,
                            const OverlapOptions& options) {
  TD_CHECK(options.iters >= 1, "--iters must be at least 1, got {}", options.iters);
  TD_CHECK(options.warmup >= 0, "--warmup must not be negative, got {}", options.warmup);
  TD_CHECK(options.target_ms > 0, "--target-ms must be positive, got {}", options.target_ms);
  TD_CHECK(options.gemm_n >= 0 && options.gemm_n <= 65536, "--gemm must be 1..65536, got {}",
           options.gemm_n);
  TD_CHECK(options.train >= 1 && options.train <= 1000, "--train must be 1..1000, got {}",
           options.train);
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
  report.train = options.train;
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

  std::vector<std::vector<Medians>> mine;
  {
    OverlapRunner runner(backend, world, options);
    report.gemm_bf16 = runner.gemm_bf16();
    report.comm = runner.comm_word();
    report.gemm_calibrated = options.gemm_n == 0;
    report.gemm_n = report.gemm_calibrated ? runner.calibrate_gemm() : options.gemm_n;
    report.sleep_ms = runner.gemm_ms(report.gemm_n);
    report.bytes_calibrated = options.bytes == 0;
    const size_t wanted = report.bytes_calibrated ? runner.calibrate_bytes() : options.bytes;
    const size_t count = std::max<size_t>(1, wanted / (4 * static_cast<size_t>(n)));
    report.bytes = count * 4 * n;
    for (const auto& config : configs)
      mine.push_back(runner.run(config, report.gemm_n, report.sleep_ms, count));
  }

  // Every rank's medians on every rank; each configuration and load reports its
  // lowest-overlap rank.
  nlohmann::json mine_json = nlohmann::json::array();
  for (const auto& loads : mine) {
    nlohmann::json row = nlohmann::json::array();
    for (const Medians& m : loads) row.push_back({m.compute, m.comm, m.both, m.noise});
    mine_json.push_back(std::move(row));
  }
  const std::vector<std::string> all = all_gather_text(world, backend.device(), mine_json.dump());
  std::vector<nlohmann::json> parsed;
  for (const auto& t : all) parsed.push_back(nlohmann::json::parse(t));
  for (size_t i = 0; i < configs.size(); ++i) {
    OverlapRow row;
    row.config = configs[i];
    for (int l = 0; l < 2; ++l) {
      OverlapMeasure best;
      best.overlap = 2;  // above any real value
      for (int r = 0; r < n; ++r) {
        const auto& v = parsed[r][i][l];
        OverlapMeasure m;
        m.t_compute_ms = v[0].get<double>();
        m.t_comm_ms = v[1].get<double>();
        m.t_both_ms = v[2].get<double>();
        m.noise = v[3].get<double>();
        m.overlap = overlap_fraction(m.t_compute_ms, m.t_comm_ms, m.t_both_ms);
        m.verdict = std::min(m.t_compute_ms, m.t_comm_ms) < kShortestJudgedMs
                        ? "too short to judge"
                        : overlap_verdict(m.overlap);
        m.rank = r;
        if (m.overlap < best.overlap) best = m;
      }
      (kLoads[l] == OverlapLoad::semantics ? row.semantics : row.sharing) = best;
    }
    row.limited_by = overlap_limit(row.semantics, row.sharing);
    report.rows.push_back(std::move(row));
  }
  return report;
}

namespace {

nlohmann::json measure_json(const OverlapMeasure& m) {
  return {{"t_compute_ms", m.t_compute_ms},
          {"t_comm_ms", m.t_comm_ms},
          {"t_both_ms", m.t_both_ms},
          {"overlap", m.overlap},
          {"verdict", m.verdict},
          {"rank", m.rank},
          {"noise", m.noise}};
}

std::string pair_name(const OverlapConfig& c) {
  if (c.compute == StreamKind::shared) return "one shared stream (the control)";
  return fmt::format("{} + {}", stream_kind_name(c.compute), stream_kind_name(c.comm));
}

}  // namespace

nlohmann::json overlap_to_json(const OverlapReport& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows)
    rows.push_back({{"compute_stream", stream_kind_name(row.config.compute)},
                    {"comm_stream", stream_kind_name(row.config.comm)},
                    {"streams", stream_lifetime_name(row.config.lifetime)},
                    {"semantics", measure_json(row.semantics)},
                    {"sharing", measure_json(row.sharing)},
                    {"limited_by", row.limited_by}});
  return {{"device", r.device},
          {"ranks", r.ranks},
          {"gemm_n", r.gemm_n},
          {"gemm_dtype", r.gemm_bf16 ? "bf16" : "fp32"},
          {"train", r.train},
          {"sleep_ms", r.sleep_ms},
          {"bytes", r.bytes},
          {"comm", r.comm},
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
  const std::string dtype = r.gemm_bf16 ? "bf16" : "fp32";
  std::string out = fmt::format(
      "probe overlap: {} rank(s) on {}; compute: a train of {} GEMMs {} x {} {} ({}; {:.3g} ms "
      "each), or one sleep as long ({:.3g} ms); communication: {} of {} ({}{}), issued first; "
      "{} warm-up + {} measured iterations, medians\n",
      r.ranks, r.device, r.train, r.gemm_n, r.gemm_n, dtype,
      r.gemm_calibrated ? "calibrated" : "--gemm", r.sleep_ms, r.train * r.sleep_ms, r.comm,
      probe_bytes_text(static_cast<double>(r.bytes)),
      r.ranks > 1 ? probe_bytes_text(static_cast<double>(r.bytes) / r.ranks) + " per rank; " : "",
      r.bytes_calibrated ? "calibrated" : "--bytes", r.warmup, r.iters);
  if (r.ranks == 1 && r.comm == "copy to host")
    out +=
        "1 rank: the communication is a copy to pinned host memory on a copy engine, which "
        "holds no SMs, as a transfer to another GPU leaves most of them to the GEMMs (a "
        "one-rank NCCL all-gather is a copy kernel over every SM); run with --ranks N, one "
        "GPU per rank, for real communication\n";
  else if (r.ranks == 1)
    out +=
        "1 rank: the communication is the one-rank all-gather, a local copy on the "
        "communication stream; run with --ranks N for real communication\n";
  if (r.device_kind == DeviceKind::cuda)
    out +=
        "cuda streams: legacy-default is stream 0; a blocking stream (cudaStreamCreate) waits "
        "for stream 0's earlier work and stream 0 for its; non-blocking (cudaStreamNonBlocking, "
        "the engine's kind) waits for neither\n";
  if (r.serialize)
    out +=
        "--serialize: the compute stream waits for each communication, so no configuration can "
        "overlap\n";
  if (r.compute_pad_ms > 0 || r.comm_pad_ms > 0)
    out += fmt::format(
        "padded: +{} ms sleep at the start of each compute train, +{} ms in each "
        "communication\n",
        r.compute_pad_ms, r.comm_pad_ms);
  if (!r.caveat.empty()) out += r.caveat + "\n";

  auto table = [&](OverlapLoad load) {
    const bool sharing = load == OverlapLoad::sharing;
    std::string t = "\n";
    t += sharing ? fmt::format(
                       "sharing: the compute is the GEMMs, which share the {} and memory "
                       "bandwidth with the communication\n",
                       r.device_kind == DeviceKind::cuda ? "SMs" : "cores")
                 : "stream semantics: the compute is a sleep that holds no compute units, so only "
                   "the streams' rules can keep the parts apart\n";
    t += fmt::format("  {:<14} {:<14} {:<20} {:>11} {:>11} {:>11} {:>8}  {}\n", "compute stream",
                     "comm stream", "streams", "compute", "comm", "both", "overlap", "verdict");
    for (const auto& row : r.rows) {
      const OverlapMeasure& m = sharing ? row.sharing : row.semantics;
      std::string tail = r.ranks > 1 ? fmt::format(" (rank {})", m.rank) : "";
      if (m.noise > kOverlapNoisy) tail += fmt::format(" [noisy: {:.0f}%]", 100 * m.noise);
      if (sharing && !row.limited_by.empty()) tail += "; limited by " + row.limited_by;
      t +=
          fmt::format("  {:<14} {:<14} {:<20} {:>8.2f} ms {:>8.2f} ms {:>8.2f} ms {:>8.2f}  {}{}\n",
                      stream_kind_name(row.config.compute), stream_kind_name(row.config.comm),
                      stream_lifetime_name(row.config.lifetime), m.t_compute_ms, m.t_comm_ms,
                      m.t_both_ms, m.overlap, m.verdict, tail);
    }
    return t;
  };
  out += table(OverlapLoad::semantics);
  out += table(OverlapLoad::sharing);

  out += "\n";
  out += "overlap = (compute + comm - both) / min(compute, comm), clipped to [0, 1]";
  if (r.ranks > 1) out += "; each line shows the rank with the lowest overlap";
  out += "\n";
  // What limits each configuration, in words.
  std::vector<std::string> by_streams, by_contention;
  for (const auto& row : r.rows) {
    const std::string what =
        fmt::format("{} ({})", pair_name(row.config), stream_lifetime_name(row.config.lifetime));
    if (row.limited_by == "streams")
      by_streams.push_back(what);
    else if (row.limited_by == "contention")
      by_contention.push_back(fmt::format("{}: {:.2f} with the sleep, {:.2f} with GEMMs", what,
                                          row.semantics.overlap, row.sharing.overlap));
  }
  auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? "; " : "") + v[i];
    return s;
  };
  if (!by_streams.empty())
    out +=
        "limited by the streams (their rules keep the parts apart even when neither holds "
        "compute units): " +
        join(by_streams) + "\n";
  if (!by_contention.empty())
    out += fmt::format(
        "limited by contention, not the streams (the streams let the parts run together; the "
        "GEMMs and the communication slow each other down on shared {} and memory bandwidth): "
        "{}\n",
        r.device_kind == DeviceKind::cuda ? "SMs" : "cores", join(by_contention));
  if (!r.rows.empty() && std::all_of(r.rows.begin(), r.rows.end(), [](const OverlapRow& row) {
        return row.semantics.verdict == "overlaps" && row.sharing.verdict == "overlaps";
      }))
    out += "every configuration overlaps, with the sleep and with GEMMs\n";
  if (std::any_of(r.rows.begin(), r.rows.end(), [](const OverlapRow& row) {
        return row.semantics.noise > kOverlapNoisy || row.sharing.noise > kOverlapNoisy;
      }))
    out += fmt::format(
        "[noisy: N%]: a phase's timings spread by N% (interquartile range / median) over the "
        "iterations, above {:.0f}%: the machine's load moved them, so that line's overlap is "
        "unreliable; rerun with more --iters or on a quieter machine\n",
        100 * kOverlapNoisy);
  if (!r.rows.empty()) {
    const auto& first = r.rows.front().sharing;
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
