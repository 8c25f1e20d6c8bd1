// The cost model: op durations from the model's shapes, the list schedule of the real
// step program for training, closed forms per layout for generation, and the choice of
// a strategy with the sentence that explains it.
#include "plan/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/activations.h"
#include "shard/engine.h"
#include "shard/flat.h"

namespace tandem {

namespace {

constexpr double kGiB = 1073741824.0;
// Strategies within this fraction of the fastest count as equally fast; the one with
// the least memory per rank is then recommended.
constexpr double kTie = 0.02;
// Bytes AdamW moves per shard element: reads parameter, gradient and both moments,
// writes parameter and both moments, all fp32.
constexpr double kAdamBytes = 7 * 4;

// 3 significant digits, without an exponent for the numbers a plan prints.
std::string num(double x) {
  const double a = std::fabs(x);
  return a >= 100 ? fmt::format("{:.0f}", x) : fmt::format("{:.3g}", x);
}
std::string gb(double bytes) {
  return num(bytes / 1e9) + " GB";
}
std::string gib(double bytes) {
  return num(bytes / kGiB) + " GiB";
}
std::string pct(double f) {
  return 100 * f >= 10 ? fmt::format("{:.0f}%", 100 * f) : fmt::format("{:.2g}%", 100 * f);
}
std::string params(double n) {
  return n >= 1e9 ? num(n / 1e9) + "B" : num(n / 1e6) + "M";
}

bool windowed(Strategy s) {
  return s == Strategy::full || s == Strategy::hybrid;
}

double ceil_div(int a, int b) {
  return static_cast<double>((a + b - 1) / b);
}

// Attention's forward in a block: 4·N·T·A FLOPs (QK^T and PV over the whole sequence, the
// usual count: 12·L·d·T per token for forward plus backward); the CPU kernels materialise
// the softmax [B, H, T, T] (written, read, written), which a GPU's fused attention keeps on
// chip, its time in the FLOPs.
UnitCost attention_forward_cost(const ModelConfig& c, int B, int T, const Hardware& hw) {
  const double N = static_cast<double>(B) * T, A = static_cast<double>(c.n_head) * c.head_dim();
  UnitCost k;
  k.flops = 4 * N * T * A;
  if (!hw.gpu)
    k.bytes =
        3 * static_cast<double>(B) * c.n_head * T * T * static_cast<double>(hw.activation_bytes);
  return k;
}

}  // namespace

UnitCost unit_forward_cost(const ModelLayout& model, int u, int B, int T, const Hardware& hw) {
  const ModelConfig& c = model.config();
  const UnitLayout& unit = model.unit(u);
  const double N = static_cast<double>(B) * T, C = c.d_model, F = c.d_ff, Q = c.qkv_dim(),
               A = static_cast<double>(c.n_head) * c.head_dim(), Vp = c.vocab_padded;
  const double act = static_cast<double>(hw.activation_bytes),
               pb = static_cast<double>(hw.param_bytes);
  const bool swiglu = c.mlp == MlpKind::swiglu, rotary = c.rotary_dim() > 0;
  UnitCost k;
  switch (unit.kind) {
    case UnitKind::embedding:
      // Row lookups (token, and learned position) written as the residual stream.
      k.bytes = N * C * ((c.learned_positions ? 2 : 1) * pb + act);
      break;
    case UnitKind::block: {
      // Matrix products 2·N·in·out, and attention (attention_forward_cost).
      const UnitCost att = attention_forward_cost(c, B, T, hw);
      k.flops = 2 * N * (C * Q + A * C + (swiglu ? 3 : 2) * C * F) + att.flops;
      // Weights once; elementwise traffic per token: two norms (2C each), two residual
      // adds (3C each), the activation (GELU 2F, SwiGLU 3F), rotary on q and k (2Q).
      k.bytes = static_cast<double>(unit.numel) * pb +
                N * act * (10 * C + (swiglu ? 3 * F : 2 * F) + (rotary ? 2 * Q : 0)) + att.bytes;
      break;
    }
    case UnitKind::head:
      k.flops = 2 * N * C * Vp;
      // The head's own weights (and the tied token matrix), the norm, the logits.
      k.bytes =
          (static_cast<double>(unit.numel) + (c.tied() ? Vp * C : 0)) * pb + N * act * (2 * C + Vp);
      break;
  }
  return k;
}

UnitCost unit_recompute_cost(const ModelLayout& model, int u, int B, int T, const Hardware& hw,
                             Recompute recompute) {
  if (recompute == Recompute::none || model.unit(u).kind != UnitKind::block) return {};
  if (recompute == Recompute::unit) return unit_forward_cost(model, u, B, T, hw);
  // Attention's forward alone, reading q, k, v and writing its output.
  const ModelConfig& c = model.config();
  UnitCost k = attention_forward_cost(c, B, T, hw);
  k.bytes += static_cast<double>(B) * T * static_cast<double>(hw.activation_bytes) *
             (c.qkv_dim() + static_cast<double>(c.n_head) * c.head_dim());
  return k;
}

double kernel_call_ms(const KernelCall& call, const Hardware& hw, KernelRates::Fit* fit) {
  TD_CHECK(hw.kernels != nullptr, "kernel_call_ms needs hardware with kernel tables");
  double ms = 0;
  const KernelRates::Fit f = hw.kernels->estimate(call, &ms);
  if (f == KernelRates::Fit::none)
    ms = hw.flop_ms(kernel_call_flops(call)) +
         hw.memory_ms(kernel_call_bytes(call, hw.activation_bytes)) + hw.kernels->launch_us * 1e-3;
  if (fit != nullptr) *fit = f;
  return ms;
}

void KernelCost::add(const KernelCost& o) {
  ms += o.ms;
  calls += o.calls;
  measured += o.measured;
  interpolated += o.interpolated;
  ceiling += o.ceiling;
}

KernelCost unit_kernel_cost(const ModelLayout& model, int u, bool backward, int B, int T,
                            const Hardware& hw, Recompute recompute, int loss_chunk,
                            const std::vector<bool>& fresh) {
  const KernelTraits traits =
      kernel_traits_for(hw.gpu, hw.activation_bytes, model.config().head_dim());
  KernelCost k;
  for (const KernelCall& call :
       unit_kernel_calls(model, u, backward, B, T, traits, recompute, loss_chunk, fresh)) {
    KernelRates::Fit fit = KernelRates::Fit::none;
    k.ms += kernel_call_ms(call, hw, &fit);
    ++k.calls;
    (fit == KernelRates::Fit::measured       ? k.measured
     : fit == KernelRates::Fit::interpolated ? k.interpolated
                                             : k.ceiling) += 1;
  }
  return k;
}

std::vector<OpCost> program_costs(const ModelLayout& model, const Program& p, const Hardware& hw,
                                  int B, int T, Recompute recompute, int loss_chunk,
                                  int recompute_blocks) {
  // What unit u's block recomputes ([Partial recompute]).
  auto recompute_of = [&](int u) {
    return recompute_at(recompute, recompute_blocks, model.unit(u).layer);
  };
  // With kernel tables, each unit's forward and backward once (they repeat every micro-step).
  std::vector<double> unit_ms[2];
  // A backward that starts gradient buffers, by (unit, the units it starts).
  std::map<std::pair<int, std::vector<bool>>, double> fresh_ms;
  if (hw.kernels)
    for (int backward = 0; backward < 2; ++backward)
      for (int u = 0; u < model.num_units(); ++u)
        unit_ms[backward].push_back(
            unit_kernel_cost(model, u, backward == 1, B, T, hw, recompute_of(u), loss_chunk).ms);
  const FlatLayout flat(model, p.shard_size);
  const int S = p.shard_size, R = p.replicas;
  const double shard_total = static_cast<double>(flat.shard_total());
  const double pb = static_cast<double>(hw.param_bytes), gb_ = static_cast<double>(hw.grad_bytes);
  // [Reduce dtype] (shard/engine_exec.h): what the reduces move per element, and whether
  // the reduce stream casts to it and widens back (bf16 under fp32 gradients).
  const double rb = static_cast<double>(dtype_size(p.spec.reduce_dtype));
  const bool narrow = rb < gb_;
  std::vector<OpCost> costs;
  for (const Op& op : p.ops) {
    OpCost c;
    const double padded = op.unit >= 0 ? static_cast<double>(flat.unit(op.unit).padded) : 0;
    const double shard = op.unit >= 0 ? static_cast<double>(flat.unit(op.unit).shard) : 0;
    switch (op.kind) {
      case OpKind::zero_grad_shards:
        c.ms = hw.memory_ms(shard_total * 4);
        break;
      case OpKind::grad_norm:
        // A CPU's kernel tables time its serial sum of squares (KernelRates::grad_norm_GBps).
        c.ms = hw.kernels && hw.kernels->grad_norm_GBps > 0
                   ? shard_total * 4 / (hw.kernels->grad_norm_GBps * 1e6)
                   : hw.memory_ms(shard_total * 4);
        break;
      case OpKind::gather:
        // The fp32 shard is first rounded into this rank's block of the gathered buffer
        // when gathered parameters are narrower ([Cast on gather] in engine_cuda.cu); at one
        // rank that cast (or, in fp32, a copy) is the whole gather.
        // In fp32 across ranks the all-gather reads the shard itself.
        c.ms = S > 1 && pb >= 4 ? 0 : hw.memory_ms(shard * (4 + pb));
        if (S > 1) {
          c.ms += hw.all_gather_ms(padded * pb, S);
          c.link_bytes = padded * pb * (S - 1) / S;
        }
        break;
      case OpKind::forward:
      case OpKind::backward: {
        if (hw.kernels) {
          // The composition's calls, with the clears of the gradient buffers it starts
          // ([Fresh gradients]: what no kernel writes whole), and the executor's clears (the
          // padding past each unit's elements).
          const FreshGrads fresh = fresh_grads(model, p, op);
          if (fresh.units.empty()) {
            c.ms = unit_ms[op.kind == OpKind::backward ? 1 : 0].at(static_cast<size_t>(op.unit));
          } else {
            auto [it, added] = fresh_ms.try_emplace({op.unit, fresh.units}, 0.0);
            if (added)
              it->second = unit_kernel_cost(model, op.unit, true, B, T, hw, recompute_of(op.unit),
                                            loss_chunk, fresh.units)
                               .ms;
            c.ms = it->second;
          }
          for (const FreshGrads::Span& span : fresh.clear)
            c.ms += kernel_call_ms({KernelOp::zero, {static_cast<int64_t>(span.bytes)}}, hw);
          break;
        }
        const UnitCost u = unit_forward_cost(model, op.unit, B, T, hw);
        const double times = op.kind == OpKind::backward ? 2 : 1;
        c.ms = times * (hw.flop_ms(u.flops) + hw.memory_ms(u.bytes));
        if (op.kind == OpKind::backward) {
          const UnitCost again =
              unit_recompute_cost(model, op.unit, B, T, hw, recompute_of(op.unit));
          c.ms += hw.flop_ms(again.flops) + hw.memory_ms(again.bytes);
        }
        break;
      }
      case OpKind::reduce:
        if (S > 1) {
          c.ms = hw.reduce_scatter_ms(padded * rb, S);
          c.link_bytes = padded * rb * (S - 1) / S;
        } else {
          c.ms = hw.memory_ms(padded * (narrow ? 2 * rb : gb_ + 4));
        }
        if (narrow) {
          // The cast of the unsharded gradient (read fp32, write bf16) and the widening of
          // the shard (read bf16, write fp32); later micro-steps also read the shard.
          c.ms += hw.memory_ms(padded * (gb_ + rb) + shard * (rb + 4));
          if (windowed(p.spec.strategy) && op.micro > 0) c.ms += hw.memory_ms(shard * 4);
        } else if (windowed(p.spec.strategy) && op.micro > 0) {
          // Later micro-steps reduce into scratch and add it to the shard (read 2, write 1).
          c.ms += hw.memory_ms(shard * 12);
        }
        break;
      case OpKind::replicate_reduce:
        c.ms = hw.all_reduce_ms(shard * rb, R);
        c.link_bytes = R > 1 ? 2 * shard * rb * (R - 1) / R : 0;
        if (narrow) c.ms += hw.memory_ms(2 * shard * (4 + rb));  // cast to bf16 and back
        break;
      case OpKind::norm_reduce:
        c.ms = hw.all_reduce_ms(sizeof(double), S);
        break;
      case OpKind::optimizer:
      case OpKind::update: {
        // The whole shard at the step's end, or ([Update at gather]) one unit's on the gather
        // stream, priced as if alone: on a GPU the schedule shares the processors between
        // it and the compute ([Processor sharing]).
        const double elements = op.kind == OpKind::optimizer ? shard_total : shard;
        c.ms = hw.kernels && hw.kernels->optimizer_GBps > 0
                   ? elements * kAdamBytes / (hw.kernels->optimizer_GBps * 1e6)
                   : hw.memory_ms(elements * kAdamBytes);
        break;
      }
      case OpKind::last_rows:
      case OpKind::advance:
      case OpKind::sample:
      case OpKind::tp_reduce:
      case OpKind::send:
      case OpKind::recv:
        TD_THROW("the training cost model was given an inference program");
    }
    costs.push_back(c);
  }
  return costs;
}

// [List schedule] The executor issues ops in program order and the host never waits
// inside a step, so each stream is a queue that runs an op once the previous op of the
// stream and every op in its waits have finished.
// [Link sharing] The all-gather and reduce-scatter streams drive the same links: while
// k ops marked on_link run at once, each progresses at 1/k of its own speed (an op's
// duration is what it takes alone). The simulation therefore advances from event to
// event (an op starts or ends) rather than placing each op once.
// [Processor sharing] Ops marked on_processors run on the compute stream's processors though
// they sit on another stream (a GPU's update ops on the gather stream, [Update at gather]):
// while k of them and a compute op run at once, each progresses at 1/(k + 1) of its own
// speed, so together they take what they take one after another, as measured on an H100.
// Exposed communication is measured as the engine measures it: the time a compute op
// stood between the end of the previous compute op (or the step's start) and its own
// start, waiting on another stream; comm_ms adds the comm ops' actual durations.
Timeline schedule_simulate(const Program& p, const std::vector<double>& duration_ms,
                           const std::vector<bool>& on_link,
                           const std::vector<bool>& on_processors) {
  const size_t n = p.ops.size();
  TD_CHECK(duration_ms.size() == n, "{} durations for a program of {} ops", duration_ms.size(), n);
  TD_CHECK(on_link.empty() || on_link.size() == n, "{} link flags for a program of {} ops",
           on_link.size(), n);
  TD_CHECK(on_processors.empty() || on_processors.size() == n,
           "{} processor flags for a program of {} ops", on_processors.size(), n);
  Timeline t;
  t.start_ms.assign(n, -1);
  t.end_ms.assign(n, -1);
  std::vector<int> queue[kStreamRoles];
  for (size_t i = 0; i < n; ++i)
    queue[static_cast<int>(p.ops[i].stream)].push_back(static_cast<int>(i));
  size_t next[kStreamRoles] = {0, 0, 0};
  int running[kStreamRoles] = {-1, -1, -1};
  double left[kStreamRoles] = {0, 0, 0};  // work left, in ms of the op running alone
  double now = 0, compute_free = 0;
  const int compute = static_cast<int>(StreamRole::compute);
  for (size_t done = 0; done < n;) {
    for (int s = 0; s < kStreamRoles; ++s) {
      if (running[s] >= 0 || next[s] >= queue[s].size()) continue;
      const int i = queue[s][next[s]];
      bool ready = true;
      for (int w : p.ops[static_cast<size_t>(i)].waits)
        ready = ready && t.end_ms.at(static_cast<size_t>(w)) >= 0;
      if (!ready) continue;
      running[s] = i;
      ++next[s];
      t.start_ms[static_cast<size_t>(i)] = now;
      left[s] = duration_ms[static_cast<size_t>(i)];
      if (s == compute) t.exposed_comm_ms += now - compute_free;
    }
    auto flagged = [&](const std::vector<bool>& flags, int s) {
      return running[s] >= 0 && !flags.empty() && flags[static_cast<size_t>(running[s])];
    };
    auto on_sms = [&](int s) {
      return running[s] >= 0 && (s == compute || flagged(on_processors, s));
    };
    int sharing = 0, processors = 0;
    for (int s = 0; s < kStreamRoles; ++s) {
      sharing += flagged(on_link, s);
      processors += on_sms(s);
    }
    auto rate = [&](int s) {
      double r = flagged(on_link, s) && sharing > 1 ? 1.0 / sharing : 1.0;
      if (on_sms(s) && processors > 1) r /= processors;
      return r;
    };
    double step = -1;
    for (int s = 0; s < kStreamRoles; ++s)
      if (running[s] >= 0 && (step < 0 || left[s] / rate(s) < step)) step = left[s] / rate(s);
    TD_CHECK(step >= 0, "the program cannot proceed: op waits form a cycle");
    now += step;
    for (int s = 0; s < kStreamRoles; ++s) {
      if (running[s] < 0) continue;
      const double r = rate(s);
      left[s] -= step * r;
      if (left[s] > 1e-12 * (1 + duration_ms[static_cast<size_t>(running[s])])) continue;
      const size_t i = static_cast<size_t>(running[s]);
      t.end_ms[i] = now;
      // [Update at gather] An update on the gather stream is neither compute nor communication.
      if (p.ops[i].kind != OpKind::update)
        (s == compute ? t.compute_ms : t.comm_ms) += now - t.start_ms[i];
      if (s == compute) compute_free = now;
      running[s] = -1;
      ++done;
    }
    t.step_ms = now;
  }
  return t;
}

// The activation table the engine allocates (model/activations.h). CPU: fp32 with the
// [B, H, T, T] softmax. GPU: the compute dtype, and where the head size has a fused
// attention (32, 64, 128) one fp32 log-sum-exp per row instead of the softmax; kernel
// scratch (a few MiB) is left out.
double plan_activation_bytes(const ModelConfig& c, int B, int T, const Hardware& hw,
                             Recompute recompute, int loss_chunk, int recompute_blocks) {
  ActivationTraits t;
  t.recompute = recompute;
  t.recompute_blocks = recompute_blocks;
  t.loss_chunk = loss_chunk;
  t.compute_bytes = hw.gpu ? hw.activation_bytes : 4;
  const int D = c.head_dim();
  t.attention = hw.gpu && (D == 32 || D == 64 || D == 128) ? AttentionSaves::logsumexp
                                                           : AttentionSaves::probabilities;
  return static_cast<double>(activation_bytes(c, B, T, t));
}

ProgramSpec plan_program_spec(const PlanRequest& r, Strategy s) {
  ProgramSpec spec;
  spec.strategy = s;
  spec.world = r.ranks;
  spec.shard_group = s == Strategy::hybrid ? r.shard_group : 0;
  spec.micro_steps = r.micro_steps;
  spec.max_gathered = r.max_gathered;
  spec.param_bytes = r.hw.param_bytes;
  spec.grad_bytes = r.hw.grad_bytes;
  spec.reduce_dtype = r.reduce_dtype;
  spec.update_at_gather = r.update_at_gather;
  spec.activation_bytes = static_cast<size_t>(plan_activation_bytes(
      r.model, r.batch, r.seq, r.hw, r.recompute, r.loss_chunk, r.recompute_blocks));
  return spec;
}

namespace {

std::string memory_sentence(double need, double activations, double have) {
  return fmt::format("needs {} per rank ({} of it activations), over the {} available", gib(need),
                     gib(activations), gib(have));
}

std::string train_bottleneck(const PlanRequest& r, const StrategyPlan& sp, double activations) {
  if (!sp.fits) return memory_sentence(sp.peak_mem_bytes, activations, r.hw.mem_bytes());
  std::vector<std::string> parts;
  if (sp.gather_bytes > 0) parts.push_back("gathers " + gb(sp.gather_bytes));
  if (sp.reduce_bytes > 0) parts.push_back("reduce-scatters " + gb(sp.reduce_bytes));
  if (sp.all_reduce_bytes > 0) parts.push_back("all-reduces " + gb(sp.all_reduce_bytes));
  std::string moved = "nothing crosses a link (gathers and reduces are local copies)";
  if (!parts.empty()) moved = "each rank " + parts[0];
  for (size_t i = 1; i < parts.size(); ++i)
    moved += (i + 1 == parts.size() ? " and " : ", ") + parts[i];
  if (!parts.empty()) moved += " per step";
  if (sp.exposed_comm_ms >= 0.1 * sp.step_ms)
    return fmt::format(
        "communication: {} ms of the {} ms step is exposed; {} over {} GB/s links "
        "({} ms of communication against {} ms of compute)",
        num(sp.exposed_comm_ms), num(sp.step_ms), moved, num(r.hw.all_gather.GBps), num(sp.comm_ms),
        num(sp.compute_ms));
  return fmt::format(
      "compute: {} ms of the {} ms step; {} ({} ms of communication, {} ms of it "
      "exposed)",
      num(sp.compute_ms), num(sp.step_ms), moved, num(sp.comm_ms), num(sp.exposed_comm_ms));
}

}  // namespace

StrategyPlan plan_train_strategy(const PlanRequest& r, Strategy s) {
  const ModelLayout layout(r.model);
  const ProgramSpec spec = plan_program_spec(r, s);
  const Program p = program_build(layout, spec);
  program_check(layout, p);
  const std::vector<OpCost> costs =
      program_costs(layout, p, r.hw, r.batch, r.seq, r.recompute, r.loss_chunk, r.recompute_blocks);
  std::vector<double> ms;
  std::vector<bool> link, processors;
  for (size_t i = 0; i < costs.size(); ++i) {
    ms.push_back(costs[i].ms);
    link.push_back(costs[i].link_bytes > 0);
    // [Processor sharing] A GPU's update kernels share the multiprocessors with the compute;
    // a CPU's run on the gather stream's own thread, which has a core of its own.
    processors.push_back(r.hw.gpu && p.ops[i].kind == OpKind::update);
  }
  const Timeline t = schedule_simulate(p, ms, link, processors);

  StrategyPlan sp;
  sp.name = strategy_name(s);
  // The engine adds its reduce-stream scratch to the program's peak (reduce_scratch).
  const FlatLayout flat(layout, p.shard_size);
  sp.peak_mem_bytes =
      static_cast<double>(p.peak_bytes()) + static_cast<double>(reduce_scratch(flat, p).bytes());
  sp.fits = sp.peak_mem_bytes <= r.hw.mem_bytes();
  sp.step_ms = t.step_ms;
  sp.compute_ms = t.compute_ms;
  sp.comm_ms = t.comm_ms;
  sp.exposed_comm_ms = t.exposed_comm_ms;
  const double tokens = static_cast<double>(r.ranks) * r.batch * r.seq * r.micro_steps;
  sp.tokens_per_s = t.step_ms > 0 ? tokens / t.step_ms * 1e3 : 0;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const OpKind k = p.ops[i].kind;
    if (k == OpKind::gather) sp.gather_bytes += costs[i].link_bytes;
    if (k == OpKind::reduce) sp.reduce_bytes += costs[i].link_bytes;
    if (k == OpKind::replicate_reduce) sp.all_reduce_bytes += costs[i].link_bytes;
  }
  // [Overlap bound] However well communication overlaps, a step lasts at least as long
  // as the compute stream's work, each communication stream's work and the link's work
  // (its collectives back to back, none slowed by another). The step beyond that is
  // the most perfect overlap could save; it never exceeds the exposed communication.
  double stream_work[kStreamRoles] = {0, 0, 0};
  for (size_t i = 0; i < p.ops.size(); ++i) {
    stream_work[static_cast<int>(p.ops[i].stream)] += ms[i];
    if (link[i]) sp.link_ms += ms[i];
  }
  sp.min_step_ms = sp.link_ms;
  for (double w : stream_work) sp.min_step_ms = std::max(sp.min_step_ms, w);
  sp.bottleneck = train_bottleneck(r, sp, static_cast<double>(spec.activation_bytes));
  return sp;
}

// ---------------------------------------------------------------------------------------
// Generation. One decode step runs every sequence of the batch one token forward.

namespace {

// The shapes one decode step depends on, per sequence at a KV-cache length of T.
struct DecodeShape {
  double read_params = 0;   // parameters read per step: blocks and head (not the embedding)
  double head_params = 0;   // of which the head's product reads (the token matrix if tied)
  double total_params = 0;  // parameters held
  double flops = 0;         // per sequence per step: 2 per parameter read, plus attention
  double kv_bytes = 0;      // per sequence: the K and V cache, read once per step
  double act_bytes = 0;     // per sequence: logits and the per-token vectors
  int units = 0;
};

DecodeShape decode_shape(const ModelLayout& m, int T, const Hardware& hw) {
  const ModelConfig& c = m.config();
  DecodeShape d;
  for (const UnitLayout& u : m.units()) {
    d.total_params += static_cast<double>(u.numel);
    if (u.kind != UnitKind::embedding) d.read_params += static_cast<double>(u.numel);
  }
  if (c.tied()) d.read_params += static_cast<double>(c.vocab_padded) * c.d_model;
  d.head_params = static_cast<double>(c.vocab_padded) * c.d_model;
  const double A = static_cast<double>(c.n_head) * c.head_dim(), L = c.n_layer;
  d.flops = 2 * d.read_params + 4 * L * T * A;
  d.kv_bytes = 2 * L * T * c.n_kv_head * c.head_dim() * static_cast<double>(hw.param_bytes);
  d.act_bytes = 4.0 * (c.vocab_padded + 4 * c.d_model + 3 * c.d_ff + c.qkv_dim());
  d.units = m.num_units();
  return d;
}

// One rank decoding x sequences with `share` of the weights (1/W for tp) and `kv_share`
// of each sequence's cache: the weights stream from memory once per step unless the
// matrix products take longer; the cache streams once per sequence.
struct LocalStep {
  double weights_ms = 0, flops_ms = 0, kv_ms = 0;
  double ms() const { return std::max(weights_ms, flops_ms) + kv_ms; }
};

// `head` of the `read` parameters are the head's product, priced at its own rate.
LocalStep local_step(const DecodeShape& d, double x, double read, double head, double kv_share,
                     const Hardware& hw) {
  LocalStep s;
  const double pb = static_cast<double>(hw.param_bytes);
  s.weights_ms = hw.matvec_ms((read - head) * pb) + hw.head_matvec_ms(head * pb);
  s.flops_ms = hw.flop_ms(d.flops * x * read / d.read_params);
  s.kv_ms = hw.memory_ms(d.kv_bytes * x * kv_share);
  return s;
}

struct DecodeStep {
  double step_ms = 0, compute_ms = 0, comm_ms = 0, exposed_ms = 0, mem = 0;
  double gather_bytes = 0, all_reduce_bytes = 0;
  LocalStep local;
  int collectives = 0;
};

// replicate and fsdp decode b sequences data-parallel: ceil(b / W) per rank.
DecodeStep decode_replicate(const DecodeShape& d, int b, int W, const Hardware& hw) {
  DecodeStep s;
  const double x = ceil_div(b, W);
  s.local = local_step(d, x, d.read_params, d.head_params, 1, hw);
  s.step_ms = s.compute_ms = s.local.ms();
  s.mem = d.total_params * static_cast<double>(hw.param_bytes) + (d.kv_bytes + d.act_bytes) * x;
  return s;
}

// Every unit is gathered per step (prefetched, so it overlaps the reads of the units
// before it); each rank holds its shard and `K` gathered units.
DecodeStep decode_fsdp(const ModelLayout& m, const DecodeShape& d, int b, int W, int K,
                       const Hardware& hw) {
  DecodeStep s;
  const double x = ceil_div(b, W), pb = static_cast<double>(hw.param_bytes);
  const FlatLayout flat(m, W);
  s.local = local_step(d, x, d.read_params, d.head_params, 1, hw);
  s.compute_ms = s.local.ms();
  for (int u = 0; u < flat.num_units(); ++u) {
    const double bytes = static_cast<double>(flat.unit(u).padded) * pb;
    s.comm_ms += hw.all_gather_ms(bytes, W);
    s.gather_bytes += bytes * (W - 1) / W;
  }
  s.collectives = W > 1 ? flat.num_units() : 0;
  s.step_ms = std::max(s.compute_ms, s.comm_ms);
  s.exposed_ms = s.step_ms - s.compute_ms;
  s.mem = static_cast<double>(flat.shard_total()) * pb +
          K * static_cast<double>(flat.largest_padded()) * pb + (d.kv_bytes + d.act_bytes) * x;
  return s;
}

// Column/row-parallel layers: each rank reads 1/W of the weights and of the KV heads
// (when W divides them; otherwise the one KV head its query heads read), then the
// all-reduces of the activations (two per sequential block, one per parallel block) and
// the all-gather of each rank's sampling candidates (8 bytes per row: a greedy draw's)
// sit on the critical path.
DecodeStep decode_tp(const ModelConfig& c, const DecodeShape& d, int b, int W, const Hardware& hw) {
  DecodeStep s;
  const double share = 1.0 / W;
  const double kv_share = c.n_kv_head % W == 0 ? share : 1.0 / c.n_kv_head;
  s.local = local_step(d, b, d.read_params * share, d.head_params * share, kv_share, hw);
  s.compute_ms = s.local.ms();
  const double act = static_cast<double>(hw.activation_bytes);
  const double ar = static_cast<double>(b) * c.d_model * act, cands = 8.0 * b * W;
  const int per_block = c.residual == ResidualKind::parallel ? 1 : 2;
  if (W > 1) {
    s.comm_ms = per_block * c.n_layer * hw.all_reduce_ms(ar, W) + hw.all_gather_ms(cands, W);
    s.all_reduce_bytes = per_block * c.n_layer * 2 * ar * (W - 1) / W;
    s.gather_bytes = cands * (W - 1) / W;
    s.collectives = per_block * c.n_layer + 1;
  }
  s.exposed_ms = s.comm_ms;
  s.step_ms = s.compute_ms + s.comm_ms;
  s.mem = d.total_params * static_cast<double>(hw.param_bytes) * share +
          (d.kv_bytes * kv_share + d.act_bytes) * b;
  return s;
}

// Units placed by rank in W contiguous stages (pipeline_stages: the embedding on the first,
// the head on the last, balanced by what a step reads). A token passes the stages one after
// another; m = min(b, W) micro-batches keep them busy, so a step of all b sequences takes
// max(m, W) stage times of the fullest stage.
DecodeStep decode_pipeline(const ModelLayout& m, const DecodeShape& d, int b, int W,
                           const Hardware& hw) {
  const ModelConfig& c = m.config();
  DecodeStep s;
  const double pb = static_cast<double>(hw.param_bytes), L = c.n_layer;
  const std::vector<int> starts = pipeline_stages(m, W);
  const double micro = std::min(b, W), x = ceil_div(b, static_cast<int>(micro));
  double max_mem = 0;
  for (int st = 0; st < W; ++st) {
    double read = 0, head = 0, held = 0, blocks = 0;
    std::vector<bool> holds(static_cast<size_t>(m.num_units()), false);
    for (int u = starts[static_cast<size_t>(st)]; u < starts[static_cast<size_t>(st) + 1]; ++u) {
      holds[static_cast<size_t>(u)] = true;
      for (int r : m.reads(u)) holds[static_cast<size_t>(r)] = true;
      if (m.unit(u).kind == UnitKind::block) ++blocks;
      if (m.unit(u).kind != UnitKind::embedding) read += static_cast<double>(m.unit(u).numel);
      if (m.unit(u).kind == UnitKind::head) {
        if (c.tied()) read += static_cast<double>(c.vocab_padded) * c.d_model;
        head = d.head_params;
      }
    }
    for (int u = 0; u < m.num_units(); ++u)
      if (holds[static_cast<size_t>(u)]) held += static_cast<double>(m.unit(u).numel);
    // The slowest stage sets the pace.
    const LocalStep stage = local_step(d, x, read, head, 1.0 / W, hw);
    if (st == 0 || stage.ms() > s.local.ms()) s.local = stage;
    // The stage's caches hold every sequence; each micro-batch's workspace is its own.
    const double kv = d.kv_bytes * blocks / L * b;
    max_mem = std::max(max_mem, held * pb + kv + d.act_bytes * x * micro);
  }
  const double rounds = std::max(micro, static_cast<double>(W));
  const double hop =
      W > 1 ? hw.all_gather.ms(x * c.d_model * static_cast<double>(hw.activation_bytes)) : 0;
  s.compute_ms = rounds * s.local.ms();
  s.comm_ms = s.exposed_ms = rounds * hop;
  s.step_ms = s.compute_ms + s.comm_ms;
  s.collectives = W > 1 ? static_cast<int>(rounds) : 0;
  s.mem = max_mem;
  return s;
}

DecodeStep decode_step(const ModelLayout& m, const DecodeShape& d, const std::string& name, int b,
                       const PlanRequest& r) {
  // One rank holds every unit whole under any layout (the decoder runs replicate's programs).
  if (name == "replicate" || r.ranks == 1) return decode_replicate(d, b, r.ranks, r.hw);
  if (name == "fsdp") return decode_fsdp(m, d, b, r.ranks, r.max_gathered, r.hw);
  if (name == "tp") return decode_tp(m.config(), d, b, r.ranks, r.hw);
  return decode_pipeline(m, d, b, r.ranks, r.hw);
}

std::string not_applicable(const ModelConfig& c, const std::string& name, int W) {
  if (name == "tp" && (c.n_head % W != 0 || c.d_ff % W != 0)) {
    std::string what = c.n_head % W != 0 ? fmt::format("n_head {}", c.n_head) : "";
    if (c.d_ff % W != 0) what += fmt::format("{}d_ff {}", what.empty() ? "" : " and ", c.d_ff);
    return fmt::format("tp splits heads and the MLP across ranks: {} not divisible by {} ranks",
                       what, W);
  }
  if (name == "tp" && c.n_kv_head % W != 0 && W % c.n_kv_head != 0)
    return fmt::format(
        "tp splits the key/value heads across ranks or gives each rank one: {} key/value heads "
        "neither divide by nor divide {} ranks",
        c.n_kv_head, W);
  if (name == "pipeline" && W > c.n_layer)
    return fmt::format("pipeline places at least one block per rank: {} blocks, {} ranks",
                       c.n_layer, W);
  return "";
}

// What a local step's time goes to: the weights, the cache or the matrix products.
std::string local_sentence(const std::string& who, const LocalStep& l, double weight_bytes,
                           double kv_bytes, double flops, const std::string& per,
                           const Hardware& hw) {
  if (l.flops_ms >= l.weights_ms && l.flops_ms >= l.kv_ms)
    return fmt::format("{} is compute-bound: {} TFLOP per rank {} at {} TFLOP/s", who,
                       num(flops / 1e12), per, num(hw.tflops));
  if (l.kv_ms > l.weights_ms)
    return fmt::format(
        "{} reads {} of KV cache per rank {} (more than its {} of weights) "
        "from {} GB/s memory",
        who, gb(kv_bytes), per, gb(weight_bytes), num(hw.hbm_GBps));
  return fmt::format("{} reads {} of weights per rank {} from {} GB/s memory", who,
                     gb(weight_bytes), per, num(hw.hbm_GBps));
}

std::string generate_bottleneck(const PlanRequest& r, const ModelLayout& m, const DecodeShape& d,
                                const StrategyPlan& sp, const DecodeStep& s) {
  const std::string& name = sp.name;
  const int W = r.ranks, b = r.batch;
  const std::string rate = fmt::format("at most {} tok/s at batch {}", num(sp.tokens_per_s), b);
  const std::string per = b == 1 ? "per token" : "per decode step";
  const double pb = static_cast<double>(r.hw.param_bytes);
  const double x = name == "tp" ? b : ceil_div(b, W);
  const double share = name == "tp" ? 1.0 / W : 1.0;
  const int kv = m.config().n_kv_head;
  const double kv_share = name != "tp" ? 1.0 : kv % W == 0 ? 1.0 / W : 1.0 / kv;
  std::string prefix;
  if (!sp.fits) {
    const double weights = name == "replicate" ? d.total_params * pb
                           : name == "tp"      ? d.total_params * pb / W
                                               : 0;
    prefix = fmt::format("needs {} per rank{}, over the {} available; ", gib(sp.peak_mem_bytes),
                         weights > 0 ? fmt::format(" ({} of weights)", gib(weights)) : "",
                         gib(r.hw.mem_bytes()));
  }
  if (name == "fsdp" && W > 1 && s.comm_ms >= s.compute_ms)
    return prefix + fmt::format(
                        "fsdp gathers {} {} (each rank receives {}/{} of the {} of "
                        "weights) over a {} GB/s link: {}",
                        gb(s.gather_bytes), per, W - 1, W, gb(s.gather_bytes * W / (W - 1)),
                        num(r.hw.all_gather.GBps), rate);
  if (name == "tp" && W > 1 && s.comm_ms >= 0.25 * s.step_ms)
    return prefix + fmt::format(
                        "tp runs {} collectives {} at {} us latency each ({} ms) on top of "
                        "{} ms of weight reads: {}",
                        s.collectives, per, num(r.hw.all_reduce.latency_us), num(s.comm_ms),
                        num(s.compute_ms), rate);
  if (name == "pipeline" && W > 1) {
    const std::string how =
        b < W ? fmt::format(
                    "pipeline runs its {} stages one after another for each token ({} of {} "
                    "stages busy at batch {})",
                    W, b, W, b)
              : fmt::format("pipeline keeps {} micro-batches in flight over {} stages", W, W);
    return prefix + how + ": " + rate;
  }
  const double weights = d.read_params * share * pb;
  return prefix +
         local_sentence(name, s.local, weights, d.kv_bytes * x * kv_share, d.flops * x * share, per,
                        r.hw) +
         ": " + rate;
}

}  // namespace

const std::vector<std::string>& plan_generate_strategies() {
  static const std::vector<std::string> names = {"replicate", "fsdp", "tp", "pipeline"};
  return names;
}

StrategyPlan plan_generate_strategy(const PlanRequest& r, const std::string& name) {
  const auto& names = plan_generate_strategies();
  TD_CHECK(std::find(names.begin(), names.end(), name) != names.end(),
           "unknown inference strategy '{}' (expected replicate, fsdp, tp or pipeline)", name);
  const ModelLayout m(r.model);
  const DecodeShape d = decode_shape(m, r.seq, r.hw);
  StrategyPlan sp;
  sp.name = name;
  const std::string na = not_applicable(r.model, name, r.ranks);
  if (!na.empty()) {
    sp.applicable = false;
    sp.bottleneck = na;
    return sp;
  }
  const DecodeStep s = decode_step(m, d, name, r.batch, r);
  const DecodeStep one = decode_step(m, d, name, 1, r);
  sp.peak_mem_bytes = s.mem;
  sp.fits = s.mem <= r.hw.mem_bytes();
  sp.step_ms = s.step_ms;
  sp.compute_ms = s.compute_ms;
  sp.comm_ms = s.comm_ms;
  sp.exposed_comm_ms = s.exposed_ms;
  sp.tokens_per_s = r.batch / s.step_ms * 1e3;
  sp.tokens_per_s_batch1 = 1 / one.step_ms * 1e3;
  sp.gather_bytes = s.gather_bytes;
  sp.all_reduce_bytes = s.all_reduce_bytes;
  sp.bottleneck = generate_bottleneck(r, m, d, sp, s);
  return sp;
}

// ---------------------------------------------------------------------------------------

namespace {

// The fastest that fits; among those within kTie of it, the least memory per rank.
int recommend(const std::vector<StrategyPlan>& ss, bool train) {
  auto speed = [&](const StrategyPlan& s) { return train ? 1 / s.step_ms : s.tokens_per_s; };
  double best = 0;
  for (const StrategyPlan& s : ss)
    if (s.applicable && s.fits) best = std::max(best, speed(s));
  int pick = -1;
  for (size_t i = 0; i < ss.size(); ++i) {
    const StrategyPlan& s = ss[i];
    if (!s.applicable || !s.fits || speed(s) < best * (1 - kTie)) continue;
    if (pick < 0 || s.peak_mem_bytes < ss[static_cast<size_t>(pick)].peak_mem_bytes)
      pick = static_cast<int>(i);
  }
  return pick;
}

std::string nothing_fits(const PlanResult& res) {
  const PlanRequest& r = res.request;
  const StrategyPlan* smallest = nullptr;
  for (const StrategyPlan& s : res.strategies)
    if (s.applicable && (smallest == nullptr || s.peak_mem_bytes < smallest->peak_mem_bytes))
      smallest = &s;
  if (smallest == nullptr) return "no strategy applies to this model at this rank count";
  return fmt::format(
      "nothing fits in {} per rank: the smallest, {}, needs {}; {}", gib(r.hw.mem_bytes()),
      smallest->name, gib(smallest->peak_mem_bytes),
      r.task == PlanTask::train
          ? "add ranks, lower --batch (raising --micro-steps), or use hardware with more memory"
          : "add ranks, lower --batch or --seq, or use hardware with more memory");
}

// The fewest blocks that, recomputing as `mode` says, let strategy s fit with
// kRecomputeHeadroom of the memory free; 0 when even every block recomputing does not. The
// plan at that count is in *at.
int fewest_recompute_blocks(PlanRequest r, Strategy s, Recompute mode, StrategyPlan* at) {
  r.recompute = mode;
  auto plan_at = [&](int k) {
    r.recompute_blocks = k;
    return plan_train_strategy(r, s);
  };
  const int k = recompute_fewest_blocks(r.model.n_layer, [&](int blocks) {
    const StrategyPlan p = plan_at(blocks);
    return p.fits && p.peak_mem_bytes <= (1 - kRecomputeHeadroom) * r.hw.mem_bytes();
  });
  if (k > 0) *at = plan_at(k);
  return k;
}

// For a training plan that recomputes every block: how few need to, for the recommended
// strategy. For one that recomputes none and fits nowhere: the fastest strategy that
// recomputing whole blocks makes fit, and with how few.
void advise_recompute(PlanResult& res) {
  const PlanRequest& r = res.request;
  const int L = r.model.n_layer;
  if (r.recompute != Recompute::none && (r.recompute_blocks == 0 || r.recompute_blocks >= L) &&
      res.recommended >= 0) {
    const StrategyPlan& all = res.strategies[static_cast<size_t>(res.recommended)];
    const Strategy s = strategy_parse(all.name);
    PlanRequest none = r;
    none.recompute = Recompute::none;
    none.recompute_blocks = 0;
    const StrategyPlan kept = plan_train_strategy(none, s);
    if (kept.fits) {
      res.notes.push_back(fmt::format(
          "recompute: {} fits without it ({} per rank, {} ms a step against {} ms): drop "
          "--recompute",
          all.name, gib(kept.peak_mem_bytes), num(kept.step_ms), num(all.step_ms)));
      return;
    }
    StrategyPlan at;
    const int k = fewest_recompute_blocks(r, s, r.recompute, &at);
    if (k > 0 && k < L)
      res.notes.push_back(fmt::format(
          "recompute: {} of the {} blocks recomputing is the fewest that fit {} with {} of the "
          "memory free ({} per rank, {} ms a step against {} ms with every block): "
          "--recompute-blocks {}",
          k, L, all.name, pct(kRecomputeHeadroom), gib(at.peak_mem_bytes), num(at.step_ms),
          num(all.step_ms), k));
    return;
  }
  if (r.recompute != Recompute::none || res.recommended >= 0) return;
  int best_k = 0;
  StrategyPlan best;
  for (const StrategyPlan& p : res.strategies) {
    if (!p.applicable) continue;
    StrategyPlan at;
    const int k = fewest_recompute_blocks(r, strategy_parse(p.name), Recompute::unit, &at);
    if (k > 0 && (best_k == 0 || at.step_ms < best.step_ms)) {
      best_k = k;
      best = std::move(at);
    }
  }
  if (best_k > 0)
    res.why += fmt::format(
        "; recomputing {} of the {} blocks fits {} with {} of the memory free ({} per rank, {} "
        "ms a step): --recompute unit{}",
        best_k, L, best.name, pct(kRecomputeHeadroom), gib(best.peak_mem_bytes), num(best.step_ms),
        best_k < L ? fmt::format(" --recompute-blocks {}", best_k) : "");
}

}  // namespace

LayoutChoice plan_choose_layout(const PlanRequest& r, const std::vector<std::string>& runnable) {
  TD_CHECK(r.task == PlanTask::generate, "choosing an inference layout for a training request");
  std::vector<StrategyPlan> plans;
  for (const std::string& name : runnable) plans.push_back(plan_generate_strategy(r, name));
  // fsdp only where nothing else fits.
  bool other_fits = false;
  for (const StrategyPlan& p : plans) other_fits |= p.name != "fsdp" && p.applicable && p.fits;
  if (other_fits)
    for (StrategyPlan& p : plans)
      if (p.name == "fsdp") p.fits = false;
  LayoutChoice c;
  const int pick = recommend(plans, /*train=*/false);
  if (pick < 0) {
    PlanResult res;
    res.request = r;
    res.strategies = plans;
    c.why = nothing_fits(res);
    return c;
  }
  c.plan = plans[static_cast<size_t>(pick)];
  c.name = c.plan.name;
  c.why = fmt::format("{} is the fastest layout that fits ({} tok/s at batch {}, {} per rank); {}",
                      c.name, num(c.plan.tokens_per_s), r.batch, gib(c.plan.peak_mem_bytes),
                      c.plan.bottleneck);
  return c;
}

PlanResult plan_run(const PlanRequest& r) {
  TD_CHECK(r.ranks >= 1, "--ranks must be at least 1, got {}", r.ranks);
  TD_CHECK(r.batch >= 1 && r.seq >= 1, "--batch and --seq must be positive");
  TD_CHECK(r.micro_steps >= 1, "--micro-steps must be at least 1, got {}", r.micro_steps);
  TD_CHECK(r.seq <= r.model.context, "--seq {} exceeds the context length {} of {}", r.seq,
           r.model.context, r.model.name);
  hardware_validate(r.hw);
  PlanResult res;
  res.request = r;
  const bool train = r.task == PlanTask::train;
  TD_CHECK(train || r.recompute == Recompute::none,
           "--recompute applies to training (--task train): decoding keeps no activations for "
           "a backward");
  TD_CHECK(r.recompute_blocks == 0 || r.recompute != Recompute::none,
           "--recompute-blocks {} says how many blocks recompute: it needs --recompute attention "
           "or unit",
           r.recompute_blocks);
  TD_CHECK(train || r.loss_chunk == 0,
           "--loss-chunk applies to training (--task train): decoding computes no loss");
  TD_CHECK(train || r.reduce_dtype == DType::f32,
           "--reduce-dtype applies to training (--task train): decoding reduces no gradients");
  TD_CHECK(r.loss_chunk >= 0, "--loss-chunk must not be negative (0: every row at once), got {}",
           r.loss_chunk);
  if (train) {
    std::vector<Strategy> ss;
    if (!r.strategy.empty()) {
      ss.push_back(strategy_parse(r.strategy));
    } else {
      ss = {Strategy::full, Strategy::grad_op, Strategy::none};
      if (r.shard_group > 0) ss.push_back(Strategy::hybrid);
    }
    for (Strategy s : ss) res.strategies.push_back(plan_train_strategy(r, s));
    if (r.hw.kernels) {
      const ModelLayout layout(r.model);
      KernelCost k;
      for (int u = 0; u < layout.num_units(); ++u)
        for (bool backward : {false, true})
          k.add(unit_kernel_cost(
              layout, u, backward, r.batch, r.seq, r.hw,
              recompute_at(r.recompute, r.recompute_blocks, layout.unit(u).layer), r.loss_chunk));
      res.kernel_cost = k;
      res.notes.push_back(fmt::format(
          "units priced by the kernel tables ({}): {} kernel calls per micro-step, {} at "
          "measured shapes, {} interpolated, {} at the ceilings (no shape of their kernel "
          "measured); {} ms of kernels per micro-step",
          hardware_kernels_text(*r.hw.kernels), k.calls, k.measured, k.interpolated, k.ceiling,
          num(k.ms)));
    }
  } else {
    TD_CHECK(r.max_gathered >= 1, "--max-gathered must be at least 1, got {}", r.max_gathered);
    if (!r.strategy.empty()) {
      res.strategies.push_back(plan_generate_strategy(r, r.strategy));
    } else {
      for (const std::string& n : plan_generate_strategies())
        res.strategies.push_back(plan_generate_strategy(r, n));
    }
  }
  res.recommended = recommend(res.strategies, train);
  if (res.recommended < 0) {
    res.why = nothing_fits(res);
    if (train) advise_recompute(res);
  } else {
    const StrategyPlan& s = res.strategies[static_cast<size_t>(res.recommended)];
    const bool only = res.strategies.size() == 1;
    if (train) {
      res.why =
          fmt::format("{} {} ({} ms, {} tokens/s, {} per rank); {}", s.name,
                      only ? "(the only strategy planned) fits" : "has the shortest step that fits",
                      num(s.step_ms), num(s.tokens_per_s), gib(s.peak_mem_bytes), s.bottleneck);
      const double exposed = s.step_ms > 0 ? s.exposed_comm_ms / s.step_ms : 0;
      const double gain = s.step_ms > 0 ? std::max(0.0, s.step_ms - s.min_step_ms) / s.step_ms : 0;
      res.overlap =
          gain < exposed - 0.005
              ? fmt::format(
                    "exposed communication is {} of the step, but the links are busy for {} of "
                    "its {} ms: perfect overlap gains at most {}",
                    pct(exposed), num(s.link_ms), num(s.step_ms), pct(gain))
              : fmt::format(
                    "exposed communication is {} of the step: perfect overlap gains at most {}",
                    pct(exposed), pct(std::min(gain, exposed)));
      advise_recompute(res);
    } else {
      const std::string rates =
          r.batch == 1 ? fmt::format("{} tok/s at batch 1", num(s.tokens_per_s))
                       : fmt::format("{} tok/s at batch {}, {} at batch 1", num(s.tokens_per_s),
                                     r.batch, num(s.tokens_per_s_batch1));
      res.why =
          fmt::format("{} {} ({}, {} per rank); {}", s.name,
                      only ? "(the only layout planned) fits" : "is the fastest layout that fits",
                      rates, gib(s.peak_mem_bytes), s.bottleneck);
    }
  }
  if (r.hw.links_ranks > 0 && r.hw.links_ranks != r.ranks)
    res.notes.push_back(fmt::format(
        "the links were measured at {} ranks and this plan is for {}: ring latency grows with "
        "the ranks, so probe at {} for a closer figure",
        r.hw.links_ranks, r.ranks, r.ranks));
  if (r.hw.name == "cpu-local" && r.hw.source == "preset cpu-local")
    res.notes.push_back(
        "cpu-local holds modest defaults; measure this machine with `tandem probe compute "
        "--save FILE` and `tandem probe links --save FILE`, then pass --compute and --links");
  return res;
}

std::string plan_format(const PlanResult& res) {
  const PlanRequest& r = res.request;
  const bool train = r.task == PlanTask::train;
  std::string out =
      fmt::format("plan: {} {} ({} parameters) on {} rank(s)\n", train ? "train" : "generate",
                  r.model.name, params(static_cast<double>(r.model.num_params())), r.ranks);
  out += "hardware: " + hardware_describe(r.hw) + "\n";
  if (train)
    out += fmt::format(
        "batch {} x seq {} x {} micro-step(s) per rank: {} tokens per step{}\n", r.batch, r.seq,
        r.micro_steps, static_cast<int64_t>(r.ranks) * r.batch * r.seq * r.micro_steps,
        recompute_text(r.recompute, r.recompute_blocks, r.model.n_layer) +
            (r.loss_chunk == 0 ? std::string()
                               : fmt::format(", loss in chunks of {} rows", r.loss_chunk)) +
            (r.reduce_dtype == DType::f32 ? "" : ", gradients reduced in bf16") +
            (r.update_at_gather ? ", each update at the unit's next gather" : ""));
  else
    out += fmt::format("batch {} sequence(s) decoded together, KV cache of {} tokens each\n",
                       r.batch, r.seq);
  out += "\n";
  if (train) {
    out +=
        fmt::format("{:<10} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "strategy", "fits",
                    "mem GiB", "step ms", "compute ms", "comm ms", "exposed ms", "tokens/s");
    for (const StrategyPlan& s : res.strategies)
      out += fmt::format("{:<10} {:>4} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}\n", s.name,
                         s.fits ? "yes" : "no", num(s.peak_mem_bytes / kGiB), num(s.step_ms),
                         num(s.compute_ms), num(s.comm_ms), num(s.exposed_comm_ms),
                         num(s.tokens_per_s));
  } else {
    // The column at the request's batch only when it is not 1.
    const bool both = r.batch != 1;
    auto at_b = [&](const std::string& v) { return both ? fmt::format(" {:>10}", v) : ""; };
    out += fmt::format("{:<10} {:>4} {:>10} {:>10}{} {:>10} {:>10} {:>10} {:>10}\n", "strategy",
                       "fits", "mem GiB", "tok/s b=1", at_b(fmt::format("tok/s b={}", r.batch)),
                       "step ms", "compute ms", "comm ms", "exposed ms");
    for (const StrategyPlan& s : res.strategies) {
      if (!s.applicable) {
        out += fmt::format("{:<10} {:>4} {:>10}\n", s.name, "-", "n/a");
        continue;
      }
      out += fmt::format("{:<10} {:>4} {:>10} {:>10}{} {:>10} {:>10} {:>10} {:>10}\n", s.name,
                         s.fits ? "yes" : "no", num(s.peak_mem_bytes / kGiB),
                         num(s.tokens_per_s_batch1), at_b(num(s.tokens_per_s)), num(s.step_ms),
                         num(s.compute_ms), num(s.comm_ms), num(s.exposed_comm_ms));
    }
  }
  out += "\n";
  for (const StrategyPlan& s : res.strategies) out += fmt::format("{}: {}\n", s.name, s.bottleneck);
  out += "\n";
  out += res.recommended >= 0
             ? fmt::format("recommended: {}\n",
                           res.strategies[static_cast<size_t>(res.recommended)].name)
             : "recommended: none\n";
  out += "why: " + res.why + "\n";
  if (!res.overlap.empty()) out += "overlap: " + res.overlap + "\n";
  for (const std::string& n : res.notes) out += "note: " + n + "\n";
  return out;
}

nlohmann::json plan_to_json(const PlanResult& res) {
  const PlanRequest& r = res.request;
  const bool train = r.task == PlanTask::train;
  nlohmann::json list = nlohmann::json::array();
  for (const StrategyPlan& s : res.strategies) {
    nlohmann::json j = {{"name", s.name},
                        {"applicable", s.applicable},
                        {"fits", s.fits},
                        {"peak_mem_bytes", s.peak_mem_bytes},
                        {"step_ms", s.step_ms},
                        {"tokens_per_s", s.tokens_per_s},
                        {"compute_ms", s.compute_ms},
                        {"comm_ms", s.comm_ms},
                        {"exposed_comm_ms", s.exposed_comm_ms},
                        {"gather_bytes", s.gather_bytes},
                        {"reduce_bytes", s.reduce_bytes},
                        {"all_reduce_bytes", s.all_reduce_bytes},
                        {"bottleneck", s.bottleneck}};
    if (train) {
      j["min_step_ms"] = s.min_step_ms;
      j["link_ms"] = s.link_ms;
    } else {
      j["tokens_per_s_batch1"] = s.tokens_per_s_batch1;
    }
    list.push_back(std::move(j));
  }
  nlohmann::json out = {
      {"task", train ? "train" : "generate"},
      {"model", r.model.name},
      {"ranks", r.ranks},
      {"batch", r.batch},
      {"seq", r.seq},
      {"hardware", hardware_to_json(r.hw)},
      {"strategies", std::move(list)},
      {"recommended",
       res.recommended >= 0
           ? nlohmann::json(res.strategies[static_cast<size_t>(res.recommended)].name)
           : nlohmann::json(nullptr)},
      {"why", res.why},
      {"notes", res.notes}};
  if (train) {
    out["micro_steps"] = r.micro_steps;
    out["recompute"] = recompute_name(r.recompute);
    out["recompute_blocks"] = r.recompute_blocks;
    out["loss_chunk"] = r.loss_chunk;
    out["reduce_dtype"] = std::string(dtype_name(r.reduce_dtype));
    out["update_at_gather"] = r.update_at_gather;
    out["overlap"] = res.overlap;
    out["kernel_cost"] = nullptr;
    if (res.kernel_cost) {
      const KernelCost& k = *res.kernel_cost;
      out["kernel_cost"] = {{"ms_per_micro_step", k.ms},
                            {"calls", k.calls},
                            {"measured", k.measured},
                            {"interpolated", k.interpolated},
                            {"ceiling", k.ceiling}};
    }
  }
  return out;
}

}  // namespace tandem
