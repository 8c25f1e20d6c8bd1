// `tandem probe compute`: what one device computes and copies: fp32 GEMM TFLOP/s at a few
// sizes (bf16 where the device has it), device-to-device copy GB/s, and memory size. The
// planner reads the saved JSON.
//
// [Compute measurement] Each GEMM size runs once to warm up, then repeatedly (at least 3
// times and at least ~0.2 s) on one stream, each run between two timing events; TFLOP/s =
// 2 n^3 / median time. tflops_f32 is the best size. The copy moves `copy_bytes` from one
// device buffer to another; copy_GBps counts each byte read and written: 2 bytes / time
// (the convention of memory-bandwidth tools such as STREAM's copy), median of 5 after one
// warm-up.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "plan/probe_backend.h"

namespace tandem {

struct ComputeOptions {
  std::vector<int> sizes;  // empty: ProbeBackend::default_gemm_sizes
  size_t copy_bytes = 0;   // 0: ProbeBackend::default_copy_bytes
};

struct GemmResult {
  int n = 0;
  double ms = 0;  // median per GEMM
  double tflops = 0;
};

struct ComputeReport {
  std::string device;       // the device's name, e.g. "cuda:0 (NVIDIA H200)"
  std::string device_kind;  // "cpu" or "cuda": the saved file's device (the planner's key)
  std::vector<GemmResult> f32, bf16;
  double tflops_f32 = 0;
  std::optional<double> tflops_bf16;  // none where the device has no bf16 GEMM
  size_t copy_bytes = 0;
  double copy_GBps = 0;
  double mem_GiB = 0;
  std::string caveat;
};

// 2 n^3 / (ms / 1e3) / 1e12.
double gemm_tflops(int n, double ms);
// 2 bytes / (ms / 1e3) / 1e9 (read + write).
double copy_GBps(size_t bytes, double ms);

ComputeReport probe_compute(ProbeBackend& backend, const ComputeOptions& options);

// {"device" (the kind), "tflops_f32", "tflops_bf16" (null without bf16), "copy_GBps", "mem_GiB"}:
// exactly these keys (the planner reads this file).
nlohmann::json compute_to_json(const ComputeReport& report);
std::string compute_format(const ComputeReport& report);

}  // namespace tandem
