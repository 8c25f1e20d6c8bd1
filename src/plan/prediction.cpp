// The planner's prediction for the run being trained, and the summary of its measured
// steps next to it.
#include "plan/prediction.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "device/device.h"
#include "device/kernels.h"
#include "model/activations.h"
#include "model/compose.h"
#include "plan/hardware.h"
#include "plan/probe_backend.h"
#include "plan/probe_compute.h"
#include "plan/probe_links.h"

namespace tandem {

namespace {

// Warm-up steps left out of the medians when the run is long enough.
constexpr int64_t kWarmupSteps = 2;
// Each rate of the end-of-run calibration is measured over at least this long.
constexpr double kCalibrateMs = 150;

double median_of(const std::vector<StepMetrics>& steps, double StepMetrics::*field) {
  std::vector<double> v;
  for (const StepMetrics& m : steps) v.push_back(m.*field);
  return probe_median(std::move(v));
}

// Runs op back to back on one stream after a warm-up, for at least window_ms, and returns
// runs per second ([CPU calibration] in prediction.h): total work over total time, the way
// a step of hundreds of milliseconds experiences this machine, time slices lost to other
// work included (a median of short runs would miss them). The runs are queued in batches
// that double (1, 2, 4, ...), each waited for once, so that the stream runs them one after
// another as a step's ops run: a wait after every run would add the device's wake-up time
// to each (tens of microseconds, a tenth of a decode block's time on a CPU or a GPU).
template <typename Op>
double throughput(Device& device, Stream& s, Op op, double window_ms) {
  op(s);
  device.stream_sync(s);
  auto start = device.event_create(true), end = device.event_create(true);
  device.event_record(*start, s);
  int64_t runs = 0;
  double elapsed = 0;
  for (int64_t batch = 1; elapsed < window_ms;) {
    for (int64_t i = 0; i < batch; ++i) op(s);
    runs += batch;
    device.event_record(*end, s);
    device.stream_sync(s);
    elapsed = device.event_elapsed_ms(*start, *end);
    // The next batch doubles, but no further than the runs the window still needs at the
    // rate so far, so the window ends near window_ms rather than near twice it.
    const double left = elapsed > 0 ? (window_ms - elapsed) * static_cast<double>(runs) / elapsed
                                    : static_cast<double>(2 * batch);
    batch =
        static_cast<int64_t>(std::clamp(std::ceil(left), 1.0, 2.0 * static_cast<double>(batch)));
  }
  return static_cast<double>(runs) / (elapsed * 1e-3);
}

std::string ms(double x) {
  return std::fabs(x) >= 100 ? fmt::format("{:.0f} ms", x) : fmt::format("{:.3g} ms", x);
}

}  // namespace

void prediction_options_validate(const TrainOptions& o) {
  if (o.hardware != "auto" && o.hardware != "none") {
    const std::vector<std::string> presets = hardware_preset_names();
    std::string known;
    for (const std::string& n : presets) known += n + ", ";
    TD_CHECK(std::find(presets.begin(), presets.end(), o.hardware) != presets.end(),
             "unknown --hardware '{}' (expected auto, none or a preset: {})", o.hardware,
             known.substr(0, known.size() - 2));
  }
  TD_CHECK(o.hardware != "none" || (o.hardware_compute.empty() && o.hardware_links.empty()),
           "--hardware none predicts nothing; --hardware-compute and --hardware-links need a "
           "preset or auto");
}

PredictionHardware prediction_hardware(const TrainOptions& o, const std::string& device_name) {
  PredictionHardware p;
  if (o.hardware == "none") {
    p.why = "--hardware none";
    return p;
  }
  std::string preset = o.hardware;
  if (preset == "auto") {
    preset = hardware_preset_for_device(device_name);
    if (preset.empty()) {
      p.why = fmt::format(
          "no hardware preset for {}; name one with --hardware, probe files on top with "
          "--hardware-compute and --hardware-links",
          device_name);
      return p;
    }
    p.measure_compute = preset == "cpu-local" && o.hardware_compute.empty();
    p.measure_links = preset == "cpu-local" && o.hardware_links.empty();
  }
  p.hw = hardware_resolve(preset, o.hardware_compute, o.hardware_links);
  hardware_validate(p.hw);
  if (p.hw.kernels) p.note = kernel_rates_form_mismatch(*p.hw.kernels, o.flash_backward);
  p.available = true;
  return p;
}

int prediction_gemm_size(const ModelConfig& model) {
  return std::clamp((model.d_model + 32) / 64 * 64, 128, 2048);
}

CpuRates prediction_measure_cpu(int gemm_n, double window_ms) {
  TD_CHECK(window_ms > 0, "a calibration window must be positive, got {} ms", window_ms);
  TD_CHECK(gemm_n >= 1, "a calibration GEMM size must be positive, got {}", gemm_n);
  std::unique_ptr<Device> device = device_create_cpu();
  std::unique_ptr<ProbeBackend> backend = probe_backend_cpu(*device);
  CpuRates rates;
  rates.gemm_n = gemm_n;
  {
    const int n = gemm_n;
    const size_t bytes = static_cast<size_t>(n) * n * sizeof(float);
    ProbeBuffer a(*device, bytes), b(*device, bytes), c(*device, bytes);
    const std::vector<float> host(static_cast<size_t>(n) * n, 0.01f);
    device->copy_to_device(a.get(), host.data(), bytes);
    device->copy_to_device(b.get(), host.data(), bytes);
    auto stream =
        backend->stream_create(backend->compute_stream_kinds().back(), "calibrate gemm", 0);
    const double per_s = throughput(
        *device, *stream, [&](Stream& st) { backend->gemm_f32(st, n, a.f32(), b.f32(), c.f32()); },
        window_ms);
    rates.tflops = 2.0 * n * n * static_cast<double>(n) * per_s / 1e12;
  }
  {
    // 128 MB of weights, past any cache, n wide: what a decode step streams per row.
    const int cols = gemm_n, rows = std::max(1, static_cast<int>((size_t{32} << 20) / gemm_n));
    const size_t wbytes = static_cast<size_t>(rows) * cols * sizeof(float);
    ProbeBuffer w(*device, wbytes), x(*device, cols * sizeof(float)),
        y(*device, rows * sizeof(float));
    const std::vector<float> host(static_cast<size_t>(rows) * cols, 0.01f);
    device->copy_to_device(w.get(), host.data(), wbytes);
    device->copy_to_device(x.get(), host.data(), cols * sizeof(float));
    auto stream =
        backend->stream_create(backend->compute_stream_kinds().back(), "calibrate matvec", 0);
    const double per_s = throughput(
        *device, *stream,
        [&](Stream& st) { backend->matvec_f32(st, rows, cols, w.f32(), x.f32(), y.f32()); },
        window_ms);
    rates.matvec_GBps = static_cast<double>(wbytes) * per_s / 1e9;
  }
  const size_t bytes = size_t{64} << 20;
  ProbeBuffer src(*device, bytes), dst(*device, bytes);
  const std::vector<char> host(bytes, 1);
  device->copy_to_device(src.get(), host.data(), bytes);
  device->copy_to_device(dst.get(), host.data(), bytes);  // touch every page first
  auto stream = backend->stream_create(backend->compute_stream_kinds().back(), "calibrate copy", 0);
  const double per_s = throughput(
      *device, *stream, [&](Stream& st) { backend->copy(st, dst.get(), src.get(), bytes); },
      window_ms);
  rates.copy_GBps = 2.0 * static_cast<double>(bytes) * per_s / 1e9;
  return rates;
}

namespace {

// Copies of n weights in the compute dtype (cb bytes each), at least 128 MB of them, to be
// read in turn so that no cache holds what a timed step streams. Small values: any finite
// weights time the same.
class WeightCopies {
 public:
  WeightCopies(Device& device, size_t n, size_t cb)
      : stride_((n * cb + 255) / 256 * 256),
        copies_(std::max<size_t>(1, ((size_t{128} << 20) + stride_ - 1) / stride_)),
        buf_(device, copies_ * stride_) {
    const size_t chunk = size_t{1} << 22;
    std::vector<uint16_t> half(cb == 2 ? std::min(n, chunk) : 0, bf16_from_f32(0.01f));
    std::vector<float> full(cb == 4 ? std::min(n, chunk) : 0, 0.01f);
    const void* src = cb == 2 ? static_cast<const void*>(half.data()) : full.data();
    for (size_t i = 0; i < copies_; ++i)
      for (size_t at = 0; at < n; at += chunk)
        device.copy_to_device(buf_.as<char>() + i * stride_ + at * cb, src,
                              std::min(chunk, n - at) * cb);
  }
  size_t copies() const { return copies_; }
  char* copy(size_t i) const { return buf_.as<char>() + i * stride_; }

 private:
  size_t stride_, copies_;
  DeviceBuffer buf_;
};

}  // namespace

DecodeRates prediction_measure_decode(Device& device, const ModelConfig& model, int rows,
                                      int positions, double window_ms) {
  TD_CHECK(rows >= 1 && positions >= 1 && window_ms > 0,
           "a decode calibration of {} rows over {} positions in {} ms", rows, positions,
           window_ms);
  ModelConfig c = model;
  c.n_layer = 1;
  c.context = std::max(c.context, positions);
  const ModelLayout m(c);
  constexpr int block = 1;
  std::unique_ptr<Stream> stream = device.stream_create("calibrate decode");
  std::unique_ptr<Kernels> k = kernels_create(device, *stream, AttentionImpl::automatic);
  const size_t cb = k->compute_bytes();
  const size_t n = static_cast<size_t>(m.unit(block).numel);
  const WeightCopies w(device, n, cb);
  KvCache cache;
  cache.slots = rows;
  cache.positions = positions;
  const size_t kv = KvCache::block_bytes(c, rows, positions, cb);
  DeviceBuffer kvm(device, 2 * kv);
  const std::vector<char> zeros(2 * kv, 0);
  device.copy_to_device(kvm.get(), zeros.data(), zeros.size());
  cache.k = {kvm.get()};
  cache.v = {kvm.as<char>() + kv};
  const ActivationTraits tr = activation_traits(*k, c, rows, 1, WorkspaceUse::decode, positions);
  DeviceBuffer wsm(device, activation_bytes(c, rows, 1, tr));
  Workspace ws(c, rows, 1, tr, wsm.get());
  ws.cache = &cache;
  // Each row at position 0: the cache's reads are the planner's KV term, not this rate's.
  std::vector<int32_t> pos(static_cast<size_t>(rows), 0), slots(pos.size());
  for (int r = 0; r < rows; ++r) slots[static_cast<size_t>(r)] = r;
  device.copy_to_device(ws.positions, pos.data(), pos.size() * sizeof(int32_t));
  device.copy_to_device(ws.slots, slots.data(), slots.size() * sizeof(int32_t));
  const std::vector<char> act(static_cast<size_t>(rows) * c.d_model * cb, 0);
  device.copy_to_device(ws.residual[0], act.data(), act.size());
  std::vector<UnitParams> params(w.copies(),
                                 UnitParams(static_cast<size_t>(m.num_units()), nullptr));
  for (size_t i = 0; i < w.copies(); ++i) params[i][block] = w.copy(i);
  size_t next = 0;
  const double per_s = throughput(
      device, *stream,
      [&](Stream& st) {
        const UnitParams& p = params[next++ % params.size()];
        device.submit(st, [&k, &ws, &m, &p] {
          k->set_scratch(ws.scratch, ws.scratch_bytes);
          unit_forward_part(*k, m, block, p, ws, BlockPart::whole);
        });
      },
      window_ms);
  DecodeRates r;
  r.rows = rows;
  r.block_ms = 1e3 / per_s;
  r.matvec_GBps = static_cast<double>(n * cb) / (r.block_ms * 1e6);
  {
    // The head's product alone: one wide matrix over the vocabulary, which streams faster per
    // byte than a block's several narrower ones and carries none of a block's other work.
    const int C = c.d_model, V = c.head_rows();
    const size_t hn = static_cast<size_t>(V) * static_cast<size_t>(C);
    const WeightCopies h(device, hn, cb);
    size_t at = 0;
    const double head_per_s = throughput(
        device, *stream,
        [&](Stream& st) {
          const void* p = h.copy(at++ % h.copies());
          device.submit(st, [&k, &ws, p, rows, C, V] {
            k->linear_forward(ws.logits, ws.normf, p, nullptr, rows, C, V);
          });
        },
        window_ms);
    r.head_ms = 1e3 / head_per_s;
    r.head_GBps = static_cast<double>(hn * cb) / (r.head_ms * 1e6);
  }
  return r;
}

void prediction_apply_decode(Hardware& hw, const DecodeRates& r) {
  hw.matvec_GBps = r.matvec_GBps;
  hw.head_matvec_GBps = r.head_GBps;
  hw.source += fmt::format(
      " + decoding measured in this run (a block of {} rows in {:.3g} ms: weights at {:.4g} "
      "GB/s; the head's product at {:.4g} GB/s)",
      r.rows, r.block_ms, r.matvec_GBps, r.head_GBps);
  hardware_validate(hw);
}

size_t prediction_links_bytes(const ModelConfig& model) {
  const ModelLayout layout(model);
  int64_t largest = 0;
  for (const UnitLayout& u : layout.units()) largest = std::max(largest, u.numel);
  return std::max<size_t>(size_t{4} << 10, static_cast<size_t>(largest) * sizeof(float));
}

void prediction_calibrate_links(Hardware& hw, size_t max_bytes, Communicator& world,
                                Device& device) {
  TD_CHECK(world.size() >= 2, "a links calibration needs at least 2 ranks, got {}", world.size());
  std::unique_ptr<ProbeBackend> backend = probe_backend_create(device);
  LinksOptions options;
  options.max_bytes = max_bytes;
  options.min_bytes = std::max<size_t>(1024, max_bytes / 8);
  options.iters = 5;
  options.warmup = 1;
  const LinksReport report = probe_links(*backend, world, options);
  hardware_apply_links(hw, links_to_json(report));
  hw.source += fmt::format(" + links measured in this run ({} to {} at {} ranks)",
                           probe_bytes_text(static_cast<double>(options.min_bytes)),
                           probe_bytes_text(static_cast<double>(max_bytes)), world.size());
}

void prediction_apply_cpu(Hardware& hw, const CpuRates& r) {
  hw.tflops = r.tflops;
  hw.hbm_GBps = r.copy_GBps;
  hw.matvec_GBps = r.matvec_GBps;
  hw.source += fmt::format(
      " + measured in this run ({:.3g} TFLOP/s fp32 GEMM at n = {}, {:.3g} GB/s copy, {:.3g} GB/s "
      "matrix-vector)",
      r.tflops, r.gemm_n, r.copy_GBps, r.matvec_GBps);
  hardware_validate(hw);
}

std::shared_ptr<const KernelRates> prediction_measure_kernels(const ModelConfig& model, int batch,
                                                              int seq) {
  std::unique_ptr<Device> device = device_create_cpu();
  KernelProbeOptions o =
      kernel_probe_for_model(model, batch, seq, DeviceKind::cpu, AttentionImpl::automatic);
  o.reps = 3;
  return std::make_shared<const KernelRates>(probe_kernels(*device, o));
}

void prediction_apply_kernels(Hardware& hw, std::shared_ptr<const KernelRates> kernels) {
  TD_CHECK(kernels != nullptr, "no kernel tables to apply");
  hw.source += " + kernels measured in this run (" + hardware_kernels_text(*kernels) + ")";
  hw.kernels = std::move(kernels);
}

PlanRequest prediction_request(const TrainOptions& o, const ModelConfig& model, int world,
                               const Hardware& hw) {
  TD_CHECK(world >= 1 && o.batch >= 1, "a prediction needs a world size and batch of at least 1");
  const int global = o.global_batch > 0 ? o.global_batch : o.batch * world;
  TD_CHECK(global % (o.batch * world) == 0,
           "--global-batch {} is not a multiple of --batch {} x {} rank(s)", global, o.batch,
           world);
  PlanRequest r;
  r.task = PlanTask::train;
  r.model = model;
  r.ranks = world;
  r.batch = o.batch;
  r.seq = o.seq;
  r.micro_steps = global / (o.batch * world);
  r.max_gathered = o.max_gathered;
  r.recompute = o.recompute;
  r.loss_chunk = o.loss_chunk;
  r.reduce_dtype = o.reduce_dtype;
  r.update_at_gather = o.update_at_gather;
  r.shard_group = o.strategy == Strategy::hybrid ? o.shard_group : 0;
  r.strategy = strategy_name(o.strategy);
  r.hw = hw;
  return r;
}

StepPrediction prediction_plan(const PlanRequest& r) {
  TD_CHECK(!r.strategy.empty(), "a step prediction plans one strategy");
  const PlanResult plan = plan_run(r);
  TD_CHECK(plan.strategies.size() == 1, "the plan holds {} strategies, expected 1",
           plan.strategies.size());
  const StrategyPlan& s = plan.strategies.front();
  StepPrediction p;
  p.hardware = r.hw.name;
  p.source = r.hw.source;
  p.step_ms = s.step_ms;
  p.compute_ms = s.compute_ms;
  p.comm_ms = s.comm_ms;
  p.exposed_comm_ms = s.exposed_comm_ms;
  return p;
}

MeasuredSteps prediction_measured(const std::vector<StepMetrics>& steps) {
  MeasuredSteps m;
  m.steps = static_cast<int64_t>(steps.size());
  if (steps.empty()) return m;
  const int64_t skip = std::min(kWarmupSteps, m.steps / 2);
  const std::vector<StepMetrics> window(steps.begin() + skip, steps.end());
  m.first = window.front().step;
  m.last = window.back().step;
  m.step_ms = median_of(window, &StepMetrics::step_ms);
  m.compute_ms = median_of(window, &StepMetrics::compute_ms);
  m.comm_ms = median_of(window, &StepMetrics::comm_ms);
  m.exposed_comm_ms = median_of(window, &StepMetrics::exposed_comm_ms);
  m.tokens_per_s = median_of(window, &StepMetrics::tokens_per_s);
  return m;
}

RunSummary prediction_summarize(const PredictionHardware& hw, const TrainOptions& o,
                                const ModelConfig& model, Communicator& world, Device& device,
                                const std::vector<StepMetrics>& steps) {
  RunSummary s;
  s.measured = prediction_measured(steps);
  if (!hw.available) {
    s.why = hw.why;
    return s;
  }
  // Every rank at once, as the steps ran; the links calibration is collective, and every
  // rank gets the same links report, so a failure there fails on every rank alike.
  const bool links = hw.measure_links && world.size() > 1;
  try {
    Hardware h = hw.hw;
    if (hw.measure_compute) {
      prediction_apply_cpu(h, prediction_measure_cpu(prediction_gemm_size(model), kCalibrateMs));
      prediction_apply_kernels(h, prediction_measure_kernels(model, o.batch, o.seq));
    }
    if (links) prediction_calibrate_links(h, prediction_links_bytes(model), world, device);
    s.predicted = prediction_plan(prediction_request(o, model, world.size(), h));
    s.predicted->calibrated = hw.measure_compute || links;
  } catch (const Error& e) {
    s.why = e.message();
  }
  return s;
}

double prediction_off(const RunSummary& s) {
  if (!s.predicted || !(s.predicted->step_ms > 0)) return 0;
  return s.measured.step_ms / s.predicted->step_ms - 1;
}

std::string prediction_line(const RunSummary& s) {
  const MeasuredSteps& m = s.measured;
  const std::string window = m.first == m.last
                                 ? fmt::format("step {}", m.first)
                                 : fmt::format("median of steps {}..{}", m.first, m.last);
  const std::string measured = fmt::format("measured ({}): step {}, exposed {}", window,
                                           ms(m.step_ms), ms(m.exposed_comm_ms));
  if (!s.predicted) return fmt::format("predicted: none ({}) | {}", s.why, measured);
  const StepPrediction& p = *s.predicted;
  const std::string how = p.calibrated ? p.hardware + ", calibrated" : p.hardware;
  return fmt::format(
      "predicted ({}): step {}, exposed communication {} | {} | step time off by {:+.0f}%", how,
      ms(p.step_ms), ms(p.exposed_comm_ms), measured, 100 * prediction_off(s));
}

nlohmann::json prediction_to_json(const RunSummary& s) {
  const MeasuredSteps& m = s.measured;
  nlohmann::json predicted = nullptr;
  if (s.predicted) {
    const StepPrediction& p = *s.predicted;
    predicted = {{"hardware", p.hardware},     {"source", p.source},
                 {"step_ms", p.step_ms},       {"exposed_comm_ms", p.exposed_comm_ms},
                 {"compute_ms", p.compute_ms}, {"comm_ms", p.comm_ms}};
  }
  return {{"summary", true},
          {"steps", m.steps},
          {"measured",
           {{"step_ms", m.step_ms},
            {"exposed_comm_ms", m.exposed_comm_ms},
            {"compute_ms", m.compute_ms},
            {"comm_ms", m.comm_ms},
            {"tokens_per_s", m.tokens_per_s}}},
          {"predicted", predicted}};
}

}  // namespace tandem
