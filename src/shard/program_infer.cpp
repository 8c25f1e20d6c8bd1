// The programs of cached inference on one replica (program.h, "The programs of cached
// inference"): the same ops, buffers, arena plan and checker as the training step.
#include <fmt/format.h>

#include "core/error.h"
#include "shard/program.h"

namespace tandem {

Program program_build_inference(const ModelLayout& model, const InferenceSpec& spec) {
  const bool prefill = spec.phase == InferPhase::prefill;
  TD_CHECK(!prefill || spec.prefill_groups >= 1, "a prefill of {} groups", spec.prefill_groups);
  Program p;
  p.spec.strategy = Strategy::none;
  p.spec.world = 1;
  p.spec.param_bytes = spec.param_bytes;
  p.spec.inference = true;
  const int U = model.num_units(), head = U - 1;
  auto buffer = [&](BufferKind kind, int unit, size_t bytes, bool arena, std::string name) {
    Buffer b;
    b.kind = kind;
    b.unit = unit;
    b.bytes = bytes;
    b.arena = arena;
    b.name = std::move(name);
    p.buffers.push_back(std::move(b));
    return static_cast<int>(p.buffers.size()) - 1;
  };
  std::vector<int> params(static_cast<size_t>(U)), cache(static_cast<size_t>(U), -1);
  for (int u = 0; u < U; ++u) {
    const UnitLayout& unit = model.unit(u);
    params[static_cast<size_t>(u)] =
        buffer(BufferKind::params, u, static_cast<size_t>(unit.numel) * spec.param_bytes, false,
               fmt::format("params.{}", unit.name));
    if (unit.kind == UnitKind::block)
      cache[static_cast<size_t>(u)] = buffer(BufferKind::kv_cache, u, spec.kv_block_bytes, false,
                                             fmt::format("kv.{}", unit.name));
    p.persistent_bytes += p.buffers[static_cast<size_t>(params[static_cast<size_t>(u)])].bytes;
    if (cache[static_cast<size_t>(u)] >= 0) p.persistent_bytes += spec.kv_block_bytes;
  }
  const int ws_prefill = prefill ? buffer(BufferKind::activations, -1, spec.prefill_ws_bytes, true,
                                          "prefill-workspace")
                                 : -1;
  const int ws_decode =
      buffer(BufferKind::activations, -1, spec.decode_ws_bytes, true, "decode-workspace");

  auto forward = [&](int u, int ws) {
    Op op;
    op.kind = OpKind::forward;
    op.stream = StreamRole::compute;
    op.unit = u;
    std::vector<int> needed{u};
    for (int r : model.reads(u)) needed.push_back(r);
    for (int r : needed) {
      op.params.push_back({r, params[static_cast<size_t>(r)]});
      op.reads.push_back(params[static_cast<size_t>(r)]);
    }
    op.reads.push_back(ws);
    op.writes.push_back(ws);
    if (cache[static_cast<size_t>(u)] >= 0) {
      op.reads.push_back(cache[static_cast<size_t>(u)]);
      op.writes.push_back(cache[static_cast<size_t>(u)]);
    }
    p.ops.push_back(std::move(op));
  };
  auto step_op = [&](OpKind kind, std::vector<int> reads, std::vector<int> writes) {
    Op op;
    op.kind = kind;
    op.stream = StreamRole::compute;
    op.reads = std::move(reads);
    op.writes = std::move(writes);
    p.ops.push_back(std::move(op));
  };
  if (prefill) {
    for (int g = 0; g < spec.prefill_groups; ++g) {
      for (int u = 0; u < head; ++u) forward(u, ws_prefill);
      step_op(OpKind::last_rows, {ws_prefill}, {ws_decode});
    }
    forward(head, ws_decode);
  } else {
    for (int u = 0; u < U; ++u) forward(u, ws_decode);
    step_op(OpKind::advance, {ws_decode}, {ws_decode});
  }
  step_op(OpKind::sample, {ws_decode}, {ws_decode});

  // Lifetimes and the arena plan.
  const int n = static_cast<int>(p.ops.size());
  for (int i = 0; i < n; ++i)
    for (const auto* ids :
         {&p.ops[static_cast<size_t>(i)].reads, &p.ops[static_cast<size_t>(i)].writes})
      for (int b : *ids) {
        Buffer& buf = p.buffers[static_cast<size_t>(b)];
        if (!buf.arena) continue;
        buf.first = buf.first < 0 ? i : std::min(buf.first, i);
        buf.last = std::max(buf.last, i);
      }
  ArenaPlanner planner;
  std::vector<std::pair<int, int>> placed;
  for (size_t b = 0; b < p.buffers.size(); ++b) {
    const Buffer& buf = p.buffers[b];
    if (buf.arena && buf.first >= 0)
      placed.emplace_back(static_cast<int>(b),
                          planner.add(buf.name, buf.bytes, buf.first, buf.last));
  }
  p.plan = planner.solve();
  for (auto [b, id] : placed)
    p.buffers[static_cast<size_t>(b)].offset = p.plan.offsets[static_cast<size_t>(id)];
  p.arena_bytes = p.plan.total_bytes;
#ifndef NDEBUG
  program_check(model, p);
#endif
  return p;
}

}  // namespace tandem
