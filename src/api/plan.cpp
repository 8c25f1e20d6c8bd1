// The planner of the public API: training plans on a preset machine, refined by probe
// files and single figures as `tandem plan` refines it.
#include <tandem/plan.h>

#include "api/convert.h"
#include "api/errors.h"
#include "plan/hardware.h"
#include "plan/plan.h"
#include "shard/program.h"

namespace tandem::api {

namespace {

// Preset, then probe files, then single figures: each layer overrides the one before.
::tandem::Hardware resolve_hardware(const PlanRequest& r) {
  ::tandem::Hardware hw =
      ::tandem::hardware_resolve(r.hardware, r.compute_probe.string(), r.links_probe.string());
  bool figures = false;
  auto given = [&](const std::optional<double>& value, double& field) {
    if (!value) return;
    field = *value;
    figures = true;
  };
  given(r.tflops, hw.tflops);
  given(r.hbm_GBps, hw.hbm_GBps);
  given(r.mem_GiB, hw.mem_GiB);
  for (::tandem::LinkModel* l : {&hw.all_gather, &hw.reduce_scatter, &hw.all_reduce}) {
    given(r.link_GBps, l->GBps);
    given(r.link_latency_us, l->latency_us);
  }
  if (figures) hw.source += " + figures";
  ::tandem::hardware_set_dtype(hw, r.dtype);
  ::tandem::hardware_validate(hw);
  return hw;
}

StrategyPlan from_internal_plan(const ::tandem::StrategyPlan& s) {
  StrategyPlan p;
  p.strategy = from_internal(::tandem::strategy_parse(s.name));
  p.applicable = s.applicable;
  p.fits = s.fits;
  p.peak_mem_bytes = s.peak_mem_bytes;
  p.step_ms = s.step_ms;
  p.min_step_ms = s.min_step_ms;
  p.tokens_per_s = s.tokens_per_s;
  p.compute_ms = s.compute_ms;
  p.comm_ms = s.comm_ms;
  p.exposed_comm_ms = s.exposed_comm_ms;
  p.link_ms = s.link_ms;
  p.gather_bytes = s.gather_bytes;
  p.reduce_bytes = s.reduce_bytes;
  p.all_reduce_bytes = s.all_reduce_bytes;
  p.bottleneck = s.bottleneck;
  return p;
}

}  // namespace

PlanResult plan(const PlanRequest& request) {
  return translate_errors([&] {
    ::tandem::PlanRequest r;
    r.task = ::tandem::PlanTask::train;
    r.model = resolve_model(request.model);
    r.ranks = request.ranks;
    r.batch = request.batch;
    r.seq = request.seq;
    r.micro_steps = request.micro_steps;
    r.max_gathered = request.max_gathered;
    r.shard_group = request.shard_group;
    if (request.strategy) r.strategy = ::tandem::strategy_name(to_internal(*request.strategy));
    r.hw = resolve_hardware(request);
    const ::tandem::PlanResult res = ::tandem::plan_run(r);
    PlanResult out;
    out.hardware = ::tandem::hardware_describe(r.hw);
    for (const ::tandem::StrategyPlan& s : res.strategies)
      out.strategies.push_back(from_internal_plan(s));
    out.recommended = res.recommended;
    out.why = res.why;
    out.overlap = res.overlap;
    out.notes = res.notes;
    out.report = ::tandem::plan_format(res);
    return out;
  });
}

std::vector<std::string> hardware_presets() {
  return translate_errors([] { return ::tandem::hardware_preset_names(); });
}

}  // namespace tandem::api
