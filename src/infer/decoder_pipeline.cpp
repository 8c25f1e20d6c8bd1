// The pipeline layout's generation loop ("Pipeline" in docs/design.md): each rank runs its
// stage of the prefill and decode programs over every micro-batch; activations move between
// neighbouring stages on the pipeline stream; the last stage's tokens go to the first on the
// host, where the first stage keeps the results and decides, per micro-batch and step,
// whether the micro-batch goes on, telling the stages after it in turn.
#include <fmt/format.h>

#include <deque>

#include "core/error.h"
#include "infer/decoder.h"
#include "infer/decoder_internal.h"
#include "model/compose.h"

namespace tandem {

using namespace decoder_detail;

GenerateResult Decoder::generate_pipeline(const GenerateRequest& r, const SamplingParams& sp,
                                          Clock::time_point t0) {
  const ModelConfig& c = model_.config();
  Kernels& k = *kernels_;
  const size_t cb = k.compute_bytes();
  const std::vector<std::vector<int32_t>>& prompts = r.prompts;
  const int n = static_cast<int>(prompts.size());
  const int W = world_, s = rank_;
  const bool first = s == 0, last = s == W - 1;
  const int M = std::min(n, micro_max_);
  GenerateResult out;
  out.ids.assign(static_cast<size_t>(n), {});
  out.finish.assign(static_cast<size_t>(n), "length");
  if (first)
    for (const auto& p : prompts) out.prompt_tokens += static_cast<int64_t>(p.size());

  // The micro-batches: contiguous sequence ranges, each in a workspace of its own.
  const Sizes sz = sizes(k, c, options_, share_);
  std::vector<int> lo(static_cast<size_t>(M)), hi(static_cast<size_t>(M)),
      micro_of(static_cast<size_t>(n));
  device_.stream_sync(*stream_);
  device_.stream_sync(*gather_stream_);
  mb_ws_.clear();
  for (int m = 0; m < M; ++m) {
    const auto range = seq_range(n, m, M);
    lo[static_cast<size_t>(m)] = range.first;
    hi[static_cast<size_t>(m)] = range.second;
    const int rows = range.second - range.first;
    const ActivationTraits tr =
        activation_traits(k, c, rows, 1, WorkspaceUse::decode, options_.max_seq);
    TD_CHECK(activation_bytes(c, rows, 1, tr) <= sz.decode_ws,
             "internal: a micro-batch workspace of {} rows", rows);
    mb_ws_.push_back(std::make_unique<Workspace>(
        c, rows, 1, tr, ws_mem_->as<char>() + static_cast<size_t>(m) * align256(sz.decode_ws)));
    mb_ws_.back()->cache = &cache_;
    std::vector<int32_t> pos, slots;
    for (int b = range.first; b < range.second; ++b) {
      pos.push_back(static_cast<int32_t>(prompts[static_cast<size_t>(b)].size()));
      slots.push_back(b);
      micro_of[static_cast<size_t>(b)] = m;
    }
    upload_i32(mb_ws_.back()->positions, pos);
    upload_i32(mb_ws_.back()->slots, slots);
  }
  while (mb_done_.size() < static_cast<size_t>(M)) {
    mb_done_.push_back(device_.event_create(false));
    pipe_done_.push_back(device_.event_create(false));
  }
  std::vector<bool> recorded(static_cast<size_t>(M), false);

  // What moves between stages: the residual rows entering the stage's first block, and those
  // leaving its last one.
  const size_t in_res = static_cast<size_t>(std::max(0, stage_first() - 1));
  const size_t out_res = static_cast<size_t>(stage_end() - 1);
  std::unique_ptr<Workspace> pws;  // the current prefill chunk's
  auto ws_of = [&](const Op& op) -> Workspace& {
    return op.micro >= 0 ? *mb_ws_[static_cast<size_t>(op.micro)] : *pws;
  };

  // Prefill: every stage knows every prompt, so all agree on the chunks.
  auto per = [&](int T) { return prompts_per_chunk(k, c, options_, sz.prefill_ws, T); };
  const std::vector<std::vector<int>> chunks = chunks_of(prompts, 0, n, per);
  size_t prefill_ws_offset = 0;
  const Program prefill =
      prefill_program(model_, options_, W, cb, sz, static_cast<int>(chunks.size()), s, M,
                      arena_bytes_, &prefill_ws_offset);
  int chunk = -1;
  // A chunk starts at its receive (or, on the first stage, its embedding): both streams drain,
  // since the chunk's workspace takes the previous one's bytes.
  auto begin_chunk = [&] {
    ++chunk;
    const std::vector<int>& seqs = chunks[static_cast<size_t>(chunk)];
    const int Bc = static_cast<int>(seqs.size());
    const int T = static_cast<int>(prompts[static_cast<size_t>(seqs[0])].size());
    const ActivationTraits tr =
        activation_traits(k, c, Bc, T, WorkspaceUse::prefill, options_.max_seq);
    TD_CHECK(activation_bytes(c, Bc, T, tr) <= sz.prefill_ws,
             "internal: a prefill chunk of {} x {} exceeds its workspace", Bc, T);
    device_.stream_sync(*stream_);
    device_.stream_sync(*gather_stream_);
    pws = std::make_unique<Workspace>(c, Bc, T, tr, static_cast<char*>(arena_) + prefill_ws_offset);
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
  };
  auto transfer = [&](const Op& op, Stream& st) {
    if (op.kind == OpKind::recv && op.micro < 0) begin_chunk();
    Workspace& ws = ws_of(op);
    const size_t count = static_cast<size_t>(ws.B) * static_cast<size_t>(ws.T) * c.d_model;
    const std::string label = op.micro >= 0 ? fmt::format("activations of micro-batch {}", op.micro)
                                            : fmt::format("prefill chunk {}", chunk);
    if (op.kind == OpKind::recv)
      pipe_comm_->recv(st, ws.residual.at(in_res), count, k.compute_dtype(), s - 1, label);
    else
      pipe_comm_->send(st, ws.residual.at(out_res), count, k.compute_dtype(), s + 1, label);
  };
  // One compute op of the program being replayed.
  const Program* replaying = &prefill;
  auto run = [&](const Op& op) {
    if (op.kind == OpKind::forward && op.micro < 0 && op.unit == 0) begin_chunk();
    Workspace& ws = ws_of(op);
    if (op.kind == OpKind::sample) {
      SamplingParams mine = sp;
      mine.row_offset = lo[static_cast<size_t>(op.micro)];
      sample(ws, ws.B, mine);
      return;
    }
    std::vector<std::pair<Workspace*, std::pair<int, int>>> moves;  // (to, (row, chunk row))
    if (op.kind == OpKind::last_rows) {
      const std::vector<int>& seqs = chunks[static_cast<size_t>(chunk)];
      for (size_t i = 0; i < seqs.size(); ++i) {
        const int b = seqs[i], m = micro_of[static_cast<size_t>(b)];
        moves.push_back({mb_ws_[static_cast<size_t>(m)].get(),
                         {b - lo[static_cast<size_t>(m)], static_cast<int>(i)}});
      }
    }
    const UnitParams params = op.kind == OpKind::forward ? op_params(*replaying, op) : UnitParams{};
    Workspace* w = &ws;
    device_.submit(*stream_, [&, w, op, params, moves] {
      k.set_scratch(w->scratch, w->scratch_bytes);
      switch (op.kind) {
        case OpKind::forward:
          unit_forward_part(k, model_, op.unit, params, *w, BlockPart::whole);
          return;
        case OpKind::advance:
          k.advance_positions(w->positions, w->B);
          return;
        case OpKind::last_rows:
          for (const auto& [to, rows] : moves)
            k.copy_rows(static_cast<char*>(to->residual.back()) +
                            static_cast<size_t>(rows.first) * c.d_model * cb,
                        static_cast<const char*>(w->residual.back()) +
                            (static_cast<size_t>(rows.second) * static_cast<size_t>(w->T) +
                             static_cast<size_t>(w->T - 1)) *
                                c.d_model * cb,
                        1, c.d_model, 0);
          return;
        default:
          TD_THROW("internal: a pipeline program holds a {} op", op_kind_name(op.kind));
      }
    });
  };

  // The decode program for this request's micro-batches, and each one's ops.
  decode_program_ =
      program_build_inference(model_, spec_of(InferPhase::decode, options_, W, cb, sz, 1, s, M));
  std::vector<size_t> op_begin(static_cast<size_t>(M) + 1, decode_program_.ops.size());
  for (size_t i = decode_program_.ops.size(); i-- > 0;)
    op_begin[static_cast<size_t>(decode_program_.ops[i].micro)] = i;
  for (int m = M - 1; m >= 0; --m)
    op_begin[static_cast<size_t>(m)] =
        std::min(op_begin[static_cast<size_t>(m)], op_begin[static_cast<size_t>(m) + 1]);

  timing_step_ = timed(0) ? 0 : -1;
  replay(prefill, run, transfer);
  timing_step_ = -1;
  for (int m = 0; m < M; ++m) {
    device_.event_record(*mb_done_[static_cast<size_t>(m)], *stream_);
    device_.event_record(*pipe_done_[static_cast<size_t>(m)], *gather_stream_);
    recorded[static_cast<size_t>(m)] = true;
  }

  // Host messages. The last stage sends each micro-batch's tokens to the first; the first
  // sends each micro-batch's go-ahead along the stages. Their buffers live until the end
  // (a send completes on its stream, after the host has moved on).
  std::deque<std::vector<float>> sent;
  auto send_host = [&](Communicator& comm, Stream& st, std::vector<float> v, int peer,
                       const char* what) {
    sent.push_back(std::move(v));
    comm.send(st, sent.back().data(), sent.back().size(), DType::f32, peer, what);
  };
  auto recv_host = [&](Communicator& comm, Stream& st, size_t count, int peer, const char* what) {
    std::vector<float> v(count);
    comm.recv(st, v.data(), count, DType::f32, peer, what);
    comms_.control_device->stream_sync(st);
    return v;
  };
  std::vector<int32_t> tokens;
  auto finish_tokens = [&](int m) {  // last stage: micro-batch m's draws to the first stage
    device_.event_wait(*mb_done_[static_cast<size_t>(m)]);
    Workspace& ws = *mb_ws_[static_cast<size_t>(m)];
    tokens.resize(static_cast<size_t>(ws.B));
    device_.copy_to_host(tokens.data(), ws.tokens, tokens.size() * sizeof(int32_t));
    send_host(*tokens_comm_, *tokens_stream_, std::vector<float>(tokens.begin(), tokens.end()), 0,
              "tokens");
  };
  if (last)
    for (int m = 0; m < M; ++m) finish_tokens(m);
  replaying = &decode_program_;

  // The first stage's bookkeeping of micro-batch m's new tokens; false once all its
  // sequences have ended.
  std::vector<bool> live(static_cast<size_t>(n), true);
  auto take = [&](int m, const std::vector<float>& got) {
    bool any = false;
    for (int b = lo[static_cast<size_t>(m)]; b < hi[static_cast<size_t>(m)]; ++b) {
      if (!live[static_cast<size_t>(b)]) continue;
      const int32_t t =
          static_cast<int32_t>(got[static_cast<size_t>(b - lo[static_cast<size_t>(m)])]);
      const bool eos = !r.ignore_eos && std::find(r.eos.begin(), r.eos.end(), t) != r.eos.end();
      auto& ids = out.ids[static_cast<size_t>(b)];
      ids.push_back(t);
      ++out.decode_tokens;
      const bool keep = r.on_token ? r.on_token(b, t) : true;
      if (eos || !keep || static_cast<int>(ids.size()) >= r.tokens) {
        live[static_cast<size_t>(b)] = false;
        if (eos)
          out.finish[static_cast<size_t>(b)] = "eos";
        else if (!keep)
          out.finish[static_cast<size_t>(b)] = "stop";
      }
      any = any || live[static_cast<size_t>(b)];
    }
    return any;
  };

  std::vector<bool> going(static_cast<size_t>(M), true);
  std::vector<int32_t> input;
  std::deque<int> pending;  // last stage: micro-batches issued, tokens not yet sent
  int first_tokens = 0;     // micro-batches whose first tokens the first stage has
  Clock::time_point t1 = Clock::now();
  for (int64_t step = 1;; ++step) {
    bool issued = false;
    for (int m = 0; m < M; ++m) {
      if (!going[static_cast<size_t>(m)]) continue;
      bool go = false;
      if (first) {
        const std::vector<float> got =
            recv_host(*tokens_comm_, *tokens_stream_,
                      static_cast<size_t>(hi[static_cast<size_t>(m)] - lo[static_cast<size_t>(m)]),
                      W - 1, "tokens");
        go = take(m, got);
        if (step == 1 && ++first_tokens == M) {
          out.prefill_ms = ms_since(t0);
          out.time_to_first_token_ms = out.prefill_ms;
          out.decode_tokens = 0;  // counts decode-step tokens from here on
          t1 = Clock::now();
        }
        send_host(*flags_comm_, *flags_stream_, {go ? 1.0f : 0.0f}, 1, "go-ahead");
        // The next step's input: the drawn tokens, or the forced ones.
        input.clear();
        for (int b = lo[static_cast<size_t>(m)]; b < hi[static_cast<size_t>(m)]; ++b) {
          const auto& ids = out.ids[static_cast<size_t>(b)];
          int32_t t = ids.empty() ? 0 : ids.back();
          if (!r.forced.empty() &&
              step - 1 < static_cast<int64_t>(r.forced[static_cast<size_t>(b)].size()))
            t = r.forced[static_cast<size_t>(b)][static_cast<size_t>(step - 1)];
          input.push_back(t);
        }
      } else {
        go = recv_host(*flags_comm_, *flags_stream_, 1, s - 1, "go-ahead")[0] != 0;
        if (s + 1 < W)
          send_host(*flags_comm_, *flags_stream_, {go ? 1.0f : 0.0f}, s + 1, "go-ahead");
      }
      if (!go) {
        going[static_cast<size_t>(m)] = false;
        continue;
      }
      // Micro-batch m's step, after its previous step's compute and transfers.
      Workspace& ws = *mb_ws_[static_cast<size_t>(m)];
      if (first) {
        device_.event_wait(*mb_done_[static_cast<size_t>(m)]);
        upload_i32(ws.tokens, input);
      }
      if (recorded[static_cast<size_t>(m)]) {
        device_.stream_wait(*stream_, *pipe_done_[static_cast<size_t>(m)]);
        device_.stream_wait(*gather_stream_, *mb_done_[static_cast<size_t>(m)]);
      }
      timing_step_ = timed(step) ? step : -1;
      replay(decode_program_, run, transfer, op_begin[static_cast<size_t>(m)],
             op_begin[static_cast<size_t>(m) + 1]);
      timing_step_ = -1;
      device_.event_record(*mb_done_[static_cast<size_t>(m)], *stream_);
      device_.event_record(*pipe_done_[static_cast<size_t>(m)], *gather_stream_);
      recorded[static_cast<size_t>(m)] = true;
      issued = true;
      if (last) {
        pending.push_back(m);
        if (pending.size() > 1) {
          finish_tokens(pending.front());
          pending.pop_front();
        }
      }
    }
    while (!pending.empty()) {
      finish_tokens(pending.front());
      pending.pop_front();
    }
    if (!issued) break;
    ++out.decode_steps;
  }
  // The first stage's times are the run's (the others start their clocks before the first
  // tokens exist).
  out.decode_ms = first ? ms_since(t1) : 0;
  device_.stream_sync(*stream_);
  device_.stream_sync(*gather_stream_);
  comms_.control_device->stream_sync(*tokens_stream_);
  comms_.control_device->stream_sync(*flags_stream_);
  timing_end();
  exchange(out, 0, first ? n : 0, n);
  return out;
}

}  // namespace tandem
