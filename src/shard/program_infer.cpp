// The programs of cached inference (program.h, "The programs of cached inference"): the
// same ops, buffers, arena plan and checker as the training step, for every inference
// layout.
#include <fmt/format.h>

#include "core/error.h"
#include "shard/program.h"

namespace tandem {

InferLayout infer_layout_parse(const std::string& name) {
  if (name == "replicate") return InferLayout::replicate;
  if (name == "fsdp") return InferLayout::fsdp;
  if (name == "tp") return InferLayout::tp;
  if (name == "pipeline") return InferLayout::pipeline;
  TD_THROW("unknown inference layout '{}' (expected replicate, fsdp, tp or pipeline)", name);
}

const char* infer_layout_name(InferLayout l) {
  switch (l) {
    case InferLayout::replicate:
      return "replicate";
    case InferLayout::fsdp:
      return "fsdp";
    case InferLayout::tp:
      return "tp";
    case InferLayout::pipeline:
      return "pipeline";
  }
  return "?";
}

std::vector<int> pipeline_stages(const ModelLayout& model, int stages) {
  const int U = model.num_units(), L = model.config().n_layer;
  TD_CHECK(stages >= 1, "a pipeline of {} stages", stages);
  TD_CHECK(stages <= L,
           "a pipeline over {} ranks needs a block for every rank, and the model has {} blocks: "
           "use at most {} ranks (or another --strategy)",
           stages, L, L);
  // What a decode step reads of each unit: the blocks' and the head's parameters (a tied head
  // reads the embedding's table), nothing of the embedding's.
  std::vector<double> cost(static_cast<size_t>(U), 0.0);
  for (int u = 1; u < U; ++u) {
    cost[static_cast<size_t>(u)] = static_cast<double>(model.unit(u).numel);
    for (int r : model.reads(u))
      cost[static_cast<size_t>(u)] += static_cast<double>(model.unit(r).numel);
  }
  double total = 0;
  for (double c : cost) total += c;
  // Greedy cuts at the running share of the total, keeping a block for every later stage.
  std::vector<int> starts{0};
  double acc = 0;
  for (int u = 0; u < U - 1 && static_cast<int>(starts.size()) < stages; ++u) {
    acc += cost[static_cast<size_t>(u)];
    const int s = static_cast<int>(starts.size());  // the stage a cut after u would begin
    const int blocks_left = L - u;                  // blocks u + 1 .. L
    const bool has_block = u >= 1;  // the current stage (units starts.back() .. u) has a block
    const bool must = blocks_left == stages - s;
    const bool enough = blocks_left >= stages - s;
    if (has_block && enough &&
        (must || acc >= total * s / stages - 0.5 * cost[static_cast<size_t>(u)]))
      starts.push_back(u + 1);
  }
  TD_CHECK(static_cast<int>(starts.size()) == stages, "internal: {} pipeline stages of {}",
           starts.size(), stages);
  starts.push_back(U);
  return starts;
}

std::vector<bool> pipeline_units(const ModelLayout& model, int stages, int stage) {
  const std::vector<int> starts = pipeline_stages(model, stages);
  TD_CHECK(stage >= 0 && stage < stages, "pipeline stage {} of {}", stage, stages);
  std::vector<bool> held(static_cast<size_t>(model.num_units()), false);
  for (int u = starts[static_cast<size_t>(stage)]; u < starts[static_cast<size_t>(stage) + 1];
       ++u) {
    held[static_cast<size_t>(u)] = true;
    for (int r : model.reads(u)) held[static_cast<size_t>(r)] = true;
  }
  return held;
}

namespace {

class InferBuilder {
 public:
  InferBuilder(const ModelLayout& model, const InferenceSpec& spec)
      : model_(model), spec_(spec), U_(model.num_units()) {
    p_.spec.strategy = spec.layout == InferLayout::fsdp ? Strategy::full : Strategy::none;
    p_.spec.world = spec.world;
    p_.spec.max_gathered = spec.max_gathered;
    p_.spec.param_bytes = spec.param_bytes;
    p_.spec.inference = true;
    p_.shard_size = spec.layout == InferLayout::fsdp ? spec.world : 1;
    p_.replicas = 1;
  }

  Program build() {
    if (spec_.layout == InferLayout::pipeline) return build_pipeline();
    const bool prefill = spec_.phase == InferPhase::prefill;
    TD_CHECK(!prefill || spec_.prefill_groups >= 1, "a prefill of {} groups", spec_.prefill_groups);
    TD_CHECK(spec_.world >= 1, "an inference layout over {} ranks", spec_.world);
    const bool fsdp = spec_.layout == InferLayout::fsdp;
    TD_CHECK(!fsdp || spec_.max_gathered >= 2,
             "--max-gathered must be at least 2 for fsdp inference (the head reads two units at "
             "once where the embedding is tied, and one unit gathers while another computes), "
             "got {}",
             spec_.max_gathered);
    const FlatLayout flat(model_, fsdp ? spec_.world : 1);
    params_.assign(static_cast<size_t>(U_), -1);
    cache_.assign(static_cast<size_t>(U_), -1);
    for (int u = 0; u < U_; ++u) {
      const UnitLayout& unit = model_.unit(u);
      const size_t bytes =
          static_cast<size_t>(fsdp ? flat.unit(u).shard : unit.numel) * spec_.param_bytes;
      params_[static_cast<size_t>(u)] =
          buffer(fsdp ? BufferKind::param_shard : BufferKind::params, u, bytes, false,
                 fmt::format("{}.{}", fsdp ? "shard" : "params", unit.name));
      p_.persistent_bytes += bytes;
      if (unit.kind == UnitKind::block) {
        cache_[static_cast<size_t>(u)] = buffer(BufferKind::kv_cache, u, spec_.kv_block_bytes,
                                                false, fmt::format("kv.{}", unit.name));
        p_.persistent_bytes += spec_.kv_block_bytes;
      }
      gathered_bytes_.push_back(static_cast<size_t>(flat.unit(u).padded) * spec_.param_bytes);
    }
    ws_decode_ =
        buffer(BufferKind::activations, -1, spec_.decode_ws_bytes, false, "decode-workspace");
    p_.persistent_bytes += spec_.decode_ws_bytes;
    ws_prefill_ = prefill ? buffer(BufferKind::activations, -1, spec_.prefill_ws_bytes, true,
                                   "prefill-workspace")
                          : -1;

    // The forwards in order, each with the workspace it runs over.
    const int head = U_ - 1;
    if (prefill) {
      for (int g = 0; g < spec_.prefill_groups; ++g) {
        for (int u = 0; u < head; ++u) unit_uses(u, ws_prefill_);
        uses_.push_back({-1, ws_prefill_, OpKind::last_rows});
      }
      unit_uses(head, ws_decode_);
    } else {
      for (int u = 0; u < U_; ++u) unit_uses(u, ws_decode_);
      uses_.push_back({-1, ws_decode_, OpKind::advance});
    }
    uses_.push_back({-1, ws_decode_, OpKind::sample});
    if (fsdp)
      emit_gathered();
    else
      for (const Use& use : uses_) emit(use, {});
    plan_arena();
#ifndef NDEBUG
    program_check(model_, p_);
#endif
    return std::move(p_);
  }

 private:
  // pipeline: this rank's stage. Per group (prefill) or micro-batch (decode): the rows from
  // the previous stage (recv), the stage's units over them, the rows to the next stage (send);
  // the last stage runs the head and draws over each micro-batch's decode workspace.
  Program build_pipeline() {
    const bool prefill = spec_.phase == InferPhase::prefill;
    const int W = spec_.world, s = spec_.rank, M = spec_.micro_batches;
    TD_CHECK(s >= 0 && s < W, "pipeline stage {} of {}", s, W);
    TD_CHECK(M >= 1, "a pipeline of {} micro-batches", M);
    TD_CHECK(!prefill || spec_.prefill_groups >= 1, "a prefill of {} groups", spec_.prefill_groups);
    const std::vector<int> starts = pipeline_stages(model_, W);
    const int first = starts[static_cast<size_t>(s)], end = starts[static_cast<size_t>(s) + 1];
    const bool head_here = end == U_, has_prev = s > 0, has_next = s + 1 < W;
    params_.assign(static_cast<size_t>(U_), -1);
    cache_.assign(static_cast<size_t>(U_), -1);
    auto hold = [&](int u) {
      if (params_[static_cast<size_t>(u)] >= 0) return;
      const size_t bytes = static_cast<size_t>(model_.unit(u).numel) * spec_.param_bytes;
      params_[static_cast<size_t>(u)] = buffer(BufferKind::params, u, bytes, false,
                                               fmt::format("params.{}", model_.unit(u).name));
      p_.persistent_bytes += bytes;
    };
    for (int u = first; u < end; ++u) {
      for (int r : needed(u)) hold(r);
      if (model_.unit(u).kind == UnitKind::block) {
        cache_[static_cast<size_t>(u)] = buffer(BufferKind::kv_cache, u, spec_.kv_block_bytes,
                                                false, fmt::format("kv.{}", model_.unit(u).name));
        p_.persistent_bytes += spec_.kv_block_bytes;
      }
    }
    std::vector<int> ws(static_cast<size_t>(M));
    for (int m = 0; m < M; ++m) {
      ws[static_cast<size_t>(m)] = buffer(BufferKind::activations, -1, spec_.decode_ws_bytes, false,
                                          fmt::format("decode-workspace.m{}", m));
      p_.persistent_bytes += spec_.decode_ws_bytes;
    }
    // A pass of the stage's units over workspace `w` between the boundary buffers `in` and
    // `out` (views of it: the rows received and the rows sent); returns its last compute op.
    // `after`: what the receive waits for (the previous prefill group's last op, which read
    // the same bytes). Prefill groups share one workspace, so the first unit also waits for
    // the previous group's send to have read its rows (a first stage has no receive to order
    // them).
    int last_send = -1;
    auto boundaries = [&](const std::string& tag) {
      return std::pair<int, int>{
          has_prev ? buffer(BufferKind::boundary, -1, 0, false, "pipe-in." + tag) : -1,
          has_next ? buffer(BufferKind::boundary, -1, 0, false, "pipe-out." + tag) : -1};
    };
    auto pass = [&](int w, int micro, std::pair<int, int> io, int after) {
      const int in = io.first, out = io.second;
      int recv = -1;
      if (has_prev) {
        Op op;
        op.kind = OpKind::recv;
        op.stream = StreamRole::gather;
        op.micro = micro;
        if (after >= 0) op.waits.push_back(after);
        op.writes.push_back(in);
        p_.ops.push_back(std::move(op));
        recv = static_cast<int>(p_.ops.size()) - 1;
      }
      const int head_end = head_here && !prefill ? end : std::min(end, U_ - 1);
      int last = -1;
      for (int u = first; u < head_end; ++u) {
        last = emit({u, w, OpKind::forward, 0}, {});
        Op& op = p_.ops[static_cast<size_t>(last)];
        op.micro = micro;
        if (u == first && recv >= 0) {
          op.waits.push_back(recv);
          op.reads.push_back(in);
        }
        if (u == first && recv < 0 && prefill && last_send >= 0) op.waits.push_back(last_send);
        if (u + 1 == head_end && out >= 0) op.writes.push_back(out);
      }
      if (has_next) {
        Op op;
        op.kind = OpKind::send;
        op.stream = StreamRole::gather;
        op.micro = micro;
        op.waits.push_back(last);
        op.reads.push_back(out);
        p_.ops.push_back(std::move(op));
        last_send = static_cast<int>(p_.ops.size()) - 1;
      }
      return last;
    };
    auto step = [&](int m, OpKind kind) {
      const int at = emit({-1, ws[static_cast<size_t>(m)], kind}, {});
      p_.ops[static_cast<size_t>(at)].micro = m;
      return at;
    };
    if (prefill) {
      ws_prefill_ =
          buffer(BufferKind::activations, -1, spec_.prefill_ws_bytes, true, "prefill-workspace");
      int after = -1;
      const std::pair<int, int> io = boundaries("prefill");
      for (int g = 0; g < spec_.prefill_groups; ++g) {
        after = pass(ws_prefill_, -1, io, after);
        if (head_here) {
          // The last row of each prompt into its micro-batch's decode workspace.
          const int at = emit({-1, ws_prefill_, OpKind::last_rows}, {});
          for (int w : ws) p_.ops[static_cast<size_t>(at)].writes.push_back(w);
          after = at;
        }
      }
      if (head_here)
        for (int m = 0; m < M; ++m) {
          const int at = emit({U_ - 1, ws[static_cast<size_t>(m)], OpKind::forward, 0}, {});
          p_.ops[static_cast<size_t>(at)].micro = m;
          step(m, OpKind::sample);
        }
    } else {
      for (int m = 0; m < M; ++m) {
        pass(ws[static_cast<size_t>(m)], m, boundaries(fmt::format("m{}", m)), -1);
        step(m, OpKind::advance);
        if (head_here) step(m, OpKind::sample);
      }
    }
    plan_arena();
#ifndef NDEBUG
    program_check(model_, p_);
#endif
    return std::move(p_);
  }

  // One compute op: a forward of `unit` (part `part`), a tp reduce, or a step-wide op.
  struct Use {
    int unit;
    int ws;
    OpKind kind;
    int part = 0;
  };

  int buffer(BufferKind kind, int unit, size_t bytes, bool arena, std::string name) {
    Buffer b;
    b.kind = kind;
    b.unit = unit;
    b.bytes = bytes;
    b.arena = arena;
    b.name = std::move(name);
    p_.buffers.push_back(std::move(b));
    return static_cast<int>(p_.buffers.size()) - 1;
  }

  // A unit's forward: whole, or under tp a block's attention part, its reduce (sequential
  // residual), its MLP part and the reduce of the block's output.
  void unit_uses(int u, int ws) {
    const bool tp = spec_.layout == InferLayout::tp;
    if (!tp || model_.unit(u).kind != UnitKind::block) {
      uses_.push_back({u, ws, OpKind::forward, 0});
      return;
    }
    const bool reduce = spec_.world > 1;
    uses_.push_back({u, ws, OpKind::forward, 1});
    if (reduce && model_.config().residual == ResidualKind::sequential)
      uses_.push_back({u, ws, OpKind::tp_reduce, 1});
    uses_.push_back({u, ws, OpKind::forward, 2});
    if (reduce) uses_.push_back({u, ws, OpKind::tp_reduce, 2});
  }

  std::vector<int> needed(int u) const {
    std::vector<int> n{u};
    for (int r : model_.reads(u)) n.push_back(r);
    return n;
  }

  // Emits a use; `copies` are the gathered buffers of its units (fsdp), in needed() order.
  int emit(const Use& use, const std::vector<int>& copies) {
    Op op;
    op.kind = use.kind;
    op.stream = StreamRole::compute;
    op.unit = use.unit;
    op.part = use.part;
    // The workspace first: the executor finds an op's workspace as its first write.
    op.reads.push_back(use.ws);
    op.writes.push_back(use.ws);
    if (use.kind == OpKind::forward) {
      const std::vector<int> units = needed(use.unit);
      for (size_t i = 0; i < units.size(); ++i) {
        const int b = copies.empty() ? params_[static_cast<size_t>(units[i])] : copies[i];
        op.params.push_back({units[i], b});
        op.reads.push_back(b);
      }
      if (cache_[static_cast<size_t>(use.unit)] >= 0) {
        op.reads.push_back(cache_[static_cast<size_t>(use.unit)]);
        op.writes.push_back(cache_[static_cast<size_t>(use.unit)]);
      }
    }
    if (use.kind == OpKind::last_rows && ws_decode_ >= 0) op.writes.push_back(ws_decode_);
    p_.ops.push_back(std::move(op));
    return static_cast<int>(p_.ops.size()) - 1;
  }

  // fsdp: a gathered copy per unit per forward; copy j is gathered once copy j - K's use has
  // been issued, waiting on it, so at most K copies exist at once and the gather of the
  // next unit runs while the current one computes.
  void emit_gathered() {
    struct Copy {
      int unit, use, buffer = -1, gather = -1;
    };
    std::vector<Copy> copies;
    std::vector<std::vector<int>> of_use(uses_.size());
    for (size_t i = 0; i < uses_.size(); ++i) {
      if (uses_[i].kind != OpKind::forward) continue;
      for (int u : needed(uses_[i].unit)) {
        of_use[i].push_back(static_cast<int>(copies.size()));
        copies.push_back({u, static_cast<int>(i)});
      }
    }
    const int K = spec_.max_gathered;
    int next = 0;  // the next copy to gather
    auto gather = [&](int waits_on) {
      Copy& c = copies[static_cast<size_t>(next)];
      c.buffer = buffer(BufferKind::gathered, c.unit, gathered_bytes_[static_cast<size_t>(c.unit)],
                        true, fmt::format("gathered.{}#{}", model_.unit(c.unit).name, next));
      Op op;
      op.kind = OpKind::gather;
      op.stream = StreamRole::gather;
      op.unit = c.unit;
      if (waits_on >= 0) op.waits.push_back(waits_on);
      op.reads.push_back(params_[static_cast<size_t>(c.unit)]);
      op.writes.push_back(c.buffer);
      p_.ops.push_back(std::move(op));
      c.gather = static_cast<int>(p_.ops.size()) - 1;
      ++next;
    };
    while (next < static_cast<int>(copies.size()) && next < K) gather(-1);
    for (size_t i = 0; i < uses_.size(); ++i) {
      std::vector<int> bufs;
      for (int j : of_use[i]) {
        // A use needing more copies than K could never start.
        TD_CHECK(j < next, "internal: copy {} used before it is gathered", j);
        bufs.push_back(copies[static_cast<size_t>(j)].buffer);
      }
      const int at = emit(uses_[i], bufs);
      for (int j : of_use[i])
        p_.ops[static_cast<size_t>(at)].waits.push_back(copies[static_cast<size_t>(j)].gather);
      for (size_t r = 0; r < of_use[i].size() && next < static_cast<int>(copies.size()); ++r)
        gather(at);
    }
  }

  void plan_arena() {
    const int n = static_cast<int>(p_.ops.size());
    for (int i = 0; i < n; ++i)
      for (const auto* ids :
           {&p_.ops[static_cast<size_t>(i)].reads, &p_.ops[static_cast<size_t>(i)].writes})
        for (int b : *ids) {
          Buffer& buf = p_.buffers[static_cast<size_t>(b)];
          if (!buf.arena) continue;
          buf.first = buf.first < 0 ? i : std::min(buf.first, i);
          buf.last = std::max(buf.last, i);
        }
    ArenaPlanner planner;
    std::vector<std::pair<int, int>> placed;
    for (size_t b = 0; b < p_.buffers.size(); ++b) {
      const Buffer& buf = p_.buffers[b];
      if (buf.arena && buf.first >= 0)
        placed.emplace_back(static_cast<int>(b),
                            planner.add(buf.name, buf.bytes, buf.first, buf.last));
    }
    p_.plan = planner.solve();
    for (auto [b, id] : placed)
      p_.buffers[static_cast<size_t>(b)].offset = p_.plan.offsets[static_cast<size_t>(id)];
    p_.arena_bytes = p_.plan.total_bytes;
  }

  const ModelLayout& model_;
  const InferenceSpec& spec_;
  const int U_;
  Program p_;
  std::vector<int> params_, cache_;
  std::vector<size_t> gathered_bytes_;
  int ws_decode_ = -1, ws_prefill_ = -1;
  std::vector<Use> uses_;
};

}  // namespace

Program program_build_inference(const ModelLayout& model, const InferenceSpec& spec) {
  return InferBuilder(model, spec).build();
}

}  // namespace tandem
