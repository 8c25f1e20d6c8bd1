// Options of `tandem train`. The JSON keys of --config files are the flag names without
// the leading dashes ("global-batch": 32); flags given on the command line override them.
// Settings with a fixed set of values are enums here; their spellings are parsed only by
// train_options_apply_json and the *_parse functions.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "device/device.h"
#include "device/kernels.h"
#include "model/activations.h"
#include "optim/optim.h"
#include "shard/program.h"

namespace tandem {

// Progress output on rank 0: automatic (a redrawn bar on a terminal, plain lines
// otherwise), bar, lines (one every log_every steps) or none.
enum class ProgressMode { automatic, bar, lines, none };
// "auto" | "bar" | "lines" | "none"; throws "--progress must be auto, bar, lines or none,
// got '<name>'" for anything else.
ProgressMode progress_mode_parse(const std::string& name);
const char* progress_mode_name(ProgressMode mode);

// Whether the training step is captured as one CUDA graph ([Step graph], docs/design.md):
// on, off, or automatic, which is on for a run of one CUDA rank and off otherwise (a
// captured collective is outside --comm-timeout's watchdog, which matters only where
// another rank can die mid-step).
enum class CudaGraphMode { automatic, on, off };
// "auto" | "on" | "off"; throws "--cuda-graph must be auto, on or off, got '<name>'".
CudaGraphMode cuda_graph_mode_parse(const std::string& name);
const char* cuda_graph_mode_name(CudaGraphMode mode);
// What a mode comes to for a run on `device` over `world` ranks.
bool cuda_graph_resolve(CudaGraphMode mode, DeviceKind device, int world);

// --recompute-blocks auto: the Trainer picks the fewest blocks whose recompute fits the
// memory bound (--mem-limit, or on CUDA the smallest free memory of any rank's GPU) with
// kRecomputeHeadroom of it free, or none where the run fits without recompute.
constexpr int kRecomputeBlocksAuto = -1;

struct TrainOptions {
  // Preset, JSON config or model directory; may be empty when resuming or with init_from
  // (the directory names the model), and must match it when given.
  std::string model;
  std::string data;  // token file
  DeviceKind device = DeviceKind::cpu;
  int batch = 4;         // sequences per rank per micro-step
  int global_batch = 0;  // sequences per optimizer step; 0 = batch x ranks
  int seq = 64;          // sequence length
  int steps = 100;       // total optimizer steps of the run
  uint64_t seed = 1337;
  OptimConfig optim;
  std::string metrics;  // JSONL file, one object per step
  std::string save;     // checkpoint directory, written at the end and every save_every steps
  int save_every = 0;
  // A --save directory that holds another run's checkpoint is refused unless this is set
  // (resuming from the directory itself is the same run and needs nothing).
  bool save_overwrite = false;
  // Steps whose loss or gradient norm is NaN or Inf that the run may skip (their update
  // is not applied) before it stops; 0: the first one stops the run.
  int skip_nonfinite = 0;
  std::string resume;  // checkpoint directory to continue from
  // Weights to start a fresh run from (step 0, zero optimizer state): a tandem checkpoint
  // or a Hugging Face model directory; the model is the directory's.
  std::string init_from;
  int log_every = 10;  // optimizer steps between plain progress lines
  ProgressMode progress = ProgressMode::automatic;
  // Sharding (see docs/design.md, "Strategies").
  int ranks = 0;                       // expected world size; 0 = what the launcher gives
  Strategy strategy = Strategy::full;  // full | grad-op | none | hybrid
  int shard_group = 0;                 // hybrid: ranks per shard group
  int max_gathered = 2;                // full/hybrid: units gathered at once
  // What each block keeps for its backward: none, attention or unit ([Activation
  // recompute], model/activations.h). Less memory for one more forward of what is dropped.
  Recompute recompute = Recompute::none;
  // The blocks that recompute, the first ones; 0: every block ([Partial recompute]);
  // kRecomputeBlocksAuto ("auto"): the fewest that fit the run's memory bound, chosen when
  // the run starts (Trainer).
  int recompute_blocks = 0;
  // Rows of logits the head's loss makes at once, in its backward; 0: every row, in the
  // forward ([Chunked loss], model/compose.cpp). Less memory for the [B x T, vocab] logits.
  int loss_chunk = 0;
  // The dtype gradients cross the links in: f32, or bf16 for half the reduce bytes, each
  // rank's gradient and each partial sum rounded to bf16 ([Reduce dtype],
  // shard/engine_exec.h). Gradient buffers and shards stay fp32.
  DType reduce_dtype = DType::f32;
  // Capture the training step as one CUDA graph on its second step and replay it for every
  // later one ([Step graph], docs/design.md): the same numbers, fewer launches. `on` needs
  // CUDA; `automatic` is on for one CUDA rank (cuda_graph_resolve). JSON: "auto", "on",
  // "off", or true / false for on / off.
  CudaGraphMode cuda_graph = CudaGraphMode::automatic;
  // [Update at gather] (shard/program.h): each unit's AdamW update runs beside the next step's
  // compute, right before the unit's first gather, instead of all of them at the step's end.
  // The same numbers either way.
  bool update_at_gather = false;
  double comm_timeout = 300;        // seconds before a collective gives up
  std::string mem_limit;            // per-rank memory bound ("8GiB", "512M", bytes); empty = none
  std::string trace;                // Chrome-trace JSON of the traced steps
  std::string trace_steps = "1:3";  // window of steps to trace, "A:B" (1-based)
  // How the CUDA kernels compute attention (ignored on CPU). No JSON key: the tandem
  // command takes it from TANDEM_ATTENTION.
  AttentionImpl attention = AttentionImpl::automatic;
  // How the flash backward on Hopper forms dQ (TANDEM_FLASH_BACKWARD; FlashBackward in
  // device/kernels.h): a process-wide kernel setting each trainer applies (automatic too)
  // before it builds its engine, and names in its notes when not automatic.
  FlashBackward flash_backward = FlashBackward::automatic;
  // Predicted next to measured (plan/prediction.h): a preset, auto or none, and probe files.
  // The training loop does not use them; the tandem command checks them
  // (prediction_options_validate) and predicts after the run.
  std::string hardware = "auto";
  std::string hardware_compute, hardware_links;
  // Under `auto` on the CPU the machine is measured after the run (~2 s), but only when the
  // run's steps took at least this many seconds: a shorter run ends at once, with no
  // prediction. 0 always measures.
  double calibrate_after = 20;
};

// "8GiB", "1.5G", "512MiB", "300M", "4096": a number, optional spaces and one of the
// suffixes B, k, K, KB, KiB, M, MB, MiB, G, GB, GiB, T, TB, TiB (powers of 1024), a whole
// number of bytes. Throws "--mem-limit '<text>' is not a size ..." otherwise.
uint64_t parse_bytes(const std::string& text);

// Applies the keys present in j; unknown keys, ill-typed values and unknown spellings of
// the enum options ("device", "progress", "strategy") are errors.
void train_options_apply_json(TrainOptions& o, const nlohmann::json& j);
nlohmann::json train_options_to_json(const TrainOptions& o);
// Range checks that need no files (positive sizes, probabilities in range, ...).
void train_options_validate(const TrainOptions& o);

}  // namespace tandem
