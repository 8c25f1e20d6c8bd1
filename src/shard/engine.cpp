// Replaying the step program on one rank. See [Program order] and [Memory reuse] in
// shard/program.h for why the waits below are sufficient.
#include "shard/engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/size.h"
#include "model/activations.h"
#include "model/compose.h"
#include "shard/engine_exec.h"

namespace tandem {

namespace {

int micro_steps_of(const EngineConfig& c, int world) {
  TD_CHECK(c.batch > 0 && c.global_batch > 0, "batch {} and global batch {} must be positive",
           c.batch, c.global_batch);
  TD_CHECK(c.global_batch % (c.batch * world) == 0,
           "--global-batch {} is not a multiple of --batch {} x {} rank(s)", c.global_batch,
           c.batch, world);
  return c.global_batch / (c.batch * world);
}

}  // namespace

size_t engine_activation_bytes(DeviceKind kind, AttentionImpl attention, const ModelConfig& config,
                               int B, int T, Recompute recompute, int loss_chunk,
                               int recompute_blocks) {
  const std::unique_ptr<Kernels> k = kernels_for_sizing(kind, attention);
  ActivationTraits traits = activation_traits(*k, config, B, T);
  traits.recompute = recompute;
  traits.recompute_blocks = recompute_blocks;
  traits.loss_chunk = loss_chunk;
  return activation_bytes(config, B, T, traits);
}

RecomputeFit engine_fewest_recompute_blocks(const ModelLayout& model, EngineConfig config,
                                            DeviceKind kind, int world, Recompute mode,
                                            double room) {
  config.recompute = mode;
  auto peak = [&](int k) {
    config.recompute_blocks = k;
    return program_build(model, Engine::program_spec(model, config, kind, world)).peak_bytes();
  };
  RecomputeFit fit;
  if (mode == Recompute::none) return fit;
  fit.blocks = recompute_fewest_blocks(model.config().n_layer,
                                       [&](int k) { return static_cast<double>(peak(k)) <= room; });
  if (fit.blocks > 0) fit.peak = peak(fit.blocks);
  return fit;
}

ProgramSpec Engine::program_spec(const ModelLayout& model, const EngineConfig& c, DeviceKind kind,
                                 int world) {
  ProgramSpec s;
  s.strategy = c.strategy;
  s.world = world;
  s.shard_group = c.shard_group;
  s.micro_steps = micro_steps_of(c, world);
  s.max_gathered = c.max_gathered;
  // [Precision] On CUDA the gathered parameters are bf16, cast from the fp32 shard by the
  // gather ([Cast on gather] in shard/cuda/engine_cuda.cu); unsharded
  // gradients stay fp32 (cuBLASLt accumulates weight gradients in fp32 into them) and are
  // reduced in fp32, or in bf16 with --reduce-dtype bf16 ([Reduce dtype]). On CPU
  // everything else is fp32.
  s.param_bytes = kind == DeviceKind::cuda ? 2 : sizeof(float);
  s.grad_bytes = sizeof(float);
  s.reduce_dtype = c.reduce_dtype;
  s.grads_in_shard = c.grads_in_shard;
  s.update_at_gather = c.update_at_gather;
  s.activation_bytes = engine_activation_bytes(kind, c.attention, model.config(), c.batch, c.seq,
                                               c.recompute, c.loss_chunk, c.recompute_blocks);
  return s;
}

Engine::Engine(const ModelLayout& model, const EngineConfig& config, Device& device,
               Communicator& world)
    : model_(model),
      config_(config),
      device_(device),
      micro_steps_(micro_steps_of(config, world.size())),
      flat_(model, 1),
      program_(program_build(model, program_spec(model, config, device.kind(), world.size()))) {
  // A plan over --mem-limit, or without one over a GPU's free memory (where it would fail in
  // cudaMalloc after the setup), is refused first, saying what would make it fit. (The plan
  // leaves out the libraries' workspaces and the links' buffers, so a plan just under a
  // GPU's free memory can still fail there.)
  const uint64_t peak = program_.peak_bytes(), limit = config.mem_limit;
  const uint64_t free = limit > 0                           ? 0
                        : config.free_memory > 0            ? config.free_memory
                        : device.kind() == DeviceKind::cuda ? device.free_bytes()
                                                            : 0;
  const uint64_t bound = limit > 0 ? limit : free;
  memory_bound_ = bound;
  if (bound > 0 && peak > bound) {
    // What would fit: recomputing as few blocks as needed, in the mode asked for or whole.
    const double room = (1 - kRecomputeHeadroom) * static_cast<double>(bound);
    Recompute mode = config.recompute == Recompute::none ? Recompute::unit : config.recompute;
    RecomputeFit fit =
        engine_fewest_recompute_blocks(model, config, device.kind(), world.size(), mode, room);
    if (fit.blocks == 0 && mode == Recompute::attention) {
      mode = Recompute::unit;
      fit = engine_fewest_recompute_blocks(model, config, device.kind(), world.size(), mode, room);
    }
    const int L = model.config().n_layer;
    const std::string fix =
        fit.blocks == 0 ? "Lower --batch or add ranks: recomputing every block does not fit either"
                        : fmt::format(
                              "Recomputing {} of the {} blocks fits with {:.0f}% of it free "
                              "({}): --recompute {}{}; or lower --batch, or add ranks",
                              fit.blocks, L, 100 * kRecomputeHeadroom, format_size(fit.peak),
                              recompute_name(mode),
                              fit.blocks < L ? fmt::format(" --recompute-blocks {}", fit.blocks)
                                             : std::string());
    TD_THROW("the plan needs {} per rank ({} arena + {} shards) but {} {}: over by {}. {}",
             format_size(peak), format_size(program_.arena_bytes),
             format_size(program_.persistent_bytes),
             limit > 0 ? std::string("--mem-limit is")
             : world.size() > 1 && config.free_memory > 0
                 ? std::string("the smallest free memory of the ranks' devices is")
                 : fmt::format("the {} device has", device.name()),
             limit > 0 ? format_size(limit) : format_size(free) + " free",
             format_size(peak - bound), fix);
  }
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
  const EngineParts parts{model,     config_,     device,        world,         program_,
                          flat_,     shard_rank_, *gather_comm_, *reduce_comm_, *mesh_.replicate,
                          *compute_, *gather_,    *reduce_,      *arena_};
  exec_ = device.kind() == DeviceKind::cuda ? engine_exec_cuda(parts) : engine_exec_cpu(parts);
  step_start_ = device.event_create(true);
  for (size_t i = 0; i < program_.ops.size(); ++i) {
    before_wait_.push_back(device.event_create(true));
    before_.push_back(device.event_create(true));
    done_.push_back(device.event_create(true));
  }
  if (config.cuda_graph) {
    TD_CHECK(device.supports_graphs(),
             "--cuda-graph needs a device that captures graphs (cuda); the {} device runs each "
             "op as it is issued",
             device.name());
    for (size_t i = 0; i < program_.ops.size(); ++i) order_.push_back(device.event_create(false));
    fork_ = device.event_create(false);
    join_gather_ = device.event_create(false);
    join_reduce_ = device.event_create(false);
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
  exec_.reset();
}

ShardState Engine::shards() {
  settle();
  return exec_->shards();
}

void Engine::set_shards(const ShardState& state) {
  exec_->set_shards(state);
  pending_update_ = -1;
}

std::vector<std::vector<float>> Engine::gather_params() {
  settle();
  return exec_->gather_params();
}

void Engine::settle() {
  if (pending_update_ < 0) return;
  // The program's update ops alone, on the gather stream, with the pending step's values.
  exec_->set_optimizer_step(pending_update_);
  const StepBatch none;
  for (const Op& op : program_.ops)
    if (op.kind == OpKind::update) exec_->run_op(op, pending_update_, none);
  device_.stream_sync(*gather_);
  pending_update_ = -1;
}

std::vector<std::vector<float>> Engine::grad_shards() const {
  return exec_->grad_shards();
}

std::vector<bool> Engine::nonfinite_grad_units() const {
  std::vector<bool> bad;
  for (const std::vector<float>& g : exec_->grad_shards())
    bad.push_back(std::any_of(g.begin(), g.end(), [](float x) { return !std::isfinite(x); }));
  return bad;
}

uint64_t Engine::peak_bytes() const {
  return program_.peak_bytes() + exec_->extra_bytes();
}

void Engine::issue(int64_t step, const StepBatch& batch, bool capturing) {
  const std::vector<Op>& ops = program_.ops;
  Stream* streams[kStreamRoles] = {compute_.get(), gather_.get(), reduce_.get()};
  // Inside a capture the timing events are steps of the graph (event_record_node) and
  // order_ carries the waits ([Graphs] in device/device.h); run as issued, done_ does both.
  const auto mark = [&](Event& e, Stream& s) {
    if (capturing) {
      device_.event_record_node(e, s);
    } else {
      device_.event_record(e, s);
    }
  };
  std::vector<std::unique_ptr<Event>>& order = capturing ? order_ : done_;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    Stream& s = *streams[static_cast<int>(op.stream)];
    // [Exposed communication] The compute stream's time between before_wait and before
    // is time it spent blocked on communication.
    if (op.stream == StreamRole::compute && !op.waits.empty()) mark(*before_wait_[i], s);
    for (int w : op.waits) device_.stream_wait(s, *order[static_cast<size_t>(w)]);
    mark(*before_[i], s);
    exec_->run_op(op, step, batch);
    mark(*done_[i], s);
    if (capturing) device_.event_record(*order_[i], s);
  }
}

double exposed_overlap_ms(const Intervals& busy, const Intervals& waits) {
  return length(intersect(merged(busy), merged(waits)));
}

double Engine::exposed_comm_ms(const std::vector<double>& ms, const std::vector<double>& waited) {
  // [Exposed communication] Times from the first op's start (an event recorded the same
  // way as the others, in the graph or on a stream, where step_start_ is always on a
  // stream): each communication op's run, and each compute wait. Only steps with a wait
  // ask for them.
  const std::vector<Op>& ops = program_.ops;
  Intervals busy, waits;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].kind == OpKind::update) continue;  // not communication ([Update at gather])
    if (ops[i].stream != StreamRole::compute) {
      const double start = device_.event_elapsed_ms(*before_[0], *before_[i]);
      busy.push_back({start, start + ms[i]});
    } else if (waited[i] > 0) {
      const double start = device_.event_elapsed_ms(*before_[0], *before_wait_[i]);
      waits.push_back({start, start + waited[i]});
    }
  }
  return exposed_overlap_ms(busy, waits);
}

StepResult Engine::step(int64_t step, const StepBatch& batch, bool timings) {
  const size_t ids = static_cast<size_t>(micro_steps_) * static_cast<size_t>(config_.batch) *
                     static_cast<size_t>(config_.seq);
  TD_CHECK(batch.inputs != nullptr && batch.targets != nullptr && batch.count == ids,
           "step {}: the batch holds {} token ids, the step needs {} ({} micro-step(s) of {} x {})",
           step + 1, batch.count, ids, micro_steps_, config_.batch, config_.seq);
  const int vocab = model_.config().vocab;
  check_token_ids(batch.inputs, ids, vocab, "token");
  check_token_ids(batch.targets, ids, vocab, "target");
  // [Update at gather] This step's update ops apply the last step's update, if any (after a
  // fresh start, a resume or a settle there is none, and they change nothing).
  const bool at_gather = program_.spec.update_at_gather;
  exec_->set_optimizer_step(at_gather ? pending_update_ : step);
  exec_->begin_step(step, batch);
  Stream* streams[kStreamRoles] = {compute_.get(), gather_.get(), reduce_.get()};
  // Every stream is idle here (the host synchronised at the end of the last step), so
  // this event marks the step's start for all of them.
  device_.event_record(*step_start_, *compute_);
  if (graph_ != nullptr) {
    device_.graph_launch(*graph_, *compute_);
  } else if (config_.cuda_graph && steps_issued_ > 0) {
    // [Step graph] The capture starts on the compute stream; the communication streams
    // join it through fork_ and rejoin it at the end, and the program's waits between
    // them become the graph's edges.
    device_.capture_begin(*compute_);
    try {
      device_.event_record(*fork_, *compute_);
      device_.stream_wait(*gather_, *fork_);
      device_.stream_wait(*reduce_, *fork_);
      issue(step, batch, true);
      device_.event_record(*join_gather_, *gather_);
      device_.event_record(*join_reduce_, *reduce_);
      device_.stream_wait(*compute_, *join_gather_);
      device_.stream_wait(*compute_, *join_reduce_);
    } catch (...) {
      try {
        (void)device_.capture_end(*compute_);  // ends the capture; its error is the lesser one
      } catch (...) {
      }
      throw;
    }
    graph_ = device_.capture_end(*compute_);
    device_.graph_launch(*graph_, *compute_);
  } else {
    issue(step, batch, false);
  }
  ++steps_issued_;
  // The host waits here, at the step boundary, and nowhere else.
  for (Stream* s : streams) device_.stream_sync(*s);
  if (at_gather) pending_update_ = step;

  const std::vector<Op>& ops = program_.ops;
  StepResult r;
  // Per-op buffers kept across steps: nothing is allocated here in a step without waits.
  std::vector<double>& ms = op_ms_;
  std::vector<double>& waited = op_wait_ms_;
  ms.assign(ops.size(), 0.0);
  waited.assign(ops.size(), 0.0);
  bool any_wait = false;
  for (size_t i = 0; i < ops.size(); ++i) {
    ms[i] = device_.event_elapsed_ms(*before_[i], *done_[i]);
    if (ops[i].kind == OpKind::update) continue;  // neither compute nor communication
    if (ops[i].stream == StreamRole::compute) {
      r.compute_ms += ms[i];
      if (!ops[i].waits.empty())
        waited[i] = std::max(0.0, device_.event_elapsed_ms(*before_wait_[i], *before_[i]));
      any_wait = any_wait || waited[i] > 0;
    } else {
      r.comm_ms += ms[i];
    }
  }
  if (any_wait) r.exposed_comm_ms = exposed_comm_ms(ms, waited);
  if (timings)
    for (size_t i = 0; i < ops.size(); ++i) {
      OpTiming t;
      t.start_ms = std::max(0.0, device_.event_elapsed_ms(*step_start_, *before_[i]));
      t.end_ms = t.start_ms + ms[i];
      t.wait_ms = waited[i];
      r.ops.push_back(t);
    }
  double total = 0, norm_sq = 0;
  exec_->end_step(total, norm_sq);
  r.loss = total / (static_cast<double>(config_.global_batch) * config_.seq);
  r.grad_norm = std::sqrt(norm_sq);
  r.lr = lr_at(config_.optim, static_cast<int>(step), config_.total_steps);
  return r;
}

}  // namespace tandem
