// `tandem report`: a training run's metrics file (and optionally a Chrome trace) as one
// self-contained HTML page.
//
// [Report] The page holds inline SVG charts and nothing it would fetch (no scripts, fonts,
// images or style sheets from anywhere): per step the loss, tokens/s, step time and exposed
// communication, each a polyline with one point per step; where the metrics file ends with the
// planner's prediction (its summary line), the predicted step time and exposed communication
// are drawn next to the measured ones as a dashed series of the same steps, and the predicted
// tokens/s is the step's tokens (tokens_per_s x step_ms, the same every step) over the predicted
// step time. With a trace, a timeline of its first steps (at most timeline_steps of them, the
// whole trace when it has none): one lane per device stream, one box per event, compute and
// communication in two colours, as the trace analyzer classifies them ([Trace analysis] in
// trace_analyze.h). Every text that comes from a file is escaped.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "plan/trace_analyze.h"

namespace tandem {

struct ReportStep {
  int64_t step = 0;
  std::optional<double> loss;  // none for a step skipped with a non-finite loss
  double tokens_per_s = 0, step_ms = 0, exposed_comm_ms = 0;
};

struct ReportPrediction {
  std::string hardware;  // the planner's hardware ("h200-sxm")
  double step_ms = 0, exposed_comm_ms = 0;
};

struct ReportMetrics {
  // By step number; a step written twice (a run resumed from an earlier checkpoint) keeps
  // its later line.
  std::vector<ReportStep> steps;
  std::optional<ReportPrediction> predicted;  // from the last summary line that has one
  std::string model;                          // the summary's model, "" when unknown
};

// Reads a metrics file (`tandem train --metrics`, docs/formats.md). Throws a tandem::Error
// naming the file, and the line for a line that is not JSON, not an object, neither a step nor
// a summary, or a step without a number where one belongs; and when the file holds no steps.
ReportMetrics report_read_metrics(const std::string& path);
// The same from text already read; `name` names it in errors.
ReportMetrics report_parse_metrics(const std::string& text, const std::string& name);

struct ReportOptions {
  std::string source;      // what the page was made from (the metrics file's name), for the title
  int timeline_steps = 3;  // steps of the trace the timeline shows
};

// The page. `trace` may be null (no timeline).
std::string report_html(const ReportMetrics& metrics, const TraceAnalysis* trace,
                        const ReportOptions& options);

// Text for HTML: &, <, >, " and ' as character references.
std::string html_escape(const std::string& text);

}  // namespace tandem
