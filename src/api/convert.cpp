// Conversions between the public types and the internal ones.
#include "api/convert.h"

#include <filesystem>

#include "core/error.h"
#include "io/model_source.h"

namespace tandem::api {

namespace {

// The public defaults are those of `tandem train`, apart from progress (the library is
// quiet unless asked); these keep the two from drifting apart.
constexpr ::tandem::OptimConfig kOptim{};
constexpr OptimizerConfig kPublicOptim{};
static_assert(kOptim.lr == kPublicOptim.lr && kOptim.min_lr_ratio == kPublicOptim.min_lr_ratio &&
              kOptim.warmup == kPublicOptim.warmup &&
              kOptim.weight_decay == kPublicOptim.weight_decay &&
              kOptim.beta1 == kPublicOptim.beta1 && kOptim.beta2 == kPublicOptim.beta2 &&
              kOptim.eps == kPublicOptim.eps && kOptim.grad_clip == kPublicOptim.grad_clip);
// TrainConfig holds paths, so it has no constant instances: its defaults are spelled here.
// Building a TrainOptions at compile time needs constexpr std::string, which clang (up to
// 14 at least) does not evaluate in libstdc++; the GCC build checks it.
#if !defined(__clang__)
static_assert(
    [] {
      const ::tandem::TrainOptions o;
      return o.batch == 4 && o.global_batch == 0 && o.seq == 64 && o.steps == 100 &&
             o.seed == 1337 && o.shard_group == 0 && o.max_gathered == 2 && o.ranks == 0 &&
             o.comm_timeout == 300 && o.save_every == 0 && o.log_every == 10 && !o.save_overwrite &&
             o.skip_nonfinite == 0 && o.device == ::tandem::DeviceKind::cpu &&
             o.strategy == ::tandem::Strategy::full && o.recompute == ::tandem::Recompute::none &&
             o.recompute_blocks == 0 && o.loss_chunk == 0 &&
             o.reduce_dtype == ::tandem::DType::f32 &&
             o.cuda_graph == ::tandem::CudaGraphMode::automatic && !o.update_at_gather;
    }(),
    "TrainOptions defaults changed: change TrainConfig's in include/tandem/config.h to match");
#endif
static_assert(::tandem::kRecomputeBlocksAuto == TrainConfig::kAutoRecomputeBlocks,
              "--recompute-blocks auto is spelled alike in TrainOptions and TrainConfig");

}  // namespace

::tandem::DeviceKind to_internal(Device d) {
  switch (d) {
    case Device::cpu:
      return ::tandem::DeviceKind::cpu;
    case Device::cuda:
      return ::tandem::DeviceKind::cuda;
  }
  TD_THROW("unknown device {}", static_cast<int>(d));
}

::tandem::Strategy to_internal(Strategy s) {
  switch (s) {
    case Strategy::full:
      return ::tandem::Strategy::full;
    case Strategy::grad_op:
      return ::tandem::Strategy::grad_op;
    case Strategy::none:
      return ::tandem::Strategy::none;
    case Strategy::hybrid:
      return ::tandem::Strategy::hybrid;
  }
  TD_THROW("unknown strategy {}", static_cast<int>(s));
}

::tandem::Recompute to_internal(Recompute r) {
  switch (r) {
    case Recompute::none:
      return ::tandem::Recompute::none;
    case Recompute::attention:
      return ::tandem::Recompute::attention;
    case Recompute::unit:
      return ::tandem::Recompute::unit;
  }
  TD_THROW("unknown recompute mode {}", static_cast<int>(r));
}

Recompute from_internal(::tandem::Recompute r) {
  switch (r) {
    case ::tandem::Recompute::none:
      return Recompute::none;
    case ::tandem::Recompute::attention:
      return Recompute::attention;
    case ::tandem::Recompute::unit:
      return Recompute::unit;
  }
  TD_THROW("unknown recompute mode {}", static_cast<int>(r));
}

::tandem::DType to_internal(ReduceDtype d) {
  switch (d) {
    case ReduceDtype::f32:
      return ::tandem::DType::f32;
    case ReduceDtype::bf16:
      return ::tandem::DType::bf16;
  }
  TD_THROW("unknown reduce dtype {}", static_cast<int>(d));
}

ReduceDtype from_internal(::tandem::DType d) {
  switch (d) {
    case ::tandem::DType::f32:
      return ReduceDtype::f32;
    case ::tandem::DType::bf16:
      return ReduceDtype::bf16;
  }
  TD_THROW("unknown reduce dtype {}", static_cast<int>(d));
}

::tandem::CudaGraphMode to_internal(CudaGraph g) {
  switch (g) {
    case CudaGraph::automatic:
      return ::tandem::CudaGraphMode::automatic;
    case CudaGraph::on:
      return ::tandem::CudaGraphMode::on;
    case CudaGraph::off:
      return ::tandem::CudaGraphMode::off;
  }
  TD_THROW("unknown cuda graph mode {}", static_cast<int>(g));
}

CudaGraph from_internal(::tandem::CudaGraphMode g) {
  switch (g) {
    case ::tandem::CudaGraphMode::automatic:
      return CudaGraph::automatic;
    case ::tandem::CudaGraphMode::on:
      return CudaGraph::on;
    case ::tandem::CudaGraphMode::off:
      return CudaGraph::off;
  }
  TD_THROW("unknown cuda graph mode {}", static_cast<int>(g));
}

::tandem::ProgressMode to_internal(Progress p) {
  switch (p) {
    case Progress::automatic:
      return ::tandem::ProgressMode::automatic;
    case Progress::bar:
      return ::tandem::ProgressMode::bar;
    case Progress::lines:
      return ::tandem::ProgressMode::lines;
    case Progress::none:
      return ::tandem::ProgressMode::none;
  }
  TD_THROW("unknown progress mode {}", static_cast<int>(p));
}

Strategy from_internal(::tandem::Strategy s) {
  switch (s) {
    case ::tandem::Strategy::full:
      return Strategy::full;
    case ::tandem::Strategy::grad_op:
      return Strategy::grad_op;
    case ::tandem::Strategy::none:
      return Strategy::none;
    case ::tandem::Strategy::hybrid:
      return Strategy::hybrid;
  }
  TD_THROW("unknown strategy {}", static_cast<int>(s));
}

Family from_internal(::tandem::Family f) {
  switch (f) {
    case ::tandem::Family::gpt2:
      return Family::gpt2;
    case ::tandem::Family::llama:
      return Family::llama;
    case ::tandem::Family::neox:
      return Family::neox;
  }
  TD_THROW("unknown model family {}", static_cast<int>(f));
}

::tandem::TrainOptions to_options(const TrainConfig& c) {
  ::tandem::TrainOptions o;
  o.model = c.model;
  o.data = c.data.string();
  o.batch = c.batch;
  o.global_batch = c.global_batch;
  o.seq = c.seq;
  o.steps = c.steps;
  o.seed = c.seed;
  o.optim.lr = c.optimizer.lr;
  o.optim.min_lr_ratio = c.optimizer.min_lr_ratio;
  o.optim.warmup = c.optimizer.warmup;
  o.optim.weight_decay = c.optimizer.weight_decay;
  o.optim.beta1 = c.optimizer.beta1;
  o.optim.beta2 = c.optimizer.beta2;
  o.optim.eps = c.optimizer.eps;
  o.optim.grad_clip = c.optimizer.grad_clip;
  o.shard_group = c.shard_group;
  o.max_gathered = c.max_gathered;
  o.recompute = to_internal(c.recompute);
  o.recompute_blocks = c.recompute_blocks;
  o.loss_chunk = c.loss_chunk;
  o.reduce_dtype = to_internal(c.reduce_dtype);
  o.cuda_graph = to_internal(c.cuda_graph);
  o.update_at_gather = c.update_at_gather;
  o.ranks = c.ranks;
  o.comm_timeout = c.comm_timeout_s;
  // The option is a size text ("8GiB"); a plain number is bytes.
  o.mem_limit = c.mem_limit_bytes == 0 ? std::string() : std::to_string(c.mem_limit_bytes);
  o.save = c.save_dir.string();
  o.save_every = c.save_every;
  o.save_overwrite = c.save_overwrite;
  o.skip_nonfinite = c.skip_nonfinite;
  o.resume = c.resume_dir.string();
  o.init_from = c.init_from.string();
  o.metrics = c.metrics_path.string();
  o.log_every = c.log_every;
  o.device = to_internal(c.device);
  o.strategy = to_internal(c.strategy);
  o.progress = to_internal(c.progress);
  o.trace = c.trace_path.string();
  o.trace_steps = c.trace_steps;
  // Trainer::run of the API prints no planner prediction, so none is made.
  o.hardware = "none";
  return o;
}

TrainConfig from_options(const ::tandem::TrainOptions& o) {
  // What only the tandem command does with them: predict after the run.
  TD_CHECK(o.hardware == "auto" || o.hardware == "none",
           "training option 'hardware' is the tandem command's (its prediction after the run); "
           "the library takes tandem::plan for that");
  TD_CHECK(o.hardware_compute.empty() && o.hardware_links.empty() &&
               o.calibrate_after == ::tandem::TrainOptions{}.calibrate_after,
           "training options 'hardware-compute', 'hardware-links' and 'calibrate-after' are the "
           "tandem command's; the library takes tandem::plan for that");
  TrainConfig c;
  c.model = o.model;
  c.data = o.data;
  c.device = o.device == ::tandem::DeviceKind::cuda ? Device::cuda : Device::cpu;
  c.batch = o.batch;
  c.global_batch = o.global_batch;
  c.seq = o.seq;
  c.steps = o.steps;
  c.seed = o.seed;
  c.optimizer.lr = o.optim.lr;
  c.optimizer.min_lr_ratio = o.optim.min_lr_ratio;
  c.optimizer.warmup = o.optim.warmup;
  c.optimizer.weight_decay = o.optim.weight_decay;
  c.optimizer.beta1 = o.optim.beta1;
  c.optimizer.beta2 = o.optim.beta2;
  c.optimizer.eps = o.optim.eps;
  c.optimizer.grad_clip = o.optim.grad_clip;
  c.strategy = from_internal(o.strategy);
  c.shard_group = o.shard_group;
  c.max_gathered = o.max_gathered;
  c.recompute = from_internal(o.recompute);
  c.recompute_blocks = o.recompute_blocks;
  c.loss_chunk = o.loss_chunk;
  c.reduce_dtype = from_internal(o.reduce_dtype);
  c.cuda_graph = from_internal(o.cuda_graph);
  c.update_at_gather = o.update_at_gather;
  c.ranks = o.ranks;
  c.comm_timeout_s = o.comm_timeout;
  c.mem_limit_bytes = o.mem_limit.empty() ? 0 : ::tandem::parse_bytes(o.mem_limit);
  c.save_dir = o.save;
  c.save_every = o.save_every;
  c.save_overwrite = o.save_overwrite;
  c.skip_nonfinite = o.skip_nonfinite;
  c.resume_dir = o.resume;
  c.init_from = o.init_from;
  c.metrics_path = o.metrics;
  c.log_every = o.log_every;
  switch (o.progress) {
    case ::tandem::ProgressMode::automatic:
      c.progress = Progress::automatic;
      break;
    case ::tandem::ProgressMode::bar:
      c.progress = Progress::bar;
      break;
    case ::tandem::ProgressMode::lines:
      c.progress = Progress::lines;
      break;
    case ::tandem::ProgressMode::none:
      c.progress = Progress::none;
      break;
  }
  c.trace_path = o.trace;
  c.trace_steps = o.trace_steps;
  return c;
}

::tandem::TrainContext train_context(const ::tandem::Environment& env) {
  ::tandem::TrainContext context;
  context.mpi = env.launch.mpi;
  context.local_rank = env.launch.local_rank;
  context.stdout_terminal = env.stdout_terminal;
  return context;
}

StepMetrics from_internal(const ::tandem::StepMetrics& m) {
  StepMetrics p;
  p.step = m.step;
  p.loss = m.loss;
  p.lr = m.lr;
  p.grad_norm = m.grad_norm;
  p.tokens_per_s = m.tokens_per_s;
  p.step_ms = m.step_ms;
  p.compute_ms = m.compute_ms;
  p.comm_ms = m.comm_ms;
  p.exposed_comm_ms = m.exposed_comm_ms;
  p.peak_mem_bytes = m.peak_mem_bytes;
  p.skipped = m.skipped;
  return p;
}

ModelInfo model_info(const ::tandem::ModelConfig& c, int64_t checkpoint_step) {
  ModelInfo m;
  m.name = c.name;
  m.family = from_internal(c.family);
  m.vocab = c.vocab;
  m.vocab_padded = c.vocab_padded;
  m.context = c.context;
  m.d_model = c.d_model;
  m.n_layer = c.n_layer;
  m.n_head = c.n_head;
  m.n_kv_head = c.n_kv_head;
  m.d_ff = c.d_ff;
  m.num_params = c.num_params();
  m.num_params_padded = c.num_params_padded();
  m.checkpoint_step = checkpoint_step;
  return m;
}

::tandem::ModelConfig resolve_model(const std::string& preset_or_path, int64_t* checkpoint_step) {
  return ::tandem::model_resolve(preset_or_path, checkpoint_step);
}

}  // namespace tandem::api
