// The machine the cost model of `tandem plan` predicts for: a matrix rate, a memory
// bandwidth and size, and one latency-bandwidth line per collective. It comes from a
// named preset, from the files `tandem probe compute|links --save` write, or from flags.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tandem {

struct KernelRates;  // plan/kernel_rates.h

// [Link model] A collective moving `bus_bytes` per rank takes latency + bus_bytes / GBps:
// the nccl-tests convention, where bus bytes are the buffer size times (n-1)/n for an
// all-gather or a reduce-scatter and 2(n-1)/n for an all-reduce, so one bandwidth
// describes a link at any rank count.
struct LinkModel {
  double latency_us = 0;
  double GBps = 1;  // bus bandwidth
  double ms(double bus_bytes) const { return latency_us * 1e-3 + bus_bytes / (GBps * 1e6); }
};

struct Hardware {
  std::string name;     // preset name, or "custom"
  std::string source;   // what set the numbers: preset, probe files, flags
  bool gpu = true;      // numerics: bf16 compute copies on GPU, fp32 everywhere on CPU
  double tflops = 1;    // dense matrix rate achievable (bf16 on GPU, fp32 on CPU)
  double hbm_GBps = 1;  // device memory bandwidth, bytes read plus bytes written
  // The rate a matrix-vector product streams its weights (decoding a few rows); 0: at
  // hbm_GBps (a GPU's reach it; a CPU core's measured ones do not).
  double matvec_GBps = 0;
  // The rate the head's product (one wide matrix over the vocabulary) streams its weights
  // while decoding; 0: at matvec_GBps. Measured by a decode calibration, which folds a
  // block's other work into matvec_GBps and so must price the head apart.
  double head_matvec_GBps = 0;
  double mem_GiB = 1;  // memory per rank
  LinkModel all_gather, reduce_scatter, all_reduce;
  int links_ranks = 0;          // ranks the links probe measured (0: not from a probe)
  size_t param_bytes = 2;       // gathered (compute) parameters per element
  size_t grad_bytes = 4;        // unsharded gradients per element
  size_t activation_bytes = 2;  // activations per element
  // Per-kernel rates of a compute probe file (`kernels`), or measured in the run; null: a
  // unit's forward and backward cost FLOPs at tflops plus bytes at hbm_GBps
  // (docs/planner.md, "Op durations").
  std::shared_ptr<const KernelRates> kernels;

  double mem_bytes() const { return mem_GiB * 1073741824.0; }
  double memory_ms(double bytes) const { return bytes / (hbm_GBps * 1e6); }
  double flop_ms(double flops) const { return flops / (tflops * 1e9); }
  double matvec_ms(double bytes) const {
    return matvec_GBps > 0 ? bytes / (matvec_GBps * 1e6) : memory_ms(bytes);
  }
  double head_matvec_ms(double bytes) const {
    return head_matvec_GBps > 0 ? bytes / (head_matvec_GBps * 1e6) : matvec_ms(bytes);
  }
  // Collectives over a group of `group` ranks on a buffer of `bytes` (the gathered
  // output, the scattered input, the reduced buffer). A group of one costs nothing here.
  double all_gather_ms(double bytes, int group) const;
  double reduce_scatter_ms(double bytes, int group) const;
  double all_reduce_ms(double bytes, int group) const;
};

std::vector<std::string> hardware_preset_names();
// h100-sxm, h200-sxm, a100-80g, pcie-gen4, cpu-local; throws naming the known ones.
Hardware hardware_preset(const std::string& name);

// Probe files (schema in docs/planner.md). Compute: {"device": "cpu"|"cuda", "tflops_f32",
// "tflops_bf16", "copy_GBps", "mem_GiB", "kernels"}; sets the device, rate, bandwidth and
// memory, and the per-kernel tables where the file has them (none where it has not).
void hardware_apply_compute(Hardware& hw, const nlohmann::json& probe);
// Links: {"ranks", "sizes", "all_gather"|"reduce_scatter"|"all_reduce": [{"bytes",
// "time_us", "busbw_GBps"}]}; fits each collective's line by least squares.
void hardware_apply_links(Hardware& hw, const nlohmann::json& probe);
// "kernel tables: 42 shapes of gpt2-124m at batch 16 x 1024, launch 4.1 us".
std::string hardware_kernels_text(const KernelRates& k);
nlohmann::json hardware_read_file(const std::string& path, const char* what);

// A preset, then the probe files given (empty: none), each overriding the one before; the
// source names every layer. `tandem plan` adds its single-figure flags on top of this, and
// `tandem train --hardware` uses it as it is.
Hardware hardware_resolve(const std::string& preset, const std::string& compute_file,
                          const std::string& links_file);

// The preset of the device a process runs on, from Device::name(): `cpu-local` for "cpu",
// for a GPU the preset its model name matches (H200: h200-sxm, H100: h100-sxm, A100:
// a100-80g), and "" for a GPU without a preset.
std::string hardware_preset_for_device(const std::string& device_name);

// Fits time_us = latency + bus_bytes / GBps to (bus_bytes, time_us) points, minimising the
// relative error (see [Link fit] in hardware.cpp). One point: latency 0.
LinkModel link_fit(const std::vector<std::pair<double, double>>& bus_bytes_time_us);

// Throws a clear error for a nonpositive rate, bandwidth or memory.
void hardware_validate(const Hardware& hw);
// The precision planned: "bf16" (weights and activations of 2 bytes, gradients of 4) or "fp32"
// (4 bytes each); "auto" keeps what the preset or probe file says (bf16 on GPUs, fp32 on
// CPUs). Throws "--dtype must be auto, bf16 or fp32, got '<name>'" for anything else.
void hardware_set_dtype(Hardware& hw, const std::string& dtype);
// "bf16" or "fp32": the precision of the weights and activations hw plans.
std::string hardware_dtype(const Hardware& hw);
nlohmann::json hardware_to_json(const Hardware& hw);
// One line: "h200-sxm: 758 TFLOP/s bf16, 4170 GB/s memory, 140 GiB, links ...".
std::string hardware_describe(const Hardware& hw);

}  // namespace tandem
