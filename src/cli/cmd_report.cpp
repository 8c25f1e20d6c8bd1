// tandem report: a training run's metrics (and a trace) as one self-contained HTML page
// ([Report] in plan/report.h).
#include <fmt/format.h>

#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "io/file.h"
#include "plan/report.h"
#include "plan/trace_analyze.h"

namespace tandem {

namespace {

struct ReportArgs {
  std::string metrics, trace, out;
  int trace_steps = 3;
  std::vector<std::string> comm_kernels;
};

}  // namespace

void cli_add_report(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  auto* cmd = app.add_subcommand(
      "report",
      "One self-contained HTML page (inline SVG, nothing fetched) of a training run: loss, "
      "tokens/s, step time and exposed communication per step, the planner's prediction beside "
      "them, and with --trace a per-stream timeline of the trace's first steps");
  cmd->add_option("metrics", a->metrics, "The metrics file of `tandem train --metrics` (JSONL)")
      ->required();
  cmd->add_option("--trace", a->trace,
                  "A Chrome trace (tandem's or PyTorch's, JSON or gzipped JSON) to draw as a "
                  "timeline");
  cmd->add_option("--out", a->out, "The HTML file to write")->required();
  cmd->add_option("--trace-steps", a->trace_steps, "Steps of the trace the timeline shows")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--comm-kernels", a->comm_kernels,
                  "A regular expression of more kernel names that are communication "
                  "(repeatable), as for `trace analyze`");
  cmd->callback([a] {
    const ReportMetrics m = report_read_metrics(a->metrics);
    std::unique_ptr<TraceAnalysis> trace;
    if (!a->trace.empty()) {
      TraceAnalyzeOptions o;
      o.comm_patterns = a->comm_kernels;
      trace = std::make_unique<TraceAnalysis>(trace_analyze(trace_read(a->trace), o));
    }
    ReportOptions o;
    o.source = a->metrics;
    o.timeline_steps = a->trace_steps;
    const std::string html = report_html(m, trace.get(), o);
    file_write_atomic(a->out, html.data(), html.size());
    fmt::print("wrote {}: {} step(s){}{}\n", a->out, m.steps.size(),
               m.predicted ? ", predicted next to measured" : ", no prediction in the metrics",
               trace ? fmt::format(", a timeline of {} stream(s)", trace->streams.size()) : "");
  });
}

}  // namespace tandem
