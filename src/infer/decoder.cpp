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
#include "infer/decoder_internal.h"
#include "model/compose.h"

namespace tandem {

using namespace decoder_detail;

namespace {

// tp draws from every rank's candidates (device/kernels.h, [Split sampling]): the nucleus
// of --top-p is found among the ranks' top k, so it needs --top-k.
void sample_split_check(const SamplingParams& sp, int ranks, int most) {
  TD_CHECK(sample_split_supported(sp),
           "tp splits the vocabulary over the ranks and finds the --top-p nucleus among every "
           "rank's top k tokens: add --top-k (e.g. --top-k 50), or use --strategy replicate");
  const int K = sample_candidates_per_row(sp);
  TD_CHECK(static_cast<int64_t>(K) * ranks <= most,
           "tp draws from the top k tokens of each of its {} ranks, at most {} in all on this "
           "device: --top-k {} is too large (or use --strategy replicate)",
           ranks, most, sp.top_k);
}

}  // namespace

DecoderShare decoder_share(const DecoderOptions& options, int world) {
  const DecoderOptions o = for_world(options, world);
  DecoderShare s;
  if (o.layout == InferLayout::pipeline) {
    s.rows = ceil_div(o.batch, pipeline_micro_max(o, world));
    s.slots = o.batch;
  } else if (world == 1 || o.layout == InferLayout::tp) {
    s.rows = s.slots = o.batch;
  } else if (o.layout == InferLayout::replicate) {
    s.rows = s.slots = ceil_div(o.batch, world);
  } else {
    s.rows = ceil_div(o.batch, world);
    s.slots = s.rows + 1;
  }
  return s;
}

DecoderMemory decoder_check_fits(const ModelConfig& c, Device& device,
                                 const DecoderOptions& options, int world) {
  const DecoderOptions o = resolve(c, options);
  const DecoderMemory m = Decoder::plan(c, device.kind(), o, world);
  const uint64_t limit = o.mem_limit > 0 ? o.mem_limit : device.free_bytes();
  TD_CHECK(
      limit == 0 || m.total() <= limit,
      "decoding {} sequences of up to {} positions{} needs {} on the {} device ({} of "
      "parameters, {} of KV cache, {} of workspace and library memory) but {} {}: {} "
      "short; lower --batch or --max-seq{}",
      o.batch, o.max_seq,
      world > 1 ? fmt::format(" with {} over {} ranks", infer_layout_name(o.layout), world) : "",
      gib(m.total()), device.name(), gib(m.params), gib(m.cache), gib(m.arena + m.extra),
      o.mem_limit > 0 ? "--mem-limit allows" : "it has free", gib(limit), gib(m.total() - limit),
      world > 1 ? ", or add ranks" : "");
  return m;
}

double GenerateResult::prefill_tokens_per_s() const {
  return prefill_ms > 0 ? static_cast<double>(prompt_tokens) / (prefill_ms / 1e3) : 0;
}
double GenerateResult::decode_tokens_per_s() const {
  return decode_ms > 0 ? static_cast<double>(decode_tokens) / (decode_ms / 1e3) : 0;
}

DecoderMemory Decoder::plan(const ModelConfig& c, DeviceKind kind, const DecoderOptions& options,
                            int world) {
  const DecoderOptions o = for_world(resolve(c, options), world);
  const std::unique_ptr<Kernels> k = kernels_for_sizing(kind, o.attention);
  const ModelLayout model(c);
  const DecoderShare share = decoder_share(o, world);
  const Sizes s = sizes(*k, c, o, share);
  const size_t cb = k->compute_bytes();
  DecoderMemory m;
  m.extra = kind == DeviceKind::cuda ? (32u << 20) : 0;  // the cuBLASLt workspace
  if (o.layout == InferLayout::pipeline) {
    // Every stage refuses what the fullest one needs, so all ranks agree.
    const int M = pipeline_micro_max(o, world);
    DecoderMemory most;
    for (int r = 0; r < world; ++r) {
      const Program p =
          program_build_inference(model, spec_of(InferPhase::decode, o, world, cb, s, 1, r, M));
      DecoderMemory st = m;
      for (const Buffer& b : p.buffers) {
        if (b.kind == BufferKind::params) st.params += align256(b.bytes);
        if (b.kind == BufferKind::kv_cache) st.cache += b.bytes;
      }
      st.arena =
          arena_of(model, o, world, cb, s, r, M) + static_cast<uint64_t>(M) * align256(s.decode_ws);
      if (st.total() > most.total()) most = st;
    }
    return most;
  }
  const FlatLayout flat(model, o.layout == InferLayout::fsdp ? world : 1);
  for (int u = 0; u < model.num_units(); ++u)
    m.params += align256(static_cast<size_t>(o.layout == InferLayout::fsdp ? flat.unit(u).shard
                                                                           : model.unit(u).numel) *
                         cb);
  m.cache = static_cast<uint64_t>(s.kv_block) * static_cast<uint64_t>(c.n_layer);
  m.arena = arena_of(model, o, world, cb, s) + align256(s.decode_ws);
  return m;
}

Decoder::Decoder(const ModelLayout& model, Device& device, std::vector<std::vector<float>> params,
                 const DecoderOptions& options, const DecoderComms& comms)
    : model_(model), device_(device), options_(resolve(model.config(), options)), comms_(comms) {
  const ModelConfig& c = model.config();
  TD_CHECK(params.size() == static_cast<size_t>(model.num_units()),
           "the decoder needs the parameters of {} units, got {}", model.num_units(),
           params.size());
  if (comms_.data != nullptr) {
    world_ = comms_.data->size();
    rank_ = comms_.data->rank();
  }
  options_ = for_world(options_, world_);
  const InferLayout layout = options_.layout;
  TD_CHECK(layout != InferLayout::pipeline || c.tp.ways == 1,
           "a pipeline decoder runs the whole model's units, not a tp rank's");
  TD_CHECK(layout != InferLayout::tp || c.tp.ways == world_,
           "a tp decoder over {} ranks runs the model of one rank of {} (tp_local_config), got "
           "one of {}",
           world_, world_, c.tp.ways);
  share_ = decoder_share(options_, world_);
  memory_ = decoder_check_fits(c, device, options_, world_);
  stream_ = device.stream_create("decode");
  if (world_ > 1) {
    if (comms_.control == nullptr) {
      control_comm_ = comms_.data->duplicate("control");
      comms_.control = control_comm_.get();
      comms_.control_device = &device;
    }
    control_stream_ = comms_.control_device->stream_create("control");
    if (layout == InferLayout::tp) tp_comm_ = comms_.data->duplicate("tp");
  }
  if (layout == InferLayout::fsdp) {
    gather_comm_ = comms_.data->duplicate("all-gather");
    gather_stream_ = device.stream_create("all-gather", 1);
  }
  // pipeline: the stage's units; activations to and from the neighbours on the pipeline
  // stream, and on the host the tokens (last stage to the first) and each micro-batch's
  // go-ahead (first to last), each on a communicator and stream of its own so neither
  // direction queues behind the other ("Pipeline" in docs/design.md).
  std::vector<bool> held(static_cast<size_t>(model.num_units()), true);
  if (layout == InferLayout::pipeline) {
    stages_ = pipeline_stages(model, world_);
    micro_max_ = pipeline_micro_max(options_, world_);
    pipe_comm_ = comms_.data->duplicate("pipeline");
    gather_stream_ = device.stream_create("pipeline", 1);
    tokens_comm_ = comms_.control->duplicate("pipeline tokens");
    flags_comm_ = comms_.control->duplicate("pipeline go-ahead");
    tokens_stream_ = comms_.control_device->stream_create("pipeline tokens");
    flags_stream_ = comms_.control_device->stream_create("pipeline go-ahead");
    held = pipeline_units(model, world_, rank_);
  }
  size_t extra = 0;
  kernels_ = kernels_create(device, *stream_, options_.attention, &extra);
  const size_t cb = kernels_->compute_bytes();

  // Parameters: one allocation, unit after unit, in the compute dtype.
  const FlatLayout flat(model, layout == InferLayout::fsdp ? world_ : 1);
  if (layout == InferLayout::pipeline) {  // this stage's own, not the fullest stage's
    memory_.params = memory_.cache = 0;
    for (int u = 0; u < model.num_units(); ++u) {
      if (!held[static_cast<size_t>(u)]) continue;
      memory_.params += align256(static_cast<size_t>(model.unit(u).numel) * cb);
      if (model.unit(u).kind == UnitKind::block) ++stage_blocks_;
    }
  }
  params_mem_ = std::make_unique<DeviceBuffer>(device, std::max<uint64_t>(memory_.params, 256));
  char* const params_block = params_mem_->as<char>();
  size_t off = 0;
  std::vector<uint16_t> half;
  for (int u = 0; u < model.num_units(); ++u) {
    std::vector<float>& p = params[static_cast<size_t>(u)];
    if (!held[static_cast<size_t>(u)]) {  // another stage's
      params_.push_back(nullptr);
      shard_elems_.push_back(0);
      std::vector<float>().swap(p);
      continue;
    }
    const UnitLayout& unit = model.unit(u);
    const int64_t n = layout == InferLayout::fsdp ? flat.unit(u).shard : unit.numel;
    TD_CHECK(p.size() >= static_cast<size_t>(n), "unit {} holds {} parameters, expected {}{}",
             unit.name, p.size(), n,
             layout == InferLayout::fsdp ? fmt::format(" (its shard of {} ranks)", world_) : "");
    void* dst = params_block + off;
    const auto bad =
        std::find_if(p.begin(), p.begin() + n, [](float x) { return !std::isfinite(x); });
    TD_CHECK(bad == p.begin() + n, "parameter {} of unit {} is {}: the weights hold NaN or Inf",
             bad - p.begin(), unit.name, *bad);
    if (cb == 4) {
      device.copy_to_device(dst, p.data(), static_cast<size_t>(n) * 4);
    } else {
      half.resize(static_cast<size_t>(n));
      for (size_t i = 0; i < half.size(); ++i) half[i] = bf16_from_f32(p[i]);
      device.copy_to_device(dst, half.data(), half.size() * 2);
    }
    params_.push_back(dst);
    shard_elems_.push_back(n);
    off += align256(static_cast<size_t>(n) * cb);
    std::vector<float>().swap(p);  // released as it goes
  }

  // The cache: K then V of each block.
  const Sizes s = sizes(*kernels_, c, options_, share_);
  if (layout == InferLayout::pipeline)
    memory_.cache = static_cast<uint64_t>(s.kv_block) * static_cast<uint64_t>(stage_blocks_);
  cache_mem_ = std::make_unique<DeviceBuffer>(device, std::max<uint64_t>(memory_.cache, 256));
  cache_.slots = share_.slots;
  cache_.positions = options_.max_seq;
  size_t at = 0;  // a pipeline stage holds only its blocks' caches
  for (int l = 0; l < c.n_layer; ++l) {
    const bool mine = held[static_cast<size_t>(l) + 1];
    char* base = mine ? cache_mem_->as<char>() + at : nullptr;
    if (mine) at += s.kv_block;
    cache_.k.push_back(base);
    cache_.v.push_back(mine ? base + s.kv_block / 2 : nullptr);
  }

  // The decode workspace (held for the session; a pipeline's one per micro-batch), the arena
  // and the decode program.
  ws_mem_ = std::make_unique<DeviceBuffer>(device,
                                           static_cast<size_t>(micro_max_) * align256(s.decode_ws));
  decode_ws_ = std::make_unique<Workspace>(c, share_.rows, 1, s.decode, ws_mem_->get());
  decode_ws_->cache = &cache_;
  decode_program_ = program_build_inference(
      model, spec_of(InferPhase::decode, options_, world_, cb, s, 1, rank_, micro_max_));
  arena_bytes_ = arena_of(model, options_, world_, cb, s, rank_, micro_max_);
  if (layout == InferLayout::pipeline)
    memory_.arena = arena_bytes_ + static_cast<uint64_t>(micro_max_) * align256(s.decode_ws);
  arena_mem_ = std::make_unique<DeviceBuffer>(device, std::max<uint64_t>(arena_bytes_, 256));
  arena_ = arena_mem_->get();
  // Each decode op's parameters, found once for the session (the arena does not move).
  for (const Op& op : decode_program_.ops) decode_params_.push_back(op_params(decode_program_, op));
}

Decoder::~Decoder() {
  try {
    if (stream_) device_.stream_sync(*stream_);
    if (gather_stream_) device_.stream_sync(*gather_stream_);
    if (control_stream_) comms_.control_device->stream_sync(*control_stream_);
    if (tokens_stream_) comms_.control_device->stream_sync(*tokens_stream_);
    if (flags_stream_) comms_.control_device->stream_sync(*flags_stream_);
  } catch (...) {
  }
  graph_.reset();
  decode_ws_.reset();
  kernels_.reset();
  done_.clear();
  mb_ws_.clear();
  mb_done_.clear();
  pipe_done_.clear();
  stream_.reset();
  gather_stream_.reset();
  control_stream_.reset();
  tokens_stream_.reset();
  flags_stream_.reset();
}

void Decoder::upload_i32(int32_t* dst, const std::vector<int32_t>& src) {
  device_.copy_to_device(dst, src.data(), src.size() * sizeof(int32_t));
}

int Decoder::param_bytes() const {
  return static_cast<int>(kernels_->compute_bytes());
}

std::vector<float> Decoder::last_logits() {
  TD_CHECK(!ahead_now_,
           "last_logits() during a generate that runs ahead: the next step is already running "
           "(force the tokens, or set DecoderOptions::run_ahead = false, to read each step's)");
  TD_CHECK(!ran_past_,
           "last_logits(): the last generate ran one step past its last token, enqueued ahead "
           "before every sequence stopped (set DecoderOptions::run_ahead = false to keep the "
           "last token's step)");
  device_.stream_sync(*stream_);
  if (options_.layout == InferLayout::pipeline) {  // the last stage's micro-batches, in order
    std::vector<float> all;
    if (rank_ + 1 < world_) return all;
    for (const auto& ws : mb_ws_) {
      const std::vector<float> part = logits_of(*ws);
      all.insert(all.end(), part.begin(), part.end());
    }
    return all;
  }
  return logits_of(*decode_ws_);
}

std::vector<float> Decoder::logits_of(const Workspace& ws) {
  const ModelConfig& c = model_.config();
  const int B = ws.B, rows = c.head_rows();
  const int V = std::clamp(c.vocab - c.head_begin(), 0, rows);
  const size_t n = static_cast<size_t>(B) * static_cast<size_t>(rows);
  std::vector<float> out(static_cast<size_t>(B) * static_cast<size_t>(V));
  std::vector<float> all(n);
  if (kernels_->compute_bytes() == 4) {
    device_.copy_to_host(all.data(), ws.logits, n * 4);
  } else {
    std::vector<uint16_t> h(n);
    device_.copy_to_host(h.data(), ws.logits, n * 2);
    for (size_t i = 0; i < n; ++i) all[i] = bf16_to_f32(h[i]);
  }
  for (int b = 0; b < B; ++b)
    std::copy_n(all.begin() + static_cast<int64_t>(b) * rows, V,
                out.begin() + static_cast<int64_t>(b) * V);
  return out;
}

void Decoder::replay(const Program& p, const std::function<void(const Op&)>& run,
                     const std::function<void(const Op&, Stream&)>& transfer, size_t begin,
                     size_t end) {
  const bool events = gather_stream_ != nullptr;
  while (events && done_.size() < p.ops.size()) done_.push_back(device_.event_create(false));
  end = std::min(end, p.ops.size());
  for (size_t i = begin; i < end; ++i) {
    const Op& op = p.ops[i];
    Stream& s = op.stream == StreamRole::gather ? *gather_stream_ : *stream_;
    for (int w : op.waits) device_.stream_wait(s, *done_[static_cast<size_t>(w)]);
    const bool time = timing_step_ >= 0;
    if (time) {  // a timing event on each side of the op
      while (timing_events_.size() < 2 * pending_timings_.size() + 2)
        timing_events_.push_back(device_.event_create(true));
      PendingTiming pt{2 * pending_timings_.size(), 2 * pending_timings_.size() + 1, {}};
      pt.t.step = timing_step_;
      pt.t.stream = s.name();
      pt.t.name = fmt::format("{}{}", op_kind_name(op.kind),
                              op.unit >= 0 ? " " + model_.unit(op.unit).name : "");
      pt.t.micro = op.micro;
      device_.event_record(*timing_events_[pt.start], s);
      pending_timings_.push_back(std::move(pt));
    }
    if (op.kind == OpKind::gather) {
      const Buffer& dst = p.buffers[static_cast<size_t>(op.writes.at(0))];
      gather_comm_->all_gather(
          s, params_[static_cast<size_t>(op.unit)], static_cast<char*>(arena_) + dst.offset,
          static_cast<size_t>(shard_elems_[static_cast<size_t>(op.unit)]),
          kernels_->compute_dtype(), fmt::format("gather {}", model_.unit(op.unit).name));
    } else if (op.kind == OpKind::send || op.kind == OpKind::recv) {
      TD_CHECK(transfer != nullptr, "internal: a {} op without a transfer", op_kind_name(op.kind));
      transfer(op, s);
    } else {
      run(op);
    }
    if (time) device_.event_record(*timing_events_[pending_timings_.back().end], s);
    if (events) device_.event_record(*done_[i], s);
  }
}

void Decoder::timing_begin() {
  timings_.clear();
  pending_timings_.clear();
  timing_step_ = -1;
  if (options_.trace_last < options_.trace_first) return;
  if (!timing_zero_) timing_zero_ = device_.event_create(true);
  device_.event_record(*timing_zero_, *stream_);
}

void Decoder::timing_end() {
  timing_step_ = -1;
  if (pending_timings_.empty()) return;
  device_.stream_sync(*stream_);
  if (gather_stream_) device_.stream_sync(*gather_stream_);
  for (PendingTiming& pt : pending_timings_) {
    pt.t.start_ms = device_.event_elapsed_ms(*timing_zero_, *timing_events_[pt.start]);
    pt.t.dur_ms = device_.event_elapsed_ms(*timing_events_[pt.start], *timing_events_[pt.end]);
    timings_.push_back(std::move(pt.t));
  }
  pending_timings_.clear();
}

UnitParams Decoder::op_params(const Program& p, const Op& op) const {
  UnitParams params(static_cast<size_t>(model_.num_units()), nullptr);
  for (const UnitBuffer& ub : op.params) {
    const Buffer& b = p.buffers[static_cast<size_t>(ub.buffer)];
    params[static_cast<size_t>(ub.unit)] = b.kind == BufferKind::gathered
                                               ? static_cast<const char*>(arena_) + b.offset
                                               : params_[static_cast<size_t>(ub.unit)];
  }
  return params;
}

void Decoder::tp_reduce(const Op& op, Workspace& ws) {
  const TpReduce r = tp_reduce_after(model_, op.unit, static_cast<BlockPart>(op.part), ws);
  if (r.buf == nullptr || r.count == 0) return;
  tp_comm_->all_reduce(*stream_, r.buf, r.buf, static_cast<size_t>(r.count),
                       kernels_->compute_dtype(),
                       fmt::format("tp {} part {}", model_.unit(op.unit).name, op.part));
}

void Decoder::sample(Workspace& ws, int rows, const SamplingParams& sp) {
  const ModelConfig& c = model_.config();
  Kernels& k = *kernels_;
  if (tp_comm_ == nullptr) {
    device_.submit(*stream_, [&k, &ws, &c, rows, sp] {
      k.set_scratch(ws.scratch, ws.scratch_bytes);
      k.sample_tokens(ws.tokens, ws.logits, ws.positions, rows, c.vocab, c.vocab_padded, sp);
    });
    return;
  }
  // The vocabulary is split: each rank's candidates, all-gathered, then the one rule over
  // them (device/kernels.h, sample_candidates).
  const int K = sample_candidates_per_row(sp);
  const size_t per_rank = static_cast<size_t>(rows) * static_cast<size_t>(K);
  const size_t bytes = per_rank * static_cast<size_t>(1 + world_) * 8;
  if (!cand_mem_ || cand_bytes_ < bytes) {
    device_.stream_sync(*stream_);
    cand_mem_ = std::make_unique<DeviceBuffer>(device_, bytes);
    cand_bytes_ = bytes;
  }
  float* vals = cand_mem_->as<float>();
  int32_t* ids = reinterpret_cast<int32_t*>(vals + per_rank);
  float* all_vals = vals + 2 * per_rank;
  int32_t* all_ids = reinterpret_cast<int32_t*>(all_vals + per_rank * static_cast<size_t>(world_));
  const int rows_here = c.head_rows(), begin = c.head_begin();
  const int V = std::clamp(c.vocab - begin, 0, rows_here);
  device_.submit(*stream_, [&k, &ws, vals, ids, rows, V, rows_here, begin, sp] {
    k.set_scratch(ws.scratch, ws.scratch_bytes);
    k.sample_candidates(vals, ids, ws.logits, ws.positions, rows, V, rows_here, begin, sp);
  });
  tp_comm_->all_gather(*stream_, vals, all_vals, per_rank, DType::f32, "sample candidates");
  tp_comm_->all_gather(*stream_, ids, all_ids, per_rank, DType::f32, "sample candidate ids");
  const int W = world_;
  device_.submit(*stream_, [&k, &ws, all_vals, all_ids, rows, W, K, sp] {
    k.set_scratch(ws.scratch, ws.scratch_bytes);
    k.sample_pick(ws.tokens, all_vals, all_ids, ws.positions, rows, W, K, sp);
  });
}

int64_t Decoder::live_everywhere(int64_t local) {
  std::vector<float> v{static_cast<float>(local)};
  comms_.control->all_reduce(*control_stream_, v.data(), v.data(), 1, DType::f32, "live sequences");
  comms_.control_device->stream_sync(*control_stream_);
  return static_cast<int64_t>(v[0]);
}

void Decoder::exchange(GenerateResult& out, int lo, int hi, int n) {
  // Per sequence: [count, finish, ids...] as floats (token ids are exact in fp32), added
  // over ranks (each sequence is one rank's); per rank: the counts and times.
  size_t most = 0;
  for (int s = lo; s < hi; ++s) most = std::max(most, out.ids[static_cast<size_t>(s)].size());
  std::vector<float> len{static_cast<float>(most)};
  comms_.control->all_reduce(*control_stream_, len.data(), len.data(), 1, DType::f32,
                             "result lengths");
  comms_.control_device->stream_sync(*control_stream_);
  // A sum of maxima bounds every sequence's length.
  const size_t width = static_cast<size_t>(len[0]) + 2;
  std::vector<float> seqs(static_cast<size_t>(n) * width, 0.0f);
  static const char* kFinish[] = {"length", "eos", "stop"};
  for (int s = lo; s < hi; ++s) {
    const auto& ids = out.ids[static_cast<size_t>(s)];
    float* row = seqs.data() + static_cast<size_t>(s) * width;
    row[0] = static_cast<float>(ids.size());
    for (int f = 0; f < 3; ++f)
      if (out.finish[static_cast<size_t>(s)] == kFinish[f]) row[1] = static_cast<float>(f);
    for (size_t i = 0; i < ids.size(); ++i) row[2 + i] = static_cast<float>(ids[i]);
  }
  std::vector<float> mine{
      static_cast<float>(out.prompt_tokens), static_cast<float>(out.decode_tokens),
      static_cast<float>(out.decode_steps),  static_cast<float>(out.prefill_ms),
      static_cast<float>(out.decode_ms),     static_cast<float>(out.time_to_first_token_ms)};
  std::vector<float> all(mine.size() * static_cast<size_t>(world_));
  comms_.control->all_reduce(*control_stream_, seqs.data(), seqs.data(), seqs.size(), DType::f32,
                             "results");
  comms_.control->all_gather(*control_stream_, mine.data(), all.data(), mine.size(), DType::f32,
                             "result times");
  comms_.control_device->stream_sync(*control_stream_);
  for (int s = 0; s < n; ++s) {
    const float* row = seqs.data() + static_cast<size_t>(s) * width;
    auto& ids = out.ids[static_cast<size_t>(s)];
    ids.resize(static_cast<size_t>(row[0]));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(row[2 + i]);
    out.finish[static_cast<size_t>(s)] = kFinish[std::clamp(static_cast<int>(row[1]), 0, 2)];
  }
  out.prompt_tokens = out.decode_tokens = out.decode_steps = 0;
  out.prefill_ms = out.decode_ms = out.time_to_first_token_ms = 0;
  for (int r = 0; r < world_; ++r) {
    const float* a = all.data() + static_cast<size_t>(r) * mine.size();
    out.prompt_tokens += static_cast<int64_t>(a[0]);
    out.decode_tokens += static_cast<int64_t>(a[1]);
    out.decode_steps = std::max(out.decode_steps, static_cast<int64_t>(a[2]));
    out.prefill_ms = std::max(out.prefill_ms, static_cast<double>(a[3]));
    out.decode_ms = std::max(out.decode_ms, static_cast<double>(a[4]));
    out.time_to_first_token_ms = std::max(out.time_to_first_token_ms, static_cast<double>(a[5]));
  }
}

GenerateResult Decoder::generate(const GenerateRequest& r) {
  const ModelConfig& c = model_.config();
  const int n = static_cast<int>(r.prompts.size());
  TD_CHECK(n >= 1 && n <= options_.batch, "{} prompts for a decoder of {} sequence slots", n,
           options_.batch);
  TD_CHECK(r.tokens >= 1, "--tokens must be at least 1, got {}", r.tokens);
  ran_past_ = false;
  SamplingParams sp = r.sampling;
  TD_CHECK(std::isfinite(sp.temperature) && sp.temperature >= 0,
           "--temperature must be a finite number >= 0, got {}", sp.temperature);
  TD_CHECK(sp.top_k >= 0, "--top-k must not be negative, got {}", sp.top_k);
  TD_CHECK(sp.top_p > 0 && sp.top_p <= 1, "--top-p must be in (0, 1], got {}", sp.top_p);
  if (tp_comm_ != nullptr) sample_split_check(sp, world_, kernels_->sample_pick_max_candidates());
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
  timing_begin();
  if (options_.layout == InferLayout::pipeline) return generate_pipeline(r, sp, t0);
  GenerateResult out;
  out.ids.assign(static_cast<size_t>(n), {});
  out.finish.assign(static_cast<size_t>(n), "length");
  const std::vector<std::vector<int32_t>>& prompts = r.prompts;

  // This rank's sequences [lo, hi): all of them under tp, a contiguous share otherwise.
  const InferLayout layout = options_.layout;
  const bool split = world_ > 1 && layout != InferLayout::tp;
  const bool lockstep = split && layout == InferLayout::fsdp;  // every rank joins every gather
  // (Plain ints, not a structured binding: the lambdas below capture them.)
  const std::pair<int, int> range = split ? seq_range(n, rank_, world_) : std::pair<int, int>{0, n};
  const int lo = range.first, hi = range.second;
  const int B = hi - lo;
  // An fsdp rank without sequences decodes one stand-in row in the spare slot.
  const bool stand_in = lockstep && B == 0;
  const int rows = stand_in ? 1 : B;
  const int spare = share_.slots - 1;
  sp.row_offset = lo;
  for (int s = lo; s < hi; ++s)
    out.prompt_tokens += static_cast<int64_t>(prompts[static_cast<size_t>(s)].size());
  if (rows == 0) {  // replicate: nothing here; the others' results arrive below
    exchange(out, lo, hi, n);
    return out;
  }

  const Sizes sz = sizes(*kernels_, c, options_, share_);
  Kernels& k = *kernels_;
  const size_t cb = k.compute_bytes();
  if (decode_ws_->B != rows) {  // fewer sequences than rows: a workspace of `rows`, in place
    const ActivationTraits tr =
        activation_traits(k, c, rows, 1, WorkspaceUse::decode, options_.max_seq);
    TD_CHECK(activation_bytes(c, rows, 1, tr) <= sz.decode_ws,
             "internal: decode workspace of {} rows", rows);
    device_.stream_sync(*stream_);
    decode_ws_ = std::make_unique<Workspace>(c, rows, 1, tr, ws_mem_->get());
    decode_ws_->cache = &cache_;
  }
  Workspace& dws = *decode_ws_;

  std::vector<int32_t> pos(static_cast<size_t>(rows)), slots(static_cast<size_t>(rows));
  for (int b = 0; b < B; ++b) {
    pos[static_cast<size_t>(b)] = static_cast<int32_t>(prompts[static_cast<size_t>(lo + b)].size());
    slots[static_cast<size_t>(b)] = b;
  }
  if (stand_in) {
    pos[0] = 1;
    slots[0] = spare;
  }

  // Prefill: chunks of prompts of one length, each at most prefill_tokens rows and fitting
  // the planned workspace. Under fsdp every rank runs as many chunks as the rank with the
  // most (it can work that out alone: every rank has every prompt), a rank with fewer
  // filling in with one-token stand-ins in the spare slot.
  device_.stream_sync(*stream_);
  upload_i32(dws.positions, pos);
  upload_i32(dws.slots, slots);
  auto per = [&](int T) { return prompts_per_chunk(k, c, options_, sz.prefill_ws, T); };
  std::vector<std::vector<int>> chunks = chunks_of(prompts, lo, hi, per);
  if (lockstep) {
    size_t most = 0;
    for (int q = 0; q < world_; ++q) {
      const auto [a, b] = seq_range(n, q, world_);
      most = std::max(most, chunks_of(prompts, a, b, per).size());
    }
    while (chunks.size() < most) chunks.push_back({});  // a stand-in chunk
  }
  size_t prefill_ws_offset = 0;
  const Program prefill =
      prefill_program(model_, options_, world_, cb, sz, static_cast<int>(chunks.size()), rank_, 1,
                      arena_bytes_, &prefill_ws_offset);
  size_t chunk = 0;
  std::unique_ptr<Workspace> pws;
  auto is_prefill_ws = [&](const Op& op) {
    return prefill.buffers[static_cast<size_t>(op.writes.at(0))].name == "prefill-workspace";
  };
  timing_step_ = timed(0) ? 0 : -1;
  replay(prefill, [&](const Op& op) {
    if (op.kind == OpKind::forward && op.unit == 0 && is_prefill_ws(op)) {
      // A new chunk: its workspace and inputs (the stream drains first: the previous
      // chunk's blocks still read their positions and slots).
      const std::vector<int>& seqs = chunks[chunk];
      const int Bc = seqs.empty() ? 1 : static_cast<int>(seqs.size());
      const int T =
          seqs.empty() ? 1 : static_cast<int>(prompts[static_cast<size_t>(lo + seqs[0])].size());
      const ActivationTraits tr =
          activation_traits(k, c, Bc, T, WorkspaceUse::prefill, options_.max_seq);
      TD_CHECK(activation_bytes(c, Bc, T, tr) <= sz.prefill_ws,
               "internal: a prefill chunk of {} x {} exceeds its workspace", Bc, T);
      device_.stream_sync(*stream_);
      pws =
          std::make_unique<Workspace>(c, Bc, T, tr, static_cast<char*>(arena_) + prefill_ws_offset);
      pws->cache = &cache_;
      std::vector<int32_t> tok, ppos, pslot;
      if (seqs.empty()) {
        tok = {0};
        ppos = {0};
        pslot = {spare};
      }
      for (int b : seqs)
        for (int t = 0; t < T; ++t) {
          tok.push_back(prompts[static_cast<size_t>(lo + b)][static_cast<size_t>(t)]);
          ppos.push_back(t);
          pslot.push_back(b);
        }
      upload_i32(pws->tokens, tok);
      upload_i32(pws->positions, ppos);
      upload_i32(pws->slots, pslot);
    }
    Workspace* ws = op.kind == OpKind::last_rows || is_prefill_ws(op) ? pws.get() : &dws;
    if (op.kind == OpKind::tp_reduce) return tp_reduce(op, *ws);
    if (op.kind == OpKind::sample) return sample(dws, rows, sp);
    // The rows of this chunk that become decode rows (a stand-in chunk's only on a rank
    // whose one row is the stand-in).
    std::vector<std::pair<int, int>> moves;  // (decode row, chunk row)
    if (op.kind == OpKind::last_rows) {
      const std::vector<int>& seqs = chunks[chunk];
      for (size_t i = 0; i < seqs.size(); ++i) moves.emplace_back(seqs[i], static_cast<int>(i));
      if (seqs.empty() && stand_in) moves.emplace_back(0, 0);
      ++chunk;
    }
    const UnitParams params = op.kind == OpKind::forward ? op_params(prefill, op) : UnitParams{};
    device_.submit(*stream_, [&, ws, op, params, moves] {
      k.set_scratch(ws->scratch, ws->scratch_bytes);
      if (op.kind == OpKind::forward) {
        unit_forward_part(k, model_, op.unit, params, *ws, static_cast<BlockPart>(op.part));
        return;
      }
      TD_CHECK(op.kind == OpKind::last_rows, "internal: a prefill program holds a {} op",
               op_kind_name(op.kind));
      const int T = ws->T;
      for (auto [row, from] : moves)
        k.copy_rows(
            static_cast<char*>(dws.residual.back()) + static_cast<size_t>(row) * c.d_model * cb,
            static_cast<const char*>(ws->residual.back()) +
                (static_cast<size_t>(from) * static_cast<size_t>(T) + static_cast<size_t>(T - 1)) *
                    c.d_model * cb,
            1, c.d_model, 0);
    });
  });

  // The loop: read the tokens, hand them out, decode the next step.
  std::vector<int32_t> tokens(static_cast<size_t>(rows));
  std::vector<bool> live(static_cast<size_t>(B), true);
  int live_count = B;
  // Hands out the tokens now in `tokens`.
  auto take_tokens = [&] {
    for (int b = 0; b < B; ++b) {
      if (!live[static_cast<size_t>(b)]) continue;
      const int s = lo + b;
      const int32_t t = tokens[static_cast<size_t>(b)];
      const bool eos = !r.ignore_eos && std::find(r.eos.begin(), r.eos.end(), t) != r.eos.end();
      out.ids[static_cast<size_t>(s)].push_back(t);
      ++out.decode_tokens;
      bool keep = true;
      if (r.on_token) keep = r.on_token(s, t);
      if (eos || !keep || static_cast<int>(out.ids[static_cast<size_t>(s)].size()) >= r.tokens) {
        live[static_cast<size_t>(b)] = false;
        --live_count;
        if (eos)
          out.finish[static_cast<size_t>(s)] = "eos";
        else if (!keep)
          out.finish[static_cast<size_t>(s)] = "stop";
      }
    }
  };
  auto read_tokens = [&] {
    device_.stream_sync(*stream_);
    device_.copy_to_host(tokens.data(), dws.tokens, tokens.size() * sizeof(int32_t));
    take_tokens();
  };
  // Teacher forcing: the next step's input is the forced token, not the drawn one.
  int64_t step_index = 0;
  auto force = [&] {
    if (r.forced.empty()) return;
    std::vector<int32_t> in(tokens);
    for (int b = 0; b < B; ++b) {
      const auto& f = r.forced[static_cast<size_t>(lo + b)];
      if (step_index < static_cast<int64_t>(f.size()))
        in[static_cast<size_t>(b)] = f[static_cast<size_t>(step_index)];
    }
    upload_i32(dws.tokens, in);
    ++step_index;
  };
  auto anyone_live = [&] { return lockstep ? live_everywhere(live_count) > 0 : live_count > 0; };
  read_tokens();
  force();
  out.prefill_ms = ms_since(t0);
  out.time_to_first_token_ms = out.prefill_ms;
  out.decode_tokens = 0;  // counts decode-step tokens from here on
  const Clock::time_point t1 = Clock::now();
  // One decode step's work on the compute stream, op by op.
  auto body = [&](const Op& op, const UnitParams& params) {
    switch (op.kind) {
      case OpKind::forward:
        unit_forward_part(k, model_, op.unit, params, dws, static_cast<BlockPart>(op.part));
        break;
      case OpKind::advance:
        k.advance_positions(dws.positions, rows);
        break;
      case OpKind::sample:
        k.sample_tokens(dws.tokens, dws.logits, dws.positions, rows, c.vocab, c.vocab_padded, sp);
        break;
      default:
        TD_THROW("internal: a decode step holds a {} op", op_kind_name(op.kind));
    }
  };
  // A graph holds a step without communication (the one-replica layouts).
  bool communicates = false;
  for (const Op& op : decode_program_.ops)
    communicates = communicates || op.kind == OpKind::gather || op.kind == OpKind::tp_reduce;
  communicates = communicates || tp_comm_ != nullptr;
  const bool graphs = options_.graphs && device_.supports_graphs() && !communicates;
  graph_.reset();  // sampling parameters are captured with the graph
  // Enqueues decode step `step` (from 1).
  auto issue_step = [&](int64_t step) {
    timing_step_ = timed(step) ? step : -1;
    if (graphs && timing_step_ < 0) {
      device_.submit(*stream_, [&] {
        k.set_scratch(dws.scratch, dws.scratch_bytes);
        if (!graph_) {
          device_.capture_begin(*stream_);
          try {
            for (size_t i = 0; i < decode_program_.ops.size(); ++i)
              body(decode_program_.ops[i], decode_params_[i]);
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
    } else {
      replay(decode_program_, [&](const Op& op) {
        if (op.kind == OpKind::tp_reduce) return tp_reduce(op, dws);
        if (op.kind == OpKind::sample) return sample(dws, rows, sp);
        const UnitParams* params =
            &decode_params_[static_cast<size_t>(&op - decode_program_.ops.data())];
        device_.submit(*stream_, [&, op, params] {
          k.set_scratch(dws.scratch, dws.scratch_bytes);
          body(op, *params);
        });
      });
    }
  };
  // [Run-ahead] One device, nothing forced: step s + 1 is enqueued before the host reads
  // step s's tokens, so the device goes from one step to the next without waiting for the
  // host. Each step's tokens are copied, on the stream, into slot s % 2 of dws.drawn (the
  // next step overwrites dws.tokens) with an event after the copy; the host reads slot s % 2
  // once that event completes, then enqueues step s + 2 into the same slot. No step past
  // the last one a sequence could need is enqueued (r.tokens new tokens each, the first from
  // the prefill); when every sequence stops early (EOS, a stop), the one step enqueued ahead
  // is drained and its tokens dropped. The tokens are those of the step-by-step loop.
  const bool ahead = options_.run_ahead && r.forced.empty() && !lockstep && !communicates;
  if (ahead) {
    while (drawn_.size() < 2) drawn_.push_back(device_.event_create(false));
    struct Ahead {  // last_logits() refuses while the steps run ahead
      bool& on;
      explicit Ahead(bool& b) : on(b) { on = true; }
      ~Ahead() { on = false; }
    } in_ahead{ahead_now_};
    const int64_t last = static_cast<int64_t>(r.tokens) - 1;  // decode steps at most
    int64_t issued = 0;
    const size_t bytes = static_cast<size_t>(rows) * sizeof(int32_t);
    while (anyone_live()) {
      while (issued < last && issued - out.decode_steps < 2) {
        issue_step(issued + 1);
        const size_t slot = static_cast<size_t>(issued % 2);
        device_.copy_async(dws.drawn + slot * static_cast<size_t>(rows), dws.tokens, bytes,
                           *stream_);
        device_.event_record(*drawn_[slot], *stream_);
        ++issued;
      }
      TD_CHECK(issued > out.decode_steps, "internal: a live sequence after step {} of {}",
               out.decode_steps, last);
      const size_t slot = static_cast<size_t>(out.decode_steps % 2);
      device_.event_wait(*drawn_[slot]);
      device_.copy_to_host(tokens.data(), dws.drawn + slot * static_cast<size_t>(rows), bytes);
      ++out.decode_steps;
      take_tokens();
    }
    out.decode_ms = ms_since(t1);
    ran_past_ = issued > out.decode_steps;
    device_.stream_sync(*stream_);  // a step enqueued ahead that no sequence needed
  } else {
    while (anyone_live()) {
      issue_step(out.decode_steps + 1);
      ++out.decode_steps;
      read_tokens();
      force();
    }
    out.decode_ms = ms_since(t1);
  }
  timing_end();
  if (split) exchange(out, lo, hi, n);
  return out;
}

}  // namespace tandem
