// Per-kernel rates: the recording of the composition's calls, the tables' JSON and the
// estimate of a call from them ([Kernel calls], [Kernel estimate] in kernel_rates.h).
#include "plan/kernel_rates.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "core/error.h"
#include "model/activations.h"
#include "model/compose.h"

namespace tandem {

namespace {

struct OpInfo {
  KernelOp op;
  const char* name;
  KernelClass cls;
  std::vector<const char*> shape;
};

const std::vector<OpInfo>& ops() {
  static const std::vector<OpInfo> table = {
      {KernelOp::zero, "zero", KernelClass::memory, {"bytes"}},
      {KernelOp::embedding_forward,
       "embedding_forward",
       KernelClass::memory,
       {"B", "T", "C", "V", "positions"}},
      {KernelOp::embedding_backward,
       "embedding_backward",
       KernelClass::memory,
       {"B", "T", "C", "V", "positions"}},
      {KernelOp::layernorm_forward, "layernorm_forward", KernelClass::memory, {"N", "C", "bias"}},
      {KernelOp::layernorm_backward, "layernorm_backward", KernelClass::memory, {"N", "C", "bias"}},
      {KernelOp::rmsnorm_forward, "rmsnorm_forward", KernelClass::memory, {"N", "C"}},
      {KernelOp::rmsnorm_backward, "rmsnorm_backward", KernelClass::memory, {"N", "C"}},
      {KernelOp::linear_forward, "linear_forward", KernelClass::gemm, {"N", "in", "out", "bias"}},
      {KernelOp::linear_gelu_forward,
       "linear_gelu_forward",
       KernelClass::gemm,
       {"N", "in", "out", "bias", "erf"}},
      {KernelOp::linear_residual_forward,
       "linear_residual_forward",
       KernelClass::gemm,
       {"N", "in", "out", "bias", "residual"}},
      {KernelOp::linear_backward,
       "linear_backward",
       KernelClass::gemm,
       {"N", "in", "out", "bias", "dx_accumulate"}},
      {KernelOp::gelu_backward, "gelu_backward", KernelClass::memory, {"n", "erf"}},
      {KernelOp::swiglu_forward, "swiglu_forward", KernelClass::memory, {"N", "F"}},
      {KernelOp::swiglu_backward, "swiglu_backward", KernelClass::memory, {"N", "F"}},
      {KernelOp::rope_forward,
       "rope_forward",
       KernelClass::memory,
       {"B", "T", "H", "D", "rotary", "row_stride"}},
      {KernelOp::rope_backward,
       "rope_backward",
       KernelClass::memory,
       {"B", "T", "H", "D", "rotary", "row_stride"}},
      {KernelOp::attention_forward,
       "attention_forward",
       KernelClass::attention,
       {"B", "T", "Hq", "Hkv", "D"}},
      {KernelOp::attention_backward,
       "attention_backward",
       KernelClass::attention,
       {"B", "T", "Hq", "Hkv", "D"}},
      {KernelOp::add, "add", KernelClass::memory, {"n"}},
      {KernelOp::crossentropy_forward,
       "crossentropy_forward",
       KernelClass::memory,
       {"N", "V", "Vp"}},
      {KernelOp::crossentropy_fused_backward,
       "crossentropy_fused_backward",
       KernelClass::memory,
       {"N", "V", "Vp"}},
  };
  return table;
}

const OpInfo& info(KernelOp op) {
  return ops().at(static_cast<size_t>(op));
}

double d(int64_t v) {
  return static_cast<double>(v);
}

// [Kernel calls] A kernel table that records each training call's size arguments and runs
// nothing; the decoding kernels are never part of a training step.
class RecordingKernels final : public Kernels {
 public:
  explicit RecordingKernels(const KernelTraits& t) : traits_(t) {}
  std::vector<KernelCall> calls;

  DType compute_dtype() const override {
    return traits_.compute_bytes == 2 ? DType::bf16 : DType::f32;
  }
  AttentionSaves attention_saves(int) const override { return traits_.attention; }
  size_t scratch_bytes(const KernelShape&) const override { return 0; }
  void set_scratch(void*, size_t) override {}

  void zero(void*, size_t bytes) override { rec(KernelOp::zero, {static_cast<int64_t>(bytes)}); }
  void embedding_forward(void*, const int32_t*, const void*, const void* wpe, int B, int T, int C,
                         int V) override {
    rec(KernelOp::embedding_forward, {B, T, C, V, wpe != nullptr});
  }
  void embedding_backward(float*, float* dwpe, const void*, const int32_t*, int B, int T, int C,
                          int V) override {
    rec(KernelOp::embedding_backward, {B, T, C, V, dwpe != nullptr});
  }
  void layernorm_forward(void*, float*, float*, const void*, const void*, const void* b, int N,
                         int C, float) override {
    rec(KernelOp::layernorm_forward, {N, C, b != nullptr});
  }
  void layernorm_backward(void*, float*, float* db, const void*, const void*, const void*,
                          const float*, const float*, int N, int C, GradMode) override {
    rec(KernelOp::layernorm_backward, {N, C, db != nullptr});
  }
  void rmsnorm_forward(void*, float*, const void*, const void*, int N, int C, float) override {
    rec(KernelOp::rmsnorm_forward, {N, C});
  }
  void rmsnorm_backward(void*, float*, const void*, const void*, const void*, const float*, int N,
                        int C, GradMode) override {
    rec(KernelOp::rmsnorm_backward, {N, C});
  }
  void linear_forward(void*, const void*, const void*, const void* bias, int N, int IC,
                      int OC) override {
    rec(KernelOp::linear_forward, {N, IC, OC, bias != nullptr});
  }
  void linear_gelu_forward(void*, void*, const void*, const void*, const void* bias, int N, int IC,
                           int OC, GeluKind kind) override {
    rec(KernelOp::linear_gelu_forward, {N, IC, OC, bias != nullptr, kind == GeluKind::erf});
  }
  void linear_backward(void*, float*, float* dbias, const void*, const void*, const void*, int N,
                       int IC, int OC, bool dx_accumulate, GradMode) override {
    rec(KernelOp::linear_backward, {N, IC, OC, dbias != nullptr, dx_accumulate});
  }
  void gelu_backward(void*, const void*, const void*, int64_t n, GeluKind kind) override {
    rec(KernelOp::gelu_backward, {n, kind == GeluKind::erf});
  }
  // linear_gelu_backward keeps the table's default and is priced as its two parts, the
  // product and the GELU gradient pass (which the CUDA table folds into the product's
  // epilogue where cuBLASLt has it; the planner charges it anyway).
  void swiglu_forward(void*, const void*, int N, int F) override {
    rec(KernelOp::swiglu_forward, {N, F});
  }
  void swiglu_backward(void*, const void*, const void*, int N, int F) override {
    rec(KernelOp::swiglu_backward, {N, F});
  }
  void rope_forward(void*, int B, int T, int H, int D, int rotary_dim, int row_stride, float,
                    int) override {
    rec(KernelOp::rope_forward, {B, T, H, D, rotary_dim, row_stride});
  }
  void rope_backward(void*, int B, int T, int H, int D, int rotary_dim, int row_stride, float,
                     int) override {
    rec(KernelOp::rope_backward, {B, T, H, D, rotary_dim, row_stride});
  }
  void attention_forward(void*, void*, const void*, int B, int T, int Hq, int Hkv, int D) override {
    rec(KernelOp::attention_forward, {B, T, Hq, Hkv, D});
  }
  void attention_backward(void*, const void*, const void*, const void*, const void*, int B, int T,
                          int Hq, int Hkv, int D) override {
    rec(KernelOp::attention_backward, {B, T, Hq, Hkv, D});
  }
  void add(void*, const void*, const void*, int64_t n) override { rec(KernelOp::add, {n}); }
  void crossentropy_fused_backward(void*, float*, const int32_t*, int N, int V, int Vp,
                                   float) override {
    rec(KernelOp::crossentropy_fused_backward, {N, V, Vp});
  }
  void crossentropy_forward(float*, const void*, const int32_t*, int N, int V, int Vp) override {
    rec(KernelOp::crossentropy_forward, {N, V, Vp});
  }
  void linear_residual_forward(void*, const void*, const void*, const void* bias,
                               const void* residual, int N, int IC, int OC) override {
    rec(KernelOp::linear_residual_forward, {N, IC, OC, bias != nullptr, residual != nullptr});
  }

  void norm_linear_forward(void*, const void*, const void*, const void*, bool, float, const void*,
                           const void*, int, int, int) override {
    decoding();
  }
  void swiglu_linear_residual_forward(void*, const void*, const void*, const void*, const void*,
                                      int, int, int) override {
    decoding();
  }
  void embedding_at(void*, const int32_t*, const int32_t*, const void*, const void*, int, int,
                    int) override {
    decoding();
  }
  void rope_kv_append(void*, void*, void*, const int32_t*, const int32_t*, int, int, int, int, int,
                      float, int) override {
    decoding();
  }
  void attention_decode(void*, const void*, const void*, const void*, const int32_t*,
                        const int32_t*, int, int, int, int, int) override {
    decoding();
  }
  void copy_rows(void*, const void*, int, int, int64_t) override { decoding(); }
  void advance_positions(int32_t*, int) override { decoding(); }
  void sample_tokens(int32_t*, const void*, const int32_t*, int, int, int,
                     const SamplingParams&) override {
    decoding();
  }
  void sample_candidates(float*, int32_t*, const void*, const int32_t*, int, int, int, int,
                         const SamplingParams&) override {
    decoding();
  }
  void sample_pick(int32_t*, const float*, const int32_t*, const int32_t*, int, int, int,
                   const SamplingParams&) override {
    decoding();
  }
  int sample_pick_max_candidates() const override { return 0; }

 private:
  void rec(KernelOp op, std::vector<int64_t> shape) { calls.push_back({op, std::move(shape)}); }
  [[noreturn]] static void decoding() {
    TD_THROW("a training step's units called a decoding kernel; the planner records training only");
  }
  KernelTraits traits_;
};

// Address space that is reserved and never touched: the recording's workspace and
// parameters, whose pointers the composition only offsets.
class Reserved {
 public:
  explicit Reserved(size_t bytes) : bytes_(std::max<size_t>(bytes, 4096)) {
    p_ = mmap(nullptr, bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    TD_CHECK(p_ != MAP_FAILED, "could not reserve {} bytes of address space for a recording",
             bytes_);
  }
  ~Reserved() { munmap(p_, bytes_); }
  Reserved(const Reserved&) = delete;
  Reserved& operator=(const Reserved&) = delete;
  char* get() const { return static_cast<char*>(p_); }

 private:
  size_t bytes_;
  void* p_;
};

}  // namespace

const char* kernel_op_name(KernelOp op) {
  return info(op).name;
}

KernelOp kernel_op_parse(const std::string& name) {
  std::string known;
  for (const OpInfo& i : ops()) {
    if (name == i.name) return i.op;
    known += (known.empty() ? "" : ", ") + std::string(i.name);
  }
  TD_THROW("unknown kernel '{}' (known: {})", name, known);
}

KernelClass kernel_op_class(KernelOp op) {
  return info(op).cls;
}

const std::vector<const char*>& kernel_shape_names(KernelOp op) {
  return info(op).shape;
}

std::string kernel_call_text(const KernelCall& c) {
  std::string s = kernel_op_name(c.op);
  const auto& names = kernel_shape_names(c.op);
  for (size_t i = 0; i < c.shape.size() && i < names.size(); ++i)
    s += fmt::format(" {}={}", names[i], c.shape[i]);
  return s;
}

double kernel_call_flops(const KernelCall& c) {
  const auto& s = c.shape;
  switch (c.op) {
    case KernelOp::linear_forward:
    case KernelOp::linear_gelu_forward:
    case KernelOp::linear_residual_forward:
      return 2 * d(s[0]) * d(s[1]) * d(s[2]);
    case KernelOp::linear_backward:
      return 4 * d(s[0]) * d(s[1]) * d(s[2]);
    case KernelOp::attention_forward:
      return 4 * d(s[0]) * d(s[2]) * d(s[1]) * d(s[1]) * d(s[4]);
    case KernelOp::attention_backward:
      return 8 * d(s[0]) * d(s[2]) * d(s[1]) * d(s[1]) * d(s[4]);
    default:
      return 0;
  }
}

double kernel_call_bytes(const KernelCall& c, size_t compute_bytes) {
  const double e = static_cast<double>(compute_bytes), f = 4;
  const auto& s = c.shape;
  switch (c.op) {
    case KernelOp::zero:
      return d(s[0]);
    case KernelOp::embedding_forward:  // token (and position) rows read, the sum written
      return d(s[0]) * d(s[1]) * d(s[2]) * e * (2 + d(s[4]));
    case KernelOp::embedding_backward:  // d(out) read, fp32 gradient rows read and written
      return d(s[0]) * d(s[1]) * d(s[2]) * (e + 2 * f * (1 + d(s[4])));
    case KernelOp::layernorm_forward:
    case KernelOp::rmsnorm_forward:
      return 2 * d(s[0]) * d(s[1]) * e;
    case KernelOp::layernorm_backward:
    case KernelOp::rmsnorm_backward:  // d(out), x read; dx read and written
      return 4 * d(s[0]) * d(s[1]) * e;
    case KernelOp::linear_forward:
    case KernelOp::linear_gelu_forward:
    case KernelOp::linear_residual_forward:
      return (d(s[0]) * d(s[1]) + d(s[1]) * d(s[2]) + d(s[0]) * d(s[2])) * e;
    case KernelOp::linear_backward:  // d(out), x, w read; dx written; dw (fp32) updated
      return (2 * d(s[0]) * d(s[2]) + d(s[0]) * d(s[1]) + d(s[1]) * d(s[2])) * e +
             d(s[0]) * d(s[1]) * e + 2 * f * d(s[1]) * d(s[2]);
    case KernelOp::gelu_backward:  // d(out), x read; dx written
      return 3 * d(s[0]) * e;
    case KernelOp::swiglu_forward:
      return 3 * d(s[0]) * d(s[1]) * e;
    case KernelOp::swiglu_backward:  // h [N, 2F], d(out) [N, F] read; dh [N, 2F] written
      return 5 * d(s[0]) * d(s[1]) * e;
    case KernelOp::rope_forward:
    case KernelOp::rope_backward:
      return 2 * d(s[0]) * d(s[1]) * d(s[2]) * d(s[4]) * e;
    case KernelOp::attention_forward:  // q, k, v read, the output written
    case KernelOp::attention_backward:
      return (c.op == KernelOp::attention_backward ? 2 : 1) * d(s[0]) * d(s[1]) *
             (2 * d(s[2]) + 2 * d(s[3])) * d(s[4]) * e;
    case KernelOp::add:
      return 3 * d(s[0]) * e;
    case KernelOp::crossentropy_forward:
      return d(s[0]) * d(s[2]) * e;
    case KernelOp::crossentropy_fused_backward:
      return 2 * d(s[0]) * d(s[2]) * e;
  }
  return 0;
}

double kernel_call_work(const KernelCall& c, size_t compute_bytes) {
  return kernel_op_class(c.op) == KernelClass::memory ? kernel_call_bytes(c, compute_bytes)
                                                      : kernel_call_flops(c);
}

KernelTraits kernel_traits_for(bool gpu, size_t compute_bytes, int head_dim) {
  KernelTraits t;
  t.compute_bytes = compute_bytes;
  t.attention = gpu && (head_dim == 32 || head_dim == 64 || head_dim == 128)
                    ? AttentionSaves::logsumexp
                    : AttentionSaves::probabilities;
  return t;
}

std::vector<KernelCall> unit_kernel_calls(const ModelLayout& model, int u, bool backward, int B,
                                          int T, const KernelTraits& traits, Recompute recompute,
                                          int loss_chunk, const std::vector<bool>& fresh) {
  const ModelConfig& c = model.config();
  RecordingKernels k(traits);
  ActivationTraits at;
  at.use = WorkspaceUse::train;
  at.recompute = recompute;
  at.loss_chunk = loss_chunk;
  at.compute_bytes = traits.compute_bytes;
  at.attention = traits.attention;
  const size_t act = activation_bytes(c, B, T, at);
  int64_t largest = 0;
  for (const UnitLayout& unit : model.units()) largest = std::max(largest, unit.numel);
  const size_t params = static_cast<size_t>(largest) * 4;
  Reserved space(act + params + 4096);
  Workspace ws(c, B, T, at, space.get());
  const size_t n = static_cast<size_t>(model.num_units());
  UnitParams p(n, space.get() + act);
  UnitGrads g(n, reinterpret_cast<float*>(space.get() + act));
  if (backward)
    unit_backward(k, model, u, p, g, ws, 1.0f, fresh);
  else
    unit_forward(k, model, u, p, ws);
  return std::move(k.calls);
}

std::vector<KernelCall> model_kernel_calls(const ModelLayout& model, int B, int T,
                                           const KernelTraits& traits) {
  std::set<KernelCall> all;
  const std::vector<bool> every(static_cast<size_t>(model.num_units()), true);
  for (int u = 0; u < model.num_units(); ++u) {
    for (bool backward : {false, true})
      for (KernelCall& c : unit_kernel_calls(model, u, backward, B, T, traits))
        all.insert(std::move(c));
    // The clears of a backward that starts its gradient buffers ([Fresh gradients]).
    for (KernelCall& c : unit_kernel_calls(model, u, true, B, T, traits, Recompute::none, 0, every))
      all.insert(std::move(c));
  }
  return {all.begin(), all.end()};
}

KernelRates::Fit KernelRates::estimate(const KernelCall& call, double* ms) const {
  const double launch = launch_us * 1e-3;
  for (const KernelEntry& e : entries)
    if (e.call == call) {
      *ms = e.ms;
      return Fit::measured;
    }
  // The same kernel's shapes; attention keeps to its own head size where it has one.
  auto same = [&](const KernelEntry& e) { return e.call.op == call.op; };
  bool same_d = false;
  if (kernel_op_class(call.op) == KernelClass::attention)
    for (const KernelEntry& e : entries)
      same_d = same_d || (same(e) && e.call.shape[4] == call.shape[4]);
  std::map<double, std::pair<double, int>> points;  // work -> (sum of ms, count)
  for (const KernelEntry& e : entries) {
    if (!same(e) || (same_d && e.call.shape[4] != call.shape[4])) continue;
    const double w = kernel_call_work(e.call, compute_bytes);
    if (!(w > 0) || !(e.ms > 0)) continue;
    auto& [sum, count] = points[w];
    sum += e.ms;
    ++count;
  }
  if (points.empty()) return Fit::none;
  const double w = kernel_call_work(call, compute_bytes);
  auto at = [](const auto& it) { return it->second.first / it->second.second; };
  double t = 0;
  const auto hi = points.lower_bound(w);
  if (hi == points.end()) {
    const auto last = std::prev(points.end());
    t = at(last) * w / last->first;  // above the largest: at its rate
  } else if (hi == points.begin()) {
    const double t0 = at(hi);  // below the smallest: from one launch up to it
    t = t0 > launch ? launch + (t0 - launch) * w / hi->first : t0;
  } else {
    const auto lo = std::prev(hi);
    const double f = (w - lo->first) / (hi->first - lo->first);
    t = at(lo) + f * (at(hi) - at(lo));
  }
  *ms = std::max(t, launch);
  return Fit::interpolated;
}

nlohmann::json kernel_rates_to_json(const KernelRates& r) {
  nlohmann::json gemm = nlohmann::json::array(), attention = nlohmann::json::array(),
                 memory = nlohmann::json::array();
  for (const KernelEntry& e : r.entries) {
    nlohmann::json shape = nlohmann::json::object();
    const auto& names = kernel_shape_names(e.call.op);
    for (size_t i = 0; i < names.size() && i < e.call.shape.size(); ++i)
      shape[names[i]] = e.call.shape[i];
    nlohmann::json j = {{"kernel", kernel_op_name(e.call.op)}, {"shape", shape}, {"ms", e.ms}};
    const double s = e.ms * 1e-3;
    switch (kernel_op_class(e.call.op)) {
      case KernelClass::gemm:
        j["tflops"] = s > 0 ? kernel_call_flops(e.call) / s / 1e12 : 0;
        gemm.push_back(j);
        break;
      case KernelClass::attention:
        j["tflops"] = s > 0 ? kernel_call_flops(e.call) / s / 1e12 : 0;
        attention.push_back(j);
        break;
      case KernelClass::memory: {
        const double bytes = kernel_call_bytes(e.call, r.compute_bytes);
        j["bytes"] = bytes;
        j["GBps"] = s > 0 ? bytes / s / 1e9 : 0;
        memory.push_back(j);
        break;
      }
    }
  }
  nlohmann::json model = nullptr;
  if (!r.model.empty()) model = {{"name", r.model}, {"batch", r.batch}, {"seq", r.seq}};
  nlohmann::json optimizer = nullptr, grad_norm = nullptr;
  if (r.optimizer_GBps > 0)
    optimizer = {{"elements", r.optimizer_elements}, {"GBps", r.optimizer_GBps}};
  if (r.grad_norm_GBps > 0)
    grad_norm = {{"elements", r.optimizer_elements}, {"GBps", r.grad_norm_GBps}};
  return {{"dtype", r.compute_bytes == 2 ? "bf16" : "fp32"},
          {"launch_us", r.launch_us},
          {"flash_backward", flash_backward_name(r.flash_backward)},
          {"model", model},
          {"gemm", gemm},
          {"attention", attention},
          {"memory", memory},
          {"optimizer", optimizer},
          {"grad_norm", grad_norm}};
}

std::string kernel_rates_form_mismatch(const KernelRates& k, FlashBackward run) {
  // Only CUDA tables have a flash backward; a CPU's attention ignores the setting.
  if (k.device != "cuda" || flash_backward_same_form(k.flash_backward, run)) return "";
  return fmt::format(
      "the kernel tables were measured with the flash backward {} and this training run "
      "takes {} (TANDEM_FLASH_BACKWARD), so its attention backward is priced by the other "
      "form's time; probe again with the same setting",
      flash_backward_name(k.flash_backward), flash_backward_name(run));
}

KernelRates kernel_rates_from_json(const nlohmann::json& j, const std::string& device) {
  const char* what = "compute probe file: 'kernels'";
  TD_CHECK(j.is_object(), "{} must be an object", what);
  KernelRates r;
  r.device = device;
  if (j.contains("dtype")) {
    TD_CHECK(j.at("dtype").is_string(), "{}: 'dtype' must be \"bf16\" or \"fp32\"", what);
    const std::string dt = j.at("dtype").get<std::string>();
    TD_CHECK(dt == "bf16" || dt == "fp32", "{}: 'dtype' must be \"bf16\" or \"fp32\", got '{}'",
             what, dt);
    r.compute_bytes = dt == "bf16" ? 2 : 4;
  } else {
    r.compute_bytes = device == "cuda" ? 2 : 4;
  }
  if (j.contains("launch_us")) {
    TD_CHECK(j.at("launch_us").is_number() && j.at("launch_us").get<double>() >= 0 &&
                 std::isfinite(j.at("launch_us").get<double>()),
             "{}: 'launch_us' must be a number of at least 0", what);
    r.launch_us = j.at("launch_us").get<double>();
  }
  if (j.contains("flash_backward")) {
    const nlohmann::json& f = j.at("flash_backward");
    const std::optional<FlashBackward> passes =
        f.is_string() ? flash_backward_parse(f.get<std::string>()) : std::nullopt;
    TD_CHECK(passes.has_value(),
             "{}: 'flash_backward' must be \"automatic\", \"one-pass\" or \"two-pass\", got {}",
             what, f.dump());
    r.flash_backward = *passes;
  }
  if (j.contains("model") && j.at("model").is_object()) {
    const nlohmann::json& m = j.at("model");
    TD_CHECK((!m.contains("name") || m.at("name").is_string()) &&
                 (!m.contains("batch") || m.at("batch").is_number_integer()) &&
                 (!m.contains("seq") || m.at("seq").is_number_integer()),
             "{}: 'model' must be {{\"name\": text, \"batch\", \"seq\": integers}}, got {}", what,
             m.dump());
    r.model = m.value("name", "");
    r.batch = m.value("batch", 0);
    r.seq = m.value("seq", 0);
  }
  // {"elements", "GBps"} with a positive rate, or null / absent (files written before it).
  auto rate = [&](const char* key) {
    if (!j.contains(key) || j.at(key).is_null()) return 0.0;
    const nlohmann::json& o = j.at(key);
    TD_CHECK(o.is_object() && o.contains("GBps") && o.at("GBps").is_number() &&
                 o.at("GBps").get<double>() > 0 && std::isfinite(o.at("GBps").get<double>()) &&
                 (!o.contains("elements") ||
                  (o.at("elements").is_number_integer() && o.at("elements").get<int64_t>() >= 0)),
             "{}: '{}' must be null or {{\"elements\", \"GBps\"}} with a positive rate and a "
             "count, got {}",
             what, key, o.dump());
    r.optimizer_elements = o.value("elements", int64_t{0});
    return o.at("GBps").get<double>();
  };
  r.optimizer_GBps = rate("optimizer");
  r.grad_norm_GBps = rate("grad_norm");
  for (const char* list : {"gemm", "attention", "memory"}) {
    if (!j.contains(list)) continue;
    TD_CHECK(j.at(list).is_array(), "{}: '{}' must be a list", what, list);
    for (const nlohmann::json& e : j.at(list)) {
      TD_CHECK(e.is_object() && e.contains("kernel") && e.at("kernel").is_string() &&
                   e.contains("shape") && e.at("shape").is_object() && e.contains("ms") &&
                   e.at("ms").is_number(),
               "{}: each entry of '{}' needs \"kernel\", \"shape\" and \"ms\", got {}", what, list,
               e.dump());
      KernelEntry k;
      k.call.op = kernel_op_parse(e.at("kernel").get<std::string>());
      for (const char* name : kernel_shape_names(k.call.op)) {
        const nlohmann::json& s = e.at("shape");
        TD_CHECK(s.contains(name) && s.at(name).is_number_integer(),
                 "{}: {} needs an integer shape entry '{}', got {}", what,
                 kernel_op_name(k.call.op), name, s.dump());
        k.call.shape.push_back(s.at(name).get<int64_t>());
      }
      k.ms = e.at("ms").get<double>();
      TD_CHECK(std::isfinite(k.ms) && k.ms > 0, "{}: {} must take a positive time, got {}", what,
               kernel_call_text(k.call), k.ms);
      r.entries.push_back(std::move(k));
    }
  }
  return r;
}

}  // namespace tandem
