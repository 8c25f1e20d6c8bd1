// Per-kernel rates: what each training kernel of the kernel table (device/kernels.h) costs at
// one shape, measured by `tandem probe compute` through the same table the engine runs
// (probe_compute.h), and how the planner charges a unit's forward and backward with them.
//
// [Kernel calls] A unit's kernels are not listed by hand: unit_kernel_calls runs the one
// composition (model/compose.h) over a recording table that keeps each call's kernel and
// size arguments and touches no memory, so the planner charges exactly the calls the engine
// makes (which linears, attention, norms, activations, zeros, embedding, head and loss), and
// the probe measures exactly those shapes for a model.
//
// [Kernel estimate] A call costs, in this order:
//  - measured: the probe's time at exactly this kernel and shape (per call, issued back to
//    back: launching is part of it);
//  - interpolated: over the same kernel's measured shapes by work (FLOPs for the linears and
//    attention, nominal bytes for the rest; attention prefers its own head size): linear in
//    time between the two nearest, at the largest's rate above it, and between the launch
//    time and the smallest below it; never less than one launch;
//  - none: no shape of the kernel was measured; the planner then charges the hardware's
//    ceilings (FLOPs at the GEMM rate plus bytes at the copy bandwidth) plus one launch.
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "device/kernels.h"
#include "model/activations.h"
#include "model/model.h"

namespace tandem {

// The kernels of a training step's units (device/kernels.h).
enum class KernelOp : uint8_t {
  zero,
  embedding_forward,
  embedding_backward,
  layernorm_forward,
  layernorm_backward,
  rmsnorm_forward,
  rmsnorm_backward,
  linear_forward,
  linear_gelu_forward,
  linear_residual_forward,
  linear_backward,
  gelu_backward,
  swiglu_forward,
  swiglu_backward,
  rope_forward,
  rope_backward,
  attention_forward,
  attention_backward,
  add,
  crossentropy_forward,
  crossentropy_fused_backward,
};
constexpr int kKernelOps = static_cast<int>(KernelOp::crossentropy_fused_backward) + 1;

// gemm: the linears (work in FLOPs); attention (FLOPs); memory: everything else (bytes).
enum class KernelClass { gemm, attention, memory };

const char* kernel_op_name(KernelOp op);            // "linear_forward", the table's method name
KernelOp kernel_op_parse(const std::string& name);  // throws naming the known ones
KernelClass kernel_op_class(KernelOp op);
// The names of a kernel's size arguments, in KernelCall::shape order:
//   zero: bytes; embedding_*: B, T, C, V, positions; layernorm_*: N, C, bias; rmsnorm_*: N, C;
//   linear_forward: N, in, out, bias; linear_gelu_forward: N, in, out, bias, erf;
//   linear_residual_forward: N, in, out, bias, residual; linear_backward: N, in, out, bias,
//   dx_accumulate; gelu_backward: n, erf; swiglu_*: N, F; rope_*: B, T, H, D, rotary,
//   row_stride; attention_*: B, T, Hq, Hkv, D; add: n; crossentropy_*: N, V, Vp.
// Flags (bias, positions, erf, residual, dx_accumulate) are 0 or 1.
const std::vector<const char*>& kernel_shape_names(KernelOp op);

struct KernelCall {
  KernelOp op = KernelOp::zero;
  std::vector<int64_t> shape;
  bool operator==(const KernelCall& o) const { return op == o.op && shape == o.shape; }
  bool operator<(const KernelCall& o) const { return op != o.op ? op < o.op : shape < o.shape; }
};

// "linear_forward N=8192 in=768 out=2304 bias=1".
std::string kernel_call_text(const KernelCall& c);
// FLOPs of a gemm or attention call: 2·N·in·out forward, 4·N·in·out for linear_backward (dx
// and dw); attention 4·B·Hq·T²·D forward and twice that backward (no causal halving, as the
// planner counts attention).
double kernel_call_flops(const KernelCall& c);
// Nominal bytes a call moves, elements of `compute_bytes` (fp32 statistics and gradients of
// 4): for a memory kernel its reads and writes; for a linear its operands and result; for
// attention q, k, v and the output (and their gradients).
double kernel_call_bytes(const KernelCall& c, size_t compute_bytes);
// The call's work for interpolation: FLOPs (gemm, attention) or bytes (memory).
double kernel_call_work(const KernelCall& c, size_t compute_bytes);

// What a recording of the composition assumes of the device: the compute element size and
// what attention saves (which only changes workspace offsets and zero sizes).
struct KernelTraits {
  size_t compute_bytes = 4;
  AttentionSaves attention = AttentionSaves::probabilities;
};
// The planner's assumption for hardware of this kind: bf16 (2 bytes) on a GPU with a flash
// attention for head sizes 32, 64 and 128; fp32 with saved probabilities on a CPU.
KernelTraits kernel_traits_for(bool gpu, size_t compute_bytes, int head_dim);

// [Kernel calls] The calls of unit u's forward (backward = false) or backward at a (B, T)
// micro-batch, in issue order; a backward includes what `recompute` runs again first, and
// the clears of the gradient buffers it starts (unit_backward's `fresh`: [Fresh gradients]).
std::vector<KernelCall> unit_kernel_calls(const ModelLayout& model, int u, bool backward, int B,
                                          int T, const KernelTraits& traits,
                                          Recompute recompute = Recompute::none, int loss_chunk = 0,
                                          const std::vector<bool>& fresh = {});
// Every distinct call of one micro-step of training the model (all units, both directions;
// each backward both starting every gradient buffer it writes and adding into them).
std::vector<KernelCall> model_kernel_calls(const ModelLayout& model, int B, int T,
                                           const KernelTraits& traits);

struct KernelEntry {
  KernelCall call;
  double ms = 0;  // per call, issued back to back
};

// The probe's tables.
struct KernelRates {
  std::string device;        // "cpu" or "cuda"
  size_t compute_bytes = 4;  // the element size the kernels ran at
  double launch_us = 0;      // a tiny kernel's time per call, issued back to back
  std::string model;         // the model whose shapes were measured ("" for the default grid)
  int batch = 0, seq = 0;
  std::vector<KernelEntry> entries;
  // The optimizer's AdamW over fp32 shards, counted as the planner counts it (28 bytes per
  // element: p, g, m, v read, p, m, v written); 0: not measured (the copy bandwidth). Measured
  // on CPUs, whose AdamW is bound by its arithmetic rather than by memory.
  double optimizer_GBps = 0;
  int64_t optimizer_elements = 0;  // the size it was measured at (and the gradient norm's)
  // The gradient norm's sum of squares over fp32 gradient shards (4 bytes read per element);
  // 0: not measured (the copy bandwidth). Measured on CPUs, whose sum in double, serial for
  // bit-reproducibility, is bound by its additions' latency rather than by memory.
  double grad_norm_GBps = 0;
  // The flash backward's form the attention backward ran in (TANDEM_FLASH_BACKWARD at the
  // probe): its rate holds for runs that use the same form.
  FlashBackward flash_backward = FlashBackward::automatic;

  enum class Fit { measured, interpolated, none };
  // [Kernel estimate] The call's time in *ms, and how it was found (none: *ms untouched).
  Fit estimate(const KernelCall& call, double* ms) const;
};

// "" when a training run with the flash backward `run` takes the form k was measured with (or k
// is a CPU's, which has none); else a sentence saying that its attention backward is priced by
// the other form's time.
std::string kernel_rates_form_mismatch(const KernelRates& k, FlashBackward run);

// {"dtype", "launch_us", "flash_backward", "model": {"name", "batch", "seq"} | null, "gemm": [...],
// "attention": [...], "memory": [...], "optimizer": {"elements", "GBps"} | null}: each entry
// {"kernel", "shape": {name: value}, "ms"} plus its rate ("tflops" or "bytes" and "GBps"),
// which a reader ignores.
nlohmann::json kernel_rates_to_json(const KernelRates& r);
// Reads the object kernel_rates_to_json writes; `device` is the compute file's device.
KernelRates kernel_rates_from_json(const nlohmann::json& j, const std::string& device);

}  // namespace tandem
