// Conversion of training options from and to JSON, their validation, and the spellings of
// the progress modes and of sizes.
#include "train/options.h"

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>

#include "core/error.h"
#include "core/size.h"

namespace tandem {

namespace {

template <typename T>
void read(const nlohmann::json& j, const std::string& key, T& field) {
  const nlohmann::json& v = j.at(key);
  if constexpr (std::is_same_v<T, std::string>) {
    TD_CHECK(v.is_string(), "option '{}' must be a string, got {}", key, v.dump());
  } else if constexpr (std::is_same_v<T, bool>) {
    TD_CHECK(v.is_boolean(), "option '{}' must be true or false, got {}", key, v.dump());
  } else if constexpr (std::is_integral_v<T>) {
    TD_CHECK(v.is_number_integer(), "option '{}' must be an integer, got {}", key, v.dump());
    const bool fits =
        v.is_number_unsigned()
            ? v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
            : v.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                  (std::is_unsigned_v<T> ||
                   v.get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max()));
    TD_CHECK(fits, "option '{}' is out of range: {}", key, v.dump());
  } else {
    TD_CHECK(v.is_number(), "option '{}' must be a number, got {}", key, v.dump());
    // A flag's "inf" or "nan" arrives as a non-finite double (JSON itself has none).
    TD_CHECK(std::isfinite(v.get<double>()), "option '{}' (--{}) must be a finite number, got {}",
             key, key, v.get<double>());
    // A double beyond the field's range has no value of its type (the conversion is
    // undefined).
    TD_CHECK(std::fabs(v.get<double>()) <= static_cast<double>(std::numeric_limits<T>::max()),
             "option '{}' is out of range: {}", key, v.dump());
  }
  field = v.get<T>();
}

using Binder = std::function<void(const nlohmann::json&, const std::string&, TrainOptions&)>;

template <typename T>
Binder field_binder(T TrainOptions::*field) {
  return [field](const nlohmann::json& j, const std::string& k, TrainOptions& o) {
    read(j, k, o.*field);
  };
}

// An enum option spelled as a string: parse turns the spelling into the value, or throws.
template <typename T, typename Parse>
Binder enum_binder(T TrainOptions::*field, Parse parse) {
  return [field, parse](const nlohmann::json& j, const std::string& k, TrainOptions& o) {
    std::string name;
    read(j, k, name);
    o.*field = parse(name);
  };
}

template <typename T>
Binder optim_binder(T OptimConfig::*field) {
  return [field](const nlohmann::json& j, const std::string& k, TrainOptions& o) {
    read(j, k, o.optim.*field);
  };
}

const std::map<std::string, Binder>& binders() {
  static const std::map<std::string, Binder> table = {
      {"model", field_binder(&TrainOptions::model)},
      {"data", field_binder(&TrainOptions::data)},
      {"device", enum_binder(&TrainOptions::device, device_kind_parse)},
      {"batch", field_binder(&TrainOptions::batch)},
      {"global-batch", field_binder(&TrainOptions::global_batch)},
      {"seq", field_binder(&TrainOptions::seq)},
      {"steps", field_binder(&TrainOptions::steps)},
      {"seed", field_binder(&TrainOptions::seed)},
      {"metrics", field_binder(&TrainOptions::metrics)},
      {"save", field_binder(&TrainOptions::save)},
      {"save-every", field_binder(&TrainOptions::save_every)},
      {"save-overwrite", field_binder(&TrainOptions::save_overwrite)},
      {"skip-nonfinite", field_binder(&TrainOptions::skip_nonfinite)},
      {"resume", field_binder(&TrainOptions::resume)},
      {"init-from", field_binder(&TrainOptions::init_from)},
      {"log-every", field_binder(&TrainOptions::log_every)},
      {"progress", enum_binder(&TrainOptions::progress, progress_mode_parse)},
      {"ranks", field_binder(&TrainOptions::ranks)},
      {"strategy", enum_binder(&TrainOptions::strategy, strategy_parse)},
      {"shard-group", field_binder(&TrainOptions::shard_group)},
      {"max-gathered", field_binder(&TrainOptions::max_gathered)},
      {"recompute", enum_binder(&TrainOptions::recompute, recompute_parse)},
      {"recompute-blocks",
       [](const nlohmann::json& j, const std::string& k, TrainOptions& o) {
         const nlohmann::json& v = j.at(k);
         if (v.is_string()) {
           TD_CHECK(v.get<std::string>() == "auto",
                    "option '{}' must be a number of blocks or \"auto\", got {}", k, v.dump());
           o.recompute_blocks = kRecomputeBlocksAuto;
           return;
         }
         read(j, k, o.recompute_blocks);
         // Negative numbers are not a spelling of auto.
         TD_CHECK(o.recompute_blocks >= 0,
                  "--recompute-blocks must not be negative (0: every block; auto: the fewest "
                  "that fit), got {}",
                  o.recompute_blocks);
       }},
      {"loss-chunk", field_binder(&TrainOptions::loss_chunk)},
      {"reduce-dtype", enum_binder(&TrainOptions::reduce_dtype, reduce_dtype_parse)},
      {"cuda-graph",
       [](const nlohmann::json& j, const std::string& k, TrainOptions& o) {
         // true / false: the spelling of checkpoints written when the switch had two sides.
         const nlohmann::json& v = j.at(k);
         if (v.is_boolean()) {
           o.cuda_graph = v.get<bool>() ? CudaGraphMode::on : CudaGraphMode::off;
           return;
         }
         TD_CHECK(v.is_string(), "option '{}' must be \"auto\", \"on\" or \"off\", got {}", k,
                  v.dump());
         o.cuda_graph = cuda_graph_mode_parse(v.get<std::string>());
       }},
      {"update-at-gather", field_binder(&TrainOptions::update_at_gather)},
      {"comm-timeout", field_binder(&TrainOptions::comm_timeout)},
      {"mem-limit", field_binder(&TrainOptions::mem_limit)},
      {"trace", field_binder(&TrainOptions::trace)},
      {"trace-steps", field_binder(&TrainOptions::trace_steps)},
      {"hardware", field_binder(&TrainOptions::hardware)},
      {"hardware-compute", field_binder(&TrainOptions::hardware_compute)},
      {"hardware-links", field_binder(&TrainOptions::hardware_links)},
      {"calibrate-after", field_binder(&TrainOptions::calibrate_after)},
      {"lr", optim_binder(&OptimConfig::lr)},
      {"min-lr-ratio", optim_binder(&OptimConfig::min_lr_ratio)},
      {"warmup", optim_binder(&OptimConfig::warmup)},
      {"weight-decay", optim_binder(&OptimConfig::weight_decay)},
      {"beta1", optim_binder(&OptimConfig::beta1)},
      {"beta2", optim_binder(&OptimConfig::beta2)},
      {"eps", optim_binder(&OptimConfig::eps)},
      {"grad-clip", optim_binder(&OptimConfig::grad_clip)},
  };
  return table;
}

}  // namespace

void train_options_apply_json(TrainOptions& o, const nlohmann::json& j) {
  TD_CHECK(j.is_object(), "training config must be a JSON object, got {}", j.type_name());
  for (const auto& [key, value] : j.items()) {
    auto it = binders().find(key);
    TD_CHECK(it != binders().end(), "unknown training option '{}'", key);
    it->second(j, key, o);
  }
}

nlohmann::json train_options_to_json(const TrainOptions& o) {
  return {{"model", o.model},
          {"data", o.data},
          {"device", device_kind_name(o.device)},
          {"batch", o.batch},
          {"global-batch", o.global_batch},
          {"seq", o.seq},
          {"steps", o.steps},
          {"seed", o.seed},
          {"metrics", o.metrics},
          {"save", o.save},
          {"save-every", o.save_every},
          {"save-overwrite", o.save_overwrite},
          {"skip-nonfinite", o.skip_nonfinite},
          {"resume", o.resume},
          {"init-from", o.init_from},
          {"log-every", o.log_every},
          {"progress", progress_mode_name(o.progress)},
          {"ranks", o.ranks},
          {"strategy", strategy_name(o.strategy)},
          {"shard-group", o.shard_group},
          {"max-gathered", o.max_gathered},
          {"recompute", recompute_name(o.recompute)},
          {"recompute-blocks", o.recompute_blocks == kRecomputeBlocksAuto
                                   ? nlohmann::json("auto")
                                   : nlohmann::json(o.recompute_blocks)},
          {"loss-chunk", o.loss_chunk},
          {"reduce-dtype", std::string(dtype_name(o.reduce_dtype))},
          {"cuda-graph", cuda_graph_mode_name(o.cuda_graph)},
          {"update-at-gather", o.update_at_gather},
          {"comm-timeout", o.comm_timeout},
          {"mem-limit", o.mem_limit},
          {"trace", o.trace},
          {"trace-steps", o.trace_steps},
          {"hardware", o.hardware},
          {"hardware-compute", o.hardware_compute},
          {"hardware-links", o.hardware_links},
          {"calibrate-after", o.calibrate_after},
          {"lr", o.optim.lr},
          {"min-lr-ratio", o.optim.min_lr_ratio},
          {"warmup", o.optim.warmup},
          {"weight-decay", o.optim.weight_decay},
          {"beta1", o.optim.beta1},
          {"beta2", o.optim.beta2},
          {"eps", o.optim.eps},
          {"grad-clip", o.optim.grad_clip}};
}

void train_options_validate(const TrainOptions& o) {
  TD_CHECK(o.batch > 0, "--batch must be positive, got {}", o.batch);
  TD_CHECK(o.global_batch >= 0, "--global-batch must not be negative, got {}", o.global_batch);
  TD_CHECK(o.seq > 0, "--seq must be positive, got {}", o.seq);
  TD_CHECK(o.steps > 0, "--steps must be positive, got {}", o.steps);
  TD_CHECK(o.optim.lr > 0 && o.optim.lr < 10, "--lr must be in (0, 10), got {}", o.optim.lr);
  TD_CHECK(o.optim.warmup >= 0, "--warmup must not be negative, got {}", o.optim.warmup);
  TD_CHECK(o.optim.warmup <= o.steps,
           "--warmup {} exceeds --steps {}: the learning rate would never reach --lr",
           o.optim.warmup, o.steps);
  // Every real-valued option is finite: "inf" parses as a number but is no setting.
  for (const auto& [name, value] :
       {std::pair<const char*, double>{"--weight-decay", o.optim.weight_decay},
        {"--eps", o.optim.eps},
        {"--grad-clip", o.optim.grad_clip},
        {"--min-lr-ratio", o.optim.min_lr_ratio},
        {"--beta1", o.optim.beta1},
        {"--beta2", o.optim.beta2},
        {"--comm-timeout", o.comm_timeout}})
    TD_CHECK(std::isfinite(value), "{} must be a finite number, got {}", name, value);
  TD_CHECK(o.optim.min_lr_ratio >= 0 && o.optim.min_lr_ratio <= 1,
           "--min-lr-ratio must be in [0, 1], got {}", o.optim.min_lr_ratio);
  TD_CHECK(o.optim.weight_decay >= 0, "--weight-decay must not be negative, got {}",
           o.optim.weight_decay);
  TD_CHECK(o.optim.beta1 >= 0 && o.optim.beta1 < 1, "--beta1 must be in [0, 1), got {}",
           o.optim.beta1);
  TD_CHECK(o.optim.beta2 >= 0 && o.optim.beta2 < 1, "--beta2 must be in [0, 1), got {}",
           o.optim.beta2);
  TD_CHECK(o.optim.eps > 0, "--eps must be positive, got {}", o.optim.eps);
  TD_CHECK(o.optim.grad_clip >= 0, "--grad-clip must not be negative, got {}", o.optim.grad_clip);
  TD_CHECK(o.resume.empty() || o.init_from.empty(),
           "--init-from starts a fresh run and --resume continues one: give one of them");
  TD_CHECK(o.save_every >= 0, "--save-every must not be negative, got {}", o.save_every);
  TD_CHECK(o.skip_nonfinite >= 0, "--skip-nonfinite must not be negative, got {}",
           o.skip_nonfinite);
  TD_CHECK(o.log_every > 0, "--log-every must be positive, got {}", o.log_every);
  TD_CHECK(o.ranks >= 0, "--ranks must not be negative, got {}", o.ranks);
  TD_CHECK(o.strategy != Strategy::hybrid || o.shard_group >= 1,
           "--strategy hybrid needs --shard-group G (ranks per shard group)");
  TD_CHECK(o.strategy == Strategy::hybrid || o.shard_group == 0,
           "--shard-group applies to --strategy hybrid only");
  TD_CHECK(o.max_gathered >= 1, "--max-gathered must be at least 1, got {}", o.max_gathered);
  TD_CHECK(o.recompute_blocks >= 0 || o.recompute_blocks == kRecomputeBlocksAuto,
           "--recompute-blocks must not be negative (0: every block; auto: the fewest that fit), "
           "got {}",
           o.recompute_blocks);
  TD_CHECK(o.recompute_blocks == 0 || o.recompute != Recompute::none,
           "--recompute-blocks {} says how many blocks recompute: it needs --recompute attention "
           "or unit",
           o.recompute_blocks == kRecomputeBlocksAuto ? std::string("auto")
                                                      : std::to_string(o.recompute_blocks));
  TD_CHECK(o.loss_chunk >= 0, "--loss-chunk must not be negative (0: every row at once), got {}",
           o.loss_chunk);
  TD_CHECK(o.cuda_graph != CudaGraphMode::on || o.device == DeviceKind::cuda,
           "--cuda-graph captures the step as a CUDA graph: it needs --device cuda");
  TD_CHECK(o.calibrate_after >= 0 && std::isfinite(o.calibrate_after),
           "--calibrate-after must be a number of seconds, 0 or more, got {}", o.calibrate_after);
  TD_CHECK(o.comm_timeout > 0 && o.comm_timeout <= 1e9,
           "--comm-timeout must be positive and at most 1e9 s, got {}", o.comm_timeout);
  if (!o.mem_limit.empty()) parse_bytes(o.mem_limit);
}

CudaGraphMode cuda_graph_mode_parse(const std::string& name) {
  if (name == "auto") return CudaGraphMode::automatic;
  if (name == "on") return CudaGraphMode::on;
  if (name == "off") return CudaGraphMode::off;
  TD_THROW("--cuda-graph must be auto, on or off, got '{}'", name);
}

const char* cuda_graph_mode_name(CudaGraphMode mode) {
  switch (mode) {
    case CudaGraphMode::automatic:
      return "auto";
    case CudaGraphMode::on:
      return "on";
    case CudaGraphMode::off:
      return "off";
  }
  return "?";
}

bool cuda_graph_resolve(CudaGraphMode mode, DeviceKind device, int world) {
  switch (mode) {
    case CudaGraphMode::on:
      return true;
    case CudaGraphMode::off:
      return false;
    case CudaGraphMode::automatic:
      return device == DeviceKind::cuda && world == 1;
  }
  return false;
}

ProgressMode progress_mode_parse(const std::string& name) {
  if (name == "auto") return ProgressMode::automatic;
  if (name == "bar") return ProgressMode::bar;
  if (name == "lines") return ProgressMode::lines;
  if (name == "none") return ProgressMode::none;
  TD_THROW("--progress must be auto, bar, lines or none, got '{}'", name);
}

const char* progress_mode_name(ProgressMode mode) {
  switch (mode) {
    case ProgressMode::automatic:
      return "auto";
    case ProgressMode::bar:
      return "bar";
    case ProgressMode::lines:
      return "lines";
    case ProgressMode::none:
      return "none";
  }
  TD_THROW("unknown progress mode {}", static_cast<int>(mode));
}

uint64_t parse_bytes(const std::string& text) {
  return parse_size(text, "--mem-limit");
}

}  // namespace tandem
