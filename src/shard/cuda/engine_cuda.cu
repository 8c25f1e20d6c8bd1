// The CUDA executor of the step program. [CUDA precision]: the rank's shards of fp32
// master parameters, AdamW moments and gradients live in four contiguous device arrays
// (unit after unit, each unit's shard a multiple of 64 elements). A gather casts the unit's
// fp32 shard to bf16 straight into this rank's block of the gathered buffer and all-gathers
// in place, so no bf16 copy of the parameters is kept: gathered parameters are bf16 and the
// forward and backward compute in bf16 with fp32 accumulation. Unsharded gradients are
// fp32 and reduced in fp32, or in bf16 through a scratch on the reduce stream ([Reduce
// dtype] in shard/engine_exec.h).
//
// [CUDA ops] submit() runs each op's closure at once on the host thread (see [CUDA submit]
// in device/cuda/cuda_device.h), so issuing the program only enqueues GPU work; the host
// waits at the step's end alone. What changes from step to step is written by begin_step
// into pinned host buffers that the step's copies read when they run: the token ids of
// micro-step m (a buffer of their own, copied to the device on the compute stream by unit
// 0's forward) and AdamW's learning rate and bias corrections (copied by the optimizer op).
// So the enqueued work is the same every step and a captured step replays with each step's
// values ([Step graph], docs/design.md). The host synchronises at every step's end, so step
// s+1 may rewrite step s's buffers.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/fault.h"
#include "device/cuda/cuda_device.h"
#include "device/cuda/kernel_table.h"
#include "device/cuda/kernels.cuh"
#include "model/compose.h"
#include "shard/engine.h"
#include "shard/engine_exec.h"

namespace tandem {

namespace {

using cuda::bf16;

// Pinned host memory, freed with the object.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes) {
    if (bytes > 0) TD_CUDA_CALL(cudaMallocHost(&ptr_, bytes));
  }
  ~PinnedBuffer() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

class CudaExec final : public EngineExec {
 public:
  explicit CudaExec(const EngineParts& parts);

  void begin_step(int64_t step, const StepBatch& batch) override;
  void set_optimizer_step(int64_t step) override;
  void run_op(const Op& op, int64_t step, const StepBatch& batch) override;
  void end_step(double& loss_total, double& norm_sq) override;

  ShardState shards() const override;
  void set_shards(const ShardState& state) override;
  std::vector<std::vector<float>> gather_params() override;
  std::vector<std::vector<float>> grad_shards() const override;
  uint64_t extra_bytes() const override { return extra_bytes_; }

 private:
  static constexpr size_t kNormOffset = 0;      // float: squared gradient norm
  static constexpr size_t kStepOffset = 128;    // cuda::AdamWStep: this step's AdamW values
  static constexpr size_t kLossOffset = 256;    // double: this rank's loss sum
  static constexpr size_t kLossesOffset = 512;  // double[W]: every rank's loss sum

  int64_t shard_offset(int u) const { return unit_offset_[static_cast<size_t>(u)]; }
  // An arena buffer, or a unit's gradient shard ([Gradients in the shard]).
  void* buffer(int id) const {
    const Buffer& b = p_.program.buffers[static_cast<size_t>(id)];
    if (b.kind == BufferKind::grad_shard) return grads_->as<float>() + shard_offset(b.unit);
    return p_.arena.at(b.offset);
  }
  void reduce(const Op& op);
  void replicate_reduce(const Op& op);

  EngineParts p_;
  std::vector<FreshGrads> fresh_;  // by op index ([Fresh gradients])
  cudaStream_t compute_, gather_, reduce_;
  std::vector<int64_t> unit_offset_;  // each unit's first element in the shard arrays
  int64_t total_ = 0, largest_ = 0;
  std::unique_ptr<DeviceBuffer> params_, m_, v_, grads_, small_;
  // Reduce-stream scratch ([Reduce dtype]). f32: one unit's gradient shard, which later
  // micro-steps reduce into before adding it. bf16: a unit's unsharded gradient and its
  // shard in bf16.
  std::unique_ptr<DeviceBuffer> reduce_tmp_;  // [largest shard] fp32
  std::unique_ptr<DeviceBuffer> full16_;      // [largest padded unit] bf16
  std::unique_ptr<DeviceBuffer> shard16_;     // [largest shard] bf16
  std::unique_ptr<DeviceBuffer> norm_scratch_, chunks_;
  size_t norm_scratch_bytes_ = 0;
  int num_chunks_ = 0;
  std::vector<int> unit_chunks_;  // unit u's chunks are [unit_chunks_[u], unit_chunks_[u + 1])
  std::unique_ptr<cuda::MatmulContext> matmul_;
  std::unique_ptr<Kernels> kernels_;
  std::unique_ptr<Workspace> ws_;
  std::vector<std::unique_ptr<PinnedBuffer>> tokens_;  // per micro-step: inputs then targets
  std::unique_ptr<PinnedBuffer> adamw_step_;           // cuda::AdamWStep
  uint64_t extra_bytes_ = 0;
};

CudaExec::CudaExec(const EngineParts& parts)
    : p_(parts),
      fresh_(fresh_grads_by_op(parts.model, parts.program, parts.config.fresh_gradients)),
      compute_(cuda_stream_of(parts.compute)),
      gather_(cuda_stream_of(parts.gather)),
      reduce_(cuda_stream_of(parts.reduce)) {
  const ModelLayout& model = p_.model;
  const int U = model.num_units();
  for (int u = 0; u < U; ++u) {
    unit_offset_.push_back(total_);
    total_ += p_.flat.unit(u).shard;
    largest_ = std::max(largest_, p_.flat.unit(u).shard);
  }
  Device& d = p_.device;
  const size_t f32 = static_cast<size_t>(total_) * sizeof(float);
  params_ = std::make_unique<DeviceBuffer>(d, f32);
  m_ = std::make_unique<DeviceBuffer>(d, f32);
  v_ = std::make_unique<DeviceBuffer>(d, f32);
  grads_ = std::make_unique<DeviceBuffer>(d, f32);
  // The reduce scratch the program's reduces use, and nothing more.
  const ReduceScratch rs = reduce_scratch(p_.flat, p_.program);
  auto scratch = [&](int64_t n, size_t size) {
    return n > 0 ? std::make_unique<DeviceBuffer>(d, static_cast<size_t>(n) * size) : nullptr;
  };
  reduce_tmp_ = scratch(rs.f32_shard, sizeof(float));
  full16_ = scratch(rs.bf16_unit, sizeof(bf16));
  shard16_ = scratch(rs.bf16_shard, sizeof(bf16));
  const int W = p_.world.size();
  small_ = std::make_unique<DeviceBuffer>(d, kLossesOffset + static_cast<size_t>(W) * 8);
  norm_scratch_bytes_ = cuda::sum_squares_scratch_bytes(total_);
  norm_scratch_ = std::make_unique<DeviceBuffer>(d, norm_scratch_bytes_);

  // AdamW chunks: pieces of at most kAdamWChunk elements inside one parameter's part of
  // this rank's shard, in shard order.
  std::vector<cuda::AdamWChunk> chunks;
  for (int u = 0; u < U; ++u) {
    unit_chunks_.push_back(static_cast<int>(chunks.size()));
    const int64_t begin = p_.flat.shard_begin(u, p_.shard_rank),
                  end = begin + p_.flat.unit(u).shard;
    for (const ParamSpec& ps : model.unit(u).params) {
      const int64_t lo = std::max(begin, ps.offset), hi = std::min(end, ps.offset + ps.numel);
      for (int64_t a = lo; a < hi; a += cuda::kAdamWChunk) {
        cuda::AdamWChunk ch;
        ch.begin = shard_offset(u) + (a - begin);
        ch.n = static_cast<int32_t>(std::min<int64_t>(cuda::kAdamWChunk, hi - a));
        ch.weight_decay = ps.decay ? p_.config.optim.weight_decay : 0.0f;
        chunks.push_back(ch);
      }
    }
  }
  num_chunks_ = static_cast<int>(chunks.size());
  unit_chunks_.push_back(num_chunks_);
  chunks_ = std::make_unique<DeviceBuffer>(d, chunks.size() * sizeof(cuda::AdamWChunk));
  if (!chunks.empty())
    d.copy_to_device(chunks_->as<void>(), chunks.data(), chunks.size() * sizeof(cuda::AdamWChunk));

  // Parameters from the seed, moments zero. Every element depends on its position alone,
  // so pieces of 1 Mi elements are initialised by all host cores at once (a 1.5B-parameter
  // model takes over a minute on one core).
  std::vector<float> host(static_cast<size_t>(total_));
  {
    struct Piece {
      int unit;
      int64_t begin, end;  // within the unit's flat buffer
    };
    std::vector<Piece> pieces;
    for (int u = 0; u < U; ++u) {
      const int64_t begin = p_.flat.shard_begin(u, p_.shard_rank),
                    end = begin + p_.flat.unit(u).shard;
      for (int64_t a = begin; a < end; a += int64_t(1) << 20)
        pieces.push_back({u, a, std::min(end, a + (int64_t(1) << 20))});
    }
    std::atomic<size_t> next{0};
    auto work = [&] {
      for (size_t i; (i = next.fetch_add(1)) < pieces.size();) {
        const Piece& pc = pieces[i];
        const int64_t at =
            shard_offset(pc.unit) + (pc.begin - p_.flat.shard_begin(pc.unit, p_.shard_rank));
        model.init_slice(pc.unit, p_.config.seed, pc.begin, pc.end, host.data() + at);
      }
    };
    const unsigned threads = std::max(1u, std::min(32u, std::thread::hardware_concurrency()));
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
  }
  d.copy_to_device(params_->as<void>(), host.data(), f32);
  for (const auto& zero : {m_.get(), v_.get(), grads_.get()})
    TD_CUDA_CALL(cudaMemsetAsync(zero->as<void>(), 0, f32, compute_));
  TD_CUDA_CALL(cudaStreamSynchronize(compute_));

  matmul_ = std::make_unique<cuda::MatmulContext>();
  kernels_ = cuda::cuda_kernels(p_.config.attention, matmul_.get(), compute_);
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
  const size_t token_bytes = 2 * static_cast<size_t>(ws_->N) * sizeof(int32_t);
  for (int m = 0; m < p_.program.spec.micro_steps; ++m)
    tokens_.push_back(std::make_unique<PinnedBuffer>(token_bytes));
  adamw_step_ = std::make_unique<PinnedBuffer>(sizeof(cuda::AdamWStep));
  extra_bytes_ = rs.bytes() + norm_scratch_bytes_ + chunks.size() * sizeof(cuda::AdamWChunk) +
                 cuda::MatmulContext::kDefaultWorkspaceBytes;
}

void CudaExec::begin_step(int64_t step, const StepBatch& batch) {
  fault_point("step", step + 1);  // 1-based, as reported
  // Every micro-step's ids into its pinned buffer (the Engine checked them).
  const size_t N = static_cast<size_t>(ws_->N);
  for (size_t m = 0; m < tokens_.size(); ++m) {
    auto* host = static_cast<int32_t*>(tokens_[m]->get());
    std::memcpy(host, batch.inputs + m * N, N * sizeof(int32_t));
    std::memcpy(host + N, batch.targets + m * N, N * sizeof(int32_t));
  }
}

void CudaExec::set_optimizer_step(int64_t step) {
  cuda::AdamWStep st{};  // apply 0: the update ops change nothing
  if (step >= 0) {
    const OptimConfig& o = p_.config.optim;
    const cuda::AdamWBiasCorrection bc =
        cuda::adamw_bias_correction(o.beta1, o.beta2, static_cast<int>(step) + 1);
    TD_CHECK(bc.bc1 > 0.0f && bc.rsqrt_bc2 > 0.0f, "bad AdamW bias corrections {} {} at step {}",
             bc.bc1, bc.rsqrt_bc2, step + 1);
    st = cuda::adamw_step(lr_at(o, static_cast<int>(step), p_.config.total_steps), bc);
  }
  std::memcpy(adamw_step_->get(), &st, sizeof st);
}

// The step and its ids are begin_step's: the work enqueued here is the same every step.
void CudaExec::run_op(const Op& op, int64_t /*step*/, const StepBatch& /*batch*/) {
  const ModelLayout& model = p_.model;
  const EngineConfig& config = p_.config;
  const int U = model.num_units();
  const std::string label = op.unit >= 0 ? model.unit(op.unit).name : "step";
  switch (op.kind) {
    case OpKind::zero_grad_shards:
      TD_CUDA_CALL(cudaMemsetAsync(grads_->as<void>(), 0,
                                   static_cast<size_t>(total_) * sizeof(float), reduce_));
      return;
    case OpKind::gather: {
      // [Cast on gather] The fp32 shard, rounded to bf16 into this rank's block of the
      // gathered buffer, then gathered in place: the same bits the optimizer's rounding gave
      // when a bf16 copy was kept, 2 bytes per parameter less memory, and at one rank no
      // more traffic than that copy's write plus a gather's copy.
      const int u = op.unit;
      const int64_t n = p_.flat.unit(u).shard;
      bf16* full = static_cast<bf16*>(buffer(op.writes.at(0)));
      bf16* mine = full + static_cast<int64_t>(p_.gather_comm.rank()) * n;
      cuda::cast_f32_to_bf16(mine, params_->as<float>() + shard_offset(u), n, gather_);
      p_.gather_comm.all_gather(p_.gather, mine, full, static_cast<size_t>(n), DType::bf16, label);
      return;
    }
    case OpKind::forward:
    case OpKind::backward: {
      UnitParams params(static_cast<size_t>(U), nullptr);
      UnitGrads grads(static_cast<size_t>(U), nullptr);
      for (const UnitBuffer& ub : op.params)
        params[static_cast<size_t>(ub.unit)] = buffer(ub.buffer);
      for (const UnitBuffer& ub : op.grads)
        grads[static_cast<size_t>(ub.unit)] = static_cast<float*>(buffer(ub.buffer));
      const FreshGrads& fresh = fresh_[op_index(p_.program, op)];
      const int u = op.unit, micro = op.micro;
      p_.device.submit(p_.compute, [&, u, micro] {
        // Delays every producer on purpose (tests): a missing wait then reads stale data.
        if (config.compute_delay_ms > 0) cuda::sleep_kernel(config.compute_delay_ms, compute_);
        // [Fresh gradients] The composition fills the units' elements; the rest is cleared.
        for (const FreshGrads::Span& span : fresh.clear)
          TD_CUDA_CALL(cudaMemsetAsync(static_cast<char*>(buffer(span.buffer)) + span.offset, 0,
                                       span.bytes, compute_));
        if (op.kind == OpKind::forward) {
          if (u == 0) {
            // This micro-step's ids, from the pinned buffer begin_step filled.
            const size_t N = static_cast<size_t>(ws_->N);
            const auto* host =
                static_cast<const int32_t*>(tokens_.at(static_cast<size_t>(micro))->get());
            TD_CUDA_CALL(cudaMemcpyAsync(ws_->tokens, host, static_cast<size_t>(N) * 4,
                                         cudaMemcpyHostToDevice, compute_));
            TD_CUDA_CALL(cudaMemcpyAsync(ws_->targets, host + N, static_cast<size_t>(N) * 4,
                                         cudaMemcpyHostToDevice, compute_));
          }
          unit_forward(*kernels_, model, u, params, *ws_);
          return;
        }
        const float dloss = 1.0f / (static_cast<float>(config.global_batch) * config.seq);
        unit_backward(*kernels_, model, u, params, grads, *ws_, dloss, fresh.units);
        if (model.unit(u).kind == UnitKind::head) {
          // The step's loss sum starts at its first micro-step's head.
          auto* sum = reinterpret_cast<double*>(small_->as<char>() + kLossOffset);
          if (micro == 0) TD_CUDA_CALL(cudaMemsetAsync(sum, 0, sizeof(double), compute_));
          cuda::sum_to_double(sum, ws_->losses, ws_->N, compute_);
        }
      });
      return;
    }
    case OpKind::reduce:
      reduce(op);
      return;
    case OpKind::replicate_reduce:
      replicate_reduce(op);
      return;
    case OpKind::grad_norm:
      cuda::sum_squares(reinterpret_cast<float*>(small_->as<char>() + kNormOffset),
                        grads_->as<float>(), total_, false, norm_scratch_->as<void>(),
                        norm_scratch_bytes_, compute_);
      return;
    case OpKind::norm_reduce: {
      float* n = reinterpret_cast<float*>(small_->as<char>() + kNormOffset);
      p_.reduce_comm.all_reduce(p_.reduce, n, n, 1, DType::f32, "grad-norm");
      return;
    }
    case OpKind::optimizer:
    case OpKind::update: {
      // The step's learning rate and bias corrections, from the pinned buffer
      // set_optimizer_step filled, then the update that reads them: of every unit at the
      // step's end, or ([Update at gather]) of one unit on the gather stream.
      const OptimConfig& o = config.optim;
      const bool whole = op.kind == OpKind::optimizer;
      cudaStream_t s = whole ? compute_ : gather_;
      const int first = whole ? 0 : unit_chunks_.at(static_cast<size_t>(op.unit));
      const int last = whole ? num_chunks_ : unit_chunks_.at(static_cast<size_t>(op.unit) + 1);
      auto* st = reinterpret_cast<cuda::AdamWStep*>(small_->as<char>() + kStepOffset);
      TD_CUDA_CALL(cudaMemcpyAsync(st, adamw_step_->get(), sizeof(cuda::AdamWStep),
                                   cudaMemcpyHostToDevice, s));
      cuda::adamw_update_chunks(params_->as<float>(), grads_->as<float>(), m_->as<float>(),
                                v_->as<float>(), nullptr, chunks_->as<cuda::AdamWChunk>() + first,
                                last - first,
                                reinterpret_cast<const float*>(small_->as<char>() + kNormOffset),
                                o.grad_clip, st, o.beta1, o.beta2, o.eps, s);
      return;
    }
    case OpKind::last_rows:
    case OpKind::advance:
    case OpKind::sample:
    case OpKind::tp_reduce:
    case OpKind::send:
    case OpKind::recv:
      TD_THROW("the training engine was given an inference op ({})", op_kind_name(op.kind));
  }
}

// Reduce-scatter of a unit's unsharded gradients into its shard; later micro-steps of
// full/hybrid reduce into scratch and add.
void CudaExec::reduce(const Op& op) {
  const int u = op.unit;
  const void* send = nullptr;
  for (int b : op.reads)
    if (p_.program.buffers[static_cast<size_t>(b)].kind == BufferKind::grad_full) send = buffer(b);
  TD_CHECK(send != nullptr, "reduce of unit {} without a gradient buffer", u);
  const size_t n = static_cast<size_t>(p_.flat.unit(u).shard);
  float* shard = grads_->as<float>() + shard_offset(u);
  const bool first = !reduce_adds_to_shard(p_.program, op);
  const std::string& label = p_.model.unit(u).name;
  if (p_.config.reduce_dtype == DType::bf16) {
    // [Reduce dtype] Cast, reduce-scatter and widen, all on the reduce stream.
    bf16* full16 = full16_->as<bf16>();
    bf16* shard16 = shard16_->as<bf16>();
    cuda::cast_f32_to_bf16(full16, static_cast<const float*>(send), p_.flat.unit(u).padded,
                           reduce_);
    p_.reduce_comm.reduce_scatter(p_.reduce, full16, shard16, n, DType::bf16, label);
    if (first) {
      cuda::cast_bf16_to_f32(shard, shard16, static_cast<int64_t>(n), reduce_);
    } else {
      cuda::add_bf16_to_f32(shard, shard16, static_cast<int64_t>(n), reduce_);
    }
    return;
  }
  if (first) {
    p_.reduce_comm.reduce_scatter(p_.reduce, send, shard, n, DType::f32, label);
    return;
  }
  p_.reduce_comm.reduce_scatter(p_.reduce, send, reduce_tmp_->as<float>(), n, DType::f32, label);
  cuda::add_f32(shard, reduce_tmp_->as<float>(), static_cast<int64_t>(n), reduce_);
}

// The all-reduce of a unit's gradient shard across shard groups (hybrid, none); in bf16 it
// works in the shard scratch ([Reduce dtype]).
void CudaExec::replicate_reduce(const Op& op) {
  const int u = op.unit;
  float* g = grads_->as<float>() + shard_offset(u);
  const size_t n = static_cast<size_t>(p_.flat.unit(u).shard);
  const std::string& label = p_.model.unit(u).name;
  if (p_.config.reduce_dtype == DType::f32) {
    p_.replicate.all_reduce(p_.reduce, g, g, n, DType::f32, label);
    return;
  }
  bf16* shard16 = shard16_->as<bf16>();
  cuda::cast_f32_to_bf16(shard16, g, static_cast<int64_t>(n), reduce_);
  p_.replicate.all_reduce(p_.reduce, shard16, shard16, n, DType::bf16, label);
  cuda::cast_bf16_to_f32(g, shard16, static_cast<int64_t>(n), reduce_);
}

void CudaExec::end_step(double& loss_total, double& norm_sq) {
  const int W = p_.world.size();
  char* small = small_->as<char>();
  // Every rank's loss sum, gathered (as pairs of 32-bit words) and added in rank order.
  p_.world.all_gather(p_.reduce, small + kLossOffset, small + kLossesOffset, 2, DType::f32, "loss");
  p_.device.stream_sync(p_.reduce);
  // One copy of the small block brings the norm and every rank's loss sum.
  std::vector<char> host(kLossesOffset + static_cast<size_t>(W) * sizeof(double));
  p_.device.copy_to_host(host.data(), small, host.size());
  loss_total = 0;
  for (int r = 0; r < W; ++r) {
    double x;
    std::memcpy(&x, host.data() + kLossesOffset + static_cast<size_t>(r) * sizeof(double),
                sizeof x);
    loss_total += x;
  }
  float norm;
  std::memcpy(&norm, host.data() + kNormOffset, sizeof norm);
  norm_sq = static_cast<double>(norm);
}

ShardState CudaExec::shards() const {
  // Nothing is in flight between steps; the copies are synchronous.
  std::vector<float> p(static_cast<size_t>(total_)), m(p.size()), v(p.size());
  const size_t bytes = p.size() * sizeof(float);
  p_.device.copy_to_host(p.data(), params_->as<void>(), bytes);
  p_.device.copy_to_host(m.data(), m_->as<void>(), bytes);
  p_.device.copy_to_host(v.data(), v_->as<void>(), bytes);
  ShardState st;
  for (int u = 0; u < p_.model.num_units(); ++u) {
    const auto a = p.begin() + shard_offset(u), b = a + p_.flat.unit(u).shard;
    const auto o = static_cast<size_t>(a - p.begin());
    st.params.emplace_back(a, b);
    st.m.emplace_back(m.begin() + static_cast<std::ptrdiff_t>(o),
                      m.begin() + static_cast<std::ptrdiff_t>(o) + (b - a));
    st.v.emplace_back(v.begin() + static_cast<std::ptrdiff_t>(o),
                      v.begin() + static_cast<std::ptrdiff_t>(o) + (b - a));
  }
  return st;
}

std::vector<std::vector<float>> CudaExec::grad_shards() const {
  std::vector<float> g(static_cast<size_t>(total_));
  p_.device.copy_to_host(g.data(), grads_->as<void>(), g.size() * sizeof(float));
  std::vector<std::vector<float>> out;
  for (int u = 0; u < p_.model.num_units(); ++u) {
    const auto a = g.begin() + shard_offset(u);
    out.emplace_back(a, a + p_.flat.unit(u).shard);
  }
  return out;
}

void CudaExec::set_shards(const ShardState& st) {
  const size_t U = static_cast<size_t>(p_.model.num_units());
  TD_CHECK(st.params.size() == U && st.m.size() == U && st.v.size() == U,
           "shard state has {} units, the model {}", st.params.size(), U);
  std::vector<float> p(static_cast<size_t>(total_)), m(p.size()), v(p.size());
  for (size_t u = 0; u < U; ++u) {
    const size_t n = static_cast<size_t>(p_.flat.unit(static_cast<int>(u)).shard),
                 o = static_cast<size_t>(shard_offset(static_cast<int>(u)));
    TD_CHECK(st.params[u].size() == n && st.m[u].size() == n && st.v[u].size() == n,
             "shard of unit {} has {} elements, expected {}", u, st.params[u].size(), n);
    std::copy(st.params[u].begin(), st.params[u].end(), p.begin() + static_cast<std::ptrdiff_t>(o));
    std::copy(st.m[u].begin(), st.m[u].end(), m.begin() + static_cast<std::ptrdiff_t>(o));
    std::copy(st.v[u].begin(), st.v[u].end(), v.begin() + static_cast<std::ptrdiff_t>(o));
  }
  const size_t bytes = p.size() * sizeof(float);
  p_.device.copy_to_device(params_->as<void>(), p.data(), bytes);
  p_.device.copy_to_device(m_->as<void>(), m.data(), bytes);
  p_.device.copy_to_device(v_->as<void>(), v.data(), bytes);
}

std::vector<std::vector<float>> CudaExec::gather_params() {
  std::vector<std::vector<float>> out;
  DeviceBuffer full(p_.device, static_cast<size_t>(p_.flat.largest_padded()) * sizeof(float));
  for (int u = 0; u < p_.model.num_units(); ++u) {
    const UnitShards& us = p_.flat.unit(u);
    p_.gather_comm.all_gather(p_.gather, params_->as<float>() + shard_offset(u), full.as<float>(),
                              static_cast<size_t>(us.shard), DType::f32, p_.model.unit(u).name);
    p_.device.stream_sync(p_.gather);
    std::vector<float> host(static_cast<size_t>(us.numel));
    p_.device.copy_to_host(host.data(), full.as<void>(), host.size() * sizeof(float));
    out.push_back(std::move(host));
  }
  return out;
}

}  // namespace

std::unique_ptr<EngineExec> engine_exec_cuda(const EngineParts& parts) {
  return std::make_unique<CudaExec>(parts);
}

}  // namespace tandem
