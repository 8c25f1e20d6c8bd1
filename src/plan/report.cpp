// The report page ([Report] in report.h): the metrics file's steps as SVG line charts, the
// planner's prediction beside them, and a trace's streams as a timeline.
#include "plan/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/error.h"

namespace tandem {

namespace {

// One colour per series and per kind of timeline box; nothing else on the page uses them.
constexpr const char* kLossColour = "#1f77b4";
constexpr const char* kTokensColour = "#2ca02c";
constexpr const char* kTokensPredictedColour = "#8c564b";
constexpr const char* kStepColour = "#9467bd";
constexpr const char* kStepPredictedColour = "#e377c2";
constexpr const char* kExposedColour = "#d62728";
constexpr const char* kExposedPredictedColour = "#bcbd22";
constexpr const char* kComputeColour = "#17becf";
constexpr const char* kCommColour = "#ff7f0e";
constexpr const char* kNeitherColour = "#9e9e9e";  // tandem's update ops (TraceEvent::neither)

// Charts: the SVG's size and the plot area's margins, in pixels.
constexpr double kChartW = 560, kChartH = 310, kLeft = 72, kRight = 16, kTop = 44, kBottom = 44;
// Markers on the measured points up to this many steps.
constexpr size_t kMarkersUpTo = 100;
// The timeline draws at most this many boxes.
constexpr size_t kMaxBoxes = 20000;

using Out = std::back_insert_iterator<std::string>;

double number_at(const nlohmann::json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  TD_CHECK(it != j.end() && it->is_number(), "{}: \"{}\" is missing or not a number", where, key);
  return it->get<double>();
}

std::string px(double v) {
  return fmt::format("{:.2f}", v);
}

// An axis: from lo to hi in steps of tick, all three round numbers.
struct Axis {
  double lo = 0, hi = 1, tick = 1;
};

double nice_step(double raw) {
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / mag;
  return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

Axis value_axis(double lo, double hi, bool from_zero) {
  if (from_zero) lo = std::min(lo, 0.0);
  // Values equal but for rounding get an axis of their own size.
  if (!(hi - lo > 1e-9 * std::max(std::abs(lo), std::abs(hi)))) {
    hi = std::max(hi, lo);
    const double pad = lo != 0 ? std::abs(lo) * 0.1 : 1;
    if (!(from_zero && lo >= 0)) lo -= pad;
    hi += pad;
  }
  Axis a;
  a.tick = nice_step((hi - lo) / 5);
  a.lo = std::floor(lo / a.tick) * a.tick;
  a.hi = std::ceil(hi / a.tick) * a.tick;
  return a;
}

// Steps are integers: one step alone sits in the middle of [step - 1, step + 1].
Axis step_axis(double first, double last) {
  Axis a;
  a.lo = first;
  a.hi = last;
  if (!(a.hi > a.lo)) {
    a.lo -= 1;
    a.hi += 1;
  }
  a.tick = std::max(1.0, nice_step((a.hi - a.lo) / 8));
  return a;
}

std::string tick_text(double v, double tick) {
  const int decimals = tick >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(tick) - 1e-9));
  if (std::abs(v) < tick * 1e-9) v = 0;  // no "-0"
  return fmt::format("{:.{}f}", v, decimals);
}

std::string ms_text(double ms) {
  return fmt::format("{:.{}f}", ms, ms >= 100 ? 0 : ms >= 10 ? 1 : ms >= 1 ? 2 : 3);
}

struct Series {
  std::string id, label, colour;
  bool dashed = false;
  std::vector<std::pair<double, double>> points;  // (step, value)
};

// One chart: a title, the axes with ticks and grid lines, each series a polyline (the measured
// ones with markers while there are few steps) and a legend. The <svg> carries its axes'
// ranges (data-x-min ...) and the plot area is its rect.plot, so a reader can map back.
void chart(Out out, const std::string& id, const std::string& title, bool from_zero, const Axis& x,
           const std::vector<Series>& series) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const Series& s : series)
    for (const auto& [step, v] : s.points) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  if (!(lo <= hi)) lo = hi = 0;
  const Axis y = value_axis(lo, hi, from_zero);
  const double w = kChartW - kLeft - kRight, h = kChartH - kTop - kBottom;
  auto sx = [&](double step) { return kLeft + (step - x.lo) / (x.hi - x.lo) * w; };
  auto sy = [&](double v) { return kTop + h - (v - y.lo) / (y.hi - y.lo) * h; };
  fmt::format_to(out,
                 "<svg class=\"chart\" id=\"{}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" "
                 "height=\"{}\" viewBox=\"0 0 {} {}\" data-x-min=\"{}\" data-x-max=\"{}\" "
                 "data-y-min=\"{}\" data-y-max=\"{}\">\n",
                 id, kChartW, kChartH, kChartW, kChartH, x.lo, x.hi, y.lo, y.hi);
  fmt::format_to(out, "<text class=\"title\" x=\"{}\" y=\"16\">{}</text>\n", kLeft,
                 html_escape(title));
  // Grid and ticks.
  // Ticks by count: lo + i x tick, so rounding never skips or repeats one.
  const int y_ticks = static_cast<int>(std::lround((y.hi - y.lo) / y.tick));
  for (int i = 0; i <= y_ticks; ++i) {
    const double v = y.lo + i * y.tick;
    const std::string yy = px(sy(v));
    fmt::format_to(out,
                   "<line class=\"grid\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/><text "
                   "class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n",
                   px(kLeft), yy, px(kLeft + w), yy, px(kLeft - 6), px(sy(v) + 4),
                   tick_text(v, y.tick));
  }
  const double x_first = std::ceil(x.lo / x.tick) * x.tick;
  const int x_ticks = static_cast<int>(std::floor((x.hi - x_first) / x.tick + 1e-9));
  for (int i = 0; i <= x_ticks; ++i) {
    const double s = x_first + i * x.tick;
    const std::string xx = px(sx(s));
    fmt::format_to(out,
                   "<line class=\"grid\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/><text "
                   "class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                   xx, px(kTop), xx, px(kTop + h), xx, px(kTop + h + 16), tick_text(s, x.tick));
  }
  fmt::format_to(out,
                 "<rect class=\"plot\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>\n"
                 "<text class=\"axis\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">step</text>\n",
                 px(kLeft), px(kTop), px(w), px(h), px(kLeft + w / 2), px(kChartH - 6));
  for (const Series& s : series) {
    if (s.points.empty()) continue;
    std::string pts;
    for (const auto& [step, v] : s.points)
      pts += (pts.empty() ? "" : " ") + px(sx(step)) + "," + px(sy(v));
    fmt::format_to(out,
                   "<polyline class=\"series\" data-series=\"{}\" fill=\"none\" stroke=\"{}\" "
                   "stroke-width=\"3\"{} points=\"{}\"/>\n",
                   s.id, s.colour, s.dashed ? " stroke-dasharray=\"10 6\"" : "", pts);
    if (!s.dashed && s.points.size() <= kMarkersUpTo)
      for (const auto& [step, v] : s.points)
        fmt::format_to(out, "<circle cx=\"{}\" cy=\"{}\" r=\"4\" fill=\"{}\"/>\n", px(sx(step)),
                       px(sy(v)), s.colour);
  }
  // The legend, right-aligned above the plot.
  double lx = kLeft + w;
  for (auto it = series.rbegin(); it != series.rend(); ++it) {
    if (it->points.empty()) continue;
    const double text_w = 7.0 * static_cast<double>(it->label.size());
    lx -= text_w;
    fmt::format_to(out, "<text class=\"legend\" x=\"{}\" y=\"34\">{}</text>\n", px(lx),
                   html_escape(it->label));
    lx -= 30;
    fmt::format_to(out,
                   "<line x1=\"{}\" y1=\"30\" x2=\"{}\" y2=\"30\" stroke=\"{}\" "
                   "stroke-width=\"3\"{}/>\n",
                   px(lx), px(lx + 24), it->colour, it->dashed ? " stroke-dasharray=\"6 3\"" : "");
    lx -= 12;
  }
  fmt::format_to(out, "</svg>\n");
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string lane_label(const TraceStream& s) {
  return fmt::format("{} / {}{}", s.process,
                     s.name.empty() ? fmt::format("tid {} (unnamed)", s.tid) : s.name,
                     s.legacy_default ? " [legacy default]" : "");
}

// The timeline of the trace's first steps: a lane per stream, a box per event.
void timeline(Out out, const TraceAnalysis& t, int max_steps) {
  const int steps = std::min(max_steps, static_cast<int>(t.steps.size()));
  std::vector<const TraceEvent*> shown;
  for (const TraceEvent& e : t.events)
    if (t.steps.empty() || (e.step >= 0 && e.step < steps)) shown.push_back(&e);
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const TraceEvent* e : shown) {
    lo = std::min(lo, e->start_ms);
    hi = std::max(hi, e->end_ms);
  }
  if (!(lo < hi)) {
    lo = shown.empty() ? 0 : lo;
    hi = lo + 1;
  }
  const bool cut = shown.size() > kMaxBoxes;
  if (cut) shown.resize(kMaxBoxes);
  const bool neither =
      std::any_of(shown.begin(), shown.end(), [](const TraceEvent* e) { return e->neither; });

  fmt::format_to(out, "<h2>Timeline</h2>\n<p class=\"note\">");
  if (t.steps.empty())
    fmt::format_to(out, "The whole trace ({} format, no steps)", html_escape(t.format));
  else
    fmt::format_to(out, "The first {} of the trace's {} step(s) ({} format)", steps, t.steps.size(),
                   html_escape(t.format));
  fmt::format_to(out,
                 ": {} event(s) on {} stream(s) over {} ms; <span class=\"key\" "
                 "style=\"background:{}\"></span> compute, <span class=\"key\" "
                 "style=\"background:{}\"></span> communication{}.{}</p>\n",
                 shown.size(), t.streams.size(), ms_text(hi - lo), kComputeColour, kCommColour,
                 neither ? fmt::format(", <span class=\"key\" style=\"background:{}\"></span> "
                                       "update (neither)",
                                       kNeitherColour)
                         : "",
                 cut ? fmt::format(" Only the first {} events are drawn.", kMaxBoxes) : "");

  constexpr double W = 1160, label_w = 260, right = 16, top = 30, lane_h = 24, gap = 6;
  const double plot_w = W - label_w - right;
  const double H = top + static_cast<double>(t.streams.size()) * (lane_h + gap) + 36;
  auto sx = [&](double ms) { return label_w + (ms - lo) / (hi - lo) * plot_w; };
  fmt::format_to(out,
                 "<svg class=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" "
                 "height=\"{}\" viewBox=\"0 0 {} {}\" data-t-min=\"{}\" data-t-max=\"{}\">\n",
                 W, px(H), W, px(H), lo, hi);
  const double bottom = H - 36;
  const Axis x = value_axis(0, hi - lo, true);
  const int ticks = static_cast<int>(std::floor((hi - lo) / x.tick + 1e-9));
  for (int i = 0; i <= ticks; ++i) {
    const double v = i * x.tick;
    const std::string xx = px(sx(lo + v));
    fmt::format_to(out,
                   "<line class=\"grid\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/><text "
                   "class=\"tick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                   xx, px(top - 4), xx, px(bottom), xx, px(bottom + 16), tick_text(v, x.tick));
  }
  fmt::format_to(out, "<text class=\"axis\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">ms</text>\n",
                 px(label_w + plot_w / 2), px(H - 4));
  for (int i = 0; i < steps; ++i) {
    const double a = std::max(lo, t.steps[static_cast<size_t>(i)].start_ms);
    fmt::format_to(out,
                   "<line class=\"step\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/><text "
                   "class=\"tick\" x=\"{}\" y=\"{}\">{}</text>\n",
                   px(sx(a)), px(top - 14), px(sx(a)), px(bottom), px(sx(a) + 3), px(top - 6),
                   html_escape(t.steps[static_cast<size_t>(i)].name));
  }
  std::map<std::pair<int64_t, int64_t>, size_t> lane_of;
  for (size_t i = 0; i < t.streams.size(); ++i) lane_of[{t.streams[i].pid, t.streams[i].tid}] = i;
  std::vector<std::string> lanes(t.streams.size());
  for (const TraceEvent* e : shown) {
    const auto it = lane_of.find({e->pid, e->tid});
    if (it == lane_of.end()) continue;
    const double y = top + static_cast<double>(it->second) * (lane_h + gap);
    const double x0 = sx(e->start_ms), wbox = std::max(0.75, sx(e->end_ms) - x0);
    fmt::format_to(std::back_inserter(lanes[it->second]),
                   "<rect class=\"op {}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" "
                   "fill=\"{}\"><title>{} ({} ms)</title></rect>\n",
                   e->neither ? "neither"
                   : e->comm  ? "comm"
                              : "compute",
                   px(x0), px(y), px(wbox), px(lane_h),
                   e->neither ? kNeitherColour
                   : e->comm  ? kCommColour
                              : kComputeColour,
                   html_escape(e->name), ms_text(e->end_ms - e->start_ms));
  }
  for (size_t i = 0; i < t.streams.size(); ++i) {
    const double y = top + static_cast<double>(i) * (lane_h + gap);
    const std::string label = lane_label(t.streams[i]);
    fmt::format_to(out,
                   "<g class=\"lane\" data-lane=\"{}\"><rect class=\"lane-bg\" x=\"{}\" y=\"{}\" "
                   "width=\"{}\" height=\"{}\"/><text class=\"lane-label\" x=\"{}\" "
                   "y=\"{}\">{}</text>\n{}</g>\n",
                   i, px(label_w), px(y), px(plot_w), px(lane_h), 6, px(y + lane_h / 2 + 4),
                   html_escape(label), lanes[i]);
  }
  fmt::format_to(out, "</svg>\n");
}

}  // namespace

std::string html_escape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

ReportMetrics report_parse_metrics(const std::string& text, const std::string& name) {
  ReportMetrics m;
  std::map<int64_t, ReportStep> steps;
  size_t pos = 0, line_no = 0;
  bool any_line = false;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    any_line = true;
    const std::string where = fmt::format("the metrics file '{}', line {}", name, line_no);
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      TD_THROW("{} is not JSON: {}", where, e.what());
    }
    TD_CHECK(j.is_object(), "{} is not a JSON object", where);
    const auto summary = j.find("summary");
    if (summary != j.end() && summary->is_boolean() && summary->get<bool>()) {
      const auto model = j.find("model");
      if (model != j.end() && model->is_string()) m.model = model->get<std::string>();
      const auto p = j.find("predicted");
      if (p != j.end() && p->is_object()) {
        ReportPrediction r;
        const std::string in = where + ", \"predicted\"";
        r.step_ms = number_at(*p, "step_ms", in);
        r.exposed_comm_ms = number_at(*p, "exposed_comm_ms", in);
        const auto hw = p->find("hardware");
        if (hw != p->end() && hw->is_string()) r.hardware = hw->get<std::string>();
        m.predicted = r;
      }
      continue;
    }
    const auto step = j.find("step");
    TD_CHECK(step != j.end(),
             "{} is neither a step (it has no \"step\") nor the summary (\"summary\": true)",
             where);
    TD_CHECK(step->is_number_integer() && step->get<int64_t>() > 0,
             "{}: \"step\" is not a positive integer", where);
    ReportStep s;
    s.step = step->get<int64_t>();
    const auto loss = j.find("loss");
    const auto skipped = j.find("skipped");
    if (loss != j.end() && loss->is_null() && skipped != j.end() && skipped->is_boolean() &&
        skipped->get<bool>())
      s.loss.reset();
    else
      s.loss = number_at(j, "loss", where);
    s.tokens_per_s = number_at(j, "tokens_per_s", where);
    s.step_ms = number_at(j, "step_ms", where);
    s.exposed_comm_ms = number_at(j, "exposed_comm_ms", where);
    steps[s.step] = s;
  }
  TD_CHECK(!steps.empty(), "the metrics file '{}' holds no steps ({})", name,
           any_line ? "no line has a \"step\"" : "it is empty");
  for (const auto& [n, s] : steps) m.steps.push_back(s);
  return m;
}

ReportMetrics report_read_metrics(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TD_CHECK(in.good(), "cannot read the metrics file '{}'", path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return report_parse_metrics(text, path);
}

std::string report_html(const ReportMetrics& m, const TraceAnalysis* trace,
                        const ReportOptions& o) {
  TD_CHECK(!m.steps.empty(), "a report needs at least one step");
  std::string title = "tandem report";
  if (!m.model.empty()) title += ": " + m.model;
  if (!o.source.empty()) title += m.model.empty() ? ": " + o.source : " (" + o.source + ")";
  std::string html;
  Out out(html);
  fmt::format_to(out,
                 "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                 "<title>{}</title>\n<style>\n"
                 "body {{ font-family: sans-serif; color: #222; background: #fff; margin: 16px; "
                 "}}\n"
                 "h1 {{ font-size: 20px; }} h2 {{ font-size: 16px; margin-top: 18px; }}\n"
                 ".charts {{ display: flex; flex-wrap: wrap; gap: 8px; }}\n"
                 "svg text {{ font-family: sans-serif; font-size: 12px; fill: #222; }}\n"
                 "svg text.title {{ font-size: 14px; font-weight: bold; }}\n"
                 "svg .grid {{ stroke: #e4e4e4; stroke-width: 1; }}\n"
                 "svg .plot {{ fill: none; stroke: #888; stroke-width: 1; }}\n"
                 "svg .step {{ stroke: #888; stroke-width: 1; stroke-dasharray: 4 3; }}\n"
                 "svg .lane-bg {{ fill: #f4f4f4; }}\n"
                 "table {{ border-collapse: collapse; }} td, th {{ padding: 2px 10px; "
                 "text-align: right; border-bottom: 1px solid #ddd; }}\n"
                 ".key {{ display: inline-block; width: 12px; height: 12px; }}\n"
                 ".note {{ color: #444; font-size: 13px; }}\n"
                 "</style>\n</head>\n<body>\n<h1>{}</h1>\n",
                 html_escape(title), html_escape(title));

  const ReportStep& first = m.steps.front();
  const ReportStep& last = m.steps.back();
  fmt::format_to(out, "<p class=\"note\">{} step(s), {} to {}", m.steps.size(), first.step,
                 last.step);
  if (trace != nullptr)
    fmt::format_to(out, "; trace: {} stream(s), {} step(s)", trace->streams.size(),
                   trace->steps.size());
  fmt::format_to(out, ".</p>\n");

  // Measured medians next to the prediction.
  std::vector<double> step_ms, exposed, tokens;
  for (const ReportStep& s : m.steps) {
    step_ms.push_back(s.step_ms);
    exposed.push_back(s.exposed_comm_ms);
    tokens.push_back(s.tokens_per_s);
  }
  // tokens_per_s = the step's tokens / step_ms: the same tokens every step.
  const double tokens_per_step = last.tokens_per_s * last.step_ms / 1e3;
  const std::optional<ReportPrediction>& p = m.predicted;
  const double predicted_tokens = p && p->step_ms > 0 ? tokens_per_step / (p->step_ms / 1e3) : 0.0;
  fmt::format_to(
      out, "<table>\n<tr><th></th><th>measured (median of the steps)</th><th>{}</th></tr>\n",
      p ? fmt::format("predicted ({})",
                      html_escape(p->hardware.empty() ? std::string("planner") : p->hardware))
        : std::string("predicted: none in the metrics file"));
  auto row = [&](const char* what, double measured, const std::string& predicted) {
    fmt::format_to(out, "<tr><td>{}</td><td>{}</td><td>{}</td></tr>\n", what,
                   html_escape(ms_text(measured)), html_escape(predicted));
  };
  row("step time (ms)", median(step_ms), p ? ms_text(p->step_ms) : "");
  row("exposed communication (ms)", median(exposed), p ? ms_text(p->exposed_comm_ms) : "");
  fmt::format_to(out, "<tr><td>tokens/s</td><td>{:.0f}</td><td>{}</td></tr>\n</table>\n",
                 median(tokens), p ? fmt::format("{:.0f}", predicted_tokens) : "");

  const Axis x = step_axis(static_cast<double>(first.step), static_cast<double>(last.step));
  auto measured = [&](const char* id, const char* label, const char* colour, auto value) {
    Series s{id, label, colour, false, {}};
    for (const ReportStep& st : m.steps)
      if (const std::optional<double> v = value(st)) s.points.emplace_back(st.step, *v);
    return s;
  };
  // The predicted series are labelled with the planner's hardware.
  const std::string hw = p && !p->hardware.empty() ? " (" + p->hardware + ")" : "";
  auto predicted = [&](const char* id, const char* colour, double v) {
    Series s{id, "predicted" + hw, colour, true, {}};
    if (p)
      for (const ReportStep& st : m.steps) s.points.emplace_back(st.step, v);
    return s;
  };
  fmt::format_to(out, "<div class=\"charts\">\n");
  chart(out, "chart-loss", "loss", false, x,
        {measured("loss", "measured", kLossColour, [](const ReportStep& s) { return s.loss; })});
  chart(out, "chart-tokens", "tokens/s", true, x,
        {measured("tokens_per_s", "measured", kTokensColour,
                  [](const ReportStep& s) { return std::optional<double>(s.tokens_per_s); }),
         predicted("predicted_tokens_per_s", kTokensPredictedColour, predicted_tokens)});
  chart(out, "chart-step", "step time (ms)", true, x,
        {measured("step_ms", "measured", kStepColour,
                  [](const ReportStep& s) { return std::optional<double>(s.step_ms); }),
         predicted("predicted_step_ms", kStepPredictedColour, p ? p->step_ms : 0)});
  chart(out, "chart-exposed", "exposed communication (ms)", true, x,
        {measured("exposed_comm_ms", "measured", kExposedColour,
                  [](const ReportStep& s) { return std::optional<double>(s.exposed_comm_ms); }),
         predicted("predicted_exposed_comm_ms", kExposedPredictedColour,
                   p ? p->exposed_comm_ms : 0)});
  fmt::format_to(out, "</div>\n");
  if (trace != nullptr) timeline(out, *trace, o.timeline_steps);
  fmt::format_to(out, "</body>\n</html>\n");
  return html;
}

}  // namespace tandem
