// tandem train | generate | data prepare | models.
#include "cli/commands.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>

#include "core/error.h"
#include "core/json.h"
#include "core/size.h"
#include "io/export.h"
#include "io/file.h"
#include "io/hf.h"
#include "io/model_source.h"
#include "io/prepare.h"
#include "io/shard_checkpoint.h"
#include "io/tokenizer.h"
#include "model/config.h"
#include "plan/prediction.h"
#include "shard/program.h"
#include "train/trainer.h"

namespace tandem {

namespace {

// "--global-batch" -> "global-batch": an option's key in a config file.
std::string key_of(const CLI::Option* o) {
  const std::vector<std::string>& names = o->get_lnames();
  if (!names.empty()) return names.front();
  std::string n = o->get_name(false, true);
  return n.rfind("--", 0) == 0 ? n.substr(2) : n;
}

// The enum options of `tandem train` as spelled on the command line; train_options_apply_json
// parses them, so a flag and a config file's key fail with the same message.
struct TrainSpellings {
  std::string device = device_kind_name(TrainOptions{}.device);
  std::string progress = progress_mode_name(TrainOptions{}.progress);
  std::string strategy = strategy_name(TrainOptions{}.strategy);
  std::string recompute = recompute_name(TrainOptions{}.recompute);
  std::string reduce_dtype{dtype_name(TrainOptions{}.reduce_dtype)};
  std::string cuda_graph;  // "on" (--cuda-graph) or "off" (--no-cuda-graph), the last given
  std::string recompute_blocks = "0";  // a number of blocks or "auto"
};

// --recompute-blocks as JSON: a whole number as a number, anything else as the string the
// options' reader checks ("auto", or its message naming what was given).
nlohmann::json recompute_blocks_json(const std::string& spelled) {
  const char* s = spelled.c_str();
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(s, &end, 10);
  if (!spelled.empty() && *end == '\0' && errno == 0 && n >= std::numeric_limits<int>::min() &&
      n <= std::numeric_limits<int>::max())
    return static_cast<int>(n);
  return spelled;
}

// Once the run has taken its steps (collective): the planner's prediction next to the
// measured steps, printed by rank 0 and appended to the metrics file as its last line.
void print_prediction(Trainer& trainer, const PredictionHardware& hardware) {
  const TrainOptions& t = trainer.options();
  const RunSummary summary = prediction_summarize(hardware, t, trainer.layout().config(),
                                                  trainer.world(), trainer.device(), trainer.ran());
  if (trainer.rank() != 0) return;
  fmt::print("{}\n", prediction_line(summary));
  std::fflush(stdout);
  if (t.metrics.empty()) return;
  // The model's name too, so that a report of the file can say whose steps these are.
  nlohmann::json line = prediction_to_json(summary);
  line["model"] = trainer.layout().config().name;
  LineFile(t.metrics, /*append=*/true).write_line(line.dump());
}

}  // namespace

void cli_add_train(CLI::App& app, const Environment& env) {
  auto* cmd = app.add_subcommand("train", "Train a model");
  auto flags = std::make_shared<TrainOptions>();
  auto spelled = std::make_shared<TrainSpellings>();
  auto config = std::make_shared<std::string>();
  TrainOptions& f = *flags;
  cmd->add_option("--config", *config, "JSON file with any of these options (flags override it)");
  cmd->add_option("--model", f.model,
                  "Model preset (see 'tandem models'), JSON config file or model directory");
  cmd->add_option("--data", f.data, "Token file (see 'tandem data prepare')");
  cmd->add_option("--device", spelled->device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--batch", f.batch, "Sequences per rank per micro-step")->capture_default_str();
  cmd->add_option("--global-batch", f.global_batch,
                  "Sequences per optimizer step (default: batch x ranks)");
  cmd->add_option("--seq", f.seq, "Sequence length")->capture_default_str();
  cmd->add_option("--steps", f.steps, "Total optimizer steps of the run")->capture_default_str();
  cmd->add_option("--lr", f.optim.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--min-lr-ratio", f.optim.min_lr_ratio, "Final lr as a fraction of --lr")
      ->capture_default_str();
  cmd->add_option("--warmup", f.optim.warmup, "Linear warm-up steps")->capture_default_str();
  cmd->add_option("--weight-decay", f.optim.weight_decay, "AdamW weight decay")
      ->capture_default_str();
  cmd->add_option("--beta1", f.optim.beta1, "AdamW beta1")->capture_default_str();
  cmd->add_option("--beta2", f.optim.beta2, "AdamW beta2")->capture_default_str();
  cmd->add_option("--eps", f.optim.eps, "AdamW epsilon")->capture_default_str();
  cmd->add_option("--grad-clip", f.optim.grad_clip, "Global gradient-norm clip (0: off)")
      ->capture_default_str();
  // A negative seed would wrap around to a huge unsigned one: refuse it, as a config does.
  cmd->add_option("--seed", f.seed, "Seed of initialisation and data order")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--metrics", f.metrics, "Write one JSON object per step to this file");
  cmd->add_option("--save", f.save, "Checkpoint directory (written at the end)");
  cmd->add_option("--save-every", f.save_every, "Also save every N steps")->capture_default_str();
  cmd->add_flag("--save-overwrite", f.save_overwrite,
                "Let --save replace another run's checkpoint in that directory");
  cmd->add_option("--skip-nonfinite", f.skip_nonfinite,
                  "Steps with a NaN/Inf loss or gradient norm to skip before stopping")
      ->capture_default_str();
  cmd->add_option("--resume", f.resume, "Continue from this checkpoint directory");
  cmd->add_option("--init-from", f.init_from,
                  "Start a fresh run (step 0) from these weights: a tandem checkpoint or a "
                  "Hugging Face model directory");
  cmd->add_option("--log-every", f.log_every, "Steps between progress lines")
      ->capture_default_str();
  cmd->add_option("--progress", spelled->progress, "auto, bar, lines or none")
      ->capture_default_str();
  cmd->add_option("--ranks", f.ranks,
                  "Local ranks to start (through mpirun); under mpirun/srun, the expected count");
  cmd->add_option("--strategy", spelled->strategy, "full, grad-op, none or hybrid")
      ->capture_default_str();
  cmd->add_option("--shard-group", f.shard_group, "hybrid: ranks per shard group");
  cmd->add_option("--max-gathered", f.max_gathered, "full/hybrid: units gathered at once")
      ->capture_default_str();
  cmd->add_option("--recompute", spelled->recompute,
                  "What each block keeps for its backward: none (everything), attention (all "
                  "but attention's state and output, recomputed) or unit (only its input: the "
                  "block's forward runs again before its backward)")
      ->capture_default_str();
  cmd->add_option("--recompute-blocks", spelled->recompute_blocks,
                  "With --recompute: how many blocks recompute, the first ones (the others keep "
                  "everything); 0: every block; auto: the fewest that fit --mem-limit, or the "
                  "GPUs' free memory. `tandem plan` names the fewest that fit")
      ->capture_default_str();
  cmd->add_option("--loss-chunk", f.loss_chunk,
                  "Rows of logits the loss makes at once, in the head's backward, so the "
                  "[batch x seq, vocab] logits are never held whole; 0: every row, in the forward")
      ->capture_default_str();
  cmd->add_option("--reduce-dtype", spelled->reduce_dtype,
                  "The dtype gradients are reduced in across ranks: f32, or bf16 (half the "
                  "bytes; each rank's gradient and each partial sum rounded to bf16)")
      ->capture_default_str();
  // Two flags rather than one negated one, so that the help names each plainly; each records
  // itself as it is parsed, so the last one given wins.
  cmd->add_flag_callback(
         "--cuda-graph", [spelled] { spelled->cuda_graph = "on"; },
         "Capture the step as one CUDA graph on step 2 and replay it every later step: the same "
         "numbers, fewer launches (cuda only). Neither flag: on for a run of one CUDA rank, off "
         "otherwise")
      ->trigger_on_parse();
  cmd->add_flag_callback(
         "--no-cuda-graph", [spelled] { spelled->cuda_graph = "off"; },
         "Issue every step's kernels one by one (the opposite of --cuda-graph)")
      ->trigger_on_parse();
  cmd->add_flag("--update-at-gather", f.update_at_gather,
                "Run each unit's optimizer update beside the next step's compute, right before "
                "the unit is gathered, instead of every update at the step's end (the same "
                "numbers)");
  cmd->add_option("--comm-timeout", f.comm_timeout, "Seconds before a collective gives up")
      ->capture_default_str();
  cmd->add_option("--trace", f.trace,
                  "Write a Chrome-trace/Perfetto JSON of the traced steps (all ranks)");
  cmd->add_option("--trace-steps", f.trace_steps, "Steps to trace, A:B (1-based, inclusive)")
      ->capture_default_str();
  cmd->add_option("--mem-limit", f.mem_limit,
                  "Per-rank memory bound (e.g. 8GiB): refuse a plan that does not fit");
  cmd->add_option("--hardware", f.hardware,
                  "Hardware the planner predicts the step on, printed next to the measured step "
                  "at the end: a preset, auto (the device's; on cpu measured in the run) or none")
      ->capture_default_str();
  cmd->add_option("--hardware-compute", f.hardware_compute,
                  "Compute probe file for the prediction (tandem probe compute --save)");
  cmd->add_option("--hardware-links", f.hardware_links,
                  "Links probe file for the prediction (tandem probe links --save)");
  cmd->add_option("--calibrate-after", f.calibrate_after,
                  "Under --hardware auto on cpu: measure the machine after the run (~2 s) only "
                  "when its steps took at least this many seconds (0: always)")
      ->capture_default_str();

  cmd->callback([cmd, flags, spelled, config, env] {
    TrainOptions o;
    if (!config->empty()) {
      try {
        train_options_apply_json(o, json_read_file(*config, "training config"));
      } catch (const Error& e) {
        if (e.message().find(*config) != std::string::npos) throw;
        TD_THROW("training config '{}': {}", *config, e.message());
      }
    }
    // Flags given on the command line override the config file.
    nlohmann::json given = train_options_to_json(*flags);
    given["device"] = spelled->device;
    given["progress"] = spelled->progress;
    given["strategy"] = spelled->strategy;
    given["recompute"] = spelled->recompute;
    given["reduce-dtype"] = spelled->reduce_dtype;
    given["recompute-blocks"] = recompute_blocks_json(spelled->recompute_blocks);
    nlohmann::json overrides = nlohmann::json::object();
    for (const CLI::Option* opt : cmd->get_options()) {
      const std::string key = opt->get_name().empty() ? "" : key_of(opt);
      if (opt->count() > 0 && given.contains(key)) overrides[key] = given[key];
    }
    if (!spelled->cuda_graph.empty()) overrides["cuda-graph"] = spelled->cuda_graph;
    train_options_apply_json(o, overrides);
    o.attention = env.attention;
    o.flash_backward = env.flash_backward;
    // Every option is checked before the run is set up, the prediction's with the rest.
    train_options_validate(o);
    prediction_options_validate(o);

    TrainContext context;
    context.mpi = env.launch.mpi;
    context.local_rank = env.launch.local_rank;
    context.stdout_terminal = env.stdout_terminal;
    Trainer trainer(o, context);
    const ModelConfig& c = trainer.layout().config();
    const TrainOptions& t = trainer.options();
    const bool lead = trainer.rank() == 0;
    if (lead) {
      for (const std::string& note : trainer.notes()) fmt::print("note: {}\n", note);
      const Program& p = trainer.engine().program();
      fmt::print(
          "model {} ({} family, {:.2f}M parameters) | data {} | {} rank(s), strategy {}{}{}{}{}"
          " | batch {} x {} rank(s) x {} micro-step(s) = {} sequences of {} tokens per step"
          " | {:.1f} MiB per rank\n",
          c.name, family_name(c.family), static_cast<double>(c.num_params()) / 1e6, t.data,
          trainer.world_size(), strategy_name(t.strategy),
          recompute_text(t.recompute, t.recompute_blocks, c.n_layer),
          t.reduce_dtype == DType::f32 ? "" : ", gradients reduced in bf16",
          trainer.cuda_graph() ? ", the step replayed as one CUDA graph from step 2" : "",
          t.update_at_gather ? ", each update at the unit's next gather" : "", t.batch,
          trainer.world_size(), trainer.micro_steps(), t.global_batch, t.seq,
          static_cast<double>(p.peak_bytes()) / (1 << 20));
      if (trainer.steps_done() > 0)
        fmt::print("resuming from '{}' at step {}\n", t.resume, trainer.steps_done());
      if (!t.init_from.empty()) fmt::print("starting from the weights of '{}'\n", t.init_from);
      std::fflush(stdout);
    }
    // Predicted next to measured: the hardware (and its files) are checked before any step.
    std::optional<PredictionHardware> hardware;
    if (trainer.steps_done() < t.steps) hardware = prediction_hardware(t, trainer.device().name());
    if (lead && hardware && !hardware->note.empty()) {
      fmt::print("note: {}\n", hardware->note);
      std::fflush(stdout);
    }
    StepMetrics last = trainer.run();
    if (trainer.interrupted() != 0) {
      // [Interrupts] One line, then the status a shell gives a process ended by the signal
      // (130 for SIGINT, 143 for SIGTERM; SIGUSR1 and SIGUSR2, stop requests, count as
      // SIGTERM). The local launcher passes SIGINT and SIGTERM on as SIGUSR2 and notes which
      // it was in its directory; its ranks end with 0, and the launcher ends with the status
      // of the signal it received.
      int sig = trainer.interrupted();
      if (!env.launcher_dir.empty() && (sig == SIGUSR1 || sig == SIGUSR2)) {
        std::ifstream noted(env.launcher_dir + "/signal");
        int original = 0;
        sig = noted >> original && original == SIGINT ? SIGINT : SIGTERM;
      }
      if (lead) {
        fmt::print("interrupted by {} after step {}: {}\n", interrupt_signal_name(sig),
                   trainer.steps_done(),
                   t.save.empty() ? std::string("no checkpoint written (no --save given)")
                                  : fmt::format("checkpoint saved to '{}' (continue with --resume "
                                                "{})",
                                                t.save, t.save));
        std::fflush(stdout);
      }
      const int code = 128 + (sig == SIGINT ? SIGINT : SIGTERM);
      if (env.launcher_dir.empty()) throw CommandExit{code};
      // The launcher ends with this status; mpirun sees ranks that ended well.
      if (lead) LineFile(env.launcher_dir + "/interrupted", false).write_line(std::to_string(code));
      throw CommandExit{0};
    }
    // Once the checkpoint is safe. A short run is not held up by the calibration, which
    // takes longer than its steps; every rank decides from rank 0's figure.
    if (hardware && last.step > 0 && (hardware->measure_compute || hardware->measure_links)) {
      const double seconds = trainer.ran_seconds();
      if (seconds < t.calibrate_after) {
        hardware->available = false;
        hardware->why = fmt::format(
            "{:.2g} s of steps: too short a run to measure this machine for (~2 s); runs of {:g} "
            "s or more are measured (--calibrate-after)",
            seconds, t.calibrate_after);
      }
    }
    if (hardware && last.step > 0) print_prediction(trainer, *hardware);
    if (lead && last.step > 0)
      fmt::print(
          "done: step {} | loss {:.4f} | {:.0f} tokens/s | exposed comm {:.1f} of {:.1f} ms"
          " comm per step{}\n",
          last.step, last.loss, last.tokens_per_s, last.exposed_comm_ms, last.comm_ms,
          t.save.empty() ? "" : " | checkpoint " + t.save);
  });
}

namespace {

// Progress of `data prepare`: a redrawn bar on a terminal, a line every 10% otherwise.
std::function<void(size_t, size_t)> prepare_progress(const std::string& mode, bool terminal) {
  if (mode == "none") return {};
  const bool bar = mode == "bar" || (mode == "auto" && terminal);
  const auto start = std::chrono::steady_clock::now();
  auto last_tenth = std::make_shared<int>(-1);
  auto finished = std::make_shared<bool>(false);
  return [bar, start, last_tenth, finished](size_t done, size_t total) {
    if (*finished) return;
    *finished = done == total;
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double frac = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
    const std::string stats = fmt::format("{:.1f}/{:.1f} MB | {:.1f} MB/s", done / 1e6, total / 1e6,
                                          s > 0 ? done / 1e6 / s : 0.0);
    if (bar) {
      const int width = 24, fill = static_cast<int>(frac * width + 0.5);
      std::string b(static_cast<size_t>(fill), '#');
      b.resize(width, '.');
      fmt::print("\r\033[2Ktokenizing [{}] {}{}", b, stats, done == total ? "\n" : "");
    } else {
      const int tenth = static_cast<int>(frac * 10);
      if (tenth == *last_tenth) return;
      *last_tenth = tenth;
      fmt::print("tokenizing: {:.0f}% | {}\n", frac * 100, stats);
    }
    std::fflush(stdout);
  };
}

}  // namespace

void cli_add_data(CLI::App& app, const Environment& env) {
  auto* data = app.add_subcommand("data", "Prepare token files");
  data->require_subcommand(1);
  auto* prep = data->add_subcommand("prepare", "Tokenize text files into a token file");
  struct Args {
    std::vector<std::string> files;
    std::string out, tokenizer, checkpoint, progress = "auto";
    int threads = 0;
  };
  auto a = std::make_shared<Args>();
  prep->add_option("--text", a->files, "Text files to tokenize, in order (one document each)")
      ->required();
  prep->add_option("--out", a->out, "Token file to write")->required();
  auto* tk = prep->add_option("--tokenizer", a->tokenizer,
                              "tokenizer.json, tokenizer.model, vocab.json or a directory "
                              "holding one (default: bytes)");
  auto* ck = prep->add_option("--checkpoint", a->checkpoint,
                              "Use the tokenizer saved in this checkpoint or model directory "
                              "(bytes when it holds none)");
  tk->excludes(ck);
  prep->add_option("--threads", a->threads, "Encoding threads (0: all cores)")
      ->capture_default_str();
  prep->add_option("--progress", a->progress, "auto, bar, lines or none")->capture_default_str();
  const bool terminal = env.stdout_terminal;
  prep->callback([a, terminal] {
    TD_CHECK(a->threads >= 0, "--threads must not be negative, got {}", a->threads);
    TD_CHECK(a->progress == "auto" || a->progress == "bar" || a->progress == "lines" ||
                 a->progress == "none",
             "--progress must be auto, bar, lines or none, got '{}'", a->progress);
    std::unique_ptr<Tokenizer> tok;
    if (!a->tokenizer.empty()) tok = tokenizer_load(a->tokenizer);
    if (!a->checkpoint.empty()) tok = tokenizer_for_directory(a->checkpoint);
    PrepareOptions o;
    if (tok && tok->kind() != "byte") o.tokenizer = tok.get();
    o.threads = a->threads;
    o.progress = prepare_progress(a->progress, terminal);
    PrepareReport r = data_prepare(a->files, a->out, o);
    fmt::print(
        "wrote {} tokens ({}-byte) from {} files ({} bytes) to {} | {} tokenizer, {} "
        "thread(s), {:.1f} MB/s\n",
        r.tokens, r.token_bytes, r.files, r.bytes, a->out,
        o.tokenizer ? o.tokenizer->kind() : "byte", r.threads,
        r.seconds > 0 ? static_cast<double>(r.bytes) / 1e6 / r.seconds : 0.0);
  });
}

void cli_add_export(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "export",
      "Write a model's parameters as tandem safetensors or as a Hugging Face model directory "
      "(from a checkpoint or Hugging Face directory, or freshly initialised from --model and "
      "--seed)");
  struct Args {
    std::string checkpoint, model, out, format = "tandem", dtype = "f32", max_shard = "5GB";
    uint64_t seed = 1337;
  };
  auto a = std::make_shared<Args>();
  auto* ck = cmd->add_option("--checkpoint", a->checkpoint,
                             "Checkpoint directory or Hugging Face model directory");
  auto* md = cmd->add_option("--model", a->model, "Model preset or JSON config (fresh weights)");
  ck->excludes(md);
  cmd->add_option("--seed", a->seed, "Initialisation seed (with --model)")->capture_default_str();
  cmd->add_option("--format", a->format,
                  "tandem (one safetensors file, tandem's names) or hf (a Hugging Face model "
                  "directory)")
      ->check(CLI::IsMember({"tandem", "hf"}))
      ->capture_default_str();
  cmd->add_option("--dtype", a->dtype, "hf: tensor dtype, f32, bf16 or f16")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  cmd->add_option("--max-shard-size", a->max_shard,
                  "hf: largest safetensors file before the next tensor starts a new one "
                  "(sizes in powers of 1024: 5GB = 5 GiB)")
      ->capture_default_str();
  cmd->add_option("--out", a->out, "tandem: safetensors file to write; hf: directory to create")
      ->required();
  cmd->callback([cmd, a] {
    TD_CHECK(!a->checkpoint.empty() || !a->model.empty(), "give --checkpoint or --model");
    const bool hf = a->format == "hf";
    TD_CHECK(hf || (cmd->count("--dtype") == 0 && cmd->count("--max-shard-size") == 0),
             "--dtype and --max-shard-size apply to --format hf only");
    HfExportOptions options;
    options.dtype = a->dtype;
    if (hf) options.max_shard_bytes = parse_size(a->max_shard, "--max-shard-size");
    std::vector<std::vector<float>> params;
    ModelConfig config;
    if (!a->checkpoint.empty()) {
      const std::unique_ptr<ModelSource> source = ModelSource::open(a->checkpoint);
      for (const std::string& note : source->notes()) fmt::print("note: {}\n", note);
      config = source->config();
      options.tokens = source->tokens();
      options.naming = source->hf_naming();
      // Refuse a model no Hugging Face class expresses before reading its weights.
      if (hf) hf_arch_for(config);
      params = source->load_params();
    } else {
      config = model_config_resolve(a->model);
      if (hf) hf_arch_for(config);
    }
    ModelLayout layout(config);
    if (params.empty()) {
      for (const UnitLayout& u : layout.units()) {
        params.emplace_back(static_cast<size_t>(u.numel));
        layout.init_slice(u.index, a->seed, 0, u.numel, params.back().data());
      }
    }
    if (hf) {
      hf_export(a->out, layout, params, options);
      fmt::print("wrote {} ({} parameters) as {} ({}) to {}\n", config.name, config.num_params(),
                 hf_arch_class(hf_arch_for(config)), a->dtype, a->out);
      return;
    }
    export_safetensors(layout, params, a->out);
    fmt::print("wrote {} ({} parameters) to {}\n", config.name, layout.total_numel(), a->out);
  });
}

void cli_add_models(CLI::App& app) {
  auto* cmd = app.add_subcommand("models", "List the model presets");
  cmd->callback([] {
    fmt::print("{:<12} {:<6} {:>10} {:>7} {:>6} {:>5} {:>5} {:>7} {:>8}\n", "preset", "family",
               "params", "d_model", "layers", "heads", "kv", "context", "vocab");
    for (const auto& name : preset_names()) {
      ModelConfig c = preset(name);
      fmt::print("{:<12} {:<6} {:>9.1f}M {:>7} {:>6} {:>5} {:>5} {:>7} {:>8}\n", c.name,
                 family_name(c.family), static_cast<double>(c.num_params()) / 1e6, c.d_model,
                 c.n_layer, c.n_head, c.n_kv_head, c.context, c.vocab);
    }
  });
}

}  // namespace tandem
