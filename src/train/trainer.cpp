// The training loop: resumable, rank-aware, with metrics and progress on rank 0.
#include "train/trainer.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"
#include "core/size.h"
#include "io/model_source.h"
#include "io/tokens.h"
#include "shard/program.h"
#include "train/progress.h"

namespace tandem {

namespace {

// The first SIGINT, SIGTERM, SIGUSR1 or SIGUSR2 of a run; a second SIGINT or SIGTERM ends
// the process at once (the default action), for a user who will not wait for the step.
volatile std::sig_atomic_t g_signal = 0;
void on_signal(int sig) {
  if (g_signal != 0 && sig != SIGUSR1 && sig != SIGUSR2) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
    return;
  }
  g_signal = sig;
}

// Installs on_signal for the run's signals and restores the previous handlers on exit.
class SignalScope {
 public:
  SignalScope() {
    g_signal = 0;
    for (size_t i = 0; i < kSignals.size(); ++i) previous_[i] = std::signal(kSignals[i], on_signal);
  }
  ~SignalScope() {
    for (size_t i = 0; i < kSignals.size(); ++i) std::signal(kSignals[i], previous_[i]);
  }
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  static constexpr std::array<int, 4> kSignals = {SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
  std::array<void (*)(int), 4> previous_{};
};

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGUSR2:
      return "SIGUSR2";
  }
  return "a signal";
}

// The model of the run: the checkpoint's when resuming, the source's with --init-from (a
// --model given too must name the same architecture), else --model.
ModelConfig resolve_model(const TrainOptions& o, const CheckpointMeta* meta,
                          const ModelSource* init) {
  if (init != nullptr) {
    if (!o.model.empty())
      model_check_same(init->config(), fmt::format("--init-from '{}'", o.init_from),
                       model_resolve(o.model));
    return init->config();
  }
  if (meta == nullptr) {
    TD_CHECK(!o.model.empty(),
             "--model is required (a preset, a JSON config or a model directory), or "
             "--init-from DIR");
    return model_resolve(o.model);
  }
  if (o.model.empty()) return meta->model;
  checkpoint_check_model(*meta, model_resolve(o.model));
  return meta->model;
}

}  // namespace

nlohmann::json step_metrics_to_json(const StepMetrics& m) {
  nlohmann::json j = {{"step", m.step},
                      {"loss", m.loss},
                      {"lr", m.lr},
                      {"grad_norm", m.grad_norm},
                      {"tokens_per_s", m.tokens_per_s},
                      {"step_ms", m.step_ms},
                      {"compute_ms", m.compute_ms},
                      {"comm_ms", m.comm_ms},
                      {"exposed_comm_ms", m.exposed_comm_ms},
                      {"peak_mem_bytes", m.peak_mem_bytes}};
  // JSON has no NaN or Inf: such values are null, and a skipped step says which they were.
  if (m.skipped) {
    nlohmann::json which = nlohmann::json::array();
    if (!std::isfinite(m.loss)) {
      which.push_back("loss");
      j["loss"] = nullptr;
    }
    if (!std::isfinite(m.grad_norm)) {
      which.push_back("grad_norm");
      j["grad_norm"] = nullptr;
    }
    j["skipped"] = true;
    j["nonfinite"] = which;
  }
  return j;
}

namespace {

// [Partial recompute] What fits a run's memory bound with kRecomputeHeadroom of it free: the
// run keeping everything, or the fewest blocks recomputing as c.recompute does (fit.blocks 0:
// not even every block). The same program peaks the engine checks its bound against
// (engine_fewest_recompute_blocks); the start note and --recompute-blocks auto both read it.
struct RecomputeChoice {
  std::string of;          // what the bound is, in words
  uint64_t kept_peak = 0;  // the peak keeping everything
  bool keeps_all = false;  // kept_peak fits
  RecomputeFit fit;        // searched only where keeps_all is false
};
RecomputeChoice recompute_choice(const ModelLayout& model, const EngineConfig& c, DeviceKind kind,
                                 int world, uint64_t bound) {
  RecomputeChoice r;
  r.of = c.mem_limit > 0 ? "--mem-limit"
         : world > 1     ? "the smallest free GPU memory of the ranks"
                         : "the GPU's free memory";
  const double room = (1 - kRecomputeHeadroom) * static_cast<double>(bound);
  EngineConfig none = c;
  none.recompute = Recompute::none;
  none.recompute_blocks = 0;
  r.kept_peak = program_build(model, Engine::program_spec(model, none, kind, world)).peak_bytes();
  r.keeps_all = static_cast<double>(r.kept_peak) <= room;
  if (!r.keeps_all)
    r.fit = engine_fewest_recompute_blocks(model, c, kind, world, c.recompute, room);
  return r;
}

// For a run that recomputes every block under a memory bound: the fewest blocks that fit it,
// or that the run fits without recompute; "" when neither holds or there is no bound.
std::string recompute_note(const ModelLayout& model, const EngineConfig& c, DeviceKind kind,
                           int world, uint64_t bound) {
  const int L = model.config().n_layer;
  if (bound == 0 || c.recompute == Recompute::none ||
      (c.recompute_blocks > 0 && c.recompute_blocks < L))
    return "";
  const RecomputeChoice r = recompute_choice(model, c, kind, world, bound);
  if (r.keeps_all)
    return fmt::format(
        "the run fits {} without --recompute ({} of {}): it would run no forward twice", r.of,
        format_size(r.kept_peak), format_size(bound));
  if (r.fit.blocks == 0 || r.fit.blocks == L) return "";
  return fmt::format(
      "{} of the {} blocks recomputing would fit {} with {:.0f}% of it free ({} of {}), running "
      "{} forwards again instead of {}: --recompute-blocks {}",
      r.fit.blocks, L, r.of, 100 * kRecomputeHeadroom, format_size(r.fit.peak), format_size(bound),
      r.fit.blocks, L, r.fit.blocks);
}

}  // namespace

Trainer::Trainer(TrainOptions options, const TrainContext& context)
    : options_(std::move(options)), context_(context) {
  train_options_validate(options_);
  const DeviceKind kind = options_.device;
  // Rank r of a node drives the node's GPU r.
  device_ = device_create(kind, kind == DeviceKind::cuda ? context_.local_rank : 0);
  CommOptions comm;
  comm.timeout_s = options_.comm_timeout;
  comm.mpi = context_.mpi;
  world_ = comm_world(*device_, comm);
  if (kind == DeviceKind::cpu) {
    control_ = world_.get();
  } else {
    // [Control plane] NCCL moves device memory only; checkpoints and traces exchange small
    // host records, so they go over a host communicator of the same ranks (MPI, or one rank).
    host_device_ = device_create_cpu();
    host_world_ = comm_world(*host_device_, comm);
    host_stream_ = host_device_->stream_create("control", 0);
    control_ = host_world_.get();
  }
  const int W = world_->size();
  TD_CHECK(options_.ranks == 0 || options_.ranks == W, "--ranks {} but the job runs {} rank(s)",
           options_.ranks, W);

  if (!options_.resume.empty())
    resumed_ = std::make_unique<CheckpointMeta>(checkpoint_read_meta(options_.resume));
  std::unique_ptr<ModelSource> init;
  if (!options_.init_from.empty()) {
    init = ModelSource::open(options_.init_from);
    notes_ = init->notes();
  }
  layout_ = std::make_unique<ModelLayout>(resolve_model(options_, resumed_.get(), init.get()));
  const ModelConfig& c = layout_->config();
  // A resumed run keeps the checkpoint's seed, so the data order stays the same.
  if (resumed_) options_.seed = resumed_->seed;
  TD_CHECK(options_.seq <= c.context, "--seq {} exceeds the context length {} of model '{}'",
           options_.seq, c.context, c.name);
  if (options_.global_batch == 0) options_.global_batch = options_.batch * W;
  const int G = options_.global_batch;
  TD_CHECK(G % (options_.batch * W) == 0,
           "--global-batch {} is not a multiple of --batch {} x {} rank(s)", G, options_.batch, W);
  if (resumed_) {
    const int ckpt_batch = resumed_->data.value("global_batch", G);
    const int ckpt_seq = resumed_->data.value("seq", options_.seq);
    TD_CHECK(ckpt_batch == G && ckpt_seq == options_.seq,
             "checkpoint was trained with global batch {} and sequence {}; this run asks for {} "
             "and {}",
             ckpt_batch, ckpt_seq, G, options_.seq);
  }

  TD_CHECK(!options_.data.empty(), "--data is required (a token file; see 'tandem data prepare')");
  TokenData tokens = tokens_read(options_.data);
  data_ = std::make_unique<Dataset>(std::move(tokens.tokens), options_.seq, options_.seed,
                                    options_.data);
  data_->check_vocab(c.vocab);

  EngineConfig ec;
  ec.strategy = options_.strategy;
  ec.shard_group = options_.shard_group;
  ec.max_gathered = options_.max_gathered;
  ec.recompute = options_.recompute;
  ec.recompute_blocks = options_.recompute_blocks;
  ec.loss_chunk = options_.loss_chunk;
  ec.reduce_dtype = options_.reduce_dtype;
  ec.update_at_gather = options_.update_at_gather;
  ec.cuda_graph = cuda_graph_resolve(options_.cuda_graph, options_.device, W);
  cuda_graph_ = ec.cuda_graph;
  ec.batch = options_.batch;
  ec.seq = options_.seq;
  ec.global_batch = G;
  ec.total_steps = options_.steps;
  ec.seed = options_.seed;
  ec.optim = options_.optim;
  // The plan's memory is known before anything is allocated: the engine refuses a run that
  // cannot fit.
  ec.mem_limit = options_.mem_limit.empty() ? 0 : parse_bytes(options_.mem_limit);
  ec.attention = options_.attention;
  // Process-wide: every trainer sets its own, so an earlier trainer's choice does not linger.
  kernels_set_flash_backward(options_.flash_backward);
  if (options_.flash_backward != FlashBackward::automatic) {
    notes_.push_back(options_.flash_backward == FlashBackward::one_pass
                         ? "flash backward: one pass (TANDEM_FLASH_BACKWARD=one-pass; the Hopper "
                           "kernels' dQ is then not the same bits on every run)"
                         : "flash backward: two passes (TANDEM_FLASH_BACKWARD=two-pass)");
  }
  // On CUDA without --mem-limit every rank checks the plan against the smallest free memory
  // of the ranks' GPUs, so all refuse or none does.
  if (ec.mem_limit == 0 && kind == DeviceKind::cuda) ec.free_memory = smallest_free_memory();
  const bool chosen = options_.recompute_blocks == kRecomputeBlocksAuto;
  if (chosen) notes_.push_back(choose_recompute_blocks(ec));
  engine_ = std::make_unique<Engine>(*layout_, ec, *device_, *world_);
  if (const std::string note =
          chosen ? "" : recompute_note(*layout_, ec, device_->kind(), W, engine_->memory_bound());
      !note.empty())
    notes_.push_back(note);
  // The step's token ids are filled in place every step, never reallocated.
  const size_t ids = static_cast<size_t>(engine_->micro_steps()) * options_.batch * options_.seq;
  inputs_.reserve(ids);
  targets_.reserve(ids);

  if (resumed_) {
    engine_->set_shards(
        checkpoint_load_shard(options_.resume, engine_->flat(), engine_->shard_rank()));
    step_ = resumed_->step;
  }
  if (init) {
    // A fresh run from given weights: each rank reads its own shard at this run's layout,
    // the optimizer state starts at zero and the step count at 0.
    ShardState st;
    st.params = init->load_param_shard(engine_->flat(), engine_->shard_rank());
    for (const std::vector<float>& p : st.params) {
      st.m.emplace_back(p.size(), 0.0f);
      st.v.emplace_back(p.size(), 0.0f);
    }
    engine_->set_shards(st);
  }
  if (!options_.trace.empty())
    trace_ = std::make_unique<StepTrace>(options_.trace, options_.trace_steps);
  if (!options_.save.empty() && world_->rank() == 0) {
    // Find out now, not after hours of training, that the checkpoint cannot be written.
    namespace fs = std::filesystem;
    std::error_code ec2;
    fs::create_directories(options_.save, ec2);
    TD_CHECK(fs::is_directory(options_.save), "cannot create checkpoint directory '{}': {}",
             options_.save, ec2 ? ec2.message() : "a file of that name exists");
    // One run per directory: a second one would delete the first one's files.
    lock_save_dir();
    // Another run's checkpoint is kept unless the user says to replace it; continuing from
    // the directory itself is the same run.
    const bool same_run =
        !options_.resume.empty() && fs::equivalent(options_.resume, options_.save, ec2);
    if (!same_run && !options_.save_overwrite &&
        fs::exists(fs::path(options_.save) / "index.json")) {
      std::string held = "a checkpoint";
      try {
        const CheckpointMeta other = checkpoint_read_meta(options_.save);
        held = fmt::format("a checkpoint of model '{}' at step {}", other.model.name, other.step);
      } catch (const Error&) {
        held = "a checkpoint index";
      }
      TD_THROW(
          "--save directory '{}' already holds {}; continue that run with --resume {}, "
          "save elsewhere, or pass --save-overwrite to replace it",
          options_.save, held, options_.save);
    }
  }
}

Trainer::~Trainer() = default;

// [Partial recompute] --recompute-blocks auto. Every rank must build the same program, so the
// bound is one for all: --mem-limit, or on CUDA the smallest free memory of the ranks' GPUs
// (smallest_free_memory, before the engine exists). The choice is recompute_choice's, the
// search the start note makes too; where not even every block leaves the headroom free, every
// block recomputes and the engine refuses the run only if it is over the bound itself.
std::string Trainer::choose_recompute_blocks(EngineConfig& config) {
  const int W = world_->size(), L = layout_->config().n_layer;
  const uint64_t bound = config.mem_limit > 0 ? config.mem_limit : config.free_memory;
  TD_CHECK(bound > 0,
           "--recompute-blocks auto fits the run to a memory bound, and a CPU run has none of "
           "its own: give --mem-limit, or a number of blocks");
  const RecomputeChoice r = recompute_choice(*layout_, config, device_->kind(), W, bound);
  if (r.keeps_all) {
    config.recompute = options_.recompute = Recompute::none;
    config.recompute_blocks = options_.recompute_blocks = 0;
    return fmt::format(
        "--recompute-blocks auto: the run fits {} without recompute ({} of {}), so no block "
        "recomputes",
        r.of, format_size(r.kept_peak), format_size(bound));
  }
  config.recompute_blocks = options_.recompute_blocks =
      r.fit.blocks == 0 || r.fit.blocks == L ? 0 : r.fit.blocks;
  // Not even every block leaves the headroom free: every block recomputes, and the engine
  // refuses the run only where it is over the bound itself.
  if (r.fit.blocks == 0)
    return fmt::format(
        "--recompute-blocks auto: every block recomputes, and even so less than {:.0f}% of {} "
        "stays free",
        100 * kRecomputeHeadroom, r.of);
  return fmt::format(
      "--recompute-blocks auto: {} of the {} blocks recompute, the fewest that fit {} with "
      "{:.0f}% of it free ({} of {})",
      r.fit.blocks, L, r.of, 100 * kRecomputeHeadroom, format_size(r.fit.peak), format_size(bound));
}

// The smallest free memory of the ranks' GPUs, in whole MiB (exact in the f32 the host
// communicator gathers), over the control plane, which exists before the engine.
uint64_t Trainer::smallest_free_memory() {
  constexpr double kMiB = 1 << 20;
  const float mine =
      static_cast<float>(std::floor(static_cast<double>(device_->free_bytes()) / kMiB));
  std::vector<float> free(static_cast<size_t>(world_->size()));
  control_->all_gather(control_stream(), &mine, free.data(), 1, DType::f32, "free memory");
  control_device().stream_sync(control_stream());
  return static_cast<uint64_t>(*std::min_element(free.begin(), free.end())) * (uint64_t{1} << 20);
}

Device& Trainer::control_device() {
  return host_device_ ? *host_device_ : *device_;
}

Stream& Trainer::control_stream() {
  return host_stream_ ? *host_stream_ : engine_->comm_stream();
}

StepMetrics Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  const bool traced = trace_ && trace_->wants(step_ + 1);
  // Rank r of W reads, in micro-step m, sequences [m*B*W + r*B, m*B*W + (r+1)*B) of the
  // step's global batch (Dataset::rank_batch), so every world size and micro-batch split
  // trains on the same sequences.
  data_->rank_batch(step_, options_.global_batch, options_.batch, engine_->micro_steps(),
                    world_->size(), world_->rank(), inputs_, targets_);
  StepResult r =
      engine_->step(step_, StepBatch{inputs_.data(), targets_.data(), inputs_.size()}, traced);
  ++step_;
  if (traced) {
    trace_->add(step_, std::chrono::duration<double, std::milli>(t0 - start_).count(), r);
    if (step_ == trace_->last())
      trace_->write(*layout_, engine_->program(), *control_, control_device(), control_stream());
  }
  StepMetrics m;
  m.step = step_;
  m.loss = r.loss;
  m.lr = r.lr;
  m.grad_norm = r.grad_norm;
  m.step_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  m.compute_ms = r.compute_ms;
  m.comm_ms = r.comm_ms;
  m.exposed_comm_ms = r.exposed_comm_ms;
  m.tokens_per_s = static_cast<double>(options_.global_batch) * options_.seq / (m.step_ms / 1e3);
  m.peak_mem_bytes = engine_->peak_bytes();
  if (!std::isfinite(m.loss) || !std::isfinite(m.grad_norm)) nonfinite_step(m);
  return m;
}

double Trainer::ran_seconds() {
  float seconds = 0;
  for (const StepMetrics& m : ran_) seconds += static_cast<float>(m.step_ms / 1e3);
  if (world_->size() > 1) {
    control_->broadcast(control_stream(), &seconds, 1, DType::f32, 0, "run seconds");
    control_device().stream_sync(control_stream());
  }
  return seconds;
}

// [Non-finite steps] The loss and the gradient norm are the same on every rank, so every
// rank comes here together. A non-finite norm made the optimizer skip the update (the
// parameters and moments are those of the step before); the units whose gradients hold
// NaN or Inf are found from host copies of the gradient shards, agreed over the ranks.
void Trainer::nonfinite_step(StepMetrics& m) {
  m.skipped = true;
  const std::vector<bool> local = engine_->nonfinite_grad_units();
  std::vector<float> flags(local.size());
  for (size_t u = 0; u < local.size(); ++u) flags[u] = local[u] ? 1.0f : 0.0f;
  if (world_->size() > 1) {
    control_->all_reduce(control_stream(), flags.data(), flags.data(), flags.size(), DType::f32,
                         "non-finite units");
    control_device().stream_sync(control_stream());
  }
  std::string units;
  for (size_t u = 0; u < flags.size(); ++u)
    if (flags[u] > 0)
      units +=
          fmt::format("{}'{}'", units.empty() ? "" : ", ", layout_->unit(static_cast<int>(u)).name);
  const bool applied = std::isfinite(m.grad_norm);  // only a finite norm lets the update run
  const std::string what =
      fmt::format("step {}: loss {}, gradient norm {}{}", step_, m.loss, m.grad_norm,
                  units.empty() ? "" : fmt::format(" (NaN or Inf in the gradients of {})", units));
  if (!applied && skipped_ < options_.skip_nonfinite) {
    ++skipped_;
    if (world_->rank() == 0) {
      fmt::print(stderr,
                 "tandem: warning: {}; update skipped ({} of {} allowed by --skip-nonfinite)\n",
                 what, skipped_, options_.skip_nonfinite);
      std::fflush(stderr);
    }
    return;
  }
  TD_THROW(
      "{}: training diverged; {}{}{}", what,
      applied ? "the update was applied, so nothing after step " + std::to_string(step_ - 1) +
                    " is saved"
              : "the update was not applied",
      options_.save.empty() ? ""
                            : fmt::format("; the last checkpoint in '{}' is kept", options_.save),
      applied || options_.skip_nonfinite > 0 ? ""
                                             : "; --skip-nonfinite N skips up to N such steps");
}

void Trainer::save(const std::string& dir) {
  CheckpointMeta meta;
  meta.model = layout_->config();
  meta.step = step_;
  meta.seed = options_.seed;
  meta.world_size = world_->size();
  meta.strategy = strategy_name(options_.strategy);
  meta.shard_size = engine_->program().shard_size;
  meta.align = engine_->flat().align();
  meta.train = train_options_to_json(options_);
  meta.data = {{"global_batch", options_.global_batch},
               {"seq", options_.seq},
               {"sequences_consumed", step_ * options_.global_batch}};
  const ShardState st = engine_->shards();
  checkpoint_save(dir, meta, engine_->flat(), engine_->shard_rank(), st, *control_,
                  control_device(), control_stream());
}

std::vector<std::vector<float>> Trainer::gather_params() {
  return engine_->gather_params();
}

// Rank 0 holds the --save directory's lock from construction to the end of each run().
void Trainer::lock_save_dir() {
  if (options_.save.empty() || world_->rank() != 0 || save_lock_) return;
  save_lock_ = std::make_unique<DirectoryLock>(options_.save, "checkpoint directory");
}

StepMetrics Trainer::run(const std::function<void(const StepMetrics&)>& on_step, int64_t until) {
  lock_save_dir();
  struct Unlock {
    std::unique_ptr<DirectoryLock>& lock;
    ~Unlock() { lock.reset(); }
  } unlock{save_lock_};
  StepMetrics last;
  ran_.clear();
  interrupted_ = 0;
  interrupt_checkpoint_.clear();
  const bool lead = world_->rank() == 0;
  const int64_t end = until > 0 ? std::min<int64_t>(until, options_.steps) : options_.steps;
  if (step_ >= options_.steps) {
    if (lead)
      fmt::print("checkpoint is at step {}, the run asks for {}: nothing to do\n", step_,
                 options_.steps);
    return last;
  }
  std::unique_ptr<LineFile> metrics;
  if (lead && !options_.metrics.empty())
    metrics = std::make_unique<LineFile>(options_.metrics, /*append=*/step_ > 0);
  const SignalScope signals;
  Progress progress(lead ? options_.progress : ProgressMode::none, context_.stdout_terminal, step_,
                    end, options_.log_every);
  while (step_ < end) {
    last = step();
    ran_.push_back(last);
    progress.update(last);
    if (metrics) metrics->write_line(step_metrics_to_json(last).dump());
    if (on_step) on_step(last);
    const int stop = agree_on_interrupt();
    const bool periodic = options_.save_every > 0 && step_ % options_.save_every == 0;
    if (!options_.save.empty() && (periodic || stop != 0)) save(options_.save);
    if (stop != 0) {
      progress.finish();
      interrupted_ = stop;
      interrupt_checkpoint_ = options_.save;
      return last;
    }
  }
  progress.finish();
  // A window reaching past the run's last step ends with the run.
  if (trace_ && !trace_->written() && step_ >= options_.steps)
    trace_->write(*layout_, engine_->program(), *control_, control_device(), control_stream());
  if (!options_.save.empty()) save(options_.save);
  return last;
}

// [Interrupts] Each rank's own signal, agreed over the ranks after every step (one count per
// kind of signal, all-reduced on the host communicator), so that all of them stop after the
// same step, whichever rank the signal reached, and name the same signal: a rank the signal
// has not reached yet takes the one the others got (SIGINT before SIGTERM before the stop
// requests SIGUSR2 and SIGUSR1).
int Trainer::agree_on_interrupt() {
  const int local = g_signal;
  if (world_->size() == 1) return local;
  static constexpr std::array<int, 4> kOrder = {SIGINT, SIGTERM, SIGUSR2, SIGUSR1};
  std::array<float, kOrder.size()> seen{};
  for (size_t i = 0; i < kOrder.size(); ++i) seen[i] = local == kOrder[i] ? 1.0f : 0.0f;
  control_->all_reduce(control_stream(), seen.data(), seen.data(), seen.size(), DType::f32,
                       "interrupt");
  control_device().stream_sync(control_stream());
  for (size_t i = 0; i < kOrder.size(); ++i)
    if (seen[i] > 0.0f) return kOrder[i];
  return 0;
}

const char* interrupt_signal_name(int sig) {
  return signal_name(sig);
}

}  // namespace tandem
