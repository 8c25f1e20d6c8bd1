// The compute probe: GEMMs at a few sizes and one large device copy, timed with events on
// one stream ([Compute measurement] in probe_compute.h).
#include "plan/probe_compute.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

namespace {

// Median ms of op on s: one warm-up, then at least min_runs runs and at least min_total_ms.
template <typename Op>
double time_op(Device& device, Stream& s, Op op, int min_runs, double min_total_ms) {
  auto e0 = device.event_create(true), e1 = device.event_create(true);
  op(s);
  device.stream_sync(s);
  std::vector<double> times;
  double total = 0;
  while (static_cast<int>(times.size()) < min_runs ||
         (total < min_total_ms && times.size() < 1000)) {
    device.event_record(*e0, s);
    op(s);
    device.event_record(*e1, s);
    device.stream_sync(s);
    times.push_back(device.event_elapsed_ms(*e0, *e1));
    total += times.back();
  }
  return probe_median(times);
}

}  // namespace

double gemm_tflops(int n, double ms) {
  if (!(ms > 0)) return 0;
  const double flops = 2.0 * n * static_cast<double>(n) * n;
  return flops / (ms * 1e-3) / 1e12;
}

double copy_GBps(size_t bytes, double ms) {
  if (!(ms > 0)) return 0;
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

ComputeReport probe_compute(ProbeBackend& backend, const ComputeOptions& options) {
  Device& device = backend.device();
  ComputeReport r;
  r.device = device.name();
  r.device_kind = probe_device_kind(device);
  r.mem_GiB = backend.mem_GiB();
  r.caveat = backend.timing_caveat(1);
  const std::vector<int> sizes =
      options.sizes.empty() ? backend.default_gemm_sizes() : options.sizes;
  r.copy_bytes = options.copy_bytes == 0 ? backend.default_copy_bytes() : options.copy_bytes;
  for (int n : sizes) TD_CHECK(n >= 1 && n <= 65536, "GEMM size must be 1..65536, got {}", n);

  for (int n : sizes) {
    const size_t elems = static_cast<size_t>(n) * n;
    const size_t bytes = elems * sizeof(float);
    ProbeBuffer a(device, bytes), b(device, bytes), c(device, bytes);
    std::vector<float> host(elems);
    for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i % 13) * 0.01f;
    device.copy_to_device(a.get(), host.data(), bytes);
    device.copy_to_device(b.get(), host.data(), bytes);
    // bf16 operands of their own (2 bytes per element): the same values, rounded.
    const bool bf16 = backend.has_gemm_bf16();
    const size_t bytes16 = bf16 ? elems * sizeof(uint16_t) : 0;
    ProbeBuffer a16(device, bytes16), b16(device, bytes16), c16(device, bytes16);
    if (bf16) {
      std::vector<uint16_t> host16(elems);
      for (size_t i = 0; i < elems; ++i) host16[i] = bf16_from_f32(host[i]);
      device.copy_to_device(a16.get(), host16.data(), bytes16);
      device.copy_to_device(b16.get(), host16.data(), bytes16);
    }
    auto stream = backend.stream_create(backend.compute_stream_kinds().back(), "probe compute", 0);
    const double ms = time_op(
        device, *stream, [&](Stream& s) { backend.gemm_f32(s, n, a.f32(), b.f32(), c.f32()); }, 3,
        200);
    r.f32.push_back({n, ms, gemm_tflops(n, ms)});
    r.tflops_f32 = std::max(r.tflops_f32, r.f32.back().tflops);
    if (bf16) {
      const double ms16 = time_op(
          device, *stream,
          [&](Stream& s) { backend.gemm_bf16(s, n, a16.get(), b16.get(), c16.get()); }, 3, 200);
      r.bf16.push_back({n, ms16, gemm_tflops(n, ms16)});
      r.tflops_bf16 = std::max(r.tflops_bf16.value_or(0), r.bf16.back().tflops);
    }
  }

  {
    ProbeBuffer src(device, r.copy_bytes), dst(device, r.copy_bytes);
    std::vector<char> host(r.copy_bytes, 1);
    device.copy_to_device(src.get(), host.data(), r.copy_bytes);
    device.copy_to_device(dst.get(), host.data(), r.copy_bytes);  // touch every page first
    auto stream = backend.stream_create(backend.compute_stream_kinds().back(), "probe copy", 0);
    const double ms = time_op(
        device, *stream, [&](Stream& s) { backend.copy(s, dst.get(), src.get(), r.copy_bytes); }, 5,
        0);
    r.copy_GBps = copy_GBps(r.copy_bytes, ms);
  }
  return r;
}

nlohmann::json compute_to_json(const ComputeReport& r) {
  return {{"device", r.device_kind},
          {"tflops_f32", r.tflops_f32},
          {"tflops_bf16", r.tflops_bf16 ? nlohmann::json(*r.tflops_bf16) : nlohmann::json(nullptr)},
          {"copy_GBps", r.copy_GBps},
          {"mem_GiB", r.mem_GiB}};
}

std::string compute_format(const ComputeReport& r) {
  std::string out = fmt::format("probe compute: {}, {:.1f} GiB of memory\n", r.device, r.mem_GiB);
  if (!r.caveat.empty()) out += r.caveat + "\n";
  out += fmt::format("\n  {:>6} {:>12} {:>10}\n", "n", "ms", "TFLOP/s");
  for (const auto& g : r.f32)
    out += fmt::format("  {:>6} {:>12.3f} {:>10.4f}   fp32 GEMM n x n x n (2 n^3 flops)\n", g.n,
                       g.ms, g.tflops);
  for (const auto& g : r.bf16)
    out += fmt::format("  {:>6} {:>12.3f} {:>10.4f}   bf16 GEMM, fp32 accumulation\n", g.n, g.ms,
                       g.tflops);
  out += fmt::format("\ntflops_f32 {:.4f} (best size)", r.tflops_f32);
  out += r.tflops_bf16 ? fmt::format(", tflops_bf16 {:.4f}\n", *r.tflops_bf16)
                       : fmt::format(", tflops_bf16 none ({} has no bf16 GEMM)\n", r.device);
  out += fmt::format(
      "copy {:.2f} GB/s ({} device to device, counting read + write: 2 x bytes / "
      "time)\n",
      r.copy_GBps, probe_bytes_text(static_cast<double>(r.copy_bytes)));
  return out;
}

}  // namespace tandem
