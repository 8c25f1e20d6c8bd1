// tandem probe overlap | links | compute: the measurements behind docs/diagnosis.md. Rank 0
// prints; `--ranks N` (overlap, links) starts N local ranks through mpirun, as train does.
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "io/file.h"
#include "io/model_source.h"
#include "plan/probe_backend.h"
#include "plan/probe_compute.h"
#include "plan/probe_links.h"
#include "plan/probe_overlap.h"
#include "plan/trace.h"

namespace tandem {

namespace {

// The device, the world over it and the probe backend, destroyed in reverse order.
struct ProbeSession {
  ProbeSession(const std::string& device_name, int expected_ranks, double comm_timeout,
               const LaunchEnvironment& launch) {
    const DeviceKind kind = device_kind_parse(device_name);
    // Rank r of a node drives the node's GPU r (NCCL needs one GPU per rank).
    device = device_create(kind, kind == DeviceKind::cuda ? launch.local_rank : 0);
    CommOptions comm;
    comm.timeout_s = comm_timeout;
    comm.mpi = launch.mpi;
    world = comm_world(*device, comm);
    TD_CHECK(expected_ranks == 0 || expected_ranks == world->size(),
             "--ranks {} but the job runs {} rank(s)", expected_ranks, world->size());
    backend = probe_backend_create(*device);
  }
  bool lead() const { return world->rank() == 0; }

  std::unique_ptr<Device> device;
  std::unique_ptr<Communicator> world;
  std::unique_ptr<ProbeBackend> backend;
};

void write_json(const std::string& path, const nlohmann::json& j) {
  const std::string text = j.dump(2) + "\n";
  file_write_atomic(path, text.data(), text.size());
}

size_t bytes_flag(const std::string& text, const char* flag) {
  return probe_parse_bytes(text, flag);
}

struct OverlapFlags {
  std::string device = "cpu";
  int ranks = 0;
  int gemm = 0;
  int train = 8;
  std::string bytes;
  double target_ms = 20;
  int warmup = 2;
  int iters = 6;
  bool serialize = false;
  std::string trace;
  bool json = false;
  double compute_pad_ms = 0, comm_pad_ms = 0;
  double comm_timeout = 300;
};

void run_overlap(const OverlapFlags& f, const LaunchEnvironment& launch) {
  ProbeSession s(f.device, f.ranks, f.comm_timeout, launch);
  OverlapOptions o;
  o.gemm_n = f.gemm;
  o.train = f.train;
  o.bytes = f.bytes.empty() ? 0 : bytes_flag(f.bytes, "--bytes");
  TD_CHECK(f.bytes.empty() || o.bytes > 0, "--bytes must be positive");
  o.target_ms = f.target_ms;
  o.warmup = f.warmup;
  o.iters = f.iters;
  o.serialize = f.serialize;
  o.compute_pad_ms = f.compute_pad_ms;
  o.comm_pad_ms = f.comm_pad_ms;
  std::unique_ptr<Trace> trace;
  if (!f.trace.empty()) {
    trace = std::make_unique<Trace>(s.world->rank(), fmt::format("rank {}", s.world->rank()));
    o.trace = trace.get();
  }
  const OverlapReport report = probe_overlap(*s.backend, *s.world, o);
  nlohmann::json doc;
  if (trace) doc = trace_gather(*trace, *s.world, *s.device);
  if (!s.lead()) return;
  if (trace) trace_write(f.trace, doc);
  if (f.json) {
    fmt::print("{}\n", overlap_to_json(report).dump(2));
  } else {
    fmt::print("{}", overlap_format(report));
    if (trace)
      fmt::print("trace: {} ({} events; one track per stream, one process per rank)\n", f.trace,
                 doc["traceEvents"].size());
  }
  std::fflush(stdout);
}

struct LinksFlags {
  std::string device = "cpu";
  int ranks = 0;
  std::string min_bytes = "1KiB";
  std::string max_bytes;
  int iters = 0;
  int warmup = 0;
  std::vector<std::string> ops;
  std::string save;
  std::string corrupt;
  double comm_timeout = 300;
};

// Returns the number of wrong values (every rank the same).
uint64_t run_links(const LinksFlags& f, const LaunchEnvironment& launch) {
  ProbeSession s(f.device, f.ranks, f.comm_timeout, launch);
  LinksOptions o;
  o.min_bytes = bytes_flag(f.min_bytes, "--min-bytes");
  if (!f.max_bytes.empty()) {
    o.max_bytes = bytes_flag(f.max_bytes, "--max-bytes");
    TD_CHECK(o.max_bytes > 0, "--max-bytes must be positive");
  }
  o.iters = f.iters;
  o.warmup = f.warmup;
  if (!f.ops.empty()) {
    o.ops.clear();
    for (const auto& op : f.ops) o.ops.push_back(collective_parse(op));
  }
  if (!f.corrupt.empty())
    o.corrupt = links_corrupt_first(collective_parse(f.corrupt), s.world->size());
  const LinksReport report = probe_links(*s.backend, *s.world, o);
  if (s.lead()) {
    if (!f.save.empty()) write_json(f.save, links_to_json(report));
    fmt::print("{}", links_format(report));
    if (!f.save.empty()) fmt::print("saved: {}\n", f.save);
    std::fflush(stdout);
  }
  return report.wrong_total();
}

struct ComputeFlags {
  std::string device = "cpu";
  std::vector<int> sizes;
  std::string copy_bytes;
  std::string save;
  std::string model;
  int batch = 4, seq = 64;
  bool no_kernels = false;
  double kernel_ms = 0;
  AttentionImpl attention = AttentionImpl::automatic;
  FlashBackward flash_backward = FlashBackward::automatic;
};

void run_compute(const ComputeFlags& f) {
  std::unique_ptr<Device> device = device_create(device_kind_parse(f.device));
  std::unique_ptr<ProbeBackend> backend = probe_backend_create(*device);
  ComputeOptions o;
  o.sizes = f.sizes;
  if (!f.copy_bytes.empty()) {
    o.copy_bytes = bytes_flag(f.copy_bytes, "--copy-bytes");
    TD_CHECK(o.copy_bytes > 0, "--copy-bytes must be positive");
  }
  o.kernels = !f.no_kernels;
  TD_CHECK(o.kernels || f.model.empty(), "--model measures kernel tables; drop --no-kernels");
  if (!f.model.empty()) o.model = model_resolve(f.model);
  o.batch = f.batch;
  o.seq = f.seq;
  o.attention = f.attention;
  o.flash_backward = f.flash_backward;
  TD_CHECK(f.kernel_ms >= 0 && f.kernel_ms <= 10000, "--kernel-ms must be in [0, 10000], got {}",
           f.kernel_ms);
  o.kernel_ms = f.kernel_ms;
  const ComputeReport report = probe_compute(*backend, o);
  if (!f.save.empty()) write_json(f.save, compute_to_json(report));
  fmt::print("{}", compute_format(report));
  if (!f.save.empty()) fmt::print("saved: {}\n", f.save);
  std::fflush(stdout);
}

}  // namespace

void cli_add_probe(CLI::App& app, const Environment& env) {
  const LaunchEnvironment launch = env.launch;
  auto* probe =
      app.add_subcommand("probe",
                         "Measure this machine: compute/communication overlap, links, compute (see "
                         "docs/diagnosis.md)");
  probe->require_subcommand(1);

  {
    auto* cmd = probe->add_subcommand(
        "overlap",
        "Does compute on one stream overlap communication on another, issued as a training "
        "step issues them? Verdicts per stream configuration, with sleeps (the streams' rules) "
        "and with GEMMs (contention)");
    auto f = std::make_shared<OverlapFlags>();
    cmd->add_option("--device", f->device, "cpu or cuda")->capture_default_str();
    cmd->add_option("--ranks", f->ranks,
                    "Local ranks to start (through mpirun); under mpirun/srun, the expected count");
    cmd->add_option("--gemm", f->gemm,
                    "Size n of each GEMM of the compute train (n x n; bf16 where the device has "
                    "it, else fp32); default: calibrated to --target-ms / --train");
    cmd->add_option("--train", f->train, "GEMMs (or sleeps) in each compute phase")
        ->capture_default_str();
    cmd->add_option("--bytes", f->bytes,
                    "Communication size: the all-gather output, every rank's part together (e.g. "
                    "32MiB); default: calibrated");
    cmd->add_option("--target-ms", f->target_ms, "Calibration goal for each part alone")
        ->capture_default_str();
    cmd->add_option("--warmup", f->warmup, "Warm-up iterations per configuration")
        ->capture_default_str();
    cmd->add_option("--iters", f->iters, "Measured iterations per configuration")
        ->capture_default_str();
    cmd->add_flag("--serialize", f->serialize,
                  "Make the compute stream wait for each communication (no overlap possible: "
                  "the probe's zero)");
    cmd->add_option("--trace", f->trace, "Write a Chrome-trace JSON (one named track per stream)");
    cmd->add_flag("--json", f->json, "Print the results as JSON");
    cmd->add_option("--comm-timeout", f->comm_timeout, "Seconds before a collective gives up")
        ->capture_default_str();
    // Test hooks: sleep inside each part, so that both take known time under any load.
    cmd->add_option("--compute-pad-ms", f->compute_pad_ms)->group("");
    cmd->add_option("--comm-pad-ms", f->comm_pad_ms)->group("");
    cmd->callback([f, launch] { run_overlap(*f, launch); });
  }

  {
    auto* cmd = probe->add_subcommand(
        "links",
        "All-gather, reduce-scatter and all-reduce bandwidth by size, checked values, "
        "topology");
    auto f = std::make_shared<LinksFlags>();
    cmd->add_option("--device", f->device, "cpu or cuda")->capture_default_str();
    cmd->add_option("--ranks", f->ranks,
                    "Local ranks to start (through mpirun); under mpirun/srun, the expected count");
    cmd->add_option("--min-bytes", f->min_bytes, "First size of the sweep")->capture_default_str();
    cmd->add_option("--max-bytes", f->max_bytes,
                    "Last size of the sweep (default: 64MiB on cpu, 1GiB on cuda)");
    cmd->add_option("--iters", f->iters, "Timed calls per size (default: by size, 5 to 40)");
    cmd->add_option("--warmup", f->warmup, "Warm-up calls per size (default: by size)");
    cmd->add_option("--ops", f->ops, "Collectives to run (all_gather, reduce_scatter, all_reduce)")
        ->delimiter(',');
    cmd->add_option("--save", f->save, "Write the results as JSON (read by the planner)");
    cmd->add_option("--comm-timeout", f->comm_timeout, "Seconds before a collective gives up")
        ->capture_default_str();
    // Test hook: change one received value of OP (see links_corrupt_first).
    cmd->add_option("--corrupt", f->corrupt)->group("");
    cmd->callback([f, launch] {
      const uint64_t wrong = run_links(*f, launch);  // the device and world are gone after this
      if (wrong == 0) return;
      // Every rank knows the count: all end cleanly with status 1, rank 0 says why.
      if (!launch.mpi || error_rank() == 0)
        std::fprintf(stderr,
                     "tandem: error: probe links found %llu wrong value(s) (see the 'wrong' "
                     "column)\n",
                     static_cast<unsigned long long>(wrong));
      std::fflush(stdout);
      std::fflush(stderr);
      comm_finalize();
      std::exit(1);
    });
  }

  {
    auto* cmd = probe->add_subcommand(
        "compute", "GEMM TFLOP/s and device copy GB/s of this device (one process)");
    auto f = std::make_shared<ComputeFlags>();
    cmd->add_option("--device", f->device, "cpu or cuda")->capture_default_str();
    cmd->add_option("--sizes", f->sizes, "GEMM sizes n (default: 256,512,1024,2048 on cpu)")
        ->delimiter(',');
    cmd->add_option("--copy-bytes", f->copy_bytes, "Copy size (default: 128MiB on cpu)");
    cmd->add_option("--model", f->model,
                    "Measure the kernels of this model's training step (preset, JSON config, "
                    "checkpoint or Hugging Face directory); default: a small grid of shapes");
    cmd->add_option("--batch", f->batch, "With --model: sequences per micro-step")
        ->capture_default_str();
    cmd->add_option("--seq", f->seq, "With --model: sequence length")->capture_default_str();
    cmd->add_flag("--no-kernels", f->no_kernels,
                  "Leave out the per-kernel tables (GEMM sweep and copy only)");
    cmd->add_option(
        "--kernel-ms", f->kernel_ms,
        "Length in ms of each timed batch of one kernel's calls, back to back (default: 100 "
        "on a GPU, for its sustained clock; 1 on a CPU)");
    cmd->add_option("--save", f->save, "Write the results as JSON (read by the planner)");
    f->attention = env.attention;
    f->flash_backward = env.flash_backward;
    cmd->callback([f] { run_compute(*f); });
  }
}

}  // namespace tandem
