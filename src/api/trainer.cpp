// tandem::Trainer of the public API: the internal trainer behind a pimpl, and the run loop
// with a per-step callback.
#include <tandem/trainer.h>

#include <fstream>
#include <utility>

#include "api/convert.h"
#include "api/environment.h"
#include "api/errors.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "io/shard_checkpoint.h"
#include "train/progress.h"
#include "train/trainer.h"

namespace tandem::api {

struct Trainer::Impl {
  Impl(const TrainConfig& c, const ::tandem::Environment& env)
      : config(c),
        stdout_terminal(env.stdout_terminal),
        trainer(options(c, env), train_context(env)) {
    // What the run resolved: the global batch, and a resumed checkpoint's seed.
    const ::tandem::TrainOptions& o = trainer.options();
    config.global_batch = o.global_batch;
    config.seed = o.seed;
    model = model_info(trainer.layout().config(), c.resume_dir.empty() ? 0 : trainer.steps_done());
  }

  static ::tandem::TrainOptions options(const TrainConfig& c, const ::tandem::Environment& env) {
    ::tandem::TrainOptions o = to_options(c);
    o.attention = env.attention;
    o.flash_backward = env.flash_backward;
    return o;
  }

  TrainConfig config;
  bool stdout_terminal = false;
  ::tandem::Trainer trainer;
  ModelInfo model;
};

Trainer::Trainer(const TrainConfig& config)
    : impl_(translate_errors(
          [&] { return std::make_unique<Impl>(config, ::tandem::environment_from_process()); })) {}

Trainer::~Trainer() = default;
Trainer::Trainer(Trainer&&) noexcept = default;
Trainer& Trainer::operator=(Trainer&&) noexcept = default;

StepMetrics Trainer::step() {
  return translate_errors([&] { return from_internal(impl_->trainer.step()); });
}

// The loop of `tandem train` (src/train/trainer.cpp), calling on_step after each step.
// The callback runs inside the translation, but only the library's own errors are
// translated: what the callback throws reaches the caller as it is.
StepMetrics Trainer::run(const StepCallback& on_step) {
  return run(on_step, 0);
}

StepMetrics Trainer::run(const StepCallback& on_step, int64_t steps) {
  ::tandem::Trainer& t = impl_->trainer;
  const int64_t until = steps > 0 ? t.steps_done() + steps : 0;
  if (steps < 0) translate_errors([&] { TD_THROW("steps must not be negative, got {}", steps); });
  const ::tandem::StepMetrics last = translate_errors([&] {
    if (!on_step) return t.run({}, until);
    return t.run([&](const ::tandem::StepMetrics& m) { on_step(from_internal(m)); }, until);
  });
  return t.ran().empty() ? StepMetrics{} : from_internal(last);
}

Trainer Trainer::resume(const std::filesystem::path& dir, const std::string& overrides_json) {
  const TrainConfig config = translate_errors([&] {
    const ::tandem::CheckpointMeta meta = ::tandem::checkpoint_read_meta(dir.string());
    TD_CHECK(meta.train.is_object() && !meta.train.empty(),
             "checkpoint '{}' records no training options: give a TrainConfig with resume_dir",
             dir.string());
    nlohmann::json j = meta.train;
    for (const char* key : {"hardware", "hardware-compute", "hardware-links", "init-from"})
      j.erase(key);
    j["resume"] = dir.string();
    j["progress"] = "none";
    nlohmann::json overrides;
    try {
      overrides = nlohmann::json::parse(overrides_json);
    } catch (const nlohmann::json::parse_error& e) {
      TD_THROW("overrides are not JSON: {}", e.what());
    }
    TD_CHECK(overrides.is_object(), "overrides must be a JSON object, got {}",
             overrides.type_name());
    j.update(overrides);
    return train_config_from_json(j.dump());
  });
  return Trainer(config);
}

int Trainer::interrupted() const {
  return impl_->trainer.interrupted();
}

void Trainer::save(const std::filesystem::path& dir) {
  translate_errors([&] { impl_->trainer.save(dir.string()); });
}

int64_t Trainer::steps_done() const {
  return impl_->trainer.steps_done();
}

int Trainer::rank() const {
  return impl_->trainer.rank();
}

int Trainer::world_size() const {
  return impl_->trainer.world_size();
}

const TrainConfig& Trainer::config() const {
  return impl_->config;
}

const ModelInfo& Trainer::model() const {
  return impl_->model;
}

void finalize() {
  translate_errors([] { ::tandem::comm_finalize(); });
}

void abort_job(int exit_code) {
  ::tandem::comm_abort(exit_code);
}

}  // namespace tandem::api
