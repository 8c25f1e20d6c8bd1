// tandem generate: cached decoding of one or more prompts from a tandem checkpoint or a
// Hugging Face directory, on the CPU or a GPU; `--recompute` runs the cache-free reference.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "cli/commands.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "core/size.h"
#include "device/device.h"
#include "infer/decoder.h"
#include "infer/generate.h"
#include "infer/sequence_text.h"
#include "io/model_source.h"
#include "io/tokenizer.h"
#include "model/tensor_parallel.h"
#include "plan/hardware.h"
#include "plan/plan.h"
#include "plan/prediction.h"
#include "plan/trace.h"
#include "shard/flat.h"
#include "train/step_trace.h"

namespace tandem {

namespace {

struct GenerateArgs {
  std::string checkpoint, prompt_file, device = "cpu", mem_limit, stop, strategy = "auto";
  std::string hardware = "auto", hardware_compute, hardware_links;
  std::string trace, trace_steps = "0:4";
  std::vector<std::string> prompts, prompt_ids;
  int tokens = 64, batch = 0, max_seq = 0, ranks = 0, max_gathered = 2;
  double comm_timeout = 300, calibrate_after = 20;
  SamplingParams sampling;
  bool json = false, ignore_eos = false, no_graphs = false, recompute = false;
};

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
    TD_CHECK(b != std::string::npos, "--prompt-ids '{}' has an empty item", text);
    const std::string s = item.substr(b, e - b + 1);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    TD_CHECK(used == s.size() && v >= 0 && v < (1ll << 31),
             "--prompt-ids '{}': '{}' is not a token id", text, s);
    ids.push_back(static_cast<int32_t>(v));
  }
  TD_CHECK(!ids.empty(), "--prompt-ids is empty");
  return ids;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TD_CHECK(in.good(), "cannot read --prompt-file '{}'", path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The most new tokens one call generates: a bound on a typo's cost.
constexpr int kMaxNewTokens = 100000;

// The device and the ranks of one generate job, destroyed in reverse order: the world
// over the device (MPI on CPU ranks, NCCL on GPUs) and, for a GPU job of several ranks, a
// CPU communicator for host-memory exchanges.
struct GenerateSession {
  GenerateSession(DeviceKind kind, const GenerateArgs& a, const LaunchEnvironment& launch) {
    // Rank r of a node drives the node's GPU r (NCCL needs one GPU per rank).
    device = device_create(kind, kind == DeviceKind::cuda ? launch.local_rank : 0);
    CommOptions comm;
    comm.timeout_s = a.comm_timeout;
    comm.mpi = launch.mpi;
    world = comm_world(*device, comm);
    TD_CHECK(a.ranks == 0 || a.ranks == world->size(), "--ranks {} but the job runs {} rank(s)",
             a.ranks, world->size());
    comms.data = world.get();
    if (kind == DeviceKind::cuda && world->size() > 1) {
      host_device = device_create_cpu();
      host_world = comm_world(*host_device, comm);
      comms.control = host_world.get();
      comms.control_device = host_device.get();
    }
  }
  bool lead() const { return world->rank() == 0; }

  std::unique_ptr<Device> device, host_device;
  std::unique_ptr<Communicator> world, host_world;
  DecoderComms comms;
};

// Every rank's timed ops as one Chrome trace / Perfetto JSON (a process per rank, a track
// per stream), written by rank 0 (a collective over `world`).
void write_trace(const std::string& path, const Decoder& decoder, Communicator& world,
                 Device& device) {
  Trace trace(world.rank(), fmt::format("rank {}", world.rank()));
  for (const DecodeOpTiming& t : decoder.op_timings()) {
    nlohmann::json args = {{"step", t.step}, {"phase", t.step == 0 ? "prefill" : "decode"}};
    if (t.micro >= 0) args["micro"] = t.micro;
    trace.complete(trace.track(t.stream), t.name, t.start_ms * 1e3, t.dur_ms * 1e3, args);
  }
  const nlohmann::json doc = trace_gather(trace, world, device);
  if (world.rank() != 0) return;
  trace_write(path, doc);
  fmt::print(stderr, "tandem: wrote the trace of {} ops on rank 0 to {}\n",
             decoder.op_timings().size(), path);
}

void run_generate(const GenerateArgs& a, const LaunchEnvironment& launch) {
  TD_CHECK(a.tokens >= 1 && a.tokens <= kMaxNewTokens, "--tokens must be in [1, {}], got {}",
           kMaxNewTokens, a.tokens);
  TD_CHECK(std::isfinite(a.sampling.temperature) && a.sampling.temperature >= 0,
           "--temperature must be a finite number >= 0, got {}", a.sampling.temperature);
  TD_CHECK(a.sampling.top_k >= 0, "--top-k must not be negative, got {}", a.sampling.top_k);
  TD_CHECK(a.sampling.top_p > 0 && a.sampling.top_p <= 1, "--top-p must be in (0, 1], got {}",
           a.sampling.top_p);
  TD_CHECK(a.batch >= 0, "--batch must be at least 1, got {}", a.batch);
  TD_CHECK(a.max_seq >= 0, "--max-seq must be at least 1, got {}", a.max_seq);
  const int sources = (a.prompts.empty() ? 0 : 1) + (a.prompt_ids.empty() ? 0 : 1) +
                      (a.prompt_file.empty() ? 0 : 1);
  TD_CHECK(sources <= 1,
           "give the prompt one way: --prompt TEXT, --prompt-ids 1,2,3 or "
           "--prompt-file F");
  const std::unique_ptr<ModelSource> source = ModelSource::open(a.checkpoint);
  const ModelConfig& c = source->config();
  const std::unique_ptr<Tokenizer> tok = tokenizer_for_directory(a.checkpoint);
  // Without its tokenizer a model speaks ids, unless its vocabulary is the byte one.
  const bool text_ok = tok->kind() != "byte" || c.vocab == ByteTokenizer::kVocab;
  TD_CHECK(tok->vocab_size() <= static_cast<size_t>(c.vocab),
           "model '{}' of '{}' has a vocabulary of {}, smaller than its {} tokenizer's {}", c.name,
           a.checkpoint, c.vocab, tok->kind(), tok->vocab_size());

  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> texts = a.prompts;
  if (!a.prompt_file.empty()) texts.push_back(read_text_file(a.prompt_file));
  if (sources == 0) texts.push_back("\n");  // no prompt: continue from a new line
  for (const std::string& t : texts) {
    TD_CHECK(text_ok,
             "the directory '{}' holds no tokenizer and model '{}' has a vocabulary of {}, not "
             "the byte vocabulary of {}: give the prompt as --prompt-ids, or put the model's "
             "tokenizer.json (or tokenizer.model, or vocab.json + merges.txt) beside its weights",
             a.checkpoint, c.name, c.vocab, ByteTokenizer::kVocab);
    TD_CHECK(!t.empty(), "the prompt is empty");
    std::vector<int32_t> ids;
    for (uint32_t id : tok->encode(t, true)) ids.push_back(static_cast<int32_t>(id));
    prompts.push_back(std::move(ids));
  }
  for (const std::string& s : a.prompt_ids) prompts.push_back(parse_ids(s));
  if (prompts.size() == 1 && a.batch > 1) prompts.assign(static_cast<size_t>(a.batch), prompts[0]);
  TD_CHECK(a.batch == 0 || static_cast<int>(prompts.size()) == a.batch,
           "--batch {} with {} prompts: give one prompt (copied to every sequence) or one per "
           "sequence",
           a.batch, prompts.size());
  const int B = static_cast<int>(prompts.size());
  size_t longest = 0;
  for (const auto& p : prompts) longest = std::max(longest, p.size());

  // The cache's positions and the new tokens that fit in them.
  const int limit = a.max_seq > 0 ? a.max_seq : c.context;
  TD_CHECK(a.max_seq <= c.context, "--max-seq {} is over model '{}''s context of {}", a.max_seq,
           c.name, c.context);
  TD_CHECK(static_cast<int64_t>(longest) < limit,
           "the prompt has {} tokens, leaving no room for a new one within {} {}", longest,
           a.max_seq > 0 ? "--max-seq" : "the model's context of", limit);
  int tokens = a.tokens;
  std::string note;  // printed once the request is known to run
  if (static_cast<int64_t>(longest) + tokens > limit) {
    tokens = limit - static_cast<int>(longest);
    note = fmt::format(
        "tandem: note: --tokens {} capped to {}: the longest prompt has {} tokens "
        "and {} is {}\n",
        a.tokens, tokens, longest, a.max_seq > 0 ? "--max-seq" : "the model's context", limit);
  }
  const int max_seq = a.max_seq > 0 ? a.max_seq : static_cast<int>(longest) + tokens;

  std::vector<int32_t> eos;
  if (!a.ignore_eos) {
    for (int64_t e : source->tokens().eos) eos.push_back(static_cast<int32_t>(e));
    if (tok->eos_id()) eos.push_back(static_cast<int32_t>(*tok->eos_id()));
  }
  // Streaming: one sequence, not --json.
  bool stream = B == 1 && !a.json;
  SequenceText texts_out(*tok, prompts, a.stop, eos);
  // The prompt's text, printed once the weights are in (nothing is printed from a model
  // that fails to load).
  auto print_head = [&] {
    if (!note.empty()) fmt::print(stderr, "{}", note);
    if (!stream || !text_ok) return;
    fmt::print("{}", texts_out.take(0));
    std::fflush(stdout);
  };
  auto on_token = [&](int s, int32_t t) {
    if (!text_ok) return true;
    const bool keep = texts_out.add(s, t);
    if (stream) {
      fmt::print("{}", texts_out.take(0));
      std::fflush(stdout);
    }
    return keep;
  };

  const DeviceKind kind = device_kind_parse(a.device);
  bool lead = true;  // the rank that prints
  int ranks = 1;
  std::string strategy_name = "replicate";
  double predicted = 0;     // the planner's decode tokens/s (0: no prediction)
  std::string unpredicted;  // why the summary line has no prediction, when it was asked
  std::string strategy;     // for the summary line
  GenerateResult r;
  uint64_t memory = 0;
  bool graphs = false;
  TD_CHECK(a.calibrate_after >= 0 && std::isfinite(a.calibrate_after),
           "--calibrate-after must be a number of seconds, 0 or more, got {}", a.calibrate_after);
  TD_CHECK(a.max_gathered >= 2,
           "--max-gathered must be at least 2 (fsdp gathers the next unit while the current one "
           "computes, and a tied head reads two units at once), got {}",
           a.max_gathered);
  TD_CHECK(a.trace.empty() || !a.recompute,
           "--trace times the cached decoder's ops, and --recompute runs without them");
  if (a.recompute) {
    TD_CHECK(kind == DeviceKind::cpu && B == 1 && a.ranks <= 1,
             "--recompute (no cache) runs one sequence on the CPU: the reference the cached "
             "decoder is measured against");
    const ModelLayout layout(c);
    const std::vector<std::vector<float>> params = source->load_params();
    print_head();
    const auto t0 = std::chrono::steady_clock::now();
    double first_ms = 0;
    r.ids.assign(1, {});
    r.finish.assign(1, "length");
    r.prompt_tokens = static_cast<int64_t>(prompts[0].size());
    generate_recompute(layout, params, prompts[0], tokens, a.sampling, [&](int32_t t) {
      const double now =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (r.ids[0].empty()) first_ms = now;
      r.ids[0].push_back(t);
      r.decode_ms = now - first_ms;
      if (std::find(eos.begin(), eos.end(), t) != eos.end()) {
        r.finish[0] = "eos";
        return false;
      }
      if (!on_token(0, t)) {
        r.finish[0] = "stop";
        return false;
      }
      return true;
    });
    r.time_to_first_token_ms = r.prefill_ms = first_ms;
    r.decode_steps = r.decode_tokens = static_cast<int64_t>(r.ids[0].size()) - 1;
  } else {
    const GenerateSession session(kind, a, launch);
    lead = session.lead();
    Device& device = *session.device;
    const int W = session.world->size(), rank = session.world->rank();
    ranks = W;
    // The planner's view of this machine: it chooses the layout under auto and predicts the
    // decode rate printed next to the measured one. On the CPU the nominal preset's rates are
    // replaced by this machine's, measured (all ranks at once, as they decode), and the
    // device's decode block is timed. Under auto that happens first, since it chooses the
    // layout; with a named layout it only predicts, so it happens after the decode, and only
    // when the decode took --calibrate-after seconds or more (a short request waits for no
    // measurement that would take longer than its tokens).
    const std::string preset = a.hardware == "auto"   ? hardware_preset_for_device(device.name())
                               : a.hardware == "none" ? ""
                                                      : a.hardware;
    const bool planned = !preset.empty() && (W > 1 || a.hardware != "auto");
    // What resolving the hardware measures: the CPU's rates, the device's own preset's decode
    // block (timed on its kernels at this rank's rows), and CPU ranks' links (MPI on this
    // machine is nothing like a preset's line; all ranks at once). Probe files replace them.
    const bool measure_cpu = preset == "cpu-local" && a.hardware_compute.empty();
    const bool measure_decode =
        a.hardware_compute.empty() && preset == hardware_preset_for_device(device.name());
    const bool measure_links = preset == "cpu-local" && W > 1 && a.hardware_links.empty();
    auto resolve_hardware = [&]() -> std::optional<Hardware> {
      if (!planned) return std::nullopt;
      Hardware hw = hardware_resolve(preset, a.hardware_compute, a.hardware_links);
      if (measure_cpu)
        prediction_apply_cpu(hw, prediction_measure_cpu(prediction_gemm_size(c), 100));
      if (measure_decode)
        prediction_apply_decode(
            hw, prediction_measure_decode(device, c, (B + W - 1) / W, max_seq, 100));
      if (measure_links)
        prediction_calibrate_links(hw, prediction_links_bytes(c), *session.world, device);
      hardware_validate(hw);
      return hw;
    };
    PlanRequest plan_req;
    plan_req.task = PlanTask::generate;
    plan_req.model = c;
    plan_req.ranks = W;
    plan_req.batch = B;
    plan_req.seq = max_seq;
    plan_req.max_gathered = a.max_gathered;
    std::string chosen = a.strategy;
    if (chosen == "auto" && W == 1) chosen = "replicate";  // one rank: every layout is one
    const bool plan_chooses = chosen == "auto";            // then the prediction comes first
    auto predict = [&](const Hardware& hw) {
      plan_req.hw = hw;
      const StrategyPlan plan = plan_generate_strategy(plan_req, chosen);
      if (plan.applicable) predicted = plan.tokens_per_s;
    };
    if (plan_chooses) {
      const std::optional<Hardware> hw = resolve_hardware();
      TD_CHECK(hw.has_value(),
               "--strategy auto needs the hardware to plan on: no preset for {}; name one with "
               "--hardware (probe files on top with --hardware-compute and --hardware-links), or "
               "choose --strategy replicate, fsdp, tp or pipeline",
               device.name());
      plan_req.hw = *hw;
      const LayoutChoice choice =
          plan_choose_layout(plan_req, {"replicate", "fsdp", "tp", "pipeline"});
      TD_CHECK(!choice.name.empty(), "--strategy auto: {}", choice.why);
      // Every rank planned on the rates it measured itself, and two close layouts can swap
      // places from one rank to the next: all take rank 0's choice.
      chosen = all_gather_text(*session.world, device, choice.name).at(0);
      if (session.lead()) fmt::print(stderr, "tandem: --strategy auto: {}\n", choice.why);
      predict(*hw);
    }
    strategy_name = chosen;
    DecoderOptions o;
    o.batch = B;
    o.max_seq = max_seq;
    o.graphs = !a.no_graphs;
    o.layout = infer_layout_parse(chosen);
    o.max_gathered = a.max_gathered;
    if (!a.trace.empty()) {
      const auto [first, last] = step_window_parse(a.trace_steps, 0, "0 is the prefill");
      o.trace_first = first;
      o.trace_last = last;
    }
    if (!a.mem_limit.empty()) o.mem_limit = parse_size(a.mem_limit, "--mem-limit");
    // The model this rank runs, checked against memory before any weights are read; each
    // rank reads only what it keeps.
    if (o.layout == InferLayout::tp) tp_check(c, W);
    const ModelConfig mine = o.layout == InferLayout::tp ? tp_local_config(c, W, rank) : c;
    decoder_check_fits(mine, device, o, W);
    const ModelLayout global(c), layout(mine);
    std::vector<std::vector<float>> params;
    if (o.layout == InferLayout::fsdp)
      params = source->load_param_shard(FlatLayout(layout, W), rank);
    else if (o.layout == InferLayout::tp)
      params = tp_load_params(*source, global, layout);
    else if (o.layout == InferLayout::pipeline && W > 1)
      params = load_units(*source, layout, pipeline_units(layout, W, rank));
    else
      params = source->load_params();
    {
      Decoder decoder(layout, device, std::move(params), o, session.comms);
      strategy = W > 1 ? fmt::format(" | {} over {} ranks", chosen, W) : "";
      if (!lead) stream = false;
      print_head();
      GenerateRequest req;
      req.prompts = prompts;
      req.tokens = tokens;
      req.sampling = a.sampling;
      req.eos = eos;
      req.ignore_eos = a.ignore_eos;
      req.on_token = on_token;
      r = decoder.generate(req);
      memory = decoder.memory().total();
      graphs = decoder.graphs_used();
      if (!a.trace.empty()) write_trace(a.trace, decoder, *session.world, device);
    }  // the decoder's memory is given back before the measurement below
    if (planned && !plan_chooses) {
      // The ranks decide together on rank 0's time: the links measurement is collective.
      const double seconds =
          std::stod(all_gather_text(*session.world, device,
                                    fmt::format("{:.17g}", (r.prefill_ms + r.decode_ms) / 1e3))
                        .at(0));
      const bool measures = measure_cpu || measure_decode || measure_links;
      if (!measures || seconds >= a.calibrate_after)
        predict(*resolve_hardware());
      else
        unpredicted =
            fmt::format(" (no prediction: {:.2g} s of decoding, under --calibrate-after {:g})",
                        seconds, a.calibrate_after);
    }
  }
  if (!lead) return;
  if (stream) fmt::print("\n");

  auto text_of = [&](int b) {
    if (!text_ok) return std::string();
    std::vector<uint32_t> ids(r.ids[static_cast<size_t>(b)].begin(),
                              r.ids[static_cast<size_t>(b)].end());
    return tok->decode(ids, true);
  };
  if (a.json) {
    nlohmann::ordered_json j;
    auto per_seq = [&](auto&& f) {
      nlohmann::ordered_json v = nlohmann::ordered_json::array();
      for (int b = 0; b < B; ++b) v.push_back(f(b));
      return B == 1 ? v[0] : v;
    };
    j["prompt_ids"] = per_seq([&](int b) { return prompts[static_cast<size_t>(b)]; });
    j["ids"] = per_seq([&](int b) { return r.ids[static_cast<size_t>(b)]; });
    j["text"] = per_seq([&](int b) { return text_of(b); });
    j["finish"] = per_seq([&](int b) { return r.finish[static_cast<size_t>(b)]; });
    j["prompt_tokens"] = r.prompt_tokens;
    j["time_to_first_token_ms"] = r.time_to_first_token_ms;
    j["prefill_tokens_per_s"] = r.prefill_tokens_per_s();
    j["decode_tokens_per_s"] = r.decode_tokens_per_s();
    j["decode_steps"] = r.decode_steps;
    j["peak_mem_bytes"] = memory;
    j["device"] = a.device;
    j["strategy"] = strategy_name;
    if (predicted > 0) j["predicted_decode_tokens_per_s"] = predicted;
    j["ranks"] = ranks;
    j["batch"] = B;
    j["max_seq"] = max_seq;
    j["cuda_graph"] = graphs;
    j["recompute"] = a.recompute;
    // Bytes that are not UTF-8 (a byte-level model's text cut anywhere) become U+FFFD.
    fmt::print("{}\n", j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace));
    return;
  }
  if (!stream)
    for (int b = 0; b < B; ++b) {
      if (text_ok)
        fmt::print("--- sequence {} ---\n{}{}\n", b,
                   whole_text(*tok, std::vector<uint32_t>(prompts[static_cast<size_t>(b)].begin(),
                                                          prompts[static_cast<size_t>(b)].end())),
                   text_of(b));
      else
        fmt::print("--- sequence {} ---\n{}\n", b, fmt::join(r.ids[static_cast<size_t>(b)], ","));
    }
  else if (!text_ok)
    fmt::print("{}\n", fmt::join(r.ids[0], ","));
  fmt::print(stderr,
             "prompt {} tokens | time to first token {:.1f} ms | prefill {:.0f} tokens/s | decode "
             "{:.1f} tokens/s{} | memory {:.2f} GiB{}{}\n",
             r.prompt_tokens, r.time_to_first_token_ms, r.prefill_tokens_per_s(),
             r.decode_tokens_per_s(),
             predicted > 0 ? fmt::format(" (predicted {:.1f}, {:+.0f}%)", predicted,
                                         100 * (r.decode_tokens_per_s() / predicted - 1))
                           : unpredicted,
             memory / 1073741824.0, strategy, graphs ? " | CUDA graph" : "");
}

}  // namespace

void cli_add_generate(CLI::App& app, const Environment& env) {
  auto* cmd = app.add_subcommand(
      "generate",
      "Continue prompts from a checkpoint or a Hugging Face model directory, with a KV cache, "
      "on the CPU or a GPU");
  auto a = std::make_shared<GenerateArgs>();
  cmd->add_option("--checkpoint", a->checkpoint,
                  "Checkpoint directory or Hugging Face model directory")
      ->required();
  cmd->add_option("--prompt", a->prompts,
                  "Text to continue (repeat for a batch of prompts; default: a new line)");
  cmd->add_option("--prompt-ids", a->prompt_ids,
                  "Token ids to continue, as 1,2,3 (repeat for a batch of prompts)");
  cmd->add_option("--prompt-file", a->prompt_file, "A file whose text is the prompt");
  cmd->add_option("--tokens", a->tokens, "New tokens per sequence")->capture_default_str();
  cmd->add_option("--device", a->device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--batch", a->batch, "Sequences (the one prompt is copied to each)");
  cmd->add_option("--temperature", a->sampling.temperature, "Sampling temperature (0: greedy)")
      ->capture_default_str();
  cmd->add_option("--top-k", a->sampling.top_k, "Sample among the k likeliest tokens (0: all)")
      ->capture_default_str();
  cmd->add_option("--top-p", a->sampling.top_p,
                  "Sample among the likeliest tokens holding this probability mass, in (0, 1]")
      ->capture_default_str();
  cmd->add_option("--seed", a->sampling.seed, "Sampling seed")->capture_default_str();
  cmd->add_option("--stop", a->stop, "End a sequence once its new text contains this");
  cmd->add_option("--max-seq", a->max_seq,
                  "Positions of the KV cache per sequence (default: prompt + tokens)");
  cmd->add_option("--mem-limit", a->mem_limit,
                  "Bytes the decoder may hold on the device (default: its free memory)");
  cmd->add_flag("--ignore-eos", a->ignore_eos, "Keep going past the end-of-sequence token");
  cmd->add_flag("--json", a->json, "Print one JSON object: ids, text and timings");
  cmd->add_flag("--no-graphs", a->no_graphs, "Replay the decode step without a CUDA graph");
  cmd->add_option("--trace", a->trace,
                  "Write a Chrome-trace/Perfetto JSON of the traced steps' ops (all ranks)");
  cmd->add_option("--trace-steps", a->trace_steps,
                  "Steps to trace, A:B inclusive: 0 is the prefill, decode steps count from 1 "
                  "(timed steps run op by op, not as a CUDA graph)")
      ->capture_default_str();
  cmd->add_flag("--recompute", a->recompute,
                "Recompute the whole context for every token (no cache; CPU, one sequence)");
  cmd->add_option("--ranks", a->ranks,
                  "Ranks to run on this machine (started through mpirun; under a launcher: the "
                  "job's size, checked)");
  cmd->add_option("--strategy", a->strategy,
                  "How the ranks share the model: auto (the planner's choice, printed with its "
                  "reason), replicate (every rank holds it, the sequences are split), fsdp "
                  "(shards, gathered for every token), tp (heads, MLP columns and vocabulary "
                  "split), pipeline (consecutive blocks per rank, micro-batches flowing through)")
      ->capture_default_str();
  cmd->add_option("--max-gathered", a->max_gathered, "fsdp: units gathered at once")
      ->capture_default_str();
  cmd->add_option("--hardware", a->hardware,
                  "What the planner plans on for --strategy auto and the predicted rate: auto "
                  "(this device's preset; on the CPU its rates measured first), a preset, or "
                  "none")
      ->capture_default_str();
  cmd->add_option("--calibrate-after", a->calibrate_after,
                  "With a named --strategy: measure this machine for the predicted rate after "
                  "the decode, and only when it took at least this many seconds (0: always)")
      ->capture_default_str();
  cmd->add_option("--hardware-compute", a->hardware_compute,
                  "Compute probe file for the planner (tandem probe compute --save)");
  cmd->add_option("--hardware-links", a->hardware_links,
                  "Links probe file for the planner (tandem probe links --save)");
  cmd->add_option("--comm-timeout", a->comm_timeout, "Seconds before a collective gives up")
      ->capture_default_str();
  const LaunchEnvironment launch = env.launch;
  cmd->callback([a, launch] { run_generate(*a, launch); });
}

}  // namespace tandem
