// Conversions between the public types of include/tandem/ and the internal ones. The
// public types are named api::X here and the internal ones ::tandem::X (the reason is in
// include/tandem/error.h).
#pragma once

#include <tandem/config.h>
#include <tandem/model.h>
#include <tandem/trainer.h>

#include <cstdint>
#include <string>

#include "api/environment.h"
#include "device/device.h"
#include "model/config.h"
#include "shard/program.h"
#include "train/options.h"
#include "train/trainer.h"

namespace tandem::api {

::tandem::DeviceKind to_internal(Device d);
::tandem::Strategy to_internal(Strategy s);
::tandem::Recompute to_internal(Recompute r);
::tandem::ProgressMode to_internal(Progress p);
::tandem::DType to_internal(ReduceDtype d);
ReduceDtype from_internal(::tandem::DType d);
Recompute from_internal(::tandem::Recompute r);
Strategy from_internal(::tandem::Strategy s);
Family from_internal(::tandem::Family f);

// The options of `tandem train` that the config decides; the rest keep their defaults.
::tandem::TrainOptions to_options(const TrainConfig& c);
// The public config of internal options (the JSON of `tandem train --config`); throws for
// the options only the tandem command takes.
TrainConfig from_options(const ::tandem::TrainOptions& o);
// What the process environment decides for a run (api/environment.h): the launcher's
// ranks, whether stdout is a terminal, and the CUDA attention kernels (TANDEM_ATTENTION),
// as the tandem command takes them.
::tandem::TrainContext train_context(const ::tandem::Environment& env);
StepMetrics from_internal(const ::tandem::StepMetrics& m);
ModelInfo model_info(const ::tandem::ModelConfig& c, int64_t checkpoint_step = 0);

// A preset, a JSON model config (a path ending in .json), a checkpoint directory or a
// Hugging Face model directory; sets
// *checkpoint_step to the checkpoint's step (0 otherwise) when given.
::tandem::ModelConfig resolve_model(const std::string& preset_or_path,
                                    int64_t* checkpoint_step = nullptr);

}  // namespace tandem::api
