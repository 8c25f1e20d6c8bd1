// The trace analyzer ([Trace analysis] in trace_analyze.h): device events by stream, their
// unions and the communication that no other stream's compute covers.
#include "plan/trace_analyze.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <utility>

#include "core/error.h"
#include "core/intervals.h"
#include "shard/program.h"

namespace tandem {

namespace {

using Event = TraceEvent;

// NCCL's and RCCL's kernels, copies, and tandem's communication ops.
const char* kCommPattern =
    "nccl|rccl|memcpy|allgather|reducescatter|allreduce|sendrecv|broadcast|"
    "^gather( |$)|^reduce-scatter|all-reduce|^send( |$)|^recv( |$)";

// tandem's device work: no category (generation's traces), "probe" (the probes) or a program
// op's kind (the step traces: "forward", "gather", ...). Its waits ("exposed") are not work,
// and other tools' host events (PyTorch's "user_annotation", "cpu_op", ...) are not either.
bool is_tandem_category(const std::string& cat) {
  if (cat.empty() || cat == "probe") return true;
  for (int k = 0; k <= static_cast<int>(OpKind::recv); ++k)
    if (cat == op_kind_name(static_cast<OpKind>(k))) return true;
  return false;
}

bool is_device_category(const std::string& cat) {
  return cat == "kernel" || cat == "gpu_memcpy" || cat == "gpu_memset";
}

double num(const nlohmann::json& e, const char* key) {
  const auto it = e.find(key);
  return it != e.end() && it->is_number() ? it->get<double>() : 0.0;
}

TraceTimes times_of(const std::vector<const Event*>& mine, const Intervals& others_compute) {
  TraceTimes t;
  Intervals all, compute, comm;
  for (const Event* e : mine) {
    all.push_back({e->start_ms, e->end_ms});
    if (!e->neither) (e->comm ? comm : compute).push_back({e->start_ms, e->end_ms});
    ++t.events;
    t.comm_events += e->comm;
  }
  const Intervals c = merged(comm);
  t.busy_ms = length(merged(all));
  t.compute_ms = length(merged(compute));
  t.comm_ms = length(c);
  t.overlapped_ms = length(intersect(c, others_compute));
  t.exposed_ms = t.comm_ms - t.overlapped_ms;
  return t;
}

void add(TraceTimes& to, const TraceTimes& t) {
  to.busy_ms += t.busy_ms;
  to.compute_ms += t.compute_ms;
  to.comm_ms += t.comm_ms;
  to.overlapped_ms += t.overlapped_ms;
  to.exposed_ms += t.exposed_ms;
  to.events += t.events;
  to.comm_events += t.comm_events;
}

// The times of every stream over `events` (any subset), compute of the same process's other
// streams counting as cover.
std::map<std::pair<int64_t, int64_t>, TraceTimes> stream_times(const std::vector<Event>& events,
                                                               int step) {
  std::map<std::pair<int64_t, int64_t>, std::vector<const Event*>> by_stream;
  std::map<std::pair<int64_t, int64_t>, Intervals> compute;
  for (const Event& e : events) {
    if (step >= 0 && e.step != step) continue;
    by_stream[{e.pid, e.tid}].push_back(&e);
    if (!e.comm && !e.neither) compute[{e.pid, e.tid}].push_back({e.start_ms, e.end_ms});
  }
  std::map<std::pair<int64_t, int64_t>, TraceTimes> out;
  for (const auto& [key, mine] : by_stream) {
    Intervals others;
    for (const auto& [k, c] : compute)
      if (k.first == key.first && k.second != key.second)
        others.insert(others.end(), c.begin(), c.end());
    out[key] = times_of(mine, merged(others));
  }
  return out;
}

std::string ms_text(double ms) {
  return fmt::format("{:.3f}", ms);
}

// PyTorch ends its track names with a space ("stream 7 ").
std::string trimmed(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

}  // namespace

TraceAnalysis trace_analyze(const nlohmann::json& doc, const TraceAnalyzeOptions& options) {
  const nlohmann::json* events = nullptr;
  if (doc.is_object() && doc.contains("traceEvents") && doc["traceEvents"].is_array())
    events = &doc["traceEvents"];
  else if (doc.is_array())
    events = &doc;
  TD_CHECK(events != nullptr,
           "not a Chrome trace: expected an object with a traceEvents array (or an array of "
           "events)");
  std::vector<std::regex> comm{std::regex(kCommPattern, std::regex::icase)};
  for (const std::string& p : options.comm_patterns) {
    try {
      comm.emplace_back(p, std::regex::icase);
    } catch (const std::regex_error& e) {
      TD_THROW("--comm-kernels '{}' is not a regular expression: {}", p, e.what());
    }
  }
  auto is_comm = [&](const std::string& name) {
    for (const std::regex& r : comm)
      if (std::regex_search(name, r)) return true;
    return false;
  };

  TraceAnalysis a;
  bool pytorch = false;
  for (const auto& e : *events)
    pytorch = pytorch || (e.is_object() && is_device_category(e.value("cat", "")));
  a.format = pytorch ? "pytorch" : "tandem";

  std::map<int64_t, std::string> process_names, process_labels;
  std::map<std::pair<int64_t, int64_t>, std::string> thread_names;
  std::vector<Event> dev;
  std::vector<std::pair<double, std::string>> step_starts;  // PyTorch
  std::set<int64_t> tandem_steps;
  std::vector<int64_t> event_step;  // tandem: args.step per device event, -1 without
  for (const auto& e : *events) {
    if (!e.is_object()) continue;
    const std::string ph = e.value("ph", ""), name = e.value("name", "");
    const int64_t pid =
        e.contains("pid") && e["pid"].is_number_integer() ? e["pid"].get<int64_t>() : 0;
    const int64_t tid =
        e.contains("tid") && e["tid"].is_number_integer() ? e["tid"].get<int64_t>() : 0;
    if (ph == "M") {
      const std::string label =
          e.contains("args") && e["args"].is_object() ? e["args"].value("name", "") : "";
      if (name == "process_name") process_names[pid] = trimmed(label);
      if (name == "thread_name") thread_names[{pid, tid}] = trimmed(label);
      // PyTorch names every process after the program ("python3") and labels its devices
      // ("GPU 0").
      if (name == "process_labels" && e.contains("args") && e["args"].is_object() &&
          e["args"].contains("labels") && e["args"]["labels"].is_string())
        process_labels[pid] = trimmed(e["args"]["labels"].get<std::string>());
      continue;
    }
    if (ph != "X") continue;
    const std::string cat = e.value("cat", "");
    const double start = num(e, "ts") / 1e3, end = start + num(e, "dur") / 1e3;
    if (pytorch && name.rfind("ProfilerStep#", 0) == 0 && !is_device_category(cat)) {
      step_starts.emplace_back(start, name);
      continue;
    }
    // tandem's ops carry their phase as the category (the step trace: "forward", "gather",
    // ...; the probes: "probe") or none; its waits carry "exposed" and are not work.
    if (pytorch ? !is_device_category(cat) : !is_tandem_category(cat)) continue;
    const bool neither = !pytorch && cat == op_kind_name(OpKind::update);
    dev.push_back({pid, tid, name, start, end, !neither && is_comm(name), neither, -1});
    int64_t step = -1;
    if (!pytorch && e.contains("args") && e["args"].is_object() && e["args"].contains("step") &&
        e["args"]["step"].is_number_integer())
      step = e["args"]["step"].get<int64_t>();
    event_step.push_back(step);
    if (step >= 0) tandem_steps.insert(step);
  }
  TD_CHECK(!dev.empty(),
           "the trace holds no device work: no kernel, gpu_memcpy or gpu_memset events (PyTorch) "
           "and no complete events on named tracks (tandem)");

  // Steps: PyTorch's ProfilerStep#N windows, each until the next one starts; tandem's steps.
  if (pytorch) {
    std::sort(step_starts.begin(), step_starts.end());
    std::map<std::string, double> first;  // a step's name may repeat (nested annotations)
    for (const auto& [t, name] : step_starts)
      if (!first.count(name)) first[name] = t;
    std::vector<std::pair<double, std::string>> order;
    for (const auto& [name, t] : first) order.emplace_back(t, name);
    std::sort(order.begin(), order.end());
    for (size_t i = 0; i < order.size(); ++i) {
      TraceStep s;
      s.name = order[i].second;
      s.start_ms = order[i].first;
      s.end_ms =
          i + 1 < order.size() ? order[i + 1].first : std::numeric_limits<double>::infinity();
      a.steps.push_back(s);
    }
    for (Event& e : dev)
      for (size_t i = 0; i < a.steps.size(); ++i)
        if (e.start_ms >= a.steps[i].start_ms && e.start_ms < a.steps[i].end_ms)
          e.step = static_cast<int>(i);
  } else {
    std::map<int64_t, int> index;
    for (int64_t s : tandem_steps) {
      index[s] = static_cast<int>(a.steps.size());
      TraceStep st;
      st.name = fmt::format("step {}", s);
      a.steps.push_back(st);
    }
    for (size_t i = 0; i < dev.size(); ++i)
      if (event_step[i] >= 0) dev[i].step = index[event_step[i]];
  }
  for (TraceStep& s : a.steps) {
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (const Event& e : dev)
      if (e.step == static_cast<int>(&s - a.steps.data())) {
        lo = std::min(lo, e.start_ms);
        hi = std::max(hi, e.end_ms);
      }
    if (lo <= hi) {
      s.start_ms = lo;
      s.end_ms = hi;
    } else if (!std::isfinite(s.end_ms)) {
      s.end_ms = s.start_ms;
    }
    for (const auto& [key, t] : stream_times(dev, static_cast<int>(&s - a.steps.data())))
      add(s.times, t);
  }

  for (const auto& [key, t] : stream_times(dev, -1)) {
    TraceStream st;
    st.pid = key.first;
    st.tid = key.second;
    const auto l = process_labels.find(st.pid);
    const auto p = process_names.find(st.pid);
    st.process = l != process_labels.end() && !l->second.empty()  ? l->second
                 : p != process_names.end() && !p->second.empty() ? p->second
                                                                  : fmt::format("pid {}", st.pid);
    const auto n = thread_names.find(key);
    st.name = n != thread_names.end() ? n->second : "";
    st.legacy_default = pytorch && (st.tid == 7 || st.name == "stream 7");
    st.times = t;
    add(a.total, t);
    a.streams.push_back(st);
  }

  // What a reader should look at.
  for (const TraceStream& s : a.streams) {
    if (s.name.empty())
      a.warnings.push_back(fmt::format(
          "{} has a stream without a name (tid {}): {} ms of work that no track label explains",
          s.process, s.tid, ms_text(s.times.busy_ms)));
    if (!s.legacy_default || s.times.compute_ms <= 0) continue;
    for (const TraceStream& o : a.streams)
      if (o.pid == s.pid && o.tid != s.tid && o.times.comm_ms > 0)
        a.warnings.push_back(fmt::format(
            "{}: compute runs on the legacy default stream (stream 7) while {} communicates; a "
            "blocking stream waits for the legacy default stream and the legacy default stream "
            "for it, so the two serialise unless the communication stream is created "
            "non-blocking ({} of its {} ms of communication exposed)",
            s.process, o.name.empty() ? fmt::format("stream {}", o.tid) : o.name,
            ms_text(o.times.exposed_ms), ms_text(o.times.comm_ms)));
  }
  a.events = std::move(dev);
  return a;
}

nlohmann::json trace_read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TD_CHECK(in.good(), "cannot read the trace '{}'", path);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
      static_cast<unsigned char>(bytes[1]) == 0x8b) {
    // gzip: through the system's gzip, the path single-quoted for the shell.
    std::string quoted = "'";
    for (char c : path) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    quoted += "'";
    FILE* pipe = popen(("gzip -dc -- " + quoted + " 2>/dev/null").c_str(), "r");
    TD_CHECK(pipe != nullptr, "cannot run gzip to read the gzipped trace '{}'", path);
    bytes.clear();
    char buf[1 << 16];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) bytes.append(buf, n);
    const int status = pclose(pipe);
    TD_CHECK(status == 0, "the gzipped trace '{}' does not decompress (gzip -dc failed)", path);
  }
  try {
    return nlohmann::json::parse(bytes);
  } catch (const nlohmann::json::exception& e) {
    TD_THROW("the trace '{}' is not JSON: {}", path, e.what());
  }
}

std::string trace_analysis_text(const TraceAnalysis& a) {
  std::string out = fmt::format("trace: {} format, {} stream(s), {} step(s)\n", a.format,
                                a.streams.size(), a.steps.size());
  auto row = [](const std::string& who, const TraceTimes& t) {
    return fmt::format("  {:<36} {:>10} {:>10} {:>10} {:>10} {:>10}\n", who, ms_text(t.busy_ms),
                       ms_text(t.compute_ms), ms_text(t.comm_ms), ms_text(t.overlapped_ms),
                       ms_text(t.exposed_ms));
  };
  const std::string head = fmt::format("  {:<36} {:>10} {:>10} {:>10} {:>10} {:>10}\n", "",
                                       "busy ms", "compute", "comm", "overlapped", "exposed");
  out += "streams:\n" + head;
  for (const TraceStream& s : a.streams)
    out += row(fmt::format("{} / {}{}", s.process,
                           s.name.empty() ? fmt::format("tid {} (unnamed)", s.tid) : s.name,
                           s.legacy_default ? " [legacy default]" : ""),
               s.times);
  out += row("all streams", a.total);
  if (!a.steps.empty()) {
    out += "steps:\n" + head;
    for (const TraceStep& s : a.steps) out += row(s.name, s.times);
  }
  out += fmt::format(
      "exposed communication: {} ms of {} ms communicating ({:.0f}%); perfect overlap could save "
      "up to {} ms\n",
      ms_text(a.total.exposed_ms), ms_text(a.total.comm_ms),
      a.total.comm_ms > 0 ? 100 * a.total.exposed_ms / a.total.comm_ms : 0.0,
      ms_text(a.total.exposed_ms));
  for (const std::string& w : a.warnings) out += "warning: " + w + "\n";
  return out;
}

nlohmann::json trace_analysis_json(const TraceAnalysis& a) {
  auto times = [](const TraceTimes& t) {
    return nlohmann::json{{"busy_ms", t.busy_ms},       {"compute_ms", t.compute_ms},
                          {"comm_ms", t.comm_ms},       {"overlapped_ms", t.overlapped_ms},
                          {"exposed_ms", t.exposed_ms}, {"save_ms", t.exposed_ms},
                          {"events", t.events},         {"comm_events", t.comm_events}};
  };
  nlohmann::json j = {{"format", a.format}, {"total", times(a.total)}};
  j["streams"] = nlohmann::json::array();
  for (const TraceStream& s : a.streams) {
    nlohmann::json o = times(s.times);
    o["pid"] = s.pid;
    o["tid"] = s.tid;
    o["process"] = s.process;
    o["name"] = s.name;
    o["legacy_default"] = s.legacy_default;
    j["streams"].push_back(o);
  }
  j["steps"] = nlohmann::json::array();
  for (const TraceStep& s : a.steps) {
    nlohmann::json o = times(s.times);
    o["name"] = s.name;
    o["start_ms"] = s.start_ms;
    o["end_ms"] = s.end_ms;
    j["steps"].push_back(o);
  }
  j["warnings"] = a.warnings;
  return j;
}

}  // namespace tandem
