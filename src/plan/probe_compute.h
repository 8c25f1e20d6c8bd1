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
//
// [Kernel measurement] With kernel tables (always, unless ComputeOptions::kernels is false),
// every call of the list (a model's: model_kernel_calls, or the device's default grid) runs
// through the engine's own kernel table (kernels_create) on one stream: one warm-up call,
// one timed call to size the batch, then `reps` timed batches of calls issued back to back
// (as many as take `target_ms`, at least one); a call's time is the median batch's time per
// call, so what launching it costs is part of it. Operands are spread like activations (magnitudes
// 0.02..0.3, random signs; token ids spread over the vocabulary: [Operand values] in the .cpp),
// in one device region sized for the largest call. The launch overhead is the same
// measurement of `add` on one element. On a CPU, AdamW (the optimizer's CPU kernel) over the
// model's parameters is timed too, since its arithmetic, not memory, bounds it there, and so
// is the gradient norm's serial sum of squares, bound by its additions' latency.
//
// [Sustained clocks] A GPU's clock follows its power draw. Timed in short batches with idle
// gaps between them, kernels run at boost clock, faster than in a training step, which
// keeps the GPU at its power limit: on an H200, 1 ms batches ran at 1940 MHz and 330 W while
// training GPT-2 1.5B ran at 1744 MHz and 642 W (NVML), and the tables summed 11-13% short
// of the step's kernels. So a GPU's batches last 100 ms (kGpuKernelBatchMs), long enough
// for the power limit to take hold; plans from the tables then came within 1.4-6.3% of the
// measured steps of GPT-2 124M, 1.5B and a Llama-1B shape (docs/planner.md). A CPU has no such
// limit, and its batches stay short (1 ms), so that `tandem train`'s own measurement stays cheap.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "device/kernels.h"
#include "model/config.h"
#include "plan/kernel_rates.h"
#include "plan/probe_backend.h"

namespace tandem {

// What probe_kernels measures and how.
constexpr double kGpuKernelBatchMs = 100;  // [Sustained clocks]

struct KernelProbeOptions {
  std::vector<KernelCall> calls;
  AttentionImpl attention = AttentionImpl::automatic;
  // The flash backward's form while measuring (the process-wide setting is restored after).
  FlashBackward flash_backward = FlashBackward::automatic;
  int reps = 5;          // timed batches per call (the median counts)
  double target_ms = 1;  // a batch's length: calls back to back for at least this long
                         // (kernel_probe_*: kGpuKernelBatchMs on a GPU, [Sustained clocks])
  // Scratch the engine would hand the table for these shapes (the largest of it and each
  // call's own needs is allocated).
  std::vector<KernelShape> scratch_shapes;
  std::string model;  // labels of the tables ("" for the default grid)
  int batch = 0, seq = 0;
  // CPU: AdamW and the gradient norm's sum of squares over this many fp32 elements (the
  // model's parameters; 0: none), whose rates go into KernelRates::optimizer_GBps and
  // grad_norm_GBps.
  int64_t optimizer_elements = 0;
};

// [Kernel measurement] on device, through its kernel table.
KernelRates probe_kernels(Device& device, const KernelProbeOptions& options);
// The options that measure a model's calls at a (batch, seq) micro-batch on this device:
// every distinct call of its units (model_kernel_calls), plus add at the residual's size.
KernelProbeOptions kernel_probe_for_model(const ModelConfig& model, int batch, int seq,
                                          DeviceKind kind, AttentionImpl attention);
// Without a model: the calls of the device's default shapes (cpu: gpt2-tiny and llama-tiny
// at 2 x 64; cuda: gpt2-124m at 8 x 1024 and llama2-7b at 1 x 2048), one table for both.
KernelProbeOptions kernel_probe_default(DeviceKind kind, AttentionImpl attention);

struct ComputeOptions {
  std::vector<int> sizes;            // empty: ProbeBackend::default_gemm_sizes
  size_t copy_bytes = 0;             // 0: ProbeBackend::default_copy_bytes
  bool kernels = true;               // measure the kernel tables too
  std::optional<ModelConfig> model;  // measure this model's shapes (else the default grid)
  int batch = 4, seq = 64;           // the model's micro-batch
  AttentionImpl attention = AttentionImpl::automatic;
  FlashBackward flash_backward = FlashBackward::automatic;  // while measuring the kernel tables
  double kernel_ms = 0;  // each timed batch of a kernel's calls lasts this long; 0: the default
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
  std::optional<KernelRates> kernels;
};

// 2 n^3 / (ms / 1e3) / 1e12.
double gemm_tflops(int n, double ms);
// 2 bytes / (ms / 1e3) / 1e9 (read + write).
double copy_GBps(size_t bytes, double ms);

ComputeReport probe_compute(ProbeBackend& backend, const ComputeOptions& options);

// {"device" (the kind), "tflops_f32", "tflops_bf16" (null without bf16), "copy_GBps", "mem_GiB",
// "kernels"} (kernels: kernel_rates_to_json, or null when not measured); the planner reads
// this file (docs/planner.md, "Probe files").
nlohmann::json compute_to_json(const ComputeReport& report);
std::string compute_format(const ComputeReport& report);

}  // namespace tandem
