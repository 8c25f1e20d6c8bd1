// Options of `tandem train`. The JSON keys of --config files are the flag names without
// the leading dashes ("global-batch": 32); flags given on the command line override them.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "optim/optim.h"

namespace tandem {

struct TrainOptions {
  std::string model;  // preset or JSON config; empty when resuming (taken from the checkpoint)
  std::string data;   // token file
  std::string device = "cpu";
  int batch = 4;         // sequences per rank per micro-step
  int global_batch = 0;  // sequences per optimizer step; 0 = batch x ranks
  int seq = 64;          // sequence length
  int steps = 100;       // total optimizer steps of the run
  uint64_t seed = 1337;
  OptimConfig optim;
  std::string metrics;  // JSONL file, one object per step
  std::string save;     // checkpoint directory, written at the end and every save_every steps
  int save_every = 0;
  std::string resume;             // checkpoint directory to continue from
  int log_every = 10;             // optimizer steps between plain progress lines
  std::string progress = "auto";  // auto | bar | lines | none
  // Sharding (see docs/design.md, "Strategies").
  int ranks = 0;                    // expected world size; 0 = what the launcher gives
  std::string strategy = "full";    // full | grad-op | none | hybrid
  int shard_group = 0;              // hybrid: ranks per shard group
  int max_gathered = 2;             // full/hybrid: units gathered at once
  double comm_timeout = 300;        // seconds before a collective gives up
  std::string mem_limit;            // per-rank memory bound ("8GiB", "512M", bytes); empty = none
  std::string trace;                // Chrome-trace JSON of the traced steps
  std::string trace_steps = "1:3";  // window of steps to trace, "A:B" (1-based)
  // Predicted next to measured (train/prediction.h): a preset, auto or none, and probe files.
  std::string hardware = "auto";
  std::string hardware_compute, hardware_links;
};

// "8GiB", "1.5G", "512MiB", "300M", "4096" (bytes; k/M/G/T are powers of 1024).
uint64_t parse_bytes(const std::string& text);

// Applies the keys present in j; unknown keys and ill-typed values are errors.
void train_options_apply_json(TrainOptions& o, const nlohmann::json& j);
nlohmann::json train_options_to_json(const TrainOptions& o);
// Range checks that need no files (positive sizes, probabilities in range, ...).
void train_options_validate(const TrainOptions& o);

}  // namespace tandem
