// The single-rank training loop.
#include "train/trainer.h"

#include <csignal>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "device/cpu/kernels.h"
#include "io/tokens.h"
#include "train/progress.h"

namespace tandem {

namespace {

volatile std::sig_atomic_t g_interrupted = 0;
void on_interrupt(int) { g_interrupted = 1; }

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

ModelConfig resolve_model(const TrainOptions& o, const Checkpoint* ckpt) {
  if (ckpt == nullptr) {
    TD_CHECK(!o.model.empty(), "--model is required (a preset or a JSON config)");
    return model_config_resolve(o.model);
  }
  if (o.model.empty()) return ckpt->model;
  ModelConfig asked = model_config_resolve(o.model);
  checkpoint_check_model(*ckpt, asked);
  return ckpt->model;
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

Trainer::Trainer(TrainOptions options)
    : options_(std::move(options)),
      resumed_([this] {
        train_options_validate(options_);
        TD_CHECK(options_.device == "cpu",
                 "--device {}: this build trains on cpu only (the CUDA backend is not built yet)",
                 options_.device);
        return options_.resume.empty()
                   ? nullptr
                   : std::make_unique<Checkpoint>(checkpoint_load(options_.resume));
      }()),
      layout_(resolve_model(options_, resumed_.get())) {
  const ModelConfig& c = layout_.config();
  // A resumed run keeps the checkpoint's seed, so the data order stays the same.
  if (resumed_) options_.seed = resumed_->seed;
  TD_CHECK(options_.seq <= c.context, "--seq {} exceeds the context length {} of model '{}'",
           options_.seq, c.context, c.name);
  const int ranks = 1;
  const int G = options_.global_batch > 0 ? options_.global_batch : options_.batch * ranks;
  TD_CHECK(G % (options_.batch * ranks) == 0,
           "--global-batch {} is not a multiple of --batch {} x {} rank(s)", G, options_.batch,
           ranks);
  options_.global_batch = G;
  micro_steps_ = G / (options_.batch * ranks);

  TD_CHECK(!options_.data.empty(), "--data is required (a token file; see 'tandem data prepare')");
  TokenData tokens = tokens_read(options_.data);
  data_ = std::make_unique<Dataset>(std::move(tokens.tokens), options_.seq, options_.seed,
                                    options_.data);
  data_->check_vocab(c.vocab);

  const size_t units = static_cast<size_t>(layout_.num_units());
  params_.resize(units);
  grads_.resize(units);
  m_.resize(units);
  v_.resize(units);
  for (size_t u = 0; u < units; ++u) {
    const size_t n = static_cast<size_t>(layout_.unit(static_cast<int>(u)).numel);
    params_[u].resize(n);
    grads_[u].assign(n, 0.0f);
    m_[u].assign(n, 0.0f);
    v_[u].assign(n, 0.0f);
  }
  if (options_.resume.empty()) {
    for (size_t u = 0; u < units; ++u)
      layout_.init_slice(static_cast<int>(u), options_.seed, 0,
                         static_cast<int64_t>(params_[u].size()), params_[u].data());
  } else {
    Checkpoint& ckpt = *resumed_;
    for (size_t u = 0; u < units; ++u) {
      params_[u] = std::move(ckpt.units[u].params);
      m_[u] = std::move(ckpt.units[u].m);
      v_[u] = std::move(ckpt.units[u].v);
    }
    step_ = ckpt.step;
    const int ckpt_batch = ckpt.data.value("global_batch", G);
    const int ckpt_seq = ckpt.data.value("seq", options_.seq);
    TD_CHECK(ckpt_batch == G && ckpt_seq == options_.seq,
             "checkpoint was trained with global batch {} and sequence {}; this run asks for {} "
             "and {}",
             ckpt_batch, ckpt_seq, G, options_.seq);
    resumed_.reset();
  }
  ws_ = std::make_unique<Workspace>(c, options_.batch, options_.seq);
  if (!options_.save.empty()) {
    // Find out now, not after hours of training, that the checkpoint cannot be written.
    std::error_code ec;
    std::filesystem::create_directories(options_.save, ec);
    TD_CHECK(std::filesystem::is_directory(options_.save),
             "cannot create checkpoint directory '{}': {}", options_.save, ec.message());
  }
}

uint64_t Trainer::memory_bytes() const {
  uint64_t n = 0;
  for (const auto& p : params_) n += 4 * sizeof(float) * p.size();  // params, grads, m, v
  return n + ws_->bytes();
}

StepMetrics Trainer::step() {
  const auto t0 = std::chrono::steady_clock::now();
  const int B = options_.batch, T = options_.seq, G = options_.global_batch;
  const float dloss = 1.0f / static_cast<float>(int64_t{G} * T);
  for (auto& g : grads_) std::fill(g.begin(), g.end(), 0.0f);

  UnitBuffers params, grads;
  for (size_t u = 0; u < params_.size(); ++u) {
    params.push_back(params_[u].data());
    grads.push_back(grads_[u].data());
  }
  double loss_sum = 0;
  for (int micro = 0; micro < micro_steps_; ++micro) {
    data_->batch(step_, G, micro * B, B, ws_->tokens.data(), ws_->targets.data());
    model_forward(layout_, params, *ws_);
    model_backward(layout_, params, grads, *ws_, dloss);
    for (int i = 0; i < ws_->N; ++i) loss_sum += ws_->losses[i];
  }

  double sumsq = 0;
  for (const auto& g : grads_) sumsq += cpu::sum_squares(g.data(), static_cast<int64_t>(g.size()));
  const double norm = std::sqrt(sumsq);
  const float scale = clip_scale(options_.optim, norm);
  const float lr = lr_at(options_.optim, static_cast<int>(step_), options_.steps);
  for (size_t u = 0; u < params_.size(); ++u)
    adamw_unit_range(options_.optim, layout_.unit(static_cast<int>(u)), 0,
                     static_cast<int64_t>(params_[u].size()), params_[u].data(),
                     grads_[u].data(), m_[u].data(), v_[u].data(), lr,
                     static_cast<int>(step_) + 1, scale);
  ++step_;

  StepMetrics m;
  m.step = step_;
  m.loss = loss_sum / (static_cast<double>(G) * T);
  m.lr = lr;
  m.grad_norm = norm;
  m.step_ms = ms_since(t0);
  m.compute_ms = m.step_ms;
  m.tokens_per_s = static_cast<double>(G) * T / (m.step_ms / 1e3);
  m.peak_mem_bytes = memory_bytes();
  TD_CHECK(std::isfinite(m.loss), "loss is {} at step {}: training diverged", m.loss, step_);
  return m;
}

Checkpoint Trainer::checkpoint() const {
  Checkpoint c;
  c.model = layout_.config();
  c.step = step_;
  c.seed = options_.seed;
  c.world_size = 1;
  c.strategy = "none";
  c.train = train_options_to_json(options_);
  c.data = {{"global_batch", options_.global_batch},
            {"seq", options_.seq},
            {"sequences_consumed", step_ * options_.global_batch}};
  for (size_t u = 0; u < params_.size(); ++u) c.units.push_back({params_[u], m_[u], v_[u]});
  return c;
}

void Trainer::save(const std::string& dir) const { checkpoint_save(dir, checkpoint()); }

StepMetrics Trainer::run() {
  StepMetrics last;
  if (step_ >= options_.steps) {
    fmt::print("checkpoint is at step {}, the run asks for {}: nothing to do\n", step_,
               options_.steps);
    return last;
  }
  std::ofstream metrics;
  if (!options_.metrics.empty()) {
    metrics.open(options_.metrics, step_ > 0 ? std::ios::app : std::ios::trunc);
    TD_CHECK(metrics.good(), "cannot open metrics file '{}'", options_.metrics);
  }
  g_interrupted = 0;
  auto previous = std::signal(SIGINT, on_interrupt);
  Progress progress(options_.progress, step_, options_.steps, options_.log_every);
  try {
    while (step_ < options_.steps) {
      last = step();
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
    std::signal(SIGINT, previous);
    throw;
  }
  std::signal(SIGINT, previous);
  progress.finish();
  if (!options_.save.empty()) save(options_.save);
  return last;
}

}  // namespace tandem
