// tandem trace analyze: the exposed communication of a Chrome trace's device streams, from
// tandem's traces and PyTorch's profiler ([Trace analysis] in plan/trace_analyze.h).
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "plan/trace_analyze.h"

namespace tandem {

namespace {

struct TraceArgs {
  std::string file;
  bool json = false;
  std::vector<std::string> comm_kernels;
};

}  // namespace

void cli_add_trace(CLI::App& app) {
  auto* cmd = app.add_subcommand("trace", "Read Chrome traces (tandem's and PyTorch's)");
  cmd->require_subcommand(1);
  auto a = std::make_shared<TraceArgs>();
  auto* analyze = cmd->add_subcommand(
      "analyze",
      "Per stream and per step: busy time, communication, the part other streams' compute "
      "overlaps, the exposed rest (what perfect overlap could save); the legacy default "
      "stream beside communication, and streams without names");
  analyze->add_option("file", a->file, "A Chrome trace (JSON, or gzipped JSON)")->required();
  analyze->add_flag("--json", a->json, "Print the numbers as one JSON object");
  analyze->add_option("--comm-kernels", a->comm_kernels,
                      "A regular expression of more kernel names that are communication "
                      "(repeatable; NCCL, RCCL, copies and sets are built in)");
  analyze->callback([a] {
    TraceAnalyzeOptions o;
    o.comm_patterns = a->comm_kernels;
    const TraceAnalysis r = trace_analyze(trace_read(a->file), o);
    if (a->json)
      fmt::print("{}\n", trace_analysis_json(r).dump());
    else
      fmt::print("{}", trace_analysis_text(r));
  });
}

}  // namespace tandem
