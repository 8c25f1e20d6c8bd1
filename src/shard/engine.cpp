// Replaying the step program on one rank. See [Program order] and [Memory reuse] in
// shard/program.h for why the waits below are sufficient.
#include "shard/engine.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "core/error.h"
#include "core/fault.h"
#include "device/cpu/kernels.h"

namespace tandem {

namespace {

ProgramSpec spec_of(const ModelLayout& model, const EngineConfig& c, int world, int micro) {
  ProgramSpec s;
  s.strategy = c.strategy;
  s.world = world;
  s.shard_group = c.shard_group;
  s.micro_steps = micro;
  s.max_gathered = c.max_gathered;
  s.param_bytes = sizeof(float);
  s.grad_bytes = sizeof(float);
  s.activation_bytes = Workspace::bytes_needed(model.config(), c.batch, c.seq);
  return s;
}

int micro_steps_of(const EngineConfig& c, int world) {
  TD_CHECK(c.batch > 0 && c.global_batch > 0, "batch {} and global batch {} must be positive",
           c.batch, c.global_batch);
  TD_CHECK(c.global_batch % (c.batch * world) == 0,
           "--global-batch {} is not a multiple of --batch {} x {} rank(s)", c.global_batch,
           c.batch, world);
  return c.global_batch / (c.batch * world);
}

}  // namespace

Engine::Engine(const ModelLayout& model, const EngineConfig& config, Device& device,
               Communicator& world, const Dataset& data)
    : model_(model),
      config_(config),
      device_(device),
      world_(world),
      data_(data),
      micro_steps_(micro_steps_of(config, world.size())),
      flat_(model, 1),
      program_(program_build(model, spec_of(model, config, world.size(), micro_steps_))) {
  flat_ = FlatLayout(model, program_.shard_size);
  shard_rank_ = world.rank() % program_.shard_size;
  mesh_ = comm_mesh(world, program_.shard_size);
  // [Separate communicators] All-gathers and reduces each get their own communicator and
  // stream, so a reduce never queues in front of the next gather.
  gather_comm_ = mesh_.shard->duplicate("all-gather");
  reduce_comm_ = mesh_.shard->duplicate("reduce-scatter");
  compute_ = device.stream_create("compute", 0);
  gather_ = device.stream_create("all-gather", 1);
  reduce_ = device.stream_create("reduce-scatter", 1);
  arena_ = std::make_unique<Arena>(device, program_.arena_bytes);

  const int U = model.num_units();
  for (const Buffer& b : program_.buffers)
    if (b.kind == BufferKind::activations)
      ws_ = std::make_unique<Workspace>(model.config(), config.batch, config.seq,
                                        static_cast<float*>(arena_->at(b.offset)));
  int64_t largest_shard = 0;
  for (int u = 0; u < U; ++u) {
    const int64_t n = flat_.unit(u).shard, begin = flat_.shard_begin(u, shard_rank_);
    std::vector<float> p(static_cast<size_t>(n));
    model.init_slice(u, config.seed, begin, begin + n, p.data());
    shards_.params.push_back(std::move(p));
    shards_.m.emplace_back(static_cast<size_t>(n), 0.0f);
    shards_.v.emplace_back(static_cast<size_t>(n), 0.0f);
    shards_.grads.emplace_back(static_cast<size_t>(n), 0.0f);
    largest_shard = std::max(largest_shard, n);
  }
  reduce_tmp_.assign(static_cast<size_t>(largest_shard), 0.0f);
  step_start_ = device.event_create(true);
  for (size_t i = 0; i < program_.ops.size(); ++i) {
    before_wait_.push_back(device.event_create(true));
    before_.push_back(device.event_create(true));
    done_.push_back(device.event_create(true));
  }
}

Engine::~Engine() {
  // Drain every stream before the memory their work touches goes away.
  for (Stream* s : {compute_.get(), gather_.get(), reduce_.get()}) {
    if (s == nullptr) continue;
    try {
      device_.stream_sync(*s);
    } catch (...) {  // a failed stream has nothing left to run
    }
  }
}

std::vector<std::vector<float>> Engine::gather_params() {
  std::vector<std::vector<float>> out;
  for (int u = 0; u < model_.num_units(); ++u) {
    const UnitShards& us = flat_.unit(u);
    std::vector<float> full(static_cast<size_t>(us.padded));
    gather_comm_->all_gather(*gather_, shards_.params[static_cast<size_t>(u)].data(), full.data(),
                             static_cast<size_t>(us.shard), DType::f32, model_.unit(u).name);
    device_.stream_sync(*gather_);
    full.resize(static_cast<size_t>(us.numel));
    out.push_back(std::move(full));
  }
  return out;
}

uint64_t Engine::peak_bytes() const {
  return program_.peak_bytes() + reduce_tmp_.size() * sizeof(float);
}

StepResult Engine::step(int64_t step, bool timings) {
  loss_sum_ = 0;
  const std::vector<Op>& ops = program_.ops;
  Stream* streams[kStreamRoles] = {compute_.get(), gather_.get(), reduce_.get()};
  // Every stream is idle here (the host synchronised at the end of the last step), so
  // this event marks the step's start for all of them.
  device_.event_record(*step_start_, *compute_);
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    Stream& s = *streams[static_cast<int>(op.stream)];
    // [Exposed communication] The compute stream's time between before_wait and before
    // is time it spent blocked on communication.
    if (op.stream == StreamRole::compute && !op.waits.empty())
      device_.event_record(*before_wait_[i], s);
    for (int w : op.waits) device_.stream_wait(s, *done_[static_cast<size_t>(w)]);
    device_.event_record(*before_[i], s);
    run_op(i, step);
    device_.event_record(*done_[i], s);
  }
  // The host waits here, at the step boundary, and nowhere else.
  for (Stream* s : streams) device_.stream_sync(*s);

  StepResult r;
  for (size_t i = 0; i < ops.size(); ++i) {
    const double ms = device_.event_elapsed_ms(*before_[i], *done_[i]);
    double waited = 0;
    if (ops[i].stream == StreamRole::compute) {
      r.compute_ms += ms;
      if (!ops[i].waits.empty())
        r.exposed_comm_ms += waited = device_.event_elapsed_ms(*before_wait_[i], *before_[i]);
    } else {
      r.comm_ms += ms;
    }
    if (timings) {
      OpTiming t;
      t.start_ms = std::max(0.0, device_.event_elapsed_ms(*step_start_, *before_[i]));
      t.end_ms = t.start_ms + ms;
      t.wait_ms = waited;
      r.ops.push_back(t);
    }
  }
  // Loss: each rank's sum of token losses, gathered and added in rank order so every
  // rank (and every world size) computes the mean the same way.
  std::vector<double> sums(static_cast<size_t>(world_.size()));
  world_.all_gather(*reduce_, &loss_sum_, sums.data(), 2, DType::f32, "loss");
  device_.stream_sync(*reduce_);
  double total = 0;
  for (double x : sums) total += x;
  r.loss = total / (static_cast<double>(config_.global_batch) * config_.seq);
  r.grad_norm = std::sqrt(static_cast<double>(norm_sq_));
  r.lr = lr_at(config_.optim, static_cast<int>(step), config_.total_steps);
  return r;
}

void Engine::run_op(size_t i, int64_t step) {
  const Op& op = program_.ops[i];
  const int U = model_.num_units();
  auto ptr = [&](int buffer) {
    return static_cast<float*>(arena_->at(program_.buffers[static_cast<size_t>(buffer)].offset));
  };
  const std::string label = op.unit >= 0 ? model_.unit(op.unit).name : "step";
  switch (op.kind) {
    case OpKind::zero_grad_shards:
      device_.submit(*reduce_, [this] {
        for (auto& g : shards_.grads) std::fill(g.begin(), g.end(), 0.0f);
      });
      return;
    case OpKind::gather: {
      const size_t u = static_cast<size_t>(op.unit);
      gather_comm_->all_gather(*gather_, shards_.params[u].data(), ptr(op.writes.at(0)),
                               shards_.params[u].size(), DType::f32, label);
      return;
    }
    case OpKind::forward:
    case OpKind::backward: {
      UnitBuffers params(static_cast<size_t>(U), nullptr), grads(static_cast<size_t>(U), nullptr);
      for (const UnitBuffer& ub : op.params) params[static_cast<size_t>(ub.unit)] = ptr(ub.buffer);
      for (const UnitBuffer& ub : op.grads) grads[static_cast<size_t>(ub.unit)] = ptr(ub.buffer);
      std::vector<std::pair<float*, size_t>> zero;
      for (int b : op.zero_first)
        zero.push_back({ptr(b), program_.buffers[static_cast<size_t>(b)].bytes});
      const bool forward = op.kind == OpKind::forward;
      const int u = op.unit, micro = op.micro;
      device_.submit(*compute_, [this, forward, u, micro, step, params, grads, zero] {
        if (config_.compute_delay_ms > 0)
          std::this_thread::sleep_for(
              std::chrono::duration<double, std::milli>(config_.compute_delay_ms));
        if (forward) {
          if (u == 1 && micro == 0) fault_point("step", step + 1);  // 1-based, as reported
          if (u == 0) {
            // This rank's slice of the step's sequences (same for any world size).
            const int W = world_.size(), B = config_.batch;
            data_.batch(step, config_.global_batch, micro * B * W + world_.rank() * B, B,
                        ws_->tokens.data(), ws_->targets.data());
          }
          unit_forward(model_, u, params, *ws_);
          return;
        }
        for (auto& [p, bytes] : zero) std::memset(p, 0, bytes);
        const float dloss = 1.0f / (static_cast<float>(config_.global_batch) * config_.seq);
        unit_backward(model_, u, params, grads, *ws_, dloss);
        if (model_.unit(u).kind == UnitKind::head)
          for (int t = 0; t < ws_->N; ++t) loss_sum_ += ws_->losses[t];
      });
      return;
    }
    case OpKind::reduce:
      reduce(op);
      return;
    case OpKind::replicate_reduce: {
      float* g = shards_.grads[static_cast<size_t>(op.unit)].data();
      mesh_.replicate->all_reduce(
          *reduce_, g, g, shards_.grads[static_cast<size_t>(op.unit)].size(), DType::f32, label);
      return;
    }
    case OpKind::grad_norm:
      device_.submit(*compute_, [this] {
        double sum = 0;
        for (const auto& g : shards_.grads)
          sum += cpu::sum_squares(g.data(), static_cast<int64_t>(g.size()));
        norm_sq_ = static_cast<float>(sum);
      });
      return;
    case OpKind::norm_reduce:
      reduce_comm_->all_reduce(*reduce_, &norm_sq_, &norm_sq_, 1, DType::f32, "grad-norm");
      return;
    case OpKind::optimizer:
      device_.submit(*compute_, [this, step] {
        const float scale = clip_scale(config_.optim, std::sqrt(static_cast<double>(norm_sq_)));
        const float lr = lr_at(config_.optim, static_cast<int>(step), config_.total_steps);
        for (int u = 0; u < model_.num_units(); ++u) {
          const size_t k = static_cast<size_t>(u);
          const int64_t begin = flat_.shard_begin(u, shard_rank_);
          adamw_unit_range(config_.optim, model_.unit(u), begin,
                           begin + static_cast<int64_t>(shards_.params[k].size()),
                           shards_.params[k].data(), shards_.grads[k].data(), shards_.m[k].data(),
                           shards_.v[k].data(), lr, static_cast<int>(step) + 1, scale);
        }
      });
      return;
  }
}

// Reduce-scatter of a unit's unsharded gradients into its shard. The first reduce of a
// step writes the shard directly; later micro-steps reduce into scratch and add.
void Engine::reduce(const Op& op) {
  const size_t u = static_cast<size_t>(op.unit);
  const Buffer* full = nullptr;
  for (int b : op.reads)
    if (program_.buffers[static_cast<size_t>(b)].kind == BufferKind::grad_full)
      full = &program_.buffers[static_cast<size_t>(b)];
  TD_CHECK(full != nullptr, "reduce of unit {} without a gradient buffer", op.unit);
  const float* send = static_cast<const float*>(arena_->at(full->offset));
  std::vector<float>& shard = shards_.grads[u];
  const bool first = op.micro <= 0 || program_.spec.strategy == Strategy::none ||
                     program_.spec.strategy == Strategy::grad_op;
  const std::string& label = model_.unit(op.unit).name;
  if (first) {
    reduce_comm_->reduce_scatter(*reduce_, send, shard.data(), shard.size(), DType::f32, label);
    return;
  }
  reduce_comm_->reduce_scatter(*reduce_, send, reduce_tmp_.data(), shard.size(), DType::f32, label);
  device_.submit(*reduce_, [this, u] {
    std::vector<float>& g = shards_.grads[u];
    for (size_t i = 0; i < g.size(); ++i) g[i] += reduce_tmp_[i];
  });
}

}  // namespace tandem
