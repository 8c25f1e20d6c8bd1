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
  TD_THROW("unknown inference layout '{}' (expected replicate, fsdp or tp)", name);
}

const char* infer_layout_name(InferLayout l) {
  switch (l) {
    case InferLayout::replicate:
      return "replicate";
    case InferLayout::fsdp:
      return "fsdp";
    case InferLayout::tp:
      return "tp";
  }
  return "?";
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
    const bool prefill = spec_.phase == InferPhase::prefill;
    TD_CHECK(!prefill || spec_.prefill_groups >= 1, "a prefill of {} groups",
             spec_.prefill_groups);
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
    if (use.kind == OpKind::last_rows) op.writes.push_back(ws_decode_);
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
      for (int j : of_use[i]) p_.ops[static_cast<size_t>(at)].waits.push_back(copies[static_cast<size_t>(j)].gather);
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
