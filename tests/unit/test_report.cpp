// tandem report: the metrics file's reader and its errors, the page's structure (a point per
// step in every series, a value where the axes put it, a lane per stream, nothing fetched,
// text escaped), the command line, and the page as headless Chromium draws it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "core/error.h"
#include "fault_util.h"
#include "plan/report.h"
#include "plan/trace_analyze.h"

namespace tandem {
namespace {

// Step s: loss 4 - (s - 1) / 2, step time 500 + 10 s ms for 2048 tokens, exposed s / 2 ms.
constexpr int kSteps = 5;
constexpr double kTokensPerStep = 2048;

double loss_at(int s) {
  return 4 - 0.5 * (s - 1);
}
double step_ms_at(int s) {
  return 500 + 10 * s;
}

std::string step_line(int s) {
  return nlohmann::json{{"step", s},
                        {"loss", loss_at(s)},
                        {"lr", 1e-3},
                        {"grad_norm", 1.0},
                        {"tokens_per_s", kTokensPerStep / (step_ms_at(s) / 1e3)},
                        {"step_ms", step_ms_at(s)},
                        {"compute_ms", 400.0},
                        {"comm_ms", 20.0},
                        {"exposed_comm_ms", 0.5 * s},
                        {"peak_mem_bytes", 1 << 20}}
      .dump();
}

// The summary line `tandem train` ends the file with: predicted 480 ms and 1.25 ms exposed.
std::string summary_line() {
  return nlohmann::json{{"summary", true},
                        {"steps", kSteps},
                        {"measured", {{"step_ms", 530.0}, {"exposed_comm_ms", 1.5}}},
                        {"predicted",
                         {{"hardware", "h200-sxm"},
                          {"source", "preset"},
                          {"step_ms", 480.0},
                          {"exposed_comm_ms", 1.25},
                          {"compute_ms", 470.0},
                          {"comm_ms", 30.0}}},
                        {"model", "tiny <gpt> & \"co\""}}
      .dump();
}

std::string metrics_text() {
  std::string t;
  for (int s = 1; s <= kSteps; ++s) t += step_line(s) + "\n";
  return t + summary_line() + "\n";
}

// A tandem trace of 4 steps on three tracks of one rank; step k (from 10 k ms): forward
// [0, 4) and backward [4, 8) on "compute", a gather [1, 3) on "all-gather", a reduce-scatter
// [6, 9) on a track whose name needs escaping.
nlohmann::json tandem_trace() {
  nlohmann::json ev = nlohmann::json::array();
  ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", 0}, {"args", {{"name", "rank 0"}}}});
  auto track = [&](int tid, const std::string& name) {
    ev.push_back({{"ph", "M"},
                  {"name", "thread_name"},
                  {"pid", 0},
                  {"tid", tid},
                  {"args", {{"name", name}}}});
  };
  track(0, "compute");
  track(1, "all-gather");
  track(2, "reduce-scatter <rs>");
  auto op = [&](const std::string& name, int tid, double a, double b, int step) {
    ev.push_back({{"ph", "X"},
                  {"name", name},
                  {"pid", 0},
                  {"tid", tid},
                  {"ts", a * 1e3},
                  {"dur", (b - a) * 1e3},
                  {"args", {{"step", step}}}});
  };
  for (int k = 1; k <= 4; ++k) {
    const double t = 10.0 * k;
    op("forward <block.0> & more", 0, t, t + 4, k);
    op("gather block.1", 1, t + 1, t + 3, k);
    op("backward block.0", 0, t + 4, t + 8, k);
    op("reduce-scatter block.0", 2, t + 6, t + 9, k);
  }
  return {{"traceEvents", ev}};
}

// Every opening tag `<name ...>` of the page.
std::vector<std::string> tags(const std::string& html, const std::string& name) {
  std::vector<std::string> out;
  const std::string open = "<" + name + " ";
  for (size_t at = html.find(open); at != std::string::npos; at = html.find(open, at + 1))
    out.push_back(html.substr(at, html.find('>', at) - at + 1));
  return out;
}

std::string attr(const std::string& tag, const std::string& name) {
  const std::string key = " " + name + "=\"";
  const size_t at = tag.find(key);
  if (at == std::string::npos) return "";
  const size_t from = at + key.size();
  return tag.substr(from, tag.find('"', from) - from);
}

double num_attr(const std::string& tag, const std::string& name) {
  const std::string v = attr(tag, name);
  EXPECT_FALSE(v.empty()) << name << " missing in " << tag;
  return v.empty() ? 0 : std::stod(v);
}

std::vector<std::pair<double, double>> points_of(const std::string& polyline) {
  std::vector<std::pair<double, double>> out;
  std::istringstream in(attr(polyline, "points"));
  std::string p;
  while (in >> p) {
    const size_t comma = p.find(',');
    out.emplace_back(std::stod(p.substr(0, comma)), std::stod(p.substr(comma + 1)));
  }
  return out;
}

// The SVG chart with this id: its opening tag and its body.
std::pair<std::string, std::string> chart_of(const std::string& html, const std::string& id) {
  const size_t at = html.find("id=\"" + id + "\"");
  EXPECT_NE(at, std::string::npos) << id;
  if (at == std::string::npos) return {};
  const size_t open = html.rfind("<svg", at);
  const size_t end = html.find("</svg>", at);
  return {html.substr(open, html.find('>', open) - open + 1), html.substr(open, end - open)};
}

std::string polyline_in(const std::string& body, const std::string& series) {
  for (const std::string& t : tags(body, "polyline"))
    if (attr(t, "data-series") == series) return t;
  ADD_FAILURE() << "no series " << series;
  return "";
}

// Where a chart puts (step, value): from its axes' ranges and its plot area.
std::pair<double, double> expected_xy(const std::string& svg, const std::string& body, double step,
                                      double value) {
  const std::vector<std::string> plot = tags(body, "rect");
  std::string area;
  for (const std::string& r : plot)
    if (attr(r, "class") == "plot") area = r;
  EXPECT_FALSE(area.empty());
  const double x = num_attr(area, "x"), y = num_attr(area, "y");
  const double w = num_attr(area, "width"), h = num_attr(area, "height");
  const double x0 = num_attr(svg, "data-x-min"), x1 = num_attr(svg, "data-x-max");
  const double y0 = num_attr(svg, "data-y-min"), y1 = num_attr(svg, "data-y-max");
  return {x + (step - x0) / (x1 - x0) * w, y + h - (value - y0) / (y1 - y0) * h};
}

TEST(Report, ReadsStepsPredictionAndModel) {
  // A resumed run wrote steps 2 and 3 twice: the later lines count.
  std::string text = step_line(1) + "\n" + step_line(2) + "\n" + step_line(3) + "\n";
  nlohmann::json again = nlohmann::json::parse(step_line(2));
  again["loss"] = 9.0;
  text += again.dump() + "\n\n" + step_line(3) + "\n";
  nlohmann::json skipped = nlohmann::json::parse(step_line(4));
  skipped["loss"] = nullptr;
  skipped["skipped"] = true;
  skipped["nonfinite"] = {"loss"};
  text += skipped.dump() + "\n" + summary_line() + "\n";
  const ReportMetrics m = report_parse_metrics(text, "m.jsonl");
  ASSERT_EQ(m.steps.size(), 4u);
  EXPECT_EQ(m.steps[1].step, 2);
  ASSERT_TRUE(m.steps[1].loss.has_value());
  EXPECT_DOUBLE_EQ(*m.steps[1].loss, 9.0);
  EXPECT_FALSE(m.steps[3].loss.has_value());
  EXPECT_DOUBLE_EQ(m.steps[2].step_ms, step_ms_at(3));
  EXPECT_DOUBLE_EQ(m.steps[3].exposed_comm_ms, 2.0);
  ASSERT_TRUE(m.predicted.has_value());
  EXPECT_EQ(m.predicted->hardware, "h200-sxm");
  EXPECT_DOUBLE_EQ(m.predicted->step_ms, 480);
  EXPECT_DOUBLE_EQ(m.predicted->exposed_comm_ms, 1.25);
  EXPECT_EQ(m.model, "tiny <gpt> & \"co\"");
  // Without a summary: no prediction, no model.
  const ReportMetrics plain = report_parse_metrics(step_line(1) + "\n", "m.jsonl");
  EXPECT_FALSE(plain.predicted.has_value());
  EXPECT_TRUE(plain.model.empty());
}

TEST(Report, MetricsErrorsNameTheLine) {
  auto error_of = [](const std::string& text) -> std::string {
    try {
      report_parse_metrics(text, "m.jsonl");
    } catch (const Error& e) {
      return e.message();
    }
    return "(no error)";
  };
  const std::string good = step_line(1) + "\n";
  EXPECT_NE(error_of("").find("holds no steps (it is empty)"), std::string::npos) << error_of("");
  EXPECT_NE(error_of("\n  \n").find("it is empty"), std::string::npos);
  EXPECT_NE(error_of(summary_line() + "\n").find("no line has a \"step\""), std::string::npos);
  const std::string bad_json = error_of(good + good + "{\"step\": 3, \"loss\":\n");
  EXPECT_NE(bad_json.find("'m.jsonl', line 3 is not JSON"), std::string::npos) << bad_json;
  EXPECT_NE(error_of(good + "[1, 2]\n").find("line 2 is not a JSON object"), std::string::npos);
  EXPECT_NE(error_of(good + "{\"loss\": 1}\n").find("line 2 is neither a step"), std::string::npos);
  nlohmann::json no_tokens = nlohmann::json::parse(step_line(2));
  no_tokens.erase("tokens_per_s");
  const std::string missing = error_of(good + no_tokens.dump() + "\n");
  EXPECT_NE(missing.find("line 2: \"tokens_per_s\" is missing or not a number"), std::string::npos)
      << missing;
  nlohmann::json null_loss = nlohmann::json::parse(step_line(2));
  null_loss["loss"] = nullptr;  // null without "skipped": not a step tandem writes
  EXPECT_NE(error_of(good + null_loss.dump() + "\n").find("line 2: \"loss\""), std::string::npos);
  nlohmann::json bad_step = nlohmann::json::parse(step_line(2));
  bad_step["step"] = "two";
  EXPECT_NE(error_of(good + bad_step.dump() + "\n").find("line 2: \"step\" is not a positive"),
            std::string::npos);
  try {
    report_read_metrics("/nonexistent/metrics.jsonl");
    FAIL() << "a missing file was read";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("cannot read the metrics file '/nonexistent/metrics.jsonl'"),
              std::string::npos)
        << e.message();
  }
}

TEST(Report, PageHoldsEverySeriesStreamAndNothingFetched) {
  const ReportMetrics m = report_parse_metrics(metrics_text(), "m.jsonl");
  const TraceAnalysis trace = trace_analyze(tandem_trace());
  ASSERT_EQ(trace.streams.size(), 3u);
  ReportOptions o;
  o.source = "runs/<a>.jsonl";
  const std::string html = report_html(m, &trace, o);

  // A point per step in every series: 4 measured, 3 predicted.
  const std::vector<std::string> lines = tags(html, "polyline");
  std::set<std::string> series;
  for (const std::string& l : lines) {
    series.insert(attr(l, "data-series"));
    EXPECT_EQ(points_of(l).size(), static_cast<size_t>(kSteps)) << l;
  }
  EXPECT_EQ(series, (std::set<std::string>{"loss", "tokens_per_s", "predicted_tokens_per_s",
                                           "step_ms", "predicted_step_ms", "exposed_comm_ms",
                                           "predicted_exposed_comm_ms"}));
  EXPECT_EQ(lines.size(), series.size());

  // Step 3's loss (3.0) in the loss chart: steps 1..5 across, loss 2..4 (ticks of 0.5) up.
  {
    const auto [svg, body] = chart_of(html, "chart-loss");
    EXPECT_DOUBLE_EQ(num_attr(svg, "data-x-min"), 1);
    EXPECT_DOUBLE_EQ(num_attr(svg, "data-x-max"), kSteps);
    EXPECT_DOUBLE_EQ(num_attr(svg, "data-y-min"), 2);
    EXPECT_DOUBLE_EQ(num_attr(svg, "data-y-max"), 4);
    const auto [x, y] = expected_xy(svg, body, 3, loss_at(3));
    const auto p = points_of(polyline_in(body, "loss"));
    EXPECT_NEAR(p[2].first, x, 0.01);
    EXPECT_NEAR(p[2].second, y, 0.01);
    // The middle of the plot, both ways.
    const std::string plot = tags(body, "rect")[0];
    EXPECT_NEAR(x, num_attr(plot, "x") + num_attr(plot, "width") / 2, 0.01);
    EXPECT_NEAR(y, num_attr(plot, "y") + num_attr(plot, "height") / 2, 0.01);
    EXPECT_NE(body.find(">4.0</text>"), std::string::npos);  // the top tick's label
  }
  // The predicted tokens/s: the step's 2048 tokens over the predicted 480 ms.
  {
    const auto [svg, body] = chart_of(html, "chart-tokens");
    const auto p = points_of(polyline_in(body, "predicted_tokens_per_s"));
    const auto [x, y] = expected_xy(svg, body, 1, kTokensPerStep / 0.480);
    EXPECT_NEAR(p[0].first, x, 0.01);
    EXPECT_NEAR(p[0].second, y, 0.01);
    EXPECT_DOUBLE_EQ(num_attr(svg, "data-y-min"), 0);  // rates from zero
  }
  {
    const auto [svg, body] = chart_of(html, "chart-exposed");
    const auto p = points_of(polyline_in(body, "predicted_exposed_comm_ms"));
    const auto [x, y] = expected_xy(svg, body, kSteps, 1.25);
    EXPECT_NEAR(p[kSteps - 1].first, x, 0.01);
    EXPECT_NEAR(p[kSteps - 1].second, y, 0.01);
  }

  // A lane per stream, labelled; the first 3 steps' 12 events, 6 of them communication.
  const std::vector<std::string> lanes = tags(html, "g");
  ASSERT_EQ(lanes.size(), trace.streams.size());
  for (size_t i = 0; i < lanes.size(); ++i)
    EXPECT_EQ(attr(lanes[i], "data-lane"), std::to_string(i));
  EXPECT_NE(html.find(">rank 0 / compute</text>"), std::string::npos);
  EXPECT_NE(html.find(">rank 0 / all-gather</text>"), std::string::npos);
  EXPECT_NE(html.find(">rank 0 / reduce-scatter &lt;rs&gt;</text>"), std::string::npos);
  int comm = 0, compute = 0;
  for (const std::string& r : tags(html, "rect")) {
    comm += attr(r, "class") == "op comm";
    compute += attr(r, "class") == "op compute";
  }
  EXPECT_EQ(comm, 6);
  EXPECT_EQ(compute, 6);

  // Self-contained: no address but the SVG namespace, nothing that loads anything.
  for (size_t at = html.find("http"); at != std::string::npos; at = html.find("http", at + 1))
    EXPECT_EQ(html.compare(at, 26, "http://www.w3.org/2000/svg"), 0) << html.substr(at, 60);
  for (const char* loads :
       {"<script", "<link", "<img", "<iframe", "src=", "href=", "url(", "@import", "@font-face"})
    EXPECT_EQ(html.find(loads), std::string::npos) << loads;
  // Text from the files is escaped.
  EXPECT_NE(html.find("tiny &lt;gpt&gt; &amp; &quot;co&quot; (runs/&lt;a&gt;.jsonl)"),
            std::string::npos);
  EXPECT_NE(html.find("forward &lt;block.0&gt; &amp; more"), std::string::npos);
  EXPECT_EQ(html.find("<gpt>"), std::string::npos);
  EXPECT_EQ(html.find("<block.0>"), std::string::npos);
  EXPECT_EQ(html.find("<rs>"), std::string::npos);
  EXPECT_EQ(html_escape("a<b>&\"c'"), "a&lt;b&gt;&amp;&quot;c&#39;");
}

// Without a summary the predicted series are left out, and so is the timeline without a trace.
TEST(Report, WithoutPredictionOrTrace) {
  std::string text;
  for (int s = 1; s <= kSteps; ++s) text += step_line(s) + "\n";
  const std::string html = report_html(report_parse_metrics(text, "m.jsonl"), nullptr, {});
  std::set<std::string> series;
  for (const std::string& l : tags(html, "polyline")) series.insert(attr(l, "data-series"));
  EXPECT_EQ(series, (std::set<std::string>{"loss", "tokens_per_s", "step_ms", "exposed_comm_ms"}));
  EXPECT_NE(html.find("predicted: none in the metrics file"), std::string::npos);
  EXPECT_EQ(html.find("class=\"timeline\""), std::string::npos);
}

// [Update at gather] An update op is drawn as neither compute nor communication, with its
// own key; a timeline without one has no such key.
TEST(Report, UpdateOpsAreDrawnAsNeither) {
  std::string text;
  for (int s = 1; s <= kSteps; ++s) text += step_line(s) + "\n";
  const ReportMetrics m = report_parse_metrics(text, "m.jsonl");
  for (const bool update : {true, false}) {
    SCOPED_TRACE(update ? "with an update" : "without");
    nlohmann::json ev = nlohmann::json::array();
    auto op = [](const std::string& name, int64_t tid, double a, double b, const std::string& cat) {
      return nlohmann::json{
          {"ph", "X"},  {"name", name},  {"cat", cat},           {"pid", 0},
          {"tid", tid}, {"ts", a * 1e3}, {"dur", (b - a) * 1e3}, {"args", {{"step", 1}}}};
    };
    ev.push_back(op("forward block.0", 0, 0, 4, "forward"));
    ev.push_back(op("gather block.1", 1, 0, 2, "gather"));
    if (update) ev.push_back(op("update block.1", 1, 2, 3, "update"));
    const TraceAnalysis trace = trace_analyze({{"traceEvents", ev}});
    const std::string html = report_html(m, &trace, {});
    int comm = 0, compute = 0, neither = 0;
    for (const std::string& r : tags(html, "rect")) {
      comm += attr(r, "class") == "op comm";
      compute += attr(r, "class") == "op compute";
      neither += attr(r, "class") == "op neither";
    }
    EXPECT_EQ(comm, 1);
    EXPECT_EQ(compute, 1);
    EXPECT_EQ(neither, update ? 1 : 0);
    EXPECT_EQ(html.find("update (neither)") != std::string::npos, update);
  }
}

// Values that do not change (or only in their last bit) still get an axis around them, with
// ticks: a flat loss, and no exposed communication at all.
TEST(Report, FlatSeriesGetAnAxis) {
  std::string text;
  for (int s = 1; s <= 3; ++s) {
    nlohmann::json j = nlohmann::json::parse(step_line(s));
    j["loss"] = s == 2 ? std::nextafter(2.0, 3.0) : 2.0;
    j["exposed_comm_ms"] = 0.0;
    text += j.dump() + "\n";
  }
  const std::string html = report_html(report_parse_metrics(text, "m.jsonl"), nullptr, {});
  const auto [loss, loss_body] = chart_of(html, "chart-loss");
  EXPECT_LT(num_attr(loss, "data-y-min"), 2.0);
  EXPECT_GT(num_attr(loss, "data-y-max"), 2.0);
  EXPECT_GE(tags(loss_body, "text").size(), 5u);  // title, axis label and tick labels
  const auto [exposed, exposed_body] = chart_of(html, "chart-exposed");
  EXPECT_DOUBLE_EQ(num_attr(exposed, "data-y-min"), 0);
  EXPECT_DOUBLE_EQ(num_attr(exposed, "data-y-max"), 1);
  const auto p = points_of(polyline_in(exposed_body, "exposed_comm_ms"));
  ASSERT_EQ(p.size(), 3u);
  EXPECT_NEAR(p[0].second, expected_xy(exposed, exposed_body, 1, 0).second, 0.01);
}

TEST(Report, CommandWritesThePage) {
  cli_test::TempDir dir;
  const std::string metrics = dir / "m.jsonl", out = dir / "report.html";
  std::ofstream(metrics) << metrics_text();
  const std::string trace =
      std::string(TANDEM_TEST_DATA_DIR) + "/fixtures/traces/pytorch_legacy_default.json.gz";
  const cli_test::RunResult r =
      cli_test::run_tandem({"report", metrics, "--trace", trace, "--out", out});
  ASSERT_TRUE(cli_test::succeeded(r));
  EXPECT_NE(r.out.find("5 step(s), predicted next to measured, a timeline of 2 stream(s)"),
            std::string::npos)
      << r.out;
  std::ifstream in(out);
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(html.find("GPU 0 / stream 7 [legacy default]"), std::string::npos);
  EXPECT_EQ(tags(html, "g").size(), 2u);

  std::ofstream(dir / "bad.jsonl") << step_line(1) << "\n" << step_line(2) << "\nnot json\n";
  EXPECT_TRUE(cli_test::one_error_line(
      cli_test::run_tandem({"report", dir / "bad.jsonl", "--out", dir / "bad.html"}), 1,
      {"line 3 is not JSON"}));
  EXPECT_FALSE(std::filesystem::exists(dir / "bad.html"));
  std::ofstream(dir / "empty.jsonl") << "";
  EXPECT_TRUE(cli_test::one_error_line(
      cli_test::run_tandem({"report", dir / "empty.jsonl", "--out", dir / "e.html"}), 1,
      {"holds no steps (it is empty)"}));
  EXPECT_TRUE(cli_test::one_error_line(
      cli_test::run_tandem({"report", dir / "missing.jsonl", "--out", dir / "e.html"}), 1,
      {"cannot read the metrics file"}));
  EXPECT_TRUE(cli_test::one_error_line(cli_test::run_tandem({"report", metrics}), 2, {"--out"}));
}

// End to end: the metrics of a real `tandem train` run, whose summary names the model and
// carries the planner's prediction.
TEST(Report, OfATrainingRun) {
  cli_test::TempDir dir;
  const std::string data = cli_test::token_file(dir), metrics = dir / "m.jsonl";
  ASSERT_TRUE(cli_test::succeeded(cli_test::run_tandem(
      {"train", "--model", "gpt2-tiny", "--data", data, "--seq", "16", "--batch", "1", "--steps",
       "3", "--progress", "none", "--hardware", "h200-sxm", "--metrics", metrics})));
  const ReportMetrics m = report_read_metrics(metrics);
  ASSERT_EQ(m.steps.size(), 3u);
  EXPECT_EQ(m.model, "gpt2-tiny");
  ASSERT_TRUE(m.predicted.has_value());
  EXPECT_EQ(m.predicted->hardware, "h200-sxm");
  ASSERT_TRUE(
      cli_test::succeeded(cli_test::run_tandem({"report", metrics, "--out", dir / "report.html"})));
  std::ifstream in(dir / "report.html");
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(html.find("<h1>tandem report: gpt2-tiny ("), std::string::npos);
  const std::vector<std::string> lines = tags(html, "polyline");
  EXPECT_EQ(lines.size(), 7u);
  for (const std::string& l : lines) EXPECT_EQ(points_of(l).size(), 3u) << l;
}

// Headless Chromium's screenshot of the page shows every series and both kinds of timeline
// box: pixels of each colour the page draws them in, more than a legend swatch (24 x 3 pixels)
// could account for. CI installs Chromium (scripts/install-deps.sh); elsewhere the test skips
// when it is missing.
TEST(ReportChromium, ScreenshotShowsEverySeries) {
  std::string chromium;
  for (const char* name : {"chromium", "chromium-browser"})
    if (std::system(("command -v " + std::string(name) + " >/dev/null 2>&1").c_str()) == 0) {
      chromium = name;
      break;
    }
  if (chromium.empty())
    GTEST_SKIP() << "chromium is not installed (Debian's package chromium; "
                    "scripts/install-deps.sh installs it)";

  cli_test::TempDir dir;
  const ReportMetrics m = report_parse_metrics(metrics_text(), "m.jsonl");
  const TraceAnalysis trace = trace_analyze(tandem_trace());
  const std::string page = report_html(m, &trace, {});
  std::ofstream(dir / "report.html") << page;

  // The colours the page draws each series and box kind in, read from the page itself.
  std::map<std::string, std::string> colour_of;
  for (const std::string& l : tags(page, "polyline"))
    colour_of[attr(l, "data-series")] = attr(l, "stroke");
  for (const std::string& r : tags(page, "rect"))
    if (attr(r, "class").rfind("op ", 0) == 0) colour_of[attr(r, "class")] = attr(r, "fill");
  ASSERT_EQ(colour_of.size(), 9u);
  std::set<std::string> distinct;
  for (const auto& [what, colour] : colour_of) distinct.insert(colour);
  ASSERT_EQ(distinct.size(), colour_of.size()) << "two series share a colour";

  const std::string png = dir / "shot.png", log = dir / "chromium.log";
  const std::string shot =
      "timeout 120 " + chromium +
      " --headless --no-sandbox --disable-gpu --disable-dev-shm-usage --hide-scrollbars "
      "--user-data-dir=" +
      (dir / "profile") + " --screenshot=" + png + " --window-size=1200,1600 file://" +
      (dir / "report.html") + " >" + log + " 2>&1";
  const int rc = std::system(shot.c_str());
  std::ifstream log_in(log);
  const std::string log_text((std::istreambuf_iterator<char>(log_in)),
                             std::istreambuf_iterator<char>());
  ASSERT_EQ(rc, 0) << shot << "\n" << log_text;
  ASSERT_TRUE(std::filesystem::exists(png)) << log_text;

  std::string count = "python3 " + std::string(TANDEM_TEST_DATA_DIR) + "/unit/png_colours.py " +
                      png + " 0 '#123456'";
  for (const auto& [what, colour] : colour_of) count += " '" + colour + "'";
  FILE* pipe = popen(count.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  size_t n = 0;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << count << "\n" << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["width"], 1200);
  EXPECT_EQ(j["height"], 1600);
  EXPECT_EQ(j["counts"]["#123456"], 0);  // a colour the page does not use
  for (const auto& [what, colour] : colour_of)
    EXPECT_GT(j["counts"][colour].get<int>(), 250) << what << " (" << colour << ") is not drawn";
}

}  // namespace
}  // namespace tandem
