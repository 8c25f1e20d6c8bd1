// The training loop: resumable, rank-aware, with metrics and progress on rank 0.
#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "io/tokens.h"
#include "train/progress.h"

namespace tandem {

namespace {

volatile std::sig_atomic_t g_interrupted = 0;
void on_interrupt(int) {
  g_interrupted = 1;
}

ModelConfig resolve_model(const TrainOptions& o, const CheckpointMeta* meta) {
  if (meta == nullptr) {
    TD_CHECK(!o.model.empty(), "--model is required (a preset or a JSON config)");
    return model_config_resolve(o.model);
  }
  if (o.model.empty()) return meta->model;
  checkpoint_check_model(*meta, model_config_resolve(o.model));
  return meta->model;
}

}  // namespace

nlohmann::json step_metrics_to_json(const StepMetrics& m) {
  return {{"step", m.step},
          {"loss", m.loss},
          {"lr", m.lr},
          {"grad_norm", m.grad_norm},
          {"tokens_per_s", m.tokens_per_s},
          {"step_ms", m.step_ms},
          {"compute_ms", m.compute_ms},
          {"comm_ms", m.comm_ms},
          {"exposed_comm_ms", m.exposed_comm_ms},
          {"peak_mem_bytes", m.peak_mem_bytes}};
}

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
  layout_ = std::make_unique<ModelLayout>(resolve_model(options_, resumed_.get()));
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
  engine_ = std::make_unique<Engine>(*layout_, ec, *device_, *world_);
  // The step's token ids are filled in place every step, never reallocated.
  const size_t ids = static_cast<size_t>(engine_->micro_steps()) * options_.batch * options_.seq;
  inputs_.reserve(ids);
  targets_.reserve(ids);

  if (resumed_) {
    engine_->set_shards(
        checkpoint_load_shard(options_.resume, engine_->flat(), engine_->shard_rank()));
    step_ = resumed_->step;
  }
  if (!options_.trace.empty())
    trace_ = std::make_unique<StepTrace>(options_.trace, options_.trace_steps);
  if (!options_.save.empty() && world_->rank() == 0) {
    // Find out now, not after hours of training, that the checkpoint cannot be written.
    std::error_code ec2;
    std::filesystem::create_directories(options_.save, ec2);
    TD_CHECK(std::filesystem::is_directory(options_.save),
             "cannot create checkpoint directory '{}': {}", options_.save, ec2.message());
  }
}

Trainer::~Trainer() = default;

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
  TD_CHECK(std::isfinite(m.loss), "loss is {} at step {}: training diverged", m.loss, step_);
  return m;
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

StepMetrics Trainer::run() {
  StepMetrics last;
  ran_.clear();
  const bool lead = world_->rank() == 0;
  if (step_ >= options_.steps) {
    if (lead)
      fmt::print("checkpoint is at step {}, the run asks for {}: nothing to do\n", step_,
                 options_.steps);
    return last;
  }
  std::ofstream metrics;
  if (lead && !options_.metrics.empty()) {
    metrics.open(options_.metrics, step_ > 0 ? std::ios::app : std::ios::trunc);
    TD_CHECK(metrics.good(), "cannot open metrics file '{}'", options_.metrics);
  }
  g_interrupted = 0;
  // Ctrl-C saves and stops at a step boundary. With several ranks the launcher delivers
  // the signal to every rank at slightly different steps, so there it simply ends the job.
  auto previous = world_->size() == 1 ? std::signal(SIGINT, on_interrupt) : SIG_DFL;
  Progress progress(lead ? options_.progress : ProgressMode::none, context_.stdout_terminal, step_,
                    options_.steps, options_.log_every);
  try {
    while (step_ < options_.steps) {
      last = step();
      ran_.push_back(last);
      progress.update(last);
      if (metrics.is_open()) {
        metrics << step_metrics_to_json(last).dump() << '\n';
        metrics.flush();
      }
      const bool periodic = options_.save_every > 0 && step_ % options_.save_every == 0;
      if (!options_.save.empty() && (periodic || g_interrupted)) save(options_.save);
      if (g_interrupted) {
        progress.finish();
        TD_THROW("interrupted at step {}{}", step_,
                 options_.save.empty() ? "" : "; checkpoint saved to " + options_.save);
      }
    }
  } catch (...) {
    if (world_->size() == 1) std::signal(SIGINT, previous);
    throw;
  }
  if (world_->size() == 1) std::signal(SIGINT, previous);
  progress.finish();
  // A window reaching past the run's last step ends with the run.
  if (trace_ && !trace_->written())
    trace_->write(*layout_, engine_->program(), *control_, control_device(), control_stream());
  if (!options_.save.empty()) save(options_.save);
  return last;
}

}  // namespace tandem
