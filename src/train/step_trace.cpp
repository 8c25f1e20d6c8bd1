// Gathering op timings across ranks and writing them as Chrome trace events.
#include "train/step_trace.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>

#include "core/error.h"
#include "io/file.h"

namespace tandem {

std::pair<int64_t, int64_t> step_window_parse(const std::string& window, int64_t lowest,
                                              const std::string& what) {
  const size_t colon = window.find(':');
  int64_t first = 0, last = 0;
  try {
    size_t used = 0;
    first = std::stoll(window.substr(0, colon), &used);
    TD_CHECK(used == (colon == std::string::npos ? window.size() : colon), "");
    last = first;
    if (colon != std::string::npos) {
      last = std::stoll(window.substr(colon + 1), &used);
      TD_CHECK(used == window.size() - colon - 1, "");
    }
  } catch (const std::exception&) {
    TD_THROW("--trace-steps '{}' is not a step window A:B ({})", window, what);
  }
  TD_CHECK(first >= lowest && last >= first,
           "--trace-steps '{}' is not a step window A:B with {} <= A <= B ({})", window, lowest,
           what);
  return {first, last};
}

StepTrace::StepTrace(std::string path, const std::string& window) : path_(std::move(path)) {
  std::tie(first_, last_) = step_window_parse(window, 1, "1-based, inclusive");
}

void StepTrace::add(int64_t step, double offset_ms, const StepResult& r) {
  steps_.push_back(step);
  values_.push_back(offset_ms);
  for (const OpTiming& t : r.ops) {
    values_.push_back(t.start_ms);
    values_.push_back(t.end_ms);
    values_.push_back(t.wait_ms);
  }
}

void StepTrace::write(const ModelLayout& model, const Program& program, Communicator& world,
                      Device& device, Stream& stream) {
  // Every rank ran the same program for the same steps, so the records have one size.
  std::vector<double> all(values_.size() * static_cast<size_t>(world.size()));
  world.all_gather(stream, values_.data(), all.data(), values_.size() * 2, DType::f32, "trace");
  device.stream_sync(stream);
  written_ = true;
  if (world.rank() != 0) return;

  nlohmann::json events = nlohmann::json::array();
  const char* tracks[kStreamRoles] = {"compute", "all-gather", "reduce-scatter"};
  const size_t per_step = 1 + 3 * program.ops.size();
  for (int r = 0; r < world.size(); ++r) {
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", r},
                      {"args", {{"name", fmt::format("rank {}", r)}}}});
    for (int t = 0; t < kStreamRoles; ++t)
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", r},
                        {"tid", t},
                        {"args", {{"name", tracks[t]}}}});
    const double* v = all.data() + static_cast<size_t>(r) * values_.size();
    for (size_t s = 0; s < steps_.size(); ++s, v += per_step) {
      const double offset = v[0];
      for (size_t i = 0; i < program.ops.size(); ++i) {
        const Op& op = program.ops[i];
        const double start = offset + v[1 + 3 * i], end = offset + v[2 + 3 * i],
                     wait = v[3 + 3 * i];
        const std::string unit = op.unit >= 0 ? model.unit(op.unit).name : "step";
        nlohmann::json args = {
            {"unit", unit}, {"phase", op_kind_name(op.kind)}, {"step", steps_[s]}, {"op", i}};
        if (op.micro >= 0) args["micro"] = op.micro;
        const int tid = static_cast<int>(op.stream);
        if (wait > 0)
          events.push_back({{"name", "wait for communication"},
                            {"cat", "exposed"},
                            {"ph", "X"},
                            {"pid", r},
                            {"tid", tid},
                            {"ts", (start - wait) * 1e3},
                            {"dur", wait * 1e3},
                            {"args", args}});
        events.push_back({{"name", fmt::format("{} {}", op_kind_name(op.kind), unit)},
                          {"cat", op_kind_name(op.kind)},
                          {"ph", "X"},
                          {"pid", r},
                          {"tid", tid},
                          {"ts", start * 1e3},
                          {"dur", (end - start) * 1e3},
                          {"args", args}});
      }
    }
  }
  const std::string text =
      nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
  file_write_atomic(path_, text.data(), text.size());
}

}  // namespace tandem
