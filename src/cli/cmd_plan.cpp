// tandem plan: predicts step time, exposed communication, tokens/s and memory per rank
// for every strategy of a training or generation job on given hardware, and picks one.
// `--print-schedule` also prints the step program the training prediction replays.
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "core/error.h"
#include "io/model_source.h"
#include "model/config.h"
#include "plan/hardware.h"
#include "plan/kernel_rates.h"
#include "plan/plan.h"
#include "shard/program.h"

namespace tandem {

namespace {

struct PlanArgs {
  std::string task = "train", model = "gpt2-tiny", strategy;
  int ranks = 1, shard_group = 0, max_gathered = 2, micro_steps = 1, batch = 4, seq = 64;
  bool print_schedule = false, json = false;
  std::string hardware = "cpu-local", compute_file, links_file, dtype = "auto";
  std::string recompute = "none";
  int loss_chunk = 0, recompute_blocks = 0;
  std::string reduce_dtype = "f32";
  bool update_at_gather = false;
  double tflops = 0, hbm_GBps = 0, mem_GiB = 0, link_GBps = 0, link_latency_us = 0;
};

struct HardwareFlags {
  CLI::Option *tflops, *hbm, *mem, *link, *latency;
};

// Preset, then probe files, then single flags: each layer overrides the one before.
Hardware resolve_hardware(const PlanArgs& a, const HardwareFlags& f) {
  Hardware hw = hardware_resolve(a.hardware, a.compute_file, a.links_file);
  std::string flags;
  auto given = [&](CLI::Option* o, double value, double& field) {
    if (o->count() == 0) return;
    field = value;
    flags += (flags.empty() ? "" : " ") + o->get_name();
  };
  given(f.tflops, a.tflops, hw.tflops);
  given(f.hbm, a.hbm_GBps, hw.hbm_GBps);
  given(f.mem, a.mem_GiB, hw.mem_GiB);
  for (LinkModel* l : {&hw.all_gather, &hw.reduce_scatter, &hw.all_reduce}) {
    given(f.link, a.link_GBps, l->GBps);
    given(f.latency, a.link_latency_us, l->latency_us);
  }
  if (!flags.empty()) hw.source += " + flags";
  // A single compute figure is meant to set the compute: per-kernel tables would override it.
  if (hw.kernels && (f.tflops->count() > 0 || f.hbm->count() > 0)) {
    hw.kernels.reset();
    hw.source += " (kernel tables left out: --tflops or --hbm-GBps sets the compute)";
  }
  hardware_set_dtype(hw, a.dtype);
  hardware_validate(hw);
  // Figures of a GPU laid over the CPU preset would otherwise plan fp32 weights unseen.
  if (!flags.empty() && a.dtype == "auto" && !hw.gpu && a.compute_file.empty())
    fmt::print(stderr,
               "tandem: note: planning {} weights and activations, as the {} preset does; give "
               "--dtype bf16 (or a GPU --hardware preset) to plan a GPU's\n",
               hardware_dtype(hw), hw.name);
  return hw;
}

void print_schedule(const PlanRequest& r) {
  TD_CHECK(r.task == PlanTask::train,
           "--print-schedule prints a training step program; use it with --task train");
  const ModelLayout layout(r.model);
  const Strategy s = strategy_parse(r.strategy.empty() ? "full" : r.strategy);
  const Program p = program_build(layout, plan_program_spec(r, s));
  program_check(layout, p);
  fmt::print("{}", program_print(layout, p));
  fmt::print(
      "checked: every read follows its write, no buffer is overwritten while read, "
      "every unit is gathered before use and reduced once per period\n\n");
}

}  // namespace

void cli_add_plan(CLI::App& app, const Environment& env) {
  auto* cmd = app.add_subcommand(
      "plan", "Predict step time, communication, tokens/s and memory per strategy, and pick one");
  auto a = std::make_shared<PlanArgs>();
  std::string presets;
  for (const auto& n : hardware_preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  cmd->add_option("--task", a->task, "train or generate")
      ->check(CLI::IsMember({"train", "generate"}))
      ->capture_default_str();
  cmd->add_option("--model", a->model,
                  "Model preset, JSON config, checkpoint or Hugging Face model directory")
      ->capture_default_str();
  cmd->add_option("--ranks", a->ranks, "Ranks (GPUs or processes)")->capture_default_str();
  cmd->add_option("--strategy", a->strategy,
                  "Plan only this strategy: full, grad-op, none, hybrid (train); replicate, "
                  "fsdp, tp, pipeline (generate)");
  cmd->add_option("--shard-group", a->shard_group, "hybrid: ranks per shard group (plans hybrid)");
  cmd->add_option("--max-gathered", a->max_gathered, "Units gathered at once (full, hybrid, fsdp)")
      ->capture_default_str();
  cmd->add_option("--micro-steps", a->micro_steps, "Micro-steps per optimizer step")
      ->capture_default_str();
  cmd->add_option("--recompute", a->recompute,
                  "train: what each block keeps for its backward: none, attention or unit")
      ->capture_default_str();
  cmd->add_option("--recompute-blocks", a->recompute_blocks,
                  "train: how many blocks recompute, the first ones (0: every block)")
      ->capture_default_str();
  cmd->add_option("--loss-chunk", a->loss_chunk,
                  "train: rows of logits the loss makes at once (0: every row)")
      ->capture_default_str();
  cmd->add_option("--reduce-dtype", a->reduce_dtype,
                  "train: the dtype gradients are reduced in: f32, or bf16 (half the bytes)")
      ->capture_default_str();
  cmd->add_flag("--update-at-gather", a->update_at_gather,
                "train: each unit's optimizer update beside the next step's compute, before its "
                "gather");
  cmd->add_option("--batch", a->batch,
                  "train: sequences per rank per micro-step; generate: sequences decoded together")
      ->capture_default_str();
  cmd->add_option("--seq", a->seq, "train: sequence length; generate: KV-cache length")
      ->capture_default_str();
  cmd->add_option("--hardware", a->hardware, "Hardware preset: " + presets)->capture_default_str();
  cmd->add_option("--compute", a->compute_file, "Compute probe file (tandem probe compute --save)");
  cmd->add_option("--links", a->links_file, "Links probe file (tandem probe links --save)");
  HardwareFlags f;
  cmd->add_option("--dtype", a->dtype,
                  "Precision of weights and activations: auto (the hardware's: bf16 on GPUs, fp32 "
                  "on CPUs), bf16 or fp32")
      ->capture_default_str();
  f.tflops = cmd->add_option("--tflops", a->tflops, "Dense matrix rate, TFLOP/s");
  f.hbm = cmd->add_option("--hbm-GBps", a->hbm_GBps, "Device memory bandwidth, GB/s");
  f.mem = cmd->add_option("--mem-GiB", a->mem_GiB, "Memory per rank, GiB");
  f.link = cmd->add_option("--link-GBps", a->link_GBps, "Collective bus bandwidth per rank, GB/s");
  f.latency = cmd->add_option("--link-latency-us", a->link_latency_us, "Collective latency, us");
  auto* schedule =
      cmd->add_flag("--print-schedule", a->print_schedule, "Print every op of the step program");
  cmd->add_flag("--json", a->json, "Print the plan as JSON")->excludes(schedule);
  const FlashBackward flash_backward = env.flash_backward;
  cmd->callback([a, f, flash_backward] {
    PlanRequest r;
    r.task = a->task == "generate" ? PlanTask::generate : PlanTask::train;
    r.model = model_resolve(a->model);
    r.ranks = a->ranks;
    r.batch = a->batch;
    r.seq = a->seq;
    r.micro_steps = a->micro_steps;
    r.max_gathered = a->max_gathered;
    r.recompute = recompute_parse(a->recompute);
    r.loss_chunk = a->loss_chunk;
    r.recompute_blocks = a->recompute_blocks;
    r.reduce_dtype = reduce_dtype_parse(a->reduce_dtype);
    r.update_at_gather = a->update_at_gather;
    r.shard_group = a->shard_group;
    r.strategy = a->strategy;
    r.hw = resolve_hardware(*a, f);
    // A training run takes TANDEM_FLASH_BACKWARD too; tables of the other form time its
    // attention backward wrongly (at head size 128 the forms differ by about a fifth).
    if (r.task == PlanTask::train && r.hw.kernels) {
      const std::string mismatch = kernel_rates_form_mismatch(*r.hw.kernels, flash_backward);
      if (!mismatch.empty()) fmt::print(stderr, "tandem: note: {}\n", mismatch);
    }
    const PlanResult result = plan_run(r);  // validates the request first
    if (a->print_schedule) print_schedule(r);
    if (a->json) {
      fmt::print("{}\n", plan_to_json(result).dump(2));
    } else {
      fmt::print("{}", plan_format(result));
    }
  });
}

}  // namespace tandem
