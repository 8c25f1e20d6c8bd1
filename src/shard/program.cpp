// Building the step program of a strategy: the gather instances, their prefetch, the
// compute ops, the reduces, the arena plan and the waits that memory reuse needs.
#include "shard/program.h"

#include <algorithm>
#include <map>
#include <set>

#include "core/error.h"

namespace tandem {

Strategy strategy_parse(const std::string& name) {
  if (name == "full") return Strategy::full;
  if (name == "grad-op") return Strategy::grad_op;
  if (name == "none") return Strategy::none;
  if (name == "hybrid") return Strategy::hybrid;
  TD_THROW("unknown strategy '{}' (expected full, grad-op, none or hybrid)", name);
}

DType reduce_dtype_parse(const std::string& name) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  TD_THROW("--reduce-dtype must be f32 or bf16, got '{}'", name);
}

const char* strategy_name(Strategy s) {
  switch (s) {
    case Strategy::full:
      return "full";
    case Strategy::grad_op:
      return "grad-op";
    case Strategy::none:
      return "none";
    case Strategy::hybrid:
      return "hybrid";
  }
  return "?";
}

const char* stream_role_name(StreamRole r) {
  switch (r) {
    case StreamRole::compute:
      return "compute";
    case StreamRole::gather:
      return "all-gather";
    case StreamRole::reduce:
      return "reduce-scatter";
  }
  return "?";
}

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::zero_grad_shards:
      return "zero-grad-shards";
    case OpKind::gather:
      return "gather";
    case OpKind::forward:
      return "forward";
    case OpKind::backward:
      return "backward";
    case OpKind::reduce:
      return "reduce-scatter";
    case OpKind::replicate_reduce:
      return "replica-all-reduce";
    case OpKind::grad_norm:
      return "grad-norm";
    case OpKind::norm_reduce:
      return "norm-all-reduce";
    case OpKind::optimizer:
      return "adamw";
    case OpKind::update:
      return "update";
    case OpKind::last_rows:
      return "last-rows";
    case OpKind::advance:
      return "advance";
    case OpKind::sample:
      return "sample";
    case OpKind::send:
      return "send";
    case OpKind::recv:
      return "recv";
    case OpKind::tp_reduce:
      return "tp-all-reduce";
  }
  return "?";
}

namespace {

Op make_op(OpKind kind, StreamRole stream, int unit = -1, int micro = -1) {
  Op op;
  op.kind = kind;
  op.stream = stream;
  op.unit = unit;
  op.micro = micro;
  return op;
}

// Reachability over [Program order]: reach[i] holds bit j when op j happens before op i.
class Reach {
 public:
  explicit Reach(size_t n) : words_((n + 63) / 64), bits_(n * words_, 0) {}
  bool has(size_t i, size_t j) const { return (row(i)[j / 64] >> (j % 64)) & 1u; }
  // Computes row i from its predecessors (all earlier than i).
  void compute(size_t i, const std::vector<int>& preds) {
    uint64_t* r = row(i);
    for (int p : preds) {
      const uint64_t* q = row(static_cast<size_t>(p));
      for (size_t w = 0; w < words_; ++w) r[w] |= q[w];
      r[static_cast<size_t>(p) / 64] |= uint64_t{1} << (static_cast<size_t>(p) % 64);
    }
  }

 private:
  uint64_t* row(size_t i) { return bits_.data() + i * words_; }
  const uint64_t* row(size_t i) const { return bits_.data() + i * words_; }
  size_t words_;
  std::vector<uint64_t> bits_;
};

// Predecessors of op i: the previous op of its stream and the ops it waits for.
std::vector<int> predecessors(const std::vector<Op>& ops, size_t i, std::vector<int>& last_on) {
  std::vector<int> preds = ops[i].waits;
  int& last = last_on[static_cast<size_t>(ops[i].stream)];
  if (last >= 0) preds.push_back(last);
  last = static_cast<int>(i);
  return preds;
}

bool ranges_overlap(const Buffer& a, const Buffer& b) {
  return a.arena && b.arena && a.offset < b.offset + b.bytes && b.offset < a.offset + a.bytes;
}

// The units compute op of unit u reads (its own and, for the tied head, the embedding).
std::vector<int> needs(const ModelLayout& model, int u) {
  std::vector<int> n = {u};
  for (int r : model.reads(u)) n.push_back(r);
  std::sort(n.begin(), n.end());
  return n;
}

// [Embedding backward gathers nothing] The units whose gathered parameters a compute step of
// unit u reads: needs(u), but for the embedding's backward, which scatters the residual
// gradient into its gradient rows and reads no parameter. (It still writes the embedding's
// gradient: needs(u) says which gradients a backward writes.)
std::vector<int> param_reads(const ModelLayout& model, int u, OpKind kind) {
  if (kind == OpKind::backward && model.unit(u).kind == UnitKind::embedding) {
    std::vector<int> n = needs(model, u);
    n.erase(std::remove(n.begin(), n.end(), u), n.end());
    return n;
  }
  return needs(model, u);
}

struct Instance {
  int unit;
  int first_use, last_use;  // compute positions
  int buffer = -1;
  int gather_op = -1;
  int last_use_op = -1;
};

class Builder {
 public:
  Builder(const ModelLayout& model, const ProgramSpec& spec) : model_(model) {
    p_.spec = spec;
    validate();
  }

  Program build() {
    const int U = model_.num_units(), M = p_.spec.micro_steps;
    const FlatLayout flat(model_, p_.shard_size);
    for (int u = 0; u < U; ++u) {
      shard_param_.push_back(add_buffer(BufferKind::param_shard, u, 0, false, "param-shard"));
      // Sized, as the backward clears it under [Gradients in the shard]; persistent, not planned.
      shard_grad_.push_back(add_buffer(BufferKind::grad_shard, u,
                                       static_cast<size_t>(flat.unit(u).shard) * sizeof(float),
                                       false, "grad-shard"));
    }
    activations_ =
        add_buffer(BufferKind::activations, -1, p_.spec.activation_bytes, true, "activations");
    norm_ = add_buffer(BufferKind::norm, -1, sizeof(double), false, "norm");
    updated_.assign(static_cast<size_t>(U), false);
    p_.persistent_bytes = static_cast<size_t>(flat.shard_total()) * 4 * sizeof(float);

    // The compute sequence: per micro-step, forward over the units, then backward.
    for (int m = 0; m < M; ++m) {
      for (int u = 0; u < U; ++u) seq_.push_back({OpKind::forward, u, m});
      for (int u = U - 1; u >= 0; --u) seq_.push_back({OpKind::backward, u, m});
    }
    make_instances(flat);
    make_grad_periods();

    // Else each unit's first backward clears its shard. [Update at gather] The updates read
    // the last step's gradients, so there the clear waits for the last of them, before the
    // first reduce.
    if (!p_.grads_in_shard && !p_.spec.update_at_gather) emit_zero_grad_shards();
    issue_ready_gathers();
    for (size_t p = 0; p < seq_.size(); ++p) emit_compute(static_cast<int>(p), flat);
    emit_step_end();
    plan_memory();
    return std::move(p_);
  }

 private:
  struct Step {
    OpKind kind;
    int unit, micro;
  };

  void validate() {
    ProgramSpec& s = p_.spec;
    TD_CHECK(s.world >= 1, "world size {} must be at least 1", s.world);
    TD_CHECK(s.micro_steps >= 1, "micro-steps {} must be at least 1", s.micro_steps);
    TD_CHECK(s.reduce_slack >= 0, "reduce slack {} must not be negative", s.reduce_slack);
    switch (s.strategy) {
      case Strategy::full:
      case Strategy::grad_op:
        p_.shard_size = s.world;
        break;
      case Strategy::none:
        p_.shard_size = 1;
        break;
      case Strategy::hybrid:
        TD_CHECK(s.shard_group >= 1, "--strategy hybrid needs --shard-group G (ranks per group)");
        TD_CHECK(s.world % s.shard_group == 0, "--shard-group {} does not divide the world size {}",
                 s.shard_group, s.world);
        p_.shard_size = s.shard_group;
        break;
    }
    p_.replicas = s.world / p_.shard_size;
    // [Gradients in the shard] A shard group of one rank makes each shard the whole unit and
    // its reduce-scatter a copy. Accumulating into the shard gives the unsharded buffer's sums
    // where that buffer lives for the whole step (none, grad-op) or for the only micro-step;
    // with several windowed micro-steps the buffer is summed per micro-step and then added,
    // an order the shard alone would change. With bf16 reduction and no replicas the copy is
    // where the gradient is rounded (one rank rounds as many would), so it stays.
    p_.grads_in_shard = s.grads_in_shard && p_.shard_size == 1 &&
                        (!windowed() || s.micro_steps == 1) &&
                        (s.reduce_dtype == DType::f32 || p_.replicas > 1);
    if (windowed()) {
      size_t widest = 1;
      for (int u = 0; u < model_.num_units(); ++u)
        widest = std::max(widest, needs(model_, u).size());
      TD_CHECK(s.max_gathered >= static_cast<int>(widest),
               "--max-gathered {} is too small: a unit of this model reads {} units at once",
               s.max_gathered, widest);
    }
  }

  // full and hybrid gather per use and bound the units gathered at once; none and grad-op
  // keep every unit gathered for the whole step.
  bool windowed() const {
    return p_.spec.strategy == Strategy::full || p_.spec.strategy == Strategy::hybrid;
  }
  bool accumulate_locally() const { return !windowed(); }

  int add_buffer(BufferKind kind, int unit, size_t bytes, bool arena, const std::string& what) {
    Buffer b;
    b.kind = kind;
    b.unit = unit;
    b.bytes = bytes;
    b.arena = arena;
    b.name = unit >= 0 ? fmt::format("{}[{}]", what, model_.unit(unit).name) : what;
    p_.buffers.push_back(b);
    return static_cast<int>(p_.buffers.size()) - 1;
  }

  // Gathered copies: one per run of consecutive compute positions that read the unit
  // (windowed), or one per unit for the whole step.
  void make_instances(const FlatLayout& flat) {
    const int U = model_.num_units();
    std::vector<std::vector<int>> uses(static_cast<size_t>(U));
    for (size_t p = 0; p < seq_.size(); ++p)
      for (int u : param_reads(model_, seq_[p].unit, seq_[p].kind))
        uses[static_cast<size_t>(u)].push_back(static_cast<int>(p));
    for (int u = 0; u < U; ++u) {
      const auto& us = uses[static_cast<size_t>(u)];
      size_t i = 0;
      while (i < us.size()) {
        size_t j = i;
        if (windowed()) {
          while (j + 1 < us.size() && us[j + 1] == us[j] + 1) ++j;
        } else {
          j = us.size() - 1;
        }
        Instance in{u, us[i], us[j]};
        const int copy = static_cast<int>(instances_of_[u].size());
        in.buffer = add_buffer(BufferKind::gathered, u,
                               static_cast<size_t>(flat.unit(u).padded) * p_.spec.param_bytes, true,
                               fmt::format("gathered#{}", copy));
        instances_of_[u].push_back(static_cast<int>(instances_.size()));
        instances_.push_back(in);
        i = j + 1;
      }
    }
    std::stable_sort(
        instances_.begin(), instances_.end(), [](const Instance& a, const Instance& b) {
          return a.first_use != b.first_use ? a.first_use < b.first_use : a.unit < b.unit;
        });
  }

  // Unsharded gradient buffers: per unit per micro-step (windowed), or per unit for the
  // whole step (accumulated locally, reduced once).
  void make_grad_periods() {
    const int U = model_.num_units(), M = p_.spec.micro_steps;
    const int periods = accumulate_locally() ? 1 : M;
    grad_buf_.assign(static_cast<size_t>(U), std::vector<int>(static_cast<size_t>(periods), -1));
    last_writer_pos_ = grad_buf_;
    for (size_t p = 0; p < seq_.size(); ++p) {
      if (seq_[p].kind != OpKind::backward) continue;
      const int period = accumulate_locally() ? 0 : seq_[p].micro;
      for (int u : needs(model_, seq_[p].unit))
        last_writer_pos_[static_cast<size_t>(u)][static_cast<size_t>(period)] = static_cast<int>(p);
    }
  }

  int emit(Op op) {
    // Keep only the latest wait per other stream; same-stream waits are implied.
    std::map<StreamRole, int> latest;
    for (int w : op.waits)
      if (p_.ops[static_cast<size_t>(w)].stream != op.stream)
        latest[p_.ops[static_cast<size_t>(w)].stream] =
            std::max(latest[p_.ops[static_cast<size_t>(w)].stream], w);
    op.waits.clear();
    for (auto& [s, w] : latest) op.waits.push_back(w);
    p_.ops.push_back(std::move(op));
    return static_cast<int>(p_.ops.size()) - 1;
  }

  // [Program order] A gather is issued as early as the window allows: instance j once
  // the compute op that last uses instance j - K has been issued, waiting on it.
  void issue_ready_gathers() {
    const int K = windowed() ? p_.spec.max_gathered : static_cast<int>(instances_.size());
    while (next_gather_ < instances_.size()) {
      const size_t j = next_gather_;
      Op g = make_op(OpKind::gather, StreamRole::gather, instances_[j].unit);
      if (j >= static_cast<size_t>(K)) {
        const Instance& freed = instances_[j - static_cast<size_t>(K)];
        if (freed.last_use_op < 0) return;  // its last use is not issued yet
        g.waits.push_back(freed.last_use_op);
      }
      g.micro = seq_[static_cast<size_t>(instances_[j].first_use)].micro;
      const int u = instances_[j].unit;
      if (p_.spec.update_at_gather && !updated_[static_cast<size_t>(u)]) {
        // [Update at gather] The unit's last update first, on the same stream, so the gather
        // reads the updated shard; the gather's own waits hold back the update too.
        Op up = make_op(OpKind::update, StreamRole::gather, u);
        up.waits = g.waits;
        up.reads = {shard_grad_[static_cast<size_t>(u)], norm_,
                    shard_param_[static_cast<size_t>(u)]};
        up.writes = {shard_param_[static_cast<size_t>(u)]};
        last_update_ = emit(std::move(up));
        updated_[static_cast<size_t>(u)] = true;
      }
      g.reads.push_back(shard_param_[static_cast<size_t>(instances_[j].unit)]);
      g.writes.push_back(instances_[j].buffer);
      instances_[j].gather_op = emit(std::move(g));
      ++next_gather_;
    }
  }

  Instance& instance_at(int unit, int pos) {
    for (Instance& in : instances_)
      if (in.unit == unit && in.first_use <= pos && pos <= in.last_use) return in;
    TD_THROW("no gathered instance of unit {} at position {}", unit, pos);
  }

  void emit_compute(int pos, const FlatLayout& flat) {
    const Step& s = seq_[static_cast<size_t>(pos)];
    Op op = make_op(s.kind, StreamRole::compute, s.unit, s.micro);
    for (int u : param_reads(model_, s.unit, s.kind)) {
      Instance& in = instance_at(u, pos);
      TD_CHECK(in.gather_op >= 0, "gather of unit {} not issued before its use", u);
      op.waits.push_back(in.gather_op);
      op.reads.push_back(in.buffer);
      op.params.push_back({u, in.buffer});
    }
    op.reads.push_back(activations_);
    op.writes.push_back(activations_);
    std::vector<int> reduce_now;
    if (s.kind == OpKind::backward) {
      const size_t period = accumulate_locally() ? 0 : static_cast<size_t>(s.micro);
      for (int u : needs(model_, s.unit)) {
        int& g = grad_buf_[static_cast<size_t>(u)][period];
        if (g < 0) {
          g = p_.grads_in_shard
                  ? shard_grad_[static_cast<size_t>(u)]
                  : add_buffer(BufferKind::grad_full, u,
                               static_cast<size_t>(flat.unit(u).padded) * p_.spec.grad_bytes, true,
                               fmt::format("grad#{}", period));
          op.zero_first.push_back(g);
        }
        op.writes.push_back(g);
        op.grads.push_back({u, g});
        if (last_writer_pos_[static_cast<size_t>(u)][period] == pos) reduce_now.push_back(u);
      }
    }
    const int index = emit(std::move(op));
    compute_ops_.push_back(index);
    for (Instance& in : instances_)
      if (in.last_use == pos) in.last_use_op = index;
    for (int u : reduce_now) emit_reduce(u, index, s.micro);
    issue_ready_gathers();
  }

  void emit_zero_grad_shards() {
    Op zero = make_op(OpKind::zero_grad_shards, StreamRole::reduce);
    zero.writes = shard_grad_;
    if (last_update_ >= 0) zero.waits.push_back(last_update_);
    zero_emitted_ = true;
    emit(std::move(zero));
  }

  void emit_reduce(int u, int backward_op, int micro) {
    if (!p_.grads_in_shard && !zero_emitted_) emit_zero_grad_shards();
    if (!p_.grads_in_shard) {
      const size_t period = accumulate_locally() ? 0 : static_cast<size_t>(micro);
      const int g = grad_buf_[static_cast<size_t>(u)][period];
      Op r = make_op(OpKind::reduce, StreamRole::reduce, u, micro);
      r.waits.push_back(backward_op);
      r.reads.push_back(g);
      r.reads.push_back(shard_grad_[static_cast<size_t>(u)]);
      r.writes.push_back(shard_grad_[static_cast<size_t>(u)]);
      const int index = emit(std::move(r));
      reduce_of_buffer_[g] = index;
    }
    const bool last_period = accumulate_locally() || micro == p_.spec.micro_steps - 1;
    if (p_.replicas > 1 && last_period) {
      Op a = make_op(OpKind::replicate_reduce, StreamRole::reduce, u, micro);
      // After a reduce the reduce stream's order covers the backward; without one, a wait.
      if (p_.grads_in_shard) a.waits.push_back(backward_op);
      a.reads.push_back(shard_grad_[static_cast<size_t>(u)]);
      a.writes.push_back(shard_grad_[static_cast<size_t>(u)]);
      emit(std::move(a));
    }
  }

  void emit_step_end() {
    Op norm = make_op(OpKind::grad_norm, StreamRole::compute);
    for (size_t i = p_.ops.size(); i-- > 0;)  // after the last reduce-stream op
      if (p_.ops[i].stream == StreamRole::reduce) {
        norm.waits = {static_cast<int>(i)};
        break;
      }
    norm.reads = shard_grad_;
    norm.writes = {norm_};
    const int n = emit(std::move(norm));
    Op red = make_op(OpKind::norm_reduce, StreamRole::reduce);
    red.waits = {n};
    red.reads = {norm_};
    red.writes = {norm_};
    const int r = emit(std::move(red));
    if (p_.spec.update_at_gather) return;  // the next step's gathers update the shards
    Op opt = make_op(OpKind::optimizer, StreamRole::compute);
    opt.waits = {r};
    opt.reads = shard_grad_;
    opt.reads.push_back(norm_);
    opt.writes = shard_param_;
    emit(std::move(opt));
  }

  // Lifetimes, the arena plan, then the waits of [Memory reuse].
  void plan_memory() {
    const int last = static_cast<int>(p_.ops.size()) - 1;
    for (size_t i = 0; i < p_.ops.size(); ++i) {
      for (int b : p_.ops[i].reads) touch(b, static_cast<int>(i));
      for (int b : p_.ops[i].writes) touch(b, static_cast<int>(i));
    }
    p_.buffers[static_cast<size_t>(activations_)].first = 0;
    p_.buffers[static_cast<size_t>(activations_)].last = last;
    for (auto& [buffer, reduce] : reduce_of_buffer_) {
      // Keep the gradient buffer `reduce_slack` compute ops past its reduce.
      auto it = std::upper_bound(compute_ops_.begin(), compute_ops_.end(), reduce);
      const int ahead =
          std::min<int>(p_.spec.reduce_slack, static_cast<int>(compute_ops_.end() - it)) - 1;
      const int release = ahead >= 0 ? *(it + ahead) : last;
      Buffer& b = p_.buffers[static_cast<size_t>(buffer)];
      b.last = std::max(b.last, std::max(release, reduce));
    }
    ArenaPlanner planner(256);
    std::vector<int> planned;
    for (size_t b = 0; b < p_.buffers.size(); ++b) {
      const Buffer& buf = p_.buffers[b];
      if (!buf.arena || buf.bytes == 0) continue;
      planner.add(buf.name, buf.bytes, buf.first, buf.last);
      planned.push_back(static_cast<int>(b));
    }
    p_.plan = planner.solve();
    for (size_t i = 0; i < planned.size(); ++i)
      p_.buffers[static_cast<size_t>(planned[i])].offset = p_.plan.offsets[i];
    p_.arena_bytes = p_.plan.total_bytes;
    insert_reuse_waits();
  }

  void touch(int b, int op) {
    Buffer& buf = p_.buffers[static_cast<size_t>(b)];
    buf.first = buf.first < 0 ? op : std::min(buf.first, op);
    buf.last = std::max(buf.last, op);
  }

  void insert_reuse_waits() {
    const size_t n = p_.ops.size();
    // Ops touching each buffer.
    std::vector<std::vector<int>> touched(p_.buffers.size());
    for (size_t i = 0; i < n; ++i) {
      for (int b : p_.ops[i].reads) touched[static_cast<size_t>(b)].push_back(static_cast<int>(i));
      for (int b : p_.ops[i].writes) touched[static_cast<size_t>(b)].push_back(static_cast<int>(i));
    }
    // Arena buffers by the op that first touches them.
    std::vector<std::vector<int>> starting(n);
    for (size_t b = 0; b < p_.buffers.size(); ++b)
      if (p_.buffers[b].arena && p_.buffers[b].first >= 0)
        starting[static_cast<size_t>(p_.buffers[b].first)].push_back(static_cast<int>(b));
    Reach reach(n);
    std::vector<int> last_on(kStreamRoles, -1);
    for (size_t i = 0; i < n; ++i) {
      // Does op a already happen before op i through i's stream or its waits?
      const int prev = last_on[static_cast<size_t>(p_.ops[i].stream)];
      auto ordered = [&](int a) {
        std::vector<int> preds = p_.ops[i].waits;
        if (prev >= 0) preds.push_back(prev);
        for (int q : preds)
          if (q == a || reach.has(static_cast<size_t>(q), static_cast<size_t>(a))) return true;
        return false;
      };
      for (int y : starting[i]) {
        const Buffer& Y = p_.buffers[static_cast<size_t>(y)];
        for (size_t x = 0; x < p_.buffers.size(); ++x) {
          const Buffer& X = p_.buffers[x];
          if (static_cast<int>(x) == y || !ranges_overlap(X, Y) || X.last >= Y.first) continue;
          for (int a : touched[x])
            if (a != static_cast<int>(i) && !ordered(a)) p_.ops[i].waits.push_back(a);
        }
      }
      std::sort(p_.ops[i].waits.begin(), p_.ops[i].waits.end());
      p_.ops[i].waits.erase(std::unique(p_.ops[i].waits.begin(), p_.ops[i].waits.end()),
                            p_.ops[i].waits.end());
      reach.compute(i, predecessors(p_.ops, i, last_on));
    }
  }

  const ModelLayout& model_;
  Program p_;
  std::vector<Step> seq_;
  std::vector<Instance> instances_;
  std::map<int, std::vector<int>> instances_of_;
  size_t next_gather_ = 0;
  std::vector<int> shard_param_, shard_grad_, compute_ops_;
  std::vector<std::vector<int>> grad_buf_, last_writer_pos_;
  std::map<int, int> reduce_of_buffer_;
  int activations_ = -1, norm_ = -1;
  std::vector<bool> updated_;  // [Update at gather] units whose update is issued
  int last_update_ = -1;
  bool zero_emitted_ = false;
};

}  // namespace

Program program_build(const ModelLayout& model, const ProgramSpec& spec) {
  Program p = Builder(model, spec).build();
#ifndef NDEBUG
  program_check(model, p);  // debug builds prove every program they build
#endif
  return p;
}

namespace {

[[noreturn]] void violation(const ModelLayout& model, const Program& p, const std::string& what,
                            int a, int b = -1) {
  auto describe = [&](int i) {
    const Op& op = p.ops[static_cast<size_t>(i)];
    return fmt::format("op {} ({} {}{} on {})", i, op_kind_name(op.kind),
                       op.unit >= 0 ? model.unit(op.unit).name : "step",
                       op.micro >= 0 ? fmt::format(" m{}", op.micro) : "",
                       stream_role_name(op.stream));
  };
  TD_THROW("step program of strategy {} at {} ranks is unsafe: {}: {}{}",
           strategy_name(p.spec.strategy), p.spec.world, what, describe(a),
           b >= 0 ? fmt::format(" and {}", describe(b)) : std::string());
}

// Tensor-parallel inference: a block split into parts leaves partial sums, so the next
// reader of each part's output must come after its all-reduce: a sequential block's
// attention part is reduced before its MLP part runs, and every block's MLP part is reduced
// before the next op that is not a reduce.
void check_tp_reduces(const ModelLayout& model, const Program& p) {
  bool split = false;
  for (const Op& op : p.ops) split = split || op.kind == OpKind::tp_reduce;
  if (!split) return;
  const bool sequential = model.config().residual == ResidualKind::sequential;
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const Op& op = p.ops[i];
    if (op.kind != OpKind::forward || op.part == 0) continue;
    const bool must = op.part == 2 || sequential;
    const bool reduced = i + 1 < p.ops.size() && p.ops[i + 1].kind == OpKind::tp_reduce &&
                         p.ops[i + 1].unit == op.unit && p.ops[i + 1].part == op.part;
    if (must && !reduced)
      violation(model, p,
                fmt::format("the partial sums of part {} of {} are read before their all-reduce",
                            op.part, model.unit(op.unit).name),
                static_cast<int>(i));
  }
}

// The optimizer runs once per step: one AdamW op at the end, or ([Update at gather]) one
// update per unit that comes before everything that reads its parameters or replaces what it
// reads: the unit's gathers, this step's writes of its gradients, and the new norm.
template <class HappensBefore>
void check_updates(const ModelLayout& model, const Program& p, const HappensBefore& hb) {
  const size_t n = p.ops.size();
  const int U = model.num_units();
  std::vector<int> update(static_cast<size_t>(U), -1);
  int optimizers = 0;
  for (size_t i = 0; i < n; ++i) {
    const Op& op = p.ops[i];
    if (op.kind == OpKind::optimizer) ++optimizers;
    if (op.kind != OpKind::update) continue;
    if (!p.spec.update_at_gather)
      violation(model, p, "a unit is updated at its gather in a program that updates at its end",
                static_cast<int>(i));
    if (update[static_cast<size_t>(op.unit)] >= 0)
      violation(model, p, "a unit is updated twice", update[static_cast<size_t>(op.unit)],
                static_cast<int>(i));
    update[static_cast<size_t>(op.unit)] = static_cast<int>(i);
  }
  if (optimizers != (p.spec.update_at_gather ? 0 : 1))
    TD_THROW("step program is unsafe: {} optimizer ops, expected {}", optimizers,
             p.spec.update_at_gather ? 0 : 1);
  if (!p.spec.update_at_gather) return;
  for (int u = 0; u < U; ++u)
    if (update[static_cast<size_t>(u)] < 0)
      TD_THROW("step program is unsafe: unit {} is never updated", model.unit(u).name);
  for (size_t i = 0; i < n; ++i) {
    const Op& op = p.ops[i];
    auto must_follow = [&](int u, const char* what) {
      const int up = update[static_cast<size_t>(u)];
      if (!hb(up, static_cast<int>(i)))
        violation(model, p, fmt::format("{} is not after the unit's update", what),
                  static_cast<int>(i), up);
    };
    switch (op.kind) {
      case OpKind::gather:
        must_follow(op.unit, "a gather");
        break;
      case OpKind::backward:
        for (const UnitBuffer& g : op.grads) must_follow(g.unit, "a gradient write");
        break;
      case OpKind::reduce:
      case OpKind::replicate_reduce:
        must_follow(op.unit, "a gradient write");
        break;
      case OpKind::zero_grad_shards:
      case OpKind::grad_norm:
        for (int u = 0; u < U; ++u) must_follow(u, op_kind_name(op.kind));
        break;
      default:
        break;
    }
  }
}

}  // namespace

void program_check(const ModelLayout& model, const Program& p) {
  const size_t n = p.ops.size();
  // Happens-before, computed afresh from the ops alone.
  Reach reach(n);
  std::vector<int> last_on(kStreamRoles, -1);
  for (size_t i = 0; i < n; ++i) {
    for (int w : p.ops[i].waits)
      if (w < 0 || static_cast<size_t>(w) >= i)
        violation(model, p, fmt::format("a wait on op {} that is not earlier", w),
                  static_cast<int>(i));
    reach.compute(i, predecessors(p.ops, i, last_on));
  }
  auto hb = [&](int a, int b) { return reach.has(static_cast<size_t>(b), static_cast<size_t>(a)); };

  struct Access {
    int op;
    bool write;
  };
  std::vector<std::vector<Access>> acc(p.buffers.size());
  for (size_t i = 0; i < n; ++i) {
    for (int b : p.ops[i].reads)
      acc[static_cast<size_t>(b)].push_back({static_cast<int>(i), false});
    for (int b : p.ops[i].writes)
      acc[static_cast<size_t>(b)].push_back({static_cast<int>(i), true});
  }
  // Any two accesses of the same bytes, one a write, are ordered: reads follow their
  // writes, and nothing overwrites bytes a reader may still be reading.
  auto check_pair = [&](const std::vector<Access>& xs, const std::vector<Access>& ys,
                        const char* what) {
    for (const Access& x : xs)
      for (const Access& y : ys) {
        if (x.op == y.op || !(x.write || y.write)) continue;
        const int a = std::min(x.op, y.op), b = std::max(x.op, y.op);
        if (!hb(a, b)) violation(model, p, what, a, b);
      }
  };
  for (size_t b = 0; b < p.buffers.size(); ++b)
    check_pair(acc[b], acc[b], fmt::format("unordered accesses to {}", p.buffers[b].name).c_str());
  for (size_t x = 0; x < p.buffers.size(); ++x)
    for (size_t y = x + 1; y < p.buffers.size(); ++y)
      if (ranges_overlap(p.buffers[x], p.buffers[y]))
        check_pair(acc[x], acc[y],
                   fmt::format("unordered accesses to shared arena bytes of {} and {}",
                               p.buffers[x].name, p.buffers[y].name)
                       .c_str());
  arena_plan_verify(p.plan);

  // Arena buffers (and a pipeline stage's boundaries) are written before they are read, by
  // the right kind of op.
  for (size_t b = 0; b < p.buffers.size(); ++b) {
    const Buffer& buf = p.buffers[b];
    // Shard-held gradients ([Gradients in the shard]) are written first as unsharded ones are.
    const bool held = p.grads_in_shard && buf.kind == BufferKind::grad_shard;
    if (!(buf.arena || buf.kind == BufferKind::boundary || held) || acc[b].empty() ||
        buf.kind == BufferKind::activations)
      continue;
    // [Update at gather] An update reads the gradients of the last step, not this one's.
    const auto mine = std::find_if(acc[b].begin(), acc[b].end(), [&](const Access& a) {
      return p.ops[static_cast<size_t>(a.op)].kind != OpKind::update;
    });
    if (mine == acc[b].end()) continue;
    const Access& first = *mine;
    const Op& op = p.ops[static_cast<size_t>(first.op)];
    if (!first.write)
      violation(model, p, fmt::format("{} is read before anything writes it", buf.name), first.op);
    if (buf.kind == BufferKind::gathered && !(op.kind == OpKind::gather && op.unit == buf.unit))
      violation(model, p,
                fmt::format("{} is first written by something other than its gather", buf.name),
                first.op);
    if ((buf.kind == BufferKind::grad_full || held) &&
        std::find(op.zero_first.begin(), op.zero_first.end(), static_cast<int>(b)) ==
            op.zero_first.end())
      violation(model, p, fmt::format("{} is accumulated into without being cleared", buf.name),
                first.op);
  }

  // Every compute op sees a gathered copy of each unit it reads.
  for (size_t i = 0; i < n; ++i) {
    const Op& op = p.ops[i];
    if (op.kind != OpKind::forward && op.kind != OpKind::backward) continue;
    for (int u : param_reads(model, op.unit, op.kind)) {
      bool ok = false;
      for (const UnitBuffer& ub : op.params) {
        const Buffer& buf = p.buffers[static_cast<size_t>(ub.buffer)];
        const bool whole = buf.kind == BufferKind::gathered ||
                           (p.spec.inference && buf.kind == BufferKind::params);
        ok = ok || (ub.unit == u && whole && buf.unit == u &&
                    std::find(op.reads.begin(), op.reads.end(), ub.buffer) != op.reads.end());
      }
      if (!ok)
        violation(model, p,
                  fmt::format("unit {} is used without being gathered", model.unit(u).name),
                  static_cast<int>(i));
    }
  }

  if (p.spec.inference) {
    for (const Op& op : p.ops)
      TD_CHECK(op.kind == OpKind::forward || op.kind == OpKind::last_rows ||
                   op.kind == OpKind::advance || op.kind == OpKind::sample ||
                   op.kind == OpKind::gather || op.kind == OpKind::tp_reduce ||
                   op.kind == OpKind::send || op.kind == OpKind::recv,
               "an inference program holds a {} op", op_kind_name(op.kind));
    check_tp_reduces(model, p);
    return;
  }
  check_updates(model, p, hb);
  // Each unit's gradients are reduced exactly once per period, after every write; or, with
  // [Gradients in the shard], never, each unit's shard cleared by the first op that writes it.
  const bool local = p.spec.strategy == Strategy::none || p.spec.strategy == Strategy::grad_op;
  const int periods = p.grads_in_shard ? 0 : local ? 1 : p.spec.micro_steps;
  if (p.grads_in_shard) {
    if (p.shard_size != 1)
      TD_THROW("step program is unsafe: gradients accumulate in shards of {} ranks", p.shard_size);
    for (const Buffer& buf : p.buffers)
      if (buf.kind == BufferKind::grad_full)
        TD_THROW("step program is unsafe: {} exists beside gradients kept in the shards", buf.name);
  }
  std::vector<int> reduces(static_cast<size_t>(model.num_units()), 0),
      replicated(static_cast<size_t>(model.num_units()), 0);
  for (size_t i = 0; i < n; ++i) {
    const Op& op = p.ops[i];
    if (op.kind == OpKind::replicate_reduce) ++replicated[static_cast<size_t>(op.unit)];
    if (op.kind != OpKind::reduce) continue;
    ++reduces[static_cast<size_t>(op.unit)];
    for (int b : op.reads) {
      const Buffer& buf = p.buffers[static_cast<size_t>(b)];
      if (buf.kind != BufferKind::grad_full) continue;
      if (buf.unit != op.unit)
        violation(model, p, "a reduce reads another unit's gradients", static_cast<int>(i));
      for (const Access& a : acc[static_cast<size_t>(b)])
        if (a.write && a.op > static_cast<int>(i))
          violation(model, p, fmt::format("{} is written after its reduce", buf.name),
                    static_cast<int>(i), a.op);
    }
  }
  for (int u = 0; u < model.num_units(); ++u) {
    const int r = reduces[static_cast<size_t>(u)], rr = replicated[static_cast<size_t>(u)];
    if (r != periods)
      TD_THROW(
          "step program of strategy {} at {} ranks is unsafe: unit {} is reduced {} times "
          "per step, expected {}",
          strategy_name(p.spec.strategy), p.spec.world, model.unit(u).name, r, periods);
    if (rr != (p.replicas > 1 ? 1 : 0))
      TD_THROW(
          "step program of strategy {} at {} ranks is unsafe: unit {} is all-reduced across "
          "replicas {} times, expected {}",
          strategy_name(p.spec.strategy), p.spec.world, model.unit(u).name, rr,
          p.replicas > 1 ? 1 : 0);
  }
  for (size_t b = 0; b < p.buffers.size(); ++b)
    if (p.buffers[b].kind == BufferKind::grad_full) {
      int readers = 0;
      for (const Access& a : acc[b])
        readers += !a.write && p.ops[static_cast<size_t>(a.op)].kind == OpKind::reduce;
      if (readers != 1)
        TD_THROW("step program is unsafe: {} is reduced {} times", p.buffers[b].name, readers);
    }
}

FreshGrads fresh_grads(const ModelLayout& model, const Program& p, const Op& op, bool fresh) {
  FreshGrads f;
  if (op.zero_first.empty()) return f;
  f.units.assign(static_cast<size_t>(model.num_units()), false);
  for (int b : op.zero_first) {
    const auto ub = std::find_if(op.grads.begin(), op.grads.end(),
                                 [b](const UnitBuffer& g) { return g.buffer == b; });
    TD_CHECK(ub != op.grads.end(), "op clears buffer {}, which holds none of its gradients", b);
    const size_t bytes = p.buffers.at(static_cast<size_t>(b)).bytes;
    if (!fresh) {
      f.clear.push_back({b, 0, bytes});
      continue;
    }
    f.units[static_cast<size_t>(ub->unit)] = true;
    const size_t elements =
        static_cast<size_t>(model.unit(ub->unit).numel) * static_cast<size_t>(p.spec.grad_bytes);
    TD_CHECK(elements <= bytes, "gradient buffer {} of {} bytes is smaller than unit {} ({} bytes)",
             b, bytes, model.unit(ub->unit).name, elements);
    if (elements < bytes) f.clear.push_back({b, elements, bytes - elements});
  }
  return f;
}

std::vector<FreshGrads> fresh_grads_by_op(const ModelLayout& model, const Program& p, bool fresh) {
  std::vector<FreshGrads> all;
  all.reserve(p.ops.size());
  for (const Op& op : p.ops) all.push_back(fresh_grads(model, p, op, fresh));
  return all;
}

bool reduce_adds_to_shard(const Program& p, const Op& op) {
  const Strategy s = p.spec.strategy;
  return op.kind == OpKind::reduce && op.micro > 0 &&
         (s == Strategy::full || s == Strategy::hybrid);
}

ReduceScratch reduce_scratch(const FlatLayout& flat, const Program& p) {
  bool adds = false, reduces = false, replicates = false;
  for (const Op& op : p.ops) {
    reduces = reduces || op.kind == OpKind::reduce;
    replicates = replicates || op.kind == OpKind::replicate_reduce;
    adds = adds || reduce_adds_to_shard(p, op);
  }
  ReduceScratch r;
  if (p.spec.reduce_dtype == DType::f32) {
    r.f32_shard = adds ? flat.largest_shard() : 0;
  } else {
    r.bf16_unit = reduces ? flat.largest_padded() : 0;
    r.bf16_shard = reduces || replicates ? flat.largest_shard() : 0;
  }
  return r;
}

std::string program_print(const ModelLayout& model, const Program& p) {
  std::string out = fmt::format(
      "step program: strategy {}, {} rank(s), shard group {}, {} replica(s), {} micro-step(s), "
      "max gathered {}{}\n",
      strategy_name(p.spec.strategy), p.spec.world, p.shard_size, p.replicas, p.spec.micro_steps,
      p.spec.max_gathered, p.spec.reduce_dtype == DType::f32 ? "" : ", gradients reduced in bf16");
  auto names = [&](const std::vector<int>& ids) {
    std::string s;
    for (int b : ids)
      s += fmt::format("{}{}", s.empty() ? "" : ", ", p.buffers[static_cast<size_t>(b)].name);
    return s;
  };
  for (size_t i = 0; i < p.ops.size(); ++i) {
    const Op& op = p.ops[i];
    std::string waits;
    for (int w : op.waits) waits += fmt::format("{}{}", waits.empty() ? "" : " ", w);
    out +=
        fmt::format("{:5}  {:<14} {:<18} {:<10} {:<3} waits [{}]", i, stream_role_name(op.stream),
                    op_kind_name(op.kind), op.unit >= 0 ? model.unit(op.unit).name : "-",
                    op.micro >= 0 ? fmt::format("m{}", op.micro) : "-", waits);
    std::vector<int> reads;
    for (int b : op.reads)
      if (p.buffers[static_cast<size_t>(b)].kind != BufferKind::activations) reads.push_back(b);
    std::vector<int> writes;
    for (int b : op.writes)
      if (p.buffers[static_cast<size_t>(b)].kind != BufferKind::activations) writes.push_back(b);
    if (op.kind == OpKind::zero_grad_shards || op.kind == OpKind::grad_norm ||
        op.kind == OpKind::optimizer || op.kind == OpKind::update) {
      reads.clear();
      writes.clear();
    }
    if (!reads.empty()) out += fmt::format("  reads {}", names(reads));
    if (!writes.empty()) out += fmt::format("  writes {}", names(writes));
    out += "\n";
  }
  out += "arena:\n";
  for (const Buffer& b : p.buffers)
    if (b.arena && b.bytes > 0)
      out += fmt::format("  {:<28} offset {:>12}  bytes {:>12}  live ops {}..{}\n", b.name,
                         b.offset, b.bytes, b.first, b.last);
  out += fmt::format(
      "memory per rank: arena {:.1f} MiB + shards (params, grads, AdamW) {:.1f} MiB = "
      "{:.1f} MiB\n",
      static_cast<double>(p.arena_bytes) / (1 << 20),
      static_cast<double>(p.persistent_bytes) / (1 << 20),
      static_cast<double>(p.peak_bytes()) / (1 << 20));
  return out;
}

}  // namespace tandem
