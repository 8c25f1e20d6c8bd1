// The CPU executor of the step program: fp32 shards, gathered parameters and gradients in
// host memory, the units' forward and backward from model/compose.h over the CPU kernel
// table, each op's work a closure run by its stream's worker thread.
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

#include "core/error.h"
#include "core/fault.h"
#include "device/cpu/kernel_table.h"
#include "device/cpu/kernels.h"
#include "model/compose.h"
#include "shard/engine.h"
#include "shard/engine_exec.h"

namespace tandem {

namespace {

class CpuExec final : public EngineExec {
 public:
  explicit CpuExec(const EngineParts& parts)
      : p_(parts),
        kernels_(cpu_kernels()),
        fresh_(fresh_grads_by_op(p_.model, p_.program, p_.config.fresh_gradients)) {
    const ModelLayout& model = p_.model;
    ActivationTraits traits =
        activation_traits(*kernels_, model.config(), p_.config.batch, p_.config.seq);
    traits.recompute = p_.config.recompute;
    traits.recompute_blocks = p_.config.recompute_blocks;
    traits.loss_chunk = p_.config.loss_chunk;
    for (const Buffer& b : p_.program.buffers)
      if (b.kind == BufferKind::activations)
        ws_ = std::make_unique<Workspace>(model.config(), p_.config.batch, p_.config.seq, traits,
                                          p_.arena.at(b.offset));
    TD_CHECK(ws_ != nullptr, "the step program has no activation buffer");
    kernels_->set_scratch(ws_->scratch, ws_->scratch_bytes);
    for (int u = 0; u < model.num_units(); ++u) {
      const int64_t n = p_.flat.unit(u).shard, begin = p_.flat.shard_begin(u, p_.shard_rank);
      std::vector<float> w(static_cast<size_t>(n));
      model.init_slice(u, p_.config.seed, begin, begin + n, w.data());
      params_.push_back(std::move(w));
      m_.emplace_back(static_cast<size_t>(n), 0.0f);
      v_.emplace_back(static_cast<size_t>(n), 0.0f);
      grads_.emplace_back(static_cast<size_t>(n), 0.0f);
    }
    // The reduce scratch the program's reduces use, and nothing more.
    const ReduceScratch rs = reduce_scratch(p_.flat, p_.program);
    reduce_tmp_.assign(static_cast<size_t>(rs.f32_shard), 0.0f);
    full16_.assign(static_cast<size_t>(rs.bf16_unit), 0);
    shard16_.assign(static_cast<size_t>(rs.bf16_shard), 0);
  }

  void begin_step(int64_t, const StepBatch&) override { loss_sum_ = 0; }
  void set_optimizer_step(int64_t step) override { optimizer_step_ = step; }

  void run_op(const Op& op, int64_t step, const StepBatch& batch) override;

  void end_step(double& loss_total, double& norm_sq) override {
    // Each rank's sum of token losses, gathered and added in rank order so every rank (and
    // every world size) computes the mean the same way.
    std::vector<double> sums(static_cast<size_t>(p_.world.size()));
    p_.world.all_gather(p_.reduce, &loss_sum_, sums.data(), 2, DType::f32, "loss");
    p_.device.stream_sync(p_.reduce);
    loss_total = 0;
    for (double x : sums) loss_total += x;
    norm_sq = static_cast<double>(norm_sq_);
  }

  ShardState shards() const override { return ShardState{params_, m_, v_}; }
  std::vector<std::vector<float>> grad_shards() const override { return grads_; }

  void set_shards(const ShardState& st) override {
    TD_CHECK(
        st.params.size() == params_.size() && st.m.size() == m_.size() && st.v.size() == v_.size(),
        "shard state has {} units, the model {}", st.params.size(), params_.size());
    for (size_t u = 0; u < params_.size(); ++u)
      TD_CHECK(st.params[u].size() == params_[u].size() && st.m[u].size() == m_[u].size() &&
                   st.v[u].size() == v_[u].size(),
               "shard of unit {} has {} elements, expected {}", u, st.params[u].size(),
               params_[u].size());
    params_ = st.params;
    m_ = st.m;
    v_ = st.v;
  }

  std::vector<std::vector<float>> gather_params() override {
    std::vector<std::vector<float>> out;
    for (int u = 0; u < p_.model.num_units(); ++u) {
      const UnitShards& us = p_.flat.unit(u);
      std::vector<float> full(static_cast<size_t>(us.padded));
      p_.gather_comm.all_gather(p_.gather, params_[static_cast<size_t>(u)].data(), full.data(),
                                static_cast<size_t>(us.shard), DType::f32, p_.model.unit(u).name);
      p_.device.stream_sync(p_.gather);
      full.resize(static_cast<size_t>(us.numel));
      out.push_back(std::move(full));
    }
    return out;
  }

  uint64_t extra_bytes() const override { return reduce_scratch(p_.flat, p_.program).bytes(); }

 private:
  void reduce(const Op& op);
  void reduce_bf16(const float* send, size_t u, bool first, const std::string& label);
  void replicate_reduce_bf16(size_t u, const std::string& label);
  // An arena buffer, or a unit's gradient shard ([Gradients in the shard]).
  float* buffer(int id) {
    const Buffer& b = p_.program.buffers[static_cast<size_t>(id)];
    if (b.kind == BufferKind::grad_shard) return grads_[static_cast<size_t>(b.unit)].data();
    return static_cast<float*>(p_.arena.at(b.offset));
  }

  // AdamW of step `step` on unit u's shard, with the global norm of that step's gradients.
  // [Non-finite steps] A NaN or Inf anywhere in the gradients makes the norm non-finite; the
  // update is skipped then, so parameters and moments stay as they were and the trainer
  // decides whether to stop or go on.
  void update_unit(int u, int64_t step) {
    if (!std::isfinite(norm_sq_)) return;
    const EngineConfig& config = p_.config;
    const float scale = clip_scale(config.optim, std::sqrt(static_cast<double>(norm_sq_)));
    const float lr = lr_at(config.optim, static_cast<int>(step), config.total_steps);
    const size_t k = static_cast<size_t>(u);
    const int64_t begin = p_.flat.shard_begin(u, p_.shard_rank);
    adamw_unit_range(config.optim, p_.model.unit(u), begin,
                     begin + static_cast<int64_t>(params_[k].size()), params_[k].data(),
                     grads_[k].data(), m_[k].data(), v_[k].data(), lr, static_cast<int>(step) + 1,
                     scale);
  }

  EngineParts p_;
  std::unique_ptr<Kernels> kernels_;
  std::vector<FreshGrads> fresh_;  // by op index ([Fresh gradients])
  std::unique_ptr<Workspace> ws_;
  std::vector<std::vector<float>> params_, m_, v_, grads_;
  // Reduce-stream scratch ([Reduce dtype] in shard/engine_exec.h). f32: one unit's
  // gradient shard. bf16: a unit's unsharded gradient and its shard, as bf16 bits.
  std::vector<float> reduce_tmp_;  // [largest shard] (f32)
  std::vector<uint16_t> full16_;   // [largest padded unit] (bf16)
  std::vector<uint16_t> shard16_;  // [largest shard] (bf16)
  float norm_sq_ = 0;              // grad-norm op -> norm-reduce op -> optimizer op
  int64_t optimizer_step_ = -1;    // whose update the optimizer or update ops apply
  double loss_sum_ = 0;            // compute stream only
};

void CpuExec::run_op(const Op& op, int64_t step, const StepBatch& batch) {
  const ModelLayout& model = p_.model;
  const int U = model.num_units();
  const std::string label = op.unit >= 0 ? model.unit(op.unit).name : "step";
  switch (op.kind) {
    case OpKind::zero_grad_shards:
      p_.device.submit(p_.reduce, [this] {
        for (auto& g : grads_) std::fill(g.begin(), g.end(), 0.0f);
      });
      return;
    case OpKind::gather: {
      const size_t u = static_cast<size_t>(op.unit);
      p_.gather_comm.all_gather(p_.gather, params_[u].data(), buffer(op.writes.at(0)),
                                params_[u].size(), DType::f32, label);
      return;
    }
    case OpKind::forward:
    case OpKind::backward: {
      UnitParams params(static_cast<size_t>(U), nullptr);
      UnitGrads grads(static_cast<size_t>(U), nullptr);
      for (const UnitBuffer& ub : op.params)
        params[static_cast<size_t>(ub.unit)] = buffer(ub.buffer);
      for (const UnitBuffer& ub : op.grads) grads[static_cast<size_t>(ub.unit)] = buffer(ub.buffer);
      // [Fresh gradients] The composition fills the units' elements; the rest is cleared.
      const FreshGrads* fresh = &fresh_[op_index(p_.program, op)];
      const bool forward = op.kind == OpKind::forward;
      const int u = op.unit, micro = op.micro;
      // This micro-step's token ids in the caller's batch (valid until the step ends).
      const size_t n = static_cast<size_t>(ws_->N), at = static_cast<size_t>(micro) * n;
      const int32_t* inputs = batch.inputs + at;
      const int32_t* targets = batch.targets + at;
      p_.device.submit(p_.compute, [this, forward, u, micro, step, params, grads, fresh, n, inputs,
                                    targets] {
        const EngineConfig& c = p_.config;
        if (c.compute_delay_ms > 0)
          std::this_thread::sleep_for(
              std::chrono::duration<double, std::milli>(c.compute_delay_ms));
        if (forward) {
          if (u == 1 && micro == 0) fault_point("step", step + 1);  // 1-based, as reported
          if (u == 0) {
            std::memcpy(ws_->tokens, inputs, n * sizeof(int32_t));
            std::memcpy(ws_->targets, targets, n * sizeof(int32_t));
          }
          unit_forward(*kernels_, p_.model, u, params, *ws_);
          return;
        }
        for (const FreshGrads::Span& span : fresh->clear)
          std::memset(reinterpret_cast<char*>(buffer(span.buffer)) + span.offset, 0, span.bytes);
        const float dloss = 1.0f / (static_cast<float>(c.global_batch) * c.seq);
        unit_backward(*kernels_, p_.model, u, params, grads, *ws_, dloss, fresh->units);
        if (p_.model.unit(u).kind == UnitKind::head)
          for (int t = 0; t < ws_->N; ++t) loss_sum_ += ws_->losses[t];
      });
      return;
    }
    case OpKind::reduce:
      reduce(op);
      return;
    case OpKind::replicate_reduce: {
      if (p_.config.reduce_dtype == DType::bf16) {
        replicate_reduce_bf16(static_cast<size_t>(op.unit), label);
        return;
      }
      float* g = grads_[static_cast<size_t>(op.unit)].data();
      p_.replicate.all_reduce(p_.reduce, g, g, grads_[static_cast<size_t>(op.unit)].size(),
                              DType::f32, label);
      return;
    }
    case OpKind::grad_norm:
      p_.device.submit(p_.compute, [this, step] {
        // A failure test's NaN: into the last unit's gradient shard (core/fault.h).
        if (fault_nan("step", step + 1) && !grads_.back().empty())
          grads_.back()[0] = std::numeric_limits<float>::quiet_NaN();
        double sum = 0;
        for (const auto& g : grads_)
          sum += cpu::sum_squares(g.data(), static_cast<int64_t>(g.size()));
        norm_sq_ = static_cast<float>(sum);
      });
      return;
    case OpKind::norm_reduce:
      p_.reduce_comm.all_reduce(p_.reduce, &norm_sq_, &norm_sq_, 1, DType::f32, "grad-norm");
      return;
    case OpKind::optimizer:
      p_.device.submit(p_.compute, [this, s = optimizer_step_] {
        for (int u = 0; u < p_.model.num_units(); ++u) update_unit(u, s);
      });
      return;
    case OpKind::update:
      // [Update at gather] The last step's update of this unit, before its gather.
      p_.device.submit(p_.gather, [this, u = op.unit, s = optimizer_step_] {
        if (s >= 0) update_unit(u, s);
      });
      return;
    case OpKind::last_rows:
    case OpKind::advance:
    case OpKind::sample:
    case OpKind::tp_reduce:
    case OpKind::send:
    case OpKind::recv:
      TD_THROW("the training engine was given an inference op ({})", op_kind_name(op.kind));
  }
}

// Reduce-scatter of a unit's unsharded gradients into its shard. The first reduce of a
// step writes the shard directly; later micro-steps reduce into scratch and add.
void CpuExec::reduce(const Op& op) {
  const size_t u = static_cast<size_t>(op.unit);
  const Buffer* full = nullptr;
  for (int b : op.reads)
    if (p_.program.buffers[static_cast<size_t>(b)].kind == BufferKind::grad_full)
      full = &p_.program.buffers[static_cast<size_t>(b)];
  TD_CHECK(full != nullptr, "reduce of unit {} without a gradient buffer", op.unit);
  const float* send = static_cast<const float*>(p_.arena.at(full->offset));
  std::vector<float>& shard = grads_[u];
  const bool first = !reduce_adds_to_shard(p_.program, op);
  const std::string& label = p_.model.unit(op.unit).name;
  if (p_.config.reduce_dtype == DType::bf16) {
    reduce_bf16(send, u, first, label);
    return;
  }
  if (first) {
    p_.reduce_comm.reduce_scatter(p_.reduce, send, shard.data(), shard.size(), DType::f32, label);
    return;
  }
  p_.reduce_comm.reduce_scatter(p_.reduce, send, reduce_tmp_.data(), shard.size(), DType::f32,
                                label);
  p_.device.submit(p_.reduce, [this, u] {
    std::vector<float>& g = grads_[u];
    for (size_t i = 0; i < g.size(); ++i) g[i] += reduce_tmp_[i];
  });
}

// [Reduce dtype] The casts run on the reduce stream's worker, in order with the collective
// between them.
void CpuExec::reduce_bf16(const float* send, size_t u, bool first, const std::string& label) {
  const size_t n = grads_[u].size();
  const size_t padded = static_cast<size_t>(p_.flat.unit(static_cast<int>(u)).padded);
  p_.device.submit(p_.reduce, [this, send, padded] {
    for (size_t i = 0; i < padded; ++i) full16_[i] = bf16_from_f32(send[i]);
  });
  p_.reduce_comm.reduce_scatter(p_.reduce, full16_.data(), shard16_.data(), n, DType::bf16, label);
  p_.device.submit(p_.reduce, [this, u, first] {
    std::vector<float>& g = grads_[u];
    if (first) {
      for (size_t i = 0; i < g.size(); ++i) g[i] = bf16_to_f32(shard16_[i]);
    } else {
      for (size_t i = 0; i < g.size(); ++i) g[i] += bf16_to_f32(shard16_[i]);
    }
  });
}

void CpuExec::replicate_reduce_bf16(size_t u, const std::string& label) {
  const size_t n = grads_[u].size();
  p_.device.submit(p_.reduce, [this, u] {
    const std::vector<float>& g = grads_[u];
    for (size_t i = 0; i < g.size(); ++i) shard16_[i] = bf16_from_f32(g[i]);
  });
  p_.replicate.all_reduce(p_.reduce, shard16_.data(), shard16_.data(), n, DType::bf16, label);
  p_.device.submit(p_.reduce, [this, u] {
    std::vector<float>& g = grads_[u];
    for (size_t i = 0; i < g.size(); ++i) g[i] = bf16_to_f32(shard16_[i]);
  });
}

}  // namespace

std::unique_ptr<EngineExec> engine_exec_cpu(const EngineParts& parts) {
  return std::make_unique<CpuExec>(parts);
}

#if !defined(TANDEM_HAVE_CUDA)
std::unique_ptr<EngineExec> engine_exec_cuda(const EngineParts&) {
  TD_THROW("this tandem was built without CUDA (configure with -DTANDEM_CUDA=ON)");
}
size_t engine_activation_bytes_cuda(const ModelConfig&, int, int) {
  TD_THROW("this tandem was built without CUDA (configure with -DTANDEM_CUDA=ON)");
}
#endif

}  // namespace tandem
