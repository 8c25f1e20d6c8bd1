// The links probe: for each collective and size, timed back-to-back calls, then one checked
// call; the per-rank results and topologies gathered to every rank; the report and the
// planner's JSON.
//
// [Link values] Rank r, element i (all-gather: of its part; reduce-scatter and all-reduce:
// of its whole send buffer):
//   all-gather      send = (r mod 1024) * 1024 + (i mod 1021)
//                   recv[q * part + i] = (q mod 1024) * 1024 + (i mod 1021)
//   reduce-scatter  send = w(r) * (i mod 251 + 1), w(r) = r mod 8 + 1
//                   recv on rank r at i = W * ((r * part + i) mod 251 + 1), W = sum of w
//   all-reduce      send = w(r) * (i mod 251 + 1); recv = W * (i mod 251 + 1)
// Every value and every partial sum is an integer below 2^24 (up to 8000 ranks), so fp32
// sums are exact in any order and a mismatch is a real wrong value.
#include "plan/probe_links.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <set>

#include "core/error.h"
#include "plan/trace.h"

namespace tandem {

namespace {

float ag_value(int rank, size_t i) {
  return static_cast<float>((rank % 1024) * 1024 + static_cast<int>(i % 1021));
}
int weight(int rank) {
  return rank % 8 + 1;
}
int weight_sum(int ranks) {
  int w = 0;
  for (int r = 0; r < ranks; ++r) w += weight(r);
  return w;
}
float pattern(size_t i) {
  return static_cast<float>(i % 251 + 1);
}

void fill_send(Collective c, int rank, std::vector<float>& host, size_t elems) {
  for (size_t i = 0; i < elems; ++i)
    host[i] = c == Collective::all_gather ? ag_value(rank, i)
                                          : static_cast<float>(weight(rank)) * pattern(i);
}

uint64_t count_wrong(Collective c, int rank, int ranks, const CollectiveShape& shape,
                     const float* recv) {
  uint64_t wrong = 0;
  const float w = static_cast<float>(weight_sum(ranks));
  for (size_t i = 0; i < shape.recv_elems; ++i) {
    float expected = 0;
    switch (c) {
      case Collective::all_gather:
        expected = ag_value(static_cast<int>(i / shape.count), i % shape.count);
        break;
      case Collective::reduce_scatter:
        expected = w * pattern(static_cast<size_t>(rank) * shape.count + i);
        break;
      case Collective::all_reduce:
        expected = w * pattern(i);
        break;
    }
    if (!(recv[i] == expected)) ++wrong;  // NaN (never written) counts too
  }
  return wrong;
}

void run_collective(Communicator& comm, Collective c, Stream& s, const void* send, void* recv,
                    size_t count) {
  switch (c) {
    case Collective::all_gather:
      comm.all_gather(s, send, recv, count, DType::f32, "probe links");
      return;
    case Collective::reduce_scatter:
      comm.reduce_scatter(s, send, recv, count, DType::f32, "probe links");
      return;
    case Collective::all_reduce:
      comm.all_reduce(s, send, recv, count, DType::f32, "probe links");
      return;
  }
}

// Deterministic by size, so every rank issues the same number of calls.
int iters_for(size_t bytes, int given) {
  if (given > 0) return given;
  const size_t by_size = (size_t{256} << 20) / std::max<size_t>(bytes, 1);
  return static_cast<int>(std::clamp<size_t>(by_size, 5, 40));
}
int warmup_for(int iters, int given) {
  return given > 0 ? given : std::max(1, iters / 8);
}

std::vector<size_t> sweep(size_t min_bytes, size_t max_bytes) {
  std::vector<size_t> sizes;
  for (size_t b = min_bytes; b <= max_bytes; b *= 2) {
    sizes.push_back(b);
    if (b > max_bytes / 2) break;
  }
  if (sizes.back() != max_bytes) sizes.push_back(max_bytes);
  return sizes;
}

// The links between the GPUs of each host, as the host's first rank sees them (NVML), as a
// matrix like nvidia-smi topo -m; "" on CPU. See [Probe GPU links] in
// cuda/probe_backend_cuda.cu for the entries.
std::string gpu_links_format(const nlohmann::json& ranks) {
  std::string out;
  std::set<std::string> shown;
  for (const auto& v : ranks) {
    if (!v.contains("nvml")) continue;
    const std::string host = v.value("host", "?");
    if (!shown.insert(host).second) continue;
    if (v.value("nvml", "") != "ok") {
      out += fmt::format("  gpu links on {}: unknown (NVML unavailable: {})\n", host,
                         v.value("nvml_error", "?"));
      continue;
    }
    const int gpus = v.value("gpus_visible", 0);
    if (gpus < 2 || !v.contains("gpu_links")) continue;
    std::vector<std::string> cell(static_cast<size_t>(gpus) * gpus, "?");
    for (int i = 0; i < gpus; ++i) cell[static_cast<size_t>(i) * gpus + i] = "X";
    for (const auto& pair : v["gpu_links"]) {
      const int a = pair.at("gpus").at(0).get<int>(), b = pair.at("gpus").at(1).get<int>();
      if (a < 0 || b < 0 || a >= gpus || b >= gpus) continue;
      cell[static_cast<size_t>(a) * gpus + b] = cell[static_cast<size_t>(b) * gpus + a] =
          pair.value("label", "?");
    }
    out += fmt::format(
        "  gpu links on {} (NVML, as rank {} sees them; NV<k>: k NVLinks, direct or through "
        "NVSwitch; else the PCIe path as nvidia-smi topo -m names it: PIX, PXB, PHB, NODE, "
        "SYS):\n       ",
        host, v.value("rank", 0));
    for (int j = 0; j < gpus; ++j) out += fmt::format(" {:>10}", fmt::format("GPU{}", j));
    out += "\n";
    for (int i = 0; i < gpus; ++i) {
      out += fmt::format("    {:<5}", fmt::format("GPU{}", i));
      for (int j = 0; j < gpus; ++j)
        out += fmt::format(" {:>10}", cell[static_cast<size_t>(i) * gpus + j]);
      out += "\n";
    }
  }
  return out;
}

}  // namespace

const char* collective_key(Collective c) {
  switch (c) {
    case Collective::all_gather:
      return "all_gather";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::all_reduce:
      return "all_reduce";
  }
  return "?";
}

Collective collective_parse(const std::string& key) {
  std::string k = key;
  std::replace(k.begin(), k.end(), '-', '_');
  for (Collective c : {Collective::all_gather, Collective::reduce_scatter, Collective::all_reduce})
    if (k == collective_key(c)) return c;
  TD_THROW("unknown collective '{}' (expected all_gather, reduce_scatter or all_reduce)", key);
}

CollectiveShape collective_shape(Collective c, int ranks, size_t nominal_bytes) {
  TD_CHECK(ranks >= 1, "a collective needs at least one rank, got {}", ranks);
  const size_t n = static_cast<size_t>(ranks);
  CollectiveShape s;
  if (c == Collective::all_reduce) {
    s.count = s.send_elems = s.recv_elems = nominal_bytes / 4;
  } else {
    const size_t part = nominal_bytes / (4 * n) / 4 * 4;
    s.count = part;
    s.send_elems = c == Collective::all_gather ? part : part * n;
    s.recv_elems = c == Collective::all_gather ? part * n : part;
  }
  s.bytes = std::max(s.send_elems, s.recv_elems) * 4;
  return s;
}

double busbw_factor(Collective c, int ranks) {
  TD_CHECK(ranks >= 1, "bus bandwidth needs at least one rank, got {}", ranks);
  const double n = ranks;
  return c == Collective::all_reduce ? 2.0 * (n - 1) / n : (n - 1) / n;
}

double algbw_GBps(size_t bytes, double time_us) {
  if (!(time_us > 0)) return 0;
  return static_cast<double>(bytes) / (time_us * 1e-6) / 1e9;
}

double busbw_GBps(Collective c, int ranks, size_t bytes, double time_us) {
  return algbw_GBps(bytes, time_us) * busbw_factor(c, ranks);
}

CorruptHook links_corrupt_first(Collective target, int ranks) {
  auto done = std::make_shared<bool>(false);
  return [target, ranks, done](Collective c, size_t, int rank, float* recv, size_t elems) {
    if (c != target || *done) return;
    *done = true;  // every rank sees its first call of target at the same (smallest) size
    if (rank == ranks - 1 && elems > 0) recv[0] = recv[0] + 1.0f;
  };
}

uint64_t LinksReport::wrong_total() const {
  uint64_t total = 0;
  for (const auto& [op, rows] : results)
    for (const auto& row : rows) total += row.wrong;
  return total;
}

LinksReport probe_links(ProbeBackend& backend, Communicator& world, const LinksOptions& options) {
  Device& device = backend.device();
  const int n = world.size();
  const int rank = world.rank();
  LinksReport report;
  report.device = device.name();
  report.device_kind = probe_device_kind(device);
  report.ranks = n;
  report.min_bytes = options.min_bytes;
  report.max_bytes_default = options.max_bytes == 0;
  report.max_bytes =
      report.max_bytes_default ? backend.default_links_max_bytes() : options.max_bytes;
  TD_CHECK(report.min_bytes >= 4, "--min-bytes must be at least 4, got {}", report.min_bytes);
  TD_CHECK(report.max_bytes >= report.min_bytes, "--max-bytes {} is below --min-bytes {}",
           report.max_bytes, report.min_bytes);
  TD_CHECK(options.iters >= 0 && options.warmup >= 0, "--iters and --warmup must not be negative");
  TD_CHECK(!options.ops.empty(), "no collective to probe");

  // Topology: every rank's own view.
  nlohmann::json ranks_json = nlohmann::json::array();
  std::set<std::string> hosts;
  const auto views = all_gather_text(world, device, backend.local_topology().dump());
  for (int r = 0; r < n; ++r) {
    nlohmann::json v = nlohmann::json::parse(views[r]);
    v["rank"] = r;
    hosts.insert(v.value("host", ""));
    ranks_json.push_back(std::move(v));
  }
  const bool cpu = device.kind() == DeviceKind::cpu;
  const std::string comm_kind = cpu ? "MPI" : "NCCL";
  std::string transport;
  if (n == 1)
    transport = "none: one rank, every collective is a local copy";
  else if (hosts.size() == 1)
    transport = comm_kind + (cpu ? " within one host (shared memory)"
                                 : " within one host (NVLink or PCIe between the GPUs)");
  else
    transport = comm_kind + " across hosts (the slowest link between them bounds busbw)";
  report.topology = {{"hosts", hosts.size()}, {"transport", transport}, {"ranks", ranks_json}};

  const std::vector<size_t> sizes = sweep(report.min_bytes, report.max_bytes);
  // Per op, per size: this rank's time and wrong count, gathered at the end.
  std::vector<std::vector<std::pair<double, uint64_t>>> local(options.ops.size());
  std::vector<std::vector<size_t>> moved(options.ops.size());
  {
    const size_t max_elems = report.max_bytes / 4 + 4;
    ProbeBuffer send(device, max_elems * 4), recv(device, max_elems * 4);
    std::vector<float> host(max_elems);
    const std::unique_ptr<Communicator> comm = world.duplicate("probe links");
    auto control = device.stream_create("probe control");
    // The engine's kind of communication stream: the last listed ([Stream kinds]).
    auto stream = backend.stream_create(backend.comm_stream_kinds().back(), "probe links", 1);
    auto e0 = device.event_create(true), e1 = device.event_create(true);
    auto align = [&] {
      world.barrier(*control, "probe links align");
      device.stream_sync(*control);
    };
    for (size_t k = 0; k < options.ops.size(); ++k) {
      const Collective op = options.ops[k];
      for (size_t nominal : sizes) {
        const CollectiveShape shape = collective_shape(op, n, nominal);
        if (shape.count == 0) continue;  // too small to split over the ranks
        fill_send(op, rank, host, shape.send_elems);
        device.copy_to_device(send.get(), host.data(), shape.send_elems * 4);

        const int iters = iters_for(nominal, options.iters);
        for (int i = 0, w = warmup_for(iters, options.warmup); i < w; ++i)
          run_collective(*comm, op, *stream, send.get(), recv.get(), shape.count);
        device.stream_sync(*stream);
        align();
        device.event_record(*e0, *stream);
        for (int i = 0; i < iters; ++i)
          run_collective(*comm, op, *stream, send.get(), recv.get(), shape.count);
        device.event_record(*e1, *stream);
        device.stream_sync(*stream);
        const double time_us = device.event_elapsed_ms(*e0, *e1) * 1e3 / iters;

        // The correctness call: the receive buffer starts as NaN.
        std::fill(host.begin(), host.begin() + shape.recv_elems,
                  std::numeric_limits<float>::quiet_NaN());
        device.copy_to_device(recv.get(), host.data(), shape.recv_elems * 4);
        align();
        run_collective(*comm, op, *stream, send.get(), recv.get(), shape.count);
        device.stream_sync(*stream);
        device.copy_to_host(host.data(), recv.get(), shape.recv_elems * 4);
        if (options.corrupt) options.corrupt(op, shape.bytes, rank, host.data(), shape.recv_elems);
        const uint64_t wrong = count_wrong(op, rank, n, shape, host.data());
        local[k].push_back({time_us, wrong});
        moved[k].push_back(shape.bytes);
      }
    }
  }

  // Times averaged over ranks, wrong values summed.
  nlohmann::json mine = local;
  const auto all = all_gather_text(world, device, mine.dump());
  std::vector<nlohmann::json> parsed;
  for (const auto& t : all) parsed.push_back(nlohmann::json::parse(t));
  for (size_t k = 0; k < options.ops.size(); ++k) {
    std::vector<LinkRow> rows;
    for (size_t j = 0; j < local[k].size(); ++j) {
      LinkRow row;
      row.bytes = moved[k][j];
      for (int r = 0; r < n; ++r) {
        row.time_us += parsed[r][k][j][0].get<double>() / n;
        row.wrong += parsed[r][k][j][1].get<uint64_t>();
      }
      row.algbw_GBps = algbw_GBps(row.bytes, row.time_us);
      row.busbw_GBps = busbw_GBps(options.ops[k], n, row.bytes, row.time_us);
      rows.push_back(row);
    }
    report.results.emplace_back(options.ops[k], std::move(rows));
  }
  return report;
}

nlohmann::json links_to_json(const LinksReport& r) {
  nlohmann::json out = {{"ranks", r.ranks}, {"device", r.device_kind}};
  // A collective left out with --ops is absent (the planner borrows another's line for it).
  for (const auto& [op, rows] : r.results) {
    out[collective_key(op)] = nlohmann::json::array();
    for (const auto& row : rows)
      out[collective_key(op)].push_back({{"bytes", row.bytes},
                                         {"time_us", row.time_us},
                                         {"algbw_GBps", row.algbw_GBps},
                                         {"busbw_GBps", row.busbw_GBps},
                                         {"wrong", row.wrong}});
  }
  out["topology"] = r.topology;
  return out;
}

std::string links_format(const LinksReport& r) {
  std::string out = fmt::format("probe links: {} rank(s) on {}, sizes {} to {}", r.ranks, r.device,
                                probe_bytes_text(static_cast<double>(r.min_bytes)),
                                probe_bytes_text(static_cast<double>(r.max_bytes)));
  if (r.max_bytes_default)
    out += fmt::format(" (the {} default; --max-bytes goes further, e.g. 1GiB)", r.device);
  out += "\n";
  out += fmt::format("topology: {} host(s), transport {}\n", r.topology.value("hosts", 0),
                     r.topology.value("transport", ""));
  for (const auto& v : r.topology["ranks"]) {
    out += fmt::format("  rank {}: {} ({}", v.value("rank", 0), v.value("host", "?"),
                       v.value("device", "?"));
    if (v.contains("cores")) out += fmt::format(", {} cores", v["cores"].get<int>());
    if (v.contains("cpu")) out += fmt::format(", {}", v["cpu"].get<std::string>());
    if (v.contains("gpu"))
      out += fmt::format(", {}, GPU {} of {}, PCI {}", v["gpu"].get<std::string>(),
                         v.value("gpu_index", 0), v.value("gpus_visible", 0),
                         v.value("pci_bus_id", "?"));
    out += ")\n";
  }
  out += gpu_links_format(r.topology["ranks"]);
  out +=
      "bytes: nccl-tests' size (all_gather: the gathered output; reduce_scatter: the input; "
      "all_reduce: the buffer); time: back-to-back calls, per call, averaged over ranks;\n"
      "algbw = bytes / time; busbw = algbw x (n-1)/n (all_gather, reduce_scatter) or x 2(n-1)/n "
      "(all_reduce); GB = 1e9 bytes\n";
  if (r.ranks == 1)
    out +=
        "1 rank: every collective is a local copy and busbw is 0 by definition; run with "
        "--ranks N to measure links\n";
  for (const auto& [op, rows] : r.results) {
    out += fmt::format("\n# {}\n#  {:>12} {:>12} {:>12} {:>12} {:>8}\n", collective_key(op),
                       "bytes", "time_us", "algbw_GBps", "busbw_GBps", "wrong");
    for (const auto& row : rows)
      out += fmt::format("   {:>12} {:>12.2f} {:>12.3f} {:>12.3f} {:>8}\n", row.bytes, row.time_us,
                         row.algbw_GBps, row.busbw_GBps, row.wrong);
  }
  const uint64_t wrong = r.wrong_total();
  out += "\n";
  if (wrong == 0) {
    out += "wrong values: 0 (every collective at every size returned its expected values)\n";
  } else {
    out += fmt::format("wrong values: {}", wrong);
    for (const auto& [op, rows] : r.results)
      for (const auto& row : rows)
        if (row.wrong > 0)
          out += fmt::format("; {} at {} bytes: {}", collective_key(op), row.bytes, row.wrong);
    out += "\n";
  }
  return out;
}

}  // namespace tandem
