// The tandem library: train GPT-, Llama- and NeoX-family models with fully sharded data
// parallelism on CPUs and NVIDIA GPUs, and predict a run's step time, communication and
// memory beforehand. This header includes the whole public API:
//
//   tandem/error.h    tandem::Error, the one exception type
//   tandem/model.h    model presets and shapes: load_model_info, model_presets
//   tandem/data.h     token files: prepare_text_files, byte_tokens, write_token_file
//   tandem/tokenizer.h  Tokenizer: tokenizer.json, tokenizer.model, vocab.json, bytes
//   tandem/config.h   TrainConfig and its enums (Device, Strategy, Progress)
//   tandem/trainer.h  Trainer and StepMetrics
//   tandem/plan.h     the planner: plan, PlanRequest, PlanResult
//   tandem/inference.h  Model: load a checkpoint or Hugging Face directory, generate,
//                     logits, the weights under their Hugging Face names
//
// Link with tandem::tandem (find_package(tandem); docs/building.md). The headers need only
// the C++20 standard library.
#pragma once

#include "tandem/config.h"
#include "tandem/data.h"
#include "tandem/error.h"
#include "tandem/inference.h"
#include "tandem/model.h"
#include "tandem/plan.h"
#include "tandem/tokenizer.h"
#include "tandem/trainer.h"
