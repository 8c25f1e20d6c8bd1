// `tandem probe links`: a size sweep of all-gather, reduce-scatter and all-reduce over the
// ranks it runs on, reported the way nccl-tests reports them, with a separate correctness
// pass and the topology each rank sees.
//
// [Link sizes] `bytes` is the size nccl-tests prints: the larger of a rank's send and receive
// buffers. all-gather: the gathered output (every rank's part together); reduce-scatter: the
// input (every rank's part together); all-reduce: the buffer. A nominal size B becomes a
// per-rank part of floor(B / (4 n) / 4) * 4 fp32 elements for all-gather and reduce-scatter
// (nccl-tests' rounding, so every part is a multiple of 4 elements) and floor(B / 4)
// elements for all-reduce; the reported bytes are those actually moved.
//
// [Link timing] After warm-up calls and a barrier, `iters` calls run back to back on one
// stream between two timing events; time_us is that span / iters, averaged over the ranks
// (nccl-tests' default -a 1). algbw = bytes / time; busbw = algbw * (n - 1) / n for
// all-gather and reduce-scatter and algbw * 2 (n - 1) / n for all-reduce, GB = 1e9 bytes.
// busbw is the per-rank link bandwidth a ring algorithm needs for that time, comparable
// across collectives and rank counts; at one rank it is 0.
//
// [Link correctness] A separate call per size checks the values: rank r sends small
// integers that depend on r and the element index, the receive buffer starts as NaN, and
// every element is compared with its closed form (exact in fp32 for any summation order,
// see probe_links.cpp). `wrong` counts mismatches over all ranks.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "plan/probe_backend.h"

namespace tandem {

enum class Collective { all_gather, reduce_scatter, all_reduce };
const char* collective_key(Collective c);  // "all_gather", "reduce_scatter", "all_reduce"
Collective collective_parse(const std::string& key);  // also accepts '-' for '_'

// One call for a nominal size, per [Link sizes].
struct CollectiveShape {
  size_t count = 0;       // the count argument of the Communicator call
  size_t send_elems = 0;  // elements this rank sends / receives
  size_t recv_elems = 0;
  size_t bytes = 0;  // nccl-tests' size: max(send, recv) * 4
};
CollectiveShape collective_shape(Collective c, int ranks, size_t nominal_bytes);

// nccl-tests' formulas, per [Link timing].
double busbw_factor(Collective c, int ranks);
double algbw_GBps(size_t bytes, double time_us);
double busbw_GBps(Collective c, int ranks, size_t bytes, double time_us);

// Called on every rank after the correctness call of each size, with this rank's received
// values on the host, before they are checked: a test changes one to see it counted.
using CorruptHook =
    std::function<void(Collective c, size_t bytes, int rank, float* recv, size_t elems)>;
// The hook behind the hidden `--corrupt OP`: flips the first received element of OP on the
// last rank, at the first (smallest) size only, so exactly one wrong value is expected.
CorruptHook links_corrupt_first(Collective c, int ranks);

struct LinksOptions {
  size_t min_bytes = 1024;
  size_t max_bytes = 0;  // 0: ProbeBackend::default_links_max_bytes
  int iters = 0;         // 0: by size (40 small, 5 at 64 MiB and above)
  int warmup = 0;        // 0: by size
  std::vector<Collective> ops = {Collective::all_gather, Collective::reduce_scatter,
                                 Collective::all_reduce};
  CorruptHook corrupt;
};

struct LinkRow {
  size_t bytes = 0;
  double time_us = 0, algbw_GBps = 0, busbw_GBps = 0;
  uint64_t wrong = 0;
};

struct LinksReport {
  std::string device;       // the device's name, e.g. "cuda:0 (NVIDIA H200)"
  std::string device_kind;  // "cpu" or "cuda": the saved file's device
  int ranks = 1;
  size_t min_bytes = 0, max_bytes = 0;
  bool max_bytes_default = true;
  std::vector<std::pair<Collective, std::vector<LinkRow>>> results;  // in options.ops order
  nlohmann::json topology;
  uint64_t wrong_total() const;
};

// Collective over world; every rank returns the same report.
LinksReport probe_links(ProbeBackend& backend, Communicator& world, const LinksOptions& options);

// {"ranks", "device" (the kind), "all_gather": [{"bytes", "time_us", "algbw_GBps", "busbw_GBps",
// "wrong"}], "reduce_scatter": [...], "all_reduce": [...], "topology": {...}}: exactly these
// keys (the planner reads this file); a collective left out of options.ops is absent.
nlohmann::json links_to_json(const LinksReport& report);
// The human report: header, topology, one nccl-tests-like table per collective, the verdict.
std::string links_format(const LinksReport& report);

}  // namespace tandem
