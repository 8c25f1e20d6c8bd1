// The decoder: memory plan, parameter upload, the prefill and decode programs and their
// replay over the composition, the graph of the decode step, and the generation loop.
#include "infer/decoder.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "core/dtype.h"
#include "core/error.h"
#include "model/compose.h"

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

size_t align256(size_t n) {
  return (n + 255) / 256 * 256;
}

int prefill_rows(const DecoderOptions& o) {
  return o.prefill_tokens > 0 ? o.prefill_tokens : std::max(o.max_seq, 4096);
}

// The options with max_seq resolved and checked against the model.
DecoderOptions resolve(const ModelConfig& c, DecoderOptions o) {
  if (o.max_seq == 0) o.max_seq = c.context;
  TD_CHECK(o.batch >= 1, "--batch must be at least 1, got {}", o.batch);
  TD_CHECK(o.max_seq >= 1 && o.max_seq <= c.context,
           "--max-seq must be in [1, {}] (the model's context), got {}", c.context, o.max_seq);
  TD_CHECK(o.prefill_tokens >= 0, "prefill chunk of {} tokens", o.prefill_tokens);
  o.prefill_tokens = std::min(prefill_rows(o), c.context * std::max(1, o.batch));
  o.prefill_tokens = std::max(o.prefill_tokens, o.max_seq);
  return o;
}

struct Sizes {
  ActivationTraits prefill, decode;
  size_t prefill_ws = 0, decode_ws = 0, kv_block = 0;
};

Sizes sizes(const Kernels& k, const ModelConfig& c, const DecoderOptions& o) {
  Sizes s;
  // The prefill workspace of one prompt of prefill_tokens rows bounds every chunk's (a
  // chunk holds at most that many rows; generate checks each chunk's own size).
  const int T = std::min(o.prefill_tokens, c.context);
  const int B = std::max(1, o.prefill_tokens / T);
  s.prefill = activation_traits(k, c, B, T, WorkspaceUse::prefill, o.max_seq);
  s.prefill_ws = activation_bytes(c, B, T, s.prefill);
  s.decode = activation_traits(k, c, o.batch, 1, WorkspaceUse::decode, o.max_seq);
  s.decode_ws = activation_bytes(c, o.batch, 1, s.decode);
  s.kv_block = 2 * KvCache::block_bytes(c, o.batch, o.max_seq, k.compute_bytes());
  return s;
}

std::string gib(uint64_t b) {
  return fmt::format("{:.2f} GiB", static_cast<double>(b) / (1ull << 30));
}

}  // namespace

DecoderMemory decoder_check_fits(const ModelConfig& c, Device& device,
                                 const DecoderOptions& options) {
  const DecoderOptions o = resolve(c, options);
  const DecoderMemory m = Decoder::plan(c, device.kind(), o);
  const uint64_t limit = o.mem_limit > 0 ? o.mem_limit : device.free_bytes();
  TD_CHECK(limit == 0 || m.total() <= limit,
           "decoding {} sequences of up to {} positions needs {} on the {} device ({} of "
           "parameters, {} of KV cache, {} of workspace and library memory) but {} {}: {} "
           "short; lower --batch or --max-seq",
           o.batch, o.max_seq, gib(m.total()), device.name(), gib(m.params), gib(m.cache),
           gib(m.arena + m.extra), o.mem_limit > 0 ? "--mem-limit allows" : "it has free",
           gib(limit), gib(m.total() - limit));
  return m;
}

double GenerateResult::prefill_tokens_per_s() const {
  return prefill_ms > 0 ? static_cast<double>(prompt_tokens) / (prefill_ms / 1e3) : 0;
}
double GenerateResult::decode_tokens_per_s() const {
  return decode_ms > 0 ? static_cast<double>(decode_tokens) / (decode_ms / 1e3) : 0;
}

DecoderMemory Decoder::plan(const ModelConfig& c, DeviceKind kind, const DecoderOptions& options) {
  const DecoderOptions o = resolve(c, options);
  const std::unique_ptr<Kernels> k = kernels_for_sizing(kind, o.attention);
  const ModelLayout model(c);
  const Sizes s = sizes(*k, c, o);
  DecoderMemory m;
  for (const UnitLayout& u : model.units())
    m.params += align256(static_cast<size_t>(u.numel) * k->compute_bytes());
  m.cache = static_cast<uint64_t>(s.kv_block) * static_cast<uint64_t>(c.n_layer);
  InferenceSpec spec;
  spec.phase = InferPhase::prefill;
  spec.param_bytes = k->compute_bytes();
  spec.kv_block_bytes = s.kv_block;
  spec.prefill_ws_bytes = s.prefill_ws;
  spec.decode_ws_bytes = s.decode_ws;
  m.arena = program_build_inference(model, spec).arena_bytes;
  m.extra = kind == DeviceKind::cuda ? (32u << 20) : 0;  // the cuBLASLt workspace
  return m;
}

Decoder::Decoder(const ModelLayout& model, Device& device, std::vector<std::vector<float>> params,
                 const DecoderOptions& options)
    : model_(model), device_(device), options_(resolve(model.config(), options)) {
  const ModelConfig& c = model.config();
  TD_CHECK(params.size() == static_cast<size_t>(model.num_units()),
           "the decoder needs the parameters of {} units, got {}", model.num_units(),
           params.size());
  memory_ = decoder_check_fits(c, device, options_);
  stream_ = device.stream_create("decode");
  size_t extra = 0;
  kernels_ = kernels_create(device, *stream_, options_.attention, &extra);
  const size_t cb = kernels_->compute_bytes();

  // Parameters: one allocation, unit after unit, in the compute dtype.
  params_mem_ = std::make_unique<DeviceBuffer>(device, memory_.params);
  char* const params_block = params_mem_->as<char>();
  size_t off = 0;
  std::vector<uint16_t> half;
  for (int u = 0; u < model.num_units(); ++u) {
    std::vector<float>& p = params[static_cast<size_t>(u)];
    const UnitLayout& unit = model.unit(u);
    TD_CHECK(p.size() >= static_cast<size_t>(unit.numel),
             "unit {} holds {} parameters, expected {}", unit.name, p.size(), unit.numel);
    void* dst = params_block + off;
    const auto bad =
        std::find_if(p.begin(), p.begin() + unit.numel, [](float x) { return !std::isfinite(x); });
    TD_CHECK(bad == p.begin() + unit.numel,
             "parameter {} of unit {} is {}: the weights hold NaN or Inf", bad - p.begin(),
             unit.name, *bad);
    if (cb == 4) {
      device.copy_to_device(dst, p.data(), static_cast<size_t>(unit.numel) * 4);
    } else {
      half.resize(static_cast<size_t>(unit.numel));
      for (size_t i = 0; i < half.size(); ++i) half[i] = bf16_from_f32(p[i]);
      device.copy_to_device(dst, half.data(), half.size() * 2);
    }
    params_.push_back(dst);
    off += align256(static_cast<size_t>(unit.numel) * cb);
    std::vector<float>().swap(p);  // released as it goes
  }

  // The cache: K then V of each block.
  const Sizes s = sizes(*kernels_, c, options_);
  cache_mem_ = std::make_unique<DeviceBuffer>(device, std::max<uint64_t>(memory_.cache, 256));
  cache_.slots = options_.batch;
  cache_.positions = options_.max_seq;
  for (int l = 0; l < c.n_layer; ++l) {
    char* base = cache_mem_->as<char>() + static_cast<size_t>(l) * s.kv_block;
    cache_.k.push_back(base);
    cache_.v.push_back(base + s.kv_block / 2);
  }

  // The arena and the decode program.
  InferenceSpec spec;
  spec.phase = InferPhase::decode;
  spec.param_bytes = cb;
  spec.kv_block_bytes = s.kv_block;
  spec.decode_ws_bytes = s.decode_ws;
  decode_program_ = program_build_inference(model, spec);
  arena_mem_ = std::make_unique<DeviceBuffer>(device, std::max<uint64_t>(memory_.arena, 256));
  arena_ = arena_mem_->get();
  spec.phase = InferPhase::prefill;
  spec.prefill_ws_bytes = s.prefill_ws;
  const Program prefill = program_build_inference(model, spec);
  for (const Buffer& b : prefill.buffers) {
    if (b.name == "prefill-workspace") prefill_ws_offset_ = b.offset;
    if (b.name == "decode-workspace") decode_ws_offset_ = b.offset;
  }
  decode_ws_ = std::make_unique<Workspace>(c, options_.batch, 1, s.decode,
                                           static_cast<char*>(arena_) + decode_ws_offset_);
  decode_ws_->cache = &cache_;
}

Decoder::~Decoder() {
  try {
    if (stream_) device_.stream_sync(*stream_);
  } catch (...) {
  }
  graph_.reset();
  decode_ws_.reset();
  kernels_.reset();
  stream_.reset();
}

void Decoder::upload_i32(int32_t* dst, const std::vector<int32_t>& src) {
  device_.copy_to_device(dst, src.data(), src.size() * sizeof(int32_t));
}

std::vector<float> Decoder::last_logits() {
  device_.stream_sync(*stream_);
  const ModelConfig& c = model_.config();
  const int B = decode_ws_->B;
  const size_t n = static_cast<size_t>(B) * static_cast<size_t>(c.vocab_padded);
  std::vector<float> out(static_cast<size_t>(B) * static_cast<size_t>(c.vocab));
  std::vector<float> all(n);
  if (kernels_->compute_bytes() == 4) {
    device_.copy_to_host(all.data(), decode_ws_->logits, n * 4);
  } else {
    std::vector<uint16_t> h(n);
    device_.copy_to_host(h.data(), decode_ws_->logits, n * 2);
    for (size_t i = 0; i < n; ++i) all[i] = bf16_to_f32(h[i]);
  }
  for (int b = 0; b < B; ++b)
    std::copy_n(all.begin() + static_cast<int64_t>(b) * c.vocab_padded, c.vocab,
                out.begin() + static_cast<int64_t>(b) * c.vocab);
  return out;
}

GenerateResult Decoder::generate(const GenerateRequest& r) {
  const ModelConfig& c = model_.config();
  const int n = static_cast<int>(r.prompts.size());
  TD_CHECK(n >= 1 && n <= options_.batch, "{} prompts for a decoder of {} sequence slots", n,
           options_.batch);
  TD_CHECK(r.tokens >= 1, "--tokens must be at least 1, got {}", r.tokens);
  const SamplingParams& sp = r.sampling;
  TD_CHECK(std::isfinite(sp.temperature) && sp.temperature >= 0,
           "--temperature must be a finite number >= 0, got {}", sp.temperature);
  TD_CHECK(sp.top_k >= 0, "--top-k must not be negative, got {}", sp.top_k);
  TD_CHECK(sp.top_p > 0 && sp.top_p <= 1, "--top-p must be in (0, 1], got {}", sp.top_p);
  TD_CHECK(r.forced.empty() || r.forced.size() == r.prompts.size(),
           "{} forced continuations for {} prompts", r.forced.size(), r.prompts.size());
  for (const auto& f : r.forced) check_token_ids(f.data(), f.size(), c.vocab, "forced token");
  for (int s = 0; s < n; ++s) {
    const auto& p = r.prompts[static_cast<size_t>(s)];
    TD_CHECK(!p.empty(), "prompt {} is empty", s);
    check_token_ids(p.data(), p.size(), c.vocab, "prompt token");
    TD_CHECK(static_cast<int64_t>(p.size()) + r.tokens <= options_.max_seq,
             "prompt {} has {} tokens, and {} new ones make {}, over --max-seq {}", s, p.size(),
             r.tokens, static_cast<int64_t>(p.size()) + r.tokens, options_.max_seq);
  }
  const Clock::time_point t0 = Clock::now();
  GenerateResult out;
  out.ids.assign(static_cast<size_t>(n), {});
  out.finish.assign(static_cast<size_t>(n), "length");
  const int B = n;
  const Sizes s = sizes(*kernels_, c, options_);
  Kernels& k = *kernels_;
  if (decode_ws_->B != B) {  // fewer sequences than slots: a workspace of B rows, in place
    const ActivationTraits tr =
        activation_traits(k, c, B, 1, WorkspaceUse::decode, options_.max_seq);
    TD_CHECK(activation_bytes(c, B, 1, tr) <= s.decode_ws, "internal: decode workspace of {} rows",
             B);
    device_.stream_sync(*stream_);
    decode_ws_ =
        std::make_unique<Workspace>(c, B, 1, tr, static_cast<char*>(arena_) + decode_ws_offset_);
    decode_ws_->cache = &cache_;
  }
  UnitParams params(params_.begin(), params_.end());
  const size_t cb = k.compute_bytes();

  const std::vector<std::vector<int32_t>>& prompts = r.prompts;
  std::vector<int32_t> pos(static_cast<size_t>(B)), slots(static_cast<size_t>(B));
  for (int b = 0; b < B; ++b) {
    pos[static_cast<size_t>(b)] = static_cast<int32_t>(prompts[static_cast<size_t>(b)].size());
    slots[static_cast<size_t>(b)] = b;
    out.prompt_tokens += static_cast<int64_t>(prompts[static_cast<size_t>(b)].size());
  }

  // Prefill: chunks of prompts of one length, each at most prefill_tokens rows and fitting
  // the planned workspace.
  device_.stream_sync(*stream_);
  upload_i32(decode_ws_->positions, pos);
  upload_i32(decode_ws_->slots, slots);
  std::map<size_t, std::vector<int>> by_length;
  for (int b = 0; b < B; ++b) by_length[prompts[static_cast<size_t>(b)].size()].push_back(b);
  std::vector<std::vector<int>> chunks;
  for (const auto& [len, seqs] : by_length) {
    const int T = static_cast<int>(len);
    int per = std::max(1, options_.prefill_tokens / T);
    while (per > 1 && activation_bytes(c, per, T,
                                       activation_traits(k, c, per, T, WorkspaceUse::prefill,
                                                         options_.max_seq)) > s.prefill_ws)
      per /= 2;
    for (size_t i = 0; i < seqs.size(); i += static_cast<size_t>(per))
      chunks.emplace_back(seqs.begin() + static_cast<int64_t>(i),
                          seqs.begin() + static_cast<int64_t>(std::min(seqs.size(), i + per)));
  }
  InferenceSpec spec;
  spec.phase = InferPhase::prefill;
  spec.prefill_groups = static_cast<int>(chunks.size());
  spec.param_bytes = cb;
  spec.kv_block_bytes = s.kv_block;
  spec.prefill_ws_bytes = s.prefill_ws;
  spec.decode_ws_bytes = s.decode_ws;
  const Program prefill = program_build_inference(model_, spec);
  size_t chunk = 0;
  std::unique_ptr<Workspace> pws;
  for (const Op& op : prefill.ops) {
    if (op.kind == OpKind::forward && op.unit == 0 &&
        prefill.buffers[static_cast<size_t>(op.writes[0])].name == "prefill-workspace") {
      // A new chunk: its workspace and inputs (the stream drains first: the previous
      // chunk's blocks still read their positions and slots).
      const std::vector<int>& seqs = chunks[chunk];
      const int Bc = static_cast<int>(seqs.size());
      const int T = static_cast<int>(prompts[static_cast<size_t>(seqs[0])].size());
      const ActivationTraits tr =
          activation_traits(k, c, Bc, T, WorkspaceUse::prefill, options_.max_seq);
      TD_CHECK(activation_bytes(c, Bc, T, tr) <= s.prefill_ws,
               "internal: a prefill chunk of {} x {} exceeds its workspace", Bc, T);
      device_.stream_sync(*stream_);
      pws = std::make_unique<Workspace>(c, Bc, T, tr,
                                        static_cast<char*>(arena_) + prefill_ws_offset_);
      pws->cache = &cache_;
      std::vector<int32_t> tok, ppos, pslot;
      for (int b : seqs)
        for (int t = 0; t < T; ++t) {
          tok.push_back(prompts[static_cast<size_t>(b)][static_cast<size_t>(t)]);
          ppos.push_back(t);
          pslot.push_back(b);
        }
      upload_i32(pws->tokens, tok);
      upload_i32(pws->positions, ppos);
      upload_i32(pws->slots, pslot);
    }
    Workspace* ws = prefill.buffers[static_cast<size_t>(op.writes[0])].name == "prefill-workspace"
                        ? pws.get()
                        : decode_ws_.get();
    const std::vector<int>* seqs = chunk < chunks.size() ? &chunks[chunk] : nullptr;
    device_.submit(*stream_, [&, ws, seqs, op] {
      k.set_scratch(ws->scratch, ws->scratch_bytes);
      switch (op.kind) {
        case OpKind::forward:
          unit_forward(k, model_, op.unit, params, *ws);
          break;
        case OpKind::last_rows: {
          const int T = pws->T;
          for (size_t i = 0; i < seqs->size(); ++i)
            k.copy_rows(
                static_cast<char*>(decode_ws_->residual.back()) +
                    static_cast<size_t>((*seqs)[i]) * c.d_model * cb,
                static_cast<const char*>(pws->residual.back()) +
                    (i * static_cast<size_t>(T) + static_cast<size_t>(T - 1)) * c.d_model * cb,
                1, c.d_model, 0);
          break;
        }
        case OpKind::sample:
          k.sample_tokens(decode_ws_->tokens, decode_ws_->logits, decode_ws_->positions, B, c.vocab,
                          c.vocab_padded, sp);
          break;
        default:
          TD_THROW("internal: a prefill program holds a {} op", op_kind_name(op.kind));
      }
    });
    if (op.kind == OpKind::last_rows) ++chunk;
  }

  // The loop: read the tokens, hand them out, decode the next step.
  std::vector<int32_t> tokens(static_cast<size_t>(B));
  std::vector<bool> live(static_cast<size_t>(n), true);
  int live_count = n;
  auto read_tokens = [&] {
    device_.stream_sync(*stream_);
    device_.copy_to_host(tokens.data(), decode_ws_->tokens, tokens.size() * sizeof(int32_t));
    for (int b = 0; b < n; ++b) {
      if (!live[static_cast<size_t>(b)]) continue;
      const int32_t t = tokens[static_cast<size_t>(b)];
      const bool eos = !r.ignore_eos && std::find(r.eos.begin(), r.eos.end(), t) != r.eos.end();
      out.ids[static_cast<size_t>(b)].push_back(t);
      ++out.decode_tokens;
      bool keep = true;
      if (r.on_token) keep = r.on_token(b, t);
      if (eos || !keep || static_cast<int>(out.ids[static_cast<size_t>(b)].size()) >= r.tokens) {
        live[static_cast<size_t>(b)] = false;
        --live_count;
        if (eos)
          out.finish[static_cast<size_t>(b)] = "eos";
        else if (!keep)
          out.finish[static_cast<size_t>(b)] = "stop";
      }
    }
  };
  // Teacher forcing: the next step's input is the forced token, not the drawn one.
  int64_t step_index = 0;
  auto force = [&] {
    if (r.forced.empty()) return;
    std::vector<int32_t> in(static_cast<size_t>(B));
    for (int b = 0; b < B; ++b) {
      const auto& f = r.forced[static_cast<size_t>(b)];
      in[static_cast<size_t>(b)] = step_index < static_cast<int64_t>(f.size())
                                       ? f[static_cast<size_t>(step_index)]
                                       : tokens[static_cast<size_t>(b)];
    }
    upload_i32(decode_ws_->tokens, in);
    ++step_index;
  };
  read_tokens();
  force();
  out.prefill_ms = ms_since(t0);
  out.time_to_first_token_ms = out.prefill_ms;
  out.decode_tokens = 0;  // counts decode-step tokens from here on
  const Clock::time_point t1 = Clock::now();
  auto enqueue_step = [&] {
    for (const Op& op : decode_program_.ops) {
      switch (op.kind) {
        case OpKind::forward:
          unit_forward(k, model_, op.unit, params, *decode_ws_);
          break;
        case OpKind::advance:
          k.advance_positions(decode_ws_->positions, B);
          break;
        case OpKind::sample:
          k.sample_tokens(decode_ws_->tokens, decode_ws_->logits, decode_ws_->positions, B, c.vocab,
                          c.vocab_padded, sp);
          break;
        default:
          TD_THROW("internal: a decode program holds a {} op", op_kind_name(op.kind));
      }
    }
  };
  const bool graphs = options_.graphs && device_.supports_graphs();
  graph_.reset();  // sampling parameters are captured with the graph
  while (live_count > 0) {
    device_.submit(*stream_, [&] {
      k.set_scratch(decode_ws_->scratch, decode_ws_->scratch_bytes);
      if (!graphs) return enqueue_step();
      if (!graph_) {
        device_.capture_begin(*stream_);
        try {
          enqueue_step();
        } catch (...) {
          try {
            (void)device_.capture_end(*stream_);
          } catch (...) {
          }
          throw;
        }
        graph_ = device_.capture_end(*stream_);
      }
      device_.graph_launch(*graph_, *stream_);
    });
    ++out.decode_steps;
    read_tokens();
    force();
  }
  out.decode_ms = ms_since(t1);
  return out;
}

}  // namespace tandem
