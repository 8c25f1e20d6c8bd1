// The compute probe: GEMMs at a few sizes and one large device copy, timed with events on
// one stream ([Compute measurement] in probe_compute.h).
#include "plan/probe_compute.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>

#include "core/dtype.h"
#include "core/error.h"
#include "device/cpu/kernels.h"
#include "model/activations.h"

namespace tandem {

namespace {

// One call's operands, carved in order from two regions: compute and fp32 tensors (filled
// with values spread like activations: [Operand values]) and int32 token ids. Without bases
// it only counts.
class Operands {
 public:
  Operands(char* data, char* ids) : data_(data), ids_(ids) {}
  void* data(int64_t bytes) { return take(data_, data_used_, bytes); }
  float* f32(int64_t n) { return static_cast<float*>(data(n * 4)); }
  int32_t* ids(int64_t n) { return static_cast<int32_t*>(take(ids_, ids_used_, n * 4)); }
  size_t data_used() const { return data_used_; }
  size_t ids_used() const { return ids_used_; }

 private:
  static void* take(char* base, size_t& used, int64_t bytes) {
    TD_CHECK(bytes >= 0, "a negative operand size");
    void* p = base == nullptr ? nullptr : base + used;
    used += (static_cast<size_t>(bytes) + 255) / 256 * 256;
    return p;
  }
  char *data_, *ids_;
  size_t data_used_ = 0, ids_used_ = 0;
};

// Runs one call on k with operands from o; with k null only carves (to size the regions).
void run_call(Kernels* k, const KernelCall& c, Operands& o) {
  const int64_t e = k == nullptr ? 4 : static_cast<int64_t>(k->compute_bytes());
  const auto& s = c.shape;
  auto i = [&](size_t at) { return static_cast<int>(s.at(at)); };
  switch (c.op) {
    case KernelOp::zero: {
      void* p = o.data(s[0]);
      if (k) k->zero(p, static_cast<size_t>(s[0]));
      return;
    }
    case KernelOp::embedding_forward: {
      const int64_t N = s[0] * s[1];
      void* out = o.data(N * s[2] * e);
      int32_t* tokens = o.ids(N);
      void* wte = o.data(s[3] * s[2] * e);
      void* wpe = s[4] ? o.data(s[1] * s[2] * e) : nullptr;
      if (k) k->embedding_forward(out, tokens, wte, wpe, i(0), i(1), i(2), i(3));
      return;
    }
    case KernelOp::embedding_backward: {
      const int64_t N = s[0] * s[1];
      float* dwte = o.f32(s[3] * s[2]);
      float* dwpe = s[4] ? o.f32(s[1] * s[2]) : nullptr;
      void* dout = o.data(N * s[2] * e);
      int32_t* tokens = o.ids(N);
      if (k) k->embedding_backward(dwte, dwpe, dout, tokens, i(0), i(1), i(2), i(3));
      return;
    }
    case KernelOp::layernorm_forward:
    case KernelOp::rmsnorm_forward: {
      const int64_t N = s[0], C = s[1];
      void* out = o.data(N * C * e);
      float* mean = o.f32(N);
      float* rstd = o.f32(N);
      void* x = o.data(N * C * e);
      void* w = o.data(C * e);
      if (c.op == KernelOp::rmsnorm_forward) {
        if (k) k->rmsnorm_forward(out, rstd, x, w, i(0), i(1), 1e-5f);
        return;
      }
      void* b = s[2] ? o.data(C * e) : nullptr;
      if (k) k->layernorm_forward(out, mean, rstd, x, w, b, i(0), i(1), 1e-5f);
      return;
    }
    case KernelOp::layernorm_backward:
    case KernelOp::rmsnorm_backward: {
      const int64_t N = s[0], C = s[1];
      void* dx = o.data(N * C * e);
      float* dw = o.f32(C);
      void* dout = o.data(N * C * e);
      void* x = o.data(N * C * e);
      void* w = o.data(C * e);
      float* mean = o.f32(N);
      float* rstd = o.f32(N);
      if (c.op == KernelOp::rmsnorm_backward) {
        if (k) k->rmsnorm_backward(dx, dw, dout, x, w, rstd, i(0), i(1));
        return;
      }
      float* db = s[2] ? o.f32(C) : nullptr;
      if (k) k->layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, i(0), i(1));
      return;
    }
    case KernelOp::linear_forward:
    case KernelOp::linear_gelu_forward:
    case KernelOp::linear_residual_forward: {
      const int64_t N = s[0], IC = s[1], OC = s[2];
      void* out = o.data(N * OC * e);
      void* x = o.data(N * IC * e);
      void* w = o.data(OC * IC * e);
      void* bias = s[3] ? o.data(OC * e) : nullptr;
      if (c.op == KernelOp::linear_forward) {
        if (k) k->linear_forward(out, x, w, bias, i(0), i(1), i(2));
      } else if (c.op == KernelOp::linear_gelu_forward) {
        void* pre = o.data(N * OC * e);
        if (k)
          k->linear_gelu_forward(out, pre, x, w, bias, i(0), i(1), i(2),
                                 s[4] ? GeluKind::erf : GeluKind::tanh);
      } else {
        void* residual = s[4] ? o.data(N * OC * e) : nullptr;
        if (k) k->linear_residual_forward(out, x, w, bias, residual, i(0), i(1), i(2));
      }
      return;
    }
    case KernelOp::linear_backward: {
      const int64_t N = s[0], IC = s[1], OC = s[2];
      void* dx = o.data(N * IC * e);
      float* dw = o.f32(OC * IC);
      float* dbias = s[3] ? o.f32(OC) : nullptr;
      void* dout = o.data(N * OC * e);
      void* x = o.data(N * IC * e);
      void* w = o.data(OC * IC * e);
      if (k) k->linear_backward(dx, dw, dbias, dout, x, w, i(0), i(1), i(2), s[4] != 0);
      return;
    }
    case KernelOp::gelu_backward: {
      void* dx = o.data(s[0] * e);
      void* dout = o.data(s[0] * e);
      void* x = o.data(s[0] * e);
      if (k) k->gelu_backward(dx, dout, x, s[0], s[1] ? GeluKind::erf : GeluKind::tanh);
      return;
    }
    case KernelOp::swiglu_forward: {
      void* out = o.data(s[0] * s[1] * e);
      void* h = o.data(2 * s[0] * s[1] * e);
      if (k) k->swiglu_forward(out, h, i(0), i(1));
      return;
    }
    case KernelOp::swiglu_backward: {
      void* dh = o.data(2 * s[0] * s[1] * e);
      void* dout = o.data(s[0] * s[1] * e);
      void* h = o.data(2 * s[0] * s[1] * e);
      if (k) k->swiglu_backward(dh, dout, h, i(0), i(1));
      return;
    }
    case KernelOp::rope_forward:
    case KernelOp::rope_backward: {
      void* x = o.data(s[0] * s[1] * s[5] * e);
      if (k && c.op == KernelOp::rope_forward)
        k->rope_forward(x, i(0), i(1), i(2), i(3), i(4), i(5), 10000.0f, 0);
      if (k && c.op == KernelOp::rope_backward)
        k->rope_backward(x, i(0), i(1), i(2), i(3), i(4), i(5), 10000.0f, 0);
      return;
    }
    case KernelOp::attention_forward:
    case KernelOp::attention_backward: {
      const int64_t B = s[0], T = s[1], Hq = s[2], Hkv = s[3], D = s[4];
      const bool lse = k != nullptr && k->attention_saves(i(4)) == AttentionSaves::logsumexp;
      // Sizing assumes probabilities: the larger of the two.
      const int64_t saved_bytes = lse ? B * Hq * T * 4 : B * Hq * T * T * std::max<int64_t>(e, 4);
      void* qkv = o.data(B * T * (Hq + 2 * Hkv) * D * e);
      void* out = o.data(B * T * Hq * D * e);
      void* saved = o.data(saved_bytes);
      if (c.op == KernelOp::attention_forward) {
        if (k) k->attention_forward(out, saved, qkv, i(0), i(1), i(2), i(3), i(4));
        return;
      }
      void* dqkv = o.data(B * T * (Hq + 2 * Hkv) * D * e);
      void* dout = o.data(B * T * Hq * D * e);
      if (k) k->attention_backward(dqkv, dout, qkv, out, saved, i(0), i(1), i(2), i(3), i(4));
      return;
    }
    case KernelOp::add: {
      void* out = o.data(s[0] * e);
      void* a = o.data(s[0] * e);
      void* b = o.data(s[0] * e);
      if (k) k->add(out, a, b, s[0]);
      return;
    }
    case KernelOp::crossentropy_forward:
    case KernelOp::crossentropy_fused_backward: {
      float* losses = o.f32(s[0]);
      void* logits = o.data(s[0] * s[2] * e);
      int32_t* targets = o.ids(s[0]);
      if (k && c.op == KernelOp::crossentropy_forward)
        k->crossentropy_forward(losses, logits, targets, i(0), i(1), i(2));
      if (k && c.op == KernelOp::crossentropy_fused_backward)
        k->crossentropy_fused_backward(logits, losses, targets, i(0), i(1), i(2),
                                       1.0f / static_cast<float>(s[0]));
      return;
    }
  }
}

// A KernelShape whose scratch covers one call (the table's scratch_bytes reads these fields).
KernelShape call_scratch_shape(const KernelCall& c) {
  KernelShape k;
  const auto& s = c.shape;
  auto i = [&](size_t at) { return static_cast<int>(s.at(at)); };
  switch (kernel_op_class(c.op)) {
    case KernelClass::attention:
      k.B = i(0);
      k.T = i(1);
      k.Hq = i(2);
      k.Hkv = i(3);
      k.D = i(4);
      k.C = k.A = k.Hq * k.D;
      k.Q = (k.Hq + 2 * k.Hkv) * k.D;
      return k;
    case KernelClass::gemm:
      k.T = i(0);
      k.C = k.Q = k.A = k.F = k.M = k.Vp = k.V = std::max(i(1), i(2));
      return k;
    case KernelClass::memory:
      break;
  }
  switch (c.op) {
    case KernelOp::embedding_forward:
    case KernelOp::embedding_backward:
      k.B = i(0);
      k.T = i(1);
      k.C = i(2);
      k.V = k.Vp = i(3);
      break;
    case KernelOp::layernorm_forward:
    case KernelOp::layernorm_backward:
    case KernelOp::rmsnorm_forward:
    case KernelOp::rmsnorm_backward:
    case KernelOp::swiglu_forward:
    case KernelOp::swiglu_backward:
      k.T = i(0);
      k.C = k.F = i(1);
      k.M = 2 * k.F;
      break;
    case KernelOp::crossentropy_forward:
    case KernelOp::crossentropy_fused_backward:
      k.T = i(0);
      k.V = i(1);
      k.Vp = i(2);
      break;
    default:
      break;
  }
  return k;
}

// [Operand values] Fills `bytes` of device memory at p through a bounded host chunk (repeated)
// whose 16-bit words are `words`. The CPU's kernels run at speeds that depend on the values
// (tanh and exp of a constant are several times faster than of activations), so operands are
// spread like activations and weights rather than constant.
void fill(Device& device, void* p, size_t bytes, const std::vector<uint16_t>& words) {
  for (size_t at = 0; at < bytes; at += words.size() * 2)
    device.copy_to_device(static_cast<char*>(p) + at, words.data(),
                          std::min(words.size() * 2, bytes - at));
}

// Words of bf16 values of magnitude 0.02..0.3 and random sign: read as bf16 they are those
// values, and two of them read as one fp32 (little-endian: the second is the high half) are
// a value of the same range, so one fill serves compute tensors of either dtype and the fp32
// statistics and gradients beside them. At these magnitudes a product over a width of
// hundreds to thousands lands where a layer's pre-activations do (order 1), so GELU's tanh
// and attention's exp take the paths they take in a step, not a saturated shortcut.
// `positive` leaves out the signs (AdamW's second moment is under a square root).
std::vector<uint16_t> value_words(size_t bytes, bool positive) {
  std::vector<uint16_t> w(std::max<size_t>(1, std::min(bytes, size_t{8} << 20) / 2));
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (uint16_t& v : w) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const float u = 0.02f + 0.28f * static_cast<float>(x >> 40) / static_cast<float>(1 << 24);
    v = bf16_from_f32(!positive && ((x >> 33) & 1) ? -u : u);
  }
  return w;
}

// Token ids below `vocab`, spread over it as a batch of text is.
std::vector<uint16_t> id_words(size_t bytes, int64_t vocab) {
  std::vector<uint16_t> w(std::max<size_t>(2, std::min(bytes, size_t{8} << 20) / 4 * 2));
  uint64_t x = 12345;
  for (size_t i = 0; i + 1 < w.size(); i += 2) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const auto id =
        static_cast<uint32_t>((x >> 33) % static_cast<uint64_t>(std::max<int64_t>(1, vocab)));
    w[i] = static_cast<uint16_t>(id & 0xffff);  // little-endian int32
    w[i + 1] = static_cast<uint16_t>(id >> 16);
  }
  return w;
}

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

KernelRates probe_kernels(Device& device, const KernelProbeOptions& o) {
  TD_CHECK(o.reps >= 1, "a kernel probe needs at least one timed batch per call");
  KernelRates r;
  r.device = probe_device_kind(device);
  r.model = o.model;
  r.batch = o.batch;
  r.seq = o.seq;
  r.flash_backward = o.flash_backward;
  const ScopedFlashBackward passes(o.flash_backward);
  const KernelCall launch{KernelOp::add, {1}};
  std::vector<KernelCall> calls = o.calls;
  calls.push_back(launch);
  // Operand regions for the largest call, and the table's scratch for every call.
  size_t data = 0, ids = 0;
  for (const KernelCall& c : calls) {
    Operands count(nullptr, nullptr);
    run_call(nullptr, c, count);
    data = std::max(data, count.data_used());
    ids = std::max(ids, count.ids_used());
  }
  DeviceBuffer data_mem(device, data), ids_mem(device, std::max<size_t>(ids, 256));
  // Token ids below the smallest vocabulary of the calls that read ids.
  int64_t vocab = 0;
  for (const KernelCall& c : calls) {
    const bool embedding =
        c.op == KernelOp::embedding_forward || c.op == KernelOp::embedding_backward;
    const bool loss =
        c.op == KernelOp::crossentropy_forward || c.op == KernelOp::crossentropy_fused_backward;
    if (embedding || loss) {
      const int64_t v = c.shape[embedding ? 3 : 1];
      vocab = vocab == 0 ? v : std::min(vocab, v);
    }
  }
  const size_t id_bytes = std::max<size_t>(ids, 256);
  const std::vector<uint16_t> values = value_words(data, false);  // [Operand values]
  fill(device, ids_mem.get(), id_bytes, id_words(id_bytes, vocab));
  std::unique_ptr<Stream> stream = device.stream_create("probe kernels");
  std::unique_ptr<Kernels> k = kernels_create(device, *stream, o.attention);
  r.compute_bytes = k->compute_bytes();
  size_t scratch = 0;
  for (const KernelShape& s : o.scratch_shapes) scratch = std::max(scratch, k->scratch_bytes(s));
  for (const KernelCall& c : calls)
    scratch = std::max(scratch, k->scratch_bytes(call_scratch_shape(c)));
  DeviceBuffer scratch_mem(device, std::max<size_t>(scratch, 256));
  k->set_scratch(scratch_mem.get(), scratch);

  auto e0 = device.event_create(true), e1 = device.event_create(true);
  // ms per call of n calls back to back.
  auto batch = [&](const KernelCall& c, int n) {
    device.event_record(*e0, *stream);
    device.submit(*stream, [&, n] {
      for (int j = 0; j < n; ++j) {
        Operands ops(data_mem.as<char>(), ids_mem.as<char>());
        run_call(k.get(), c, ops);
      }
    });
    device.event_record(*e1, *stream);
    device.stream_sync(*stream);
    return device.event_elapsed_ms(*e0, *e1) / n;
  };
  auto measure = [&](const KernelCall& c) {
    // Fresh operands: the calls before (zeros above all) leave values that would time
    // another path of a value-dependent kernel (tanh of 0 is ~8x faster than of activations).
    Operands count(nullptr, nullptr);
    run_call(nullptr, c, count);
    fill(device, data_mem.get(), count.data_used(), values);
    batch(c, 1);  // warm-up: first-use costs (GEMM heuristics, page faults)
    const double one = batch(c, 1);
    const int n =
        one > 0 ? static_cast<int>(std::clamp(std::ceil(o.target_ms / one), 1.0, 10000.0)) : 10000;
    std::vector<double> times;
    for (int rep = 0; rep < o.reps; ++rep) times.push_back(batch(c, n));
    // A time below the clock's resolution still counts as taking some (the tables' times
    // are positive).
    return std::max(probe_median(times), 1e-6);
  };
  r.launch_us = measure(launch) * 1e3;
  for (const KernelCall& c : o.calls) r.entries.push_back({c, measure(c)});
  if (device.kind() == DeviceKind::cpu && o.optimizer_elements > 0) {
    // p, g, m, v of fp32, in the data region's place (it is no longer needed).
    const int64_t n = o.optimizer_elements;
    DeviceBuffer state(device, static_cast<size_t>(n) * 16);
    fill(device, state.get(), static_cast<size_t>(n) * 16,
         value_words(static_cast<size_t>(n) * 16, true));
    float* base = state.as<float>();
    // The median ms of `work` on the stream, after one untimed run.
    auto median_ms = [&](const std::function<void()>& work) {
      std::vector<double> times;
      for (int rep = -1; rep < o.reps; ++rep) {
        device.event_record(*e0, *stream);
        device.submit(*stream, work);
        device.event_record(*e1, *stream);
        device.stream_sync(*stream);
        if (rep >= 0) times.push_back(device.event_elapsed_ms(*e0, *e1));
      }
      return probe_median(times);
    };
    r.optimizer_elements = n;
    r.optimizer_GBps = 28.0 * static_cast<double>(n) /
                       (median_ms([=] {
                          cpu::adamw_update(base, base + n, base + 2 * n, base + 3 * n, n, 1e-4f,
                                            0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f);
                        }) *
                        1e6);
    // The gradient norm's sum of squares over the same elements (the gradient's place).
    double sink = 0;
    r.grad_norm_GBps = 4.0 * static_cast<double>(n) /
                       (median_ms([=, &sink] { sink += cpu::sum_squares(base + n, n); }) * 1e6);
    TD_CHECK(std::isfinite(sink), "the probe's gradient norm is not finite");
  }
  device.stream_sync(*stream);
  return r;
}

KernelProbeOptions kernel_probe_for_model(const ModelConfig& model, int batch, int seq,
                                          DeviceKind kind, AttentionImpl attention) {
  TD_CHECK(batch >= 1 && seq >= 1, "a kernel probe needs --batch and --seq of at least 1");
  TD_CHECK(seq <= model.context, "--seq {} is longer than {}'s context of {}", seq, model.name,
           model.context);
  const ModelLayout layout(model);
  const std::unique_ptr<Kernels> sizing = kernels_for_sizing(kind, attention);
  KernelTraits t;
  t.compute_bytes = sizing->compute_bytes();
  t.attention = sizing->attention_saves(model.head_dim());
  KernelProbeOptions o;
  o.calls = model_kernel_calls(layout, batch, seq, t);
  o.calls.push_back({KernelOp::add, {int64_t{batch} * seq * model.d_model}});
  o.attention = attention;
  o.scratch_shapes.push_back(kernel_shape(model, batch, seq));
  o.model = model.name;
  o.batch = batch;
  o.seq = seq;
  o.optimizer_elements = layout.total_numel();
  if (kind != DeviceKind::cpu) o.target_ms = kGpuKernelBatchMs;  // [Sustained clocks]
  return o;
}

KernelProbeOptions kernel_probe_default(DeviceKind kind, AttentionImpl attention) {
  const bool cpu = kind == DeviceKind::cpu;
  struct Shape {
    const char* model;
    int batch, seq;
  };
  const std::vector<Shape> shapes =
      cpu ? std::vector<Shape>{{"gpt2-tiny", 2, 64}, {"llama-tiny", 2, 64}}
          : std::vector<Shape>{{"gpt2-124m", 8, 1024}, {"llama2-7b", 1, 2048}};
  KernelProbeOptions o;
  o.attention = attention;
  std::set<KernelCall> all;
  for (const Shape& s : shapes) {
    const KernelProbeOptions one =
        kernel_probe_for_model(preset(s.model), s.batch, s.seq, kind, attention);
    all.insert(one.calls.begin(), one.calls.end());
    o.scratch_shapes.insert(o.scratch_shapes.end(), one.scratch_shapes.begin(),
                            one.scratch_shapes.end());
  }
  o.calls.assign(all.begin(), all.end());
  o.optimizer_elements = int64_t{1} << 22;
  if (!cpu) o.target_ms = kGpuKernelBatchMs;  // [Sustained clocks]
  return o;
}

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
  if (options.kernels) {
    KernelProbeOptions ko = options.model
                                ? kernel_probe_for_model(*options.model, options.batch, options.seq,
                                                         device.kind(), options.attention)
                                : kernel_probe_default(device.kind(), options.attention);
    if (options.kernel_ms > 0) ko.target_ms = options.kernel_ms;
    ko.flash_backward = options.flash_backward;
    r.kernels = probe_kernels(device, ko);
  }
  return r;
}

nlohmann::json compute_to_json(const ComputeReport& r) {
  return {{"device", r.device_kind},
          {"tflops_f32", r.tflops_f32},
          {"tflops_bf16", r.tflops_bf16 ? nlohmann::json(*r.tflops_bf16) : nlohmann::json(nullptr)},
          {"copy_GBps", r.copy_GBps},
          {"mem_GiB", r.mem_GiB},
          {"kernels", r.kernels ? kernel_rates_to_json(*r.kernels) : nlohmann::json(nullptr)}};
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
  if (!r.kernels) return out;
  const KernelRates& k = *r.kernels;
  out += fmt::format(
      "\nkernels ({}{}, {}): each call's median time, calls issued back to back; launch {:.3g} "
      "us per call\n",
      k.compute_bytes == 2 ? "bf16" : "fp32",
      k.flash_backward == FlashBackward::automatic
          ? std::string()
          : fmt::format(", flash backward {}", flash_backward_name(k.flash_backward)),
      k.model.empty()
          ? std::string("the default grid")
          : fmt::format("the calls of {} at batch {} x seq {}", k.model, k.batch, k.seq),
      k.launch_us);
  out += fmt::format("  {:>10} {:>12}  {}\n", "ms", "rate", "kernel and shape");
  for (const KernelEntry& e : k.entries) {
    const double s = e.ms * 1e-3;
    const std::string rate =
        kernel_op_class(e.call.op) == KernelClass::memory
            ? fmt::format("{:.4g} GB/s", kernel_call_bytes(e.call, k.compute_bytes) / s / 1e9)
            : fmt::format("{:.4g} TF/s", kernel_call_flops(e.call) / s / 1e12);
    out += fmt::format("  {:>10.4g} {:>12}  {}\n", e.ms, rate, kernel_call_text(e.call));
  }
  if (k.optimizer_GBps > 0)
    out += fmt::format("  {:>10.4g} {:>12}  AdamW over {} fp32 parameters (28 bytes each)\n",
                       28.0 * static_cast<double>(k.optimizer_elements) / (k.optimizer_GBps * 1e6),
                       fmt::format("{:.4g} GB/s", k.optimizer_GBps), k.optimizer_elements);
  if (k.grad_norm_GBps > 0)
    out += fmt::format("  {:>10.4g} {:>12}  gradient norm over {} fp32 gradients (4 bytes each)\n",
                       4.0 * static_cast<double>(k.optimizer_elements) / (k.grad_norm_GBps * 1e6),
                       fmt::format("{:.4g} GB/s", k.grad_norm_GBps), k.optimizer_elements);
  return out;
}

}  // namespace tandem
