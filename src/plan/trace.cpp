// The Chrome-trace writer: tracks named before use, the per-rank parts gathered to rank 0
// as text through the communicator, and the check that no event sits on an unnamed track.
#include "plan/trace.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <set>
#include <utility>

#include "core/error.h"
#include "io/file.h"

namespace tandem {

namespace {

// Every rank's `bytes` bytes (a multiple of 4), in rank order, through device buffers.
std::vector<char> all_gather_bytes(Communicator& comm, Device& device, const void* mine,
                                   size_t bytes) {
  const size_t n = static_cast<size_t>(comm.size());
  DeviceBuffer send(device, bytes);
  DeviceBuffer recv(device, n * bytes);
  device.copy_to_device(send.get(), mine, bytes);
  {
    auto stream = device.stream_create("gather text");
    comm.all_gather(*stream, send.get(), recv.get(), bytes / 4, DType::f32, "gather text");
    device.stream_sync(*stream);
  }  // the stream drains before the buffers are freed
  std::vector<char> all(n * bytes);
  device.copy_to_host(all.data(), recv.get(), all.size());
  return all;
}

// Microseconds kept to the nanosecond: shorter files, no false precision.
double round_ns(double us) {
  return std::round(us * 1e3) / 1e3;
}

}  // namespace

Trace::Trace(int pid, const std::string& process_name) : pid_(pid) {
  TD_CHECK(!process_name.empty(), "trace process {} needs a name", pid);
  metadata_.push_back({{"ph", "M"},
                       {"name", "process_name"},
                       {"pid", pid_},
                       {"tid", 0},
                       {"args", {{"name", process_name}}}});
  metadata_.push_back({{"ph", "M"},
                       {"name", "process_sort_index"},
                       {"pid", pid_},
                       {"tid", 0},
                       {"args", {{"sort_index", pid_}}}});
}

int Trace::track(const std::string& name) {
  TD_CHECK(!name.empty(), "a trace track needs a name (process {})", pid_);
  auto it = tracks_.find(name);
  if (it != tracks_.end()) return it->second;
  const int tid = static_cast<int>(tracks_.size()) + 1;  // tid 0 carries the process metadata
  tracks_.emplace(name, tid);
  metadata_.push_back({{"ph", "M"},
                       {"name", "thread_name"},
                       {"pid", pid_},
                       {"tid", tid},
                       {"args", {{"name", name}}}});
  metadata_.push_back({{"ph", "M"},
                       {"name", "thread_sort_index"},
                       {"pid", pid_},
                       {"tid", tid},
                       {"args", {{"sort_index", tid}}}});
  return tid;
}

void Trace::check_track(int track) const {
  TD_CHECK(track >= 1 && track <= static_cast<int>(tracks_.size()),
           "trace event on track {} of process {}, which was never named (use Trace::track)", track,
           pid_);
}

void Trace::complete(int track, const std::string& name, double start_us, double dur_us,
                     const nlohmann::json& args, const std::string& category) {
  check_track(track);
  nlohmann::json e = {{"ph", "X"},
                      {"name", name},
                      {"pid", pid_},
                      {"tid", track},
                      {"ts", round_ns(start_us)},
                      {"dur", round_ns(std::max(0.0, dur_us))}};
  if (!category.empty()) e["cat"] = category;
  if (!args.is_null()) e["args"] = args;
  events_.push_back(std::move(e));
}

void Trace::instant(int track, const std::string& name, double ts_us, const nlohmann::json& args) {
  check_track(track);
  nlohmann::json e = {{"ph", "i"},   {"s", "t"},     {"name", name},
                      {"pid", pid_}, {"tid", track}, {"ts", round_ns(ts_us)}};
  if (!args.is_null()) e["args"] = args;
  events_.push_back(std::move(e));
}

nlohmann::json Trace::events() const {
  nlohmann::json all = metadata_;
  for (const auto& e : events_) all.push_back(e);
  return all;
}

nlohmann::json trace_document(const std::vector<nlohmann::json>& parts) {
  nlohmann::json events = nlohmann::json::array();
  for (const auto& part : parts)
    for (const auto& e : part) events.push_back(e);
  return {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
}

nlohmann::json trace_gather(const Trace& mine, Communicator& comm, Device& device) {
  const std::vector<std::string> texts = all_gather_text(comm, device, mine.events().dump());
  if (comm.rank() != 0) return nullptr;
  std::vector<nlohmann::json> parts;
  parts.reserve(texts.size());
  for (const auto& t : texts) parts.push_back(nlohmann::json::parse(t));
  return trace_document(parts);
}

std::vector<std::string> trace_check(const nlohmann::json& doc) {
  std::vector<std::string> problems;
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array()) {
    problems.push_back("the document has no traceEvents array");
    return problems;
  }
  std::set<std::pair<int64_t, int64_t>> named_tracks;
  std::set<int64_t> named_processes;
  for (const auto& e : doc["traceEvents"]) {
    if (e.value("ph", "") != "M") continue;
    const std::string what = e.value("name", "");
    const std::string name = e.contains("args") ? e["args"].value("name", "") : "";
    if (name.empty()) continue;
    if (what == "thread_name") named_tracks.emplace(e.value("pid", -1), e.value("tid", -1));
    if (what == "process_name") named_processes.insert(e.value("pid", -1));
  }
  size_t index = 0;
  for (const auto& e : doc["traceEvents"]) {
    ++index;
    if (e.value("ph", "") == "M") continue;
    if (!e.contains("pid") || !e.contains("tid")) {
      problems.push_back(
          fmt::format("event {} ('{}') has no pid or tid", index, e.value("name", std::string())));
      continue;
    }
    const int64_t pid = e["pid"].get<int64_t>();
    const int64_t tid = e["tid"].get<int64_t>();
    if (!named_tracks.count({pid, tid}))
      problems.push_back(
          fmt::format("event {} ('{}') is on track pid {} tid {}, which has no "
                      "thread_name",
                      index, e.value("name", std::string()), pid, tid));
    if (!named_processes.count(pid))
      problems.push_back(fmt::format("event {} ('{}') is in process {}, which has no process_name",
                                     index, e.value("name", std::string()), pid));
  }
  return problems;
}

void trace_write(const std::string& path, const nlohmann::json& doc) {
  const std::vector<std::string> problems = trace_check(doc);
  TD_CHECK(problems.empty(), "refusing to write trace '{}': {}", path, problems.front());
  const std::string text = doc.dump() + "\n";
  file_write_atomic(path, text.data(), text.size());
}

std::vector<std::string> all_gather_text(Communicator& comm, Device& device,
                                         const std::string& text) {
  const int n = comm.size();
  // Each length travels as the bits of a uint64: the collective only moves bytes, so any bit
  // pattern arrives intact.
  const uint64_t length = text.size();
  std::vector<uint64_t> lengths(n);
  std::memcpy(lengths.data(), all_gather_bytes(comm, device, &length, sizeof length).data(),
              n * sizeof length);

  const uint64_t longest = *std::max_element(lengths.begin(), lengths.end());
  std::vector<std::string> texts(n);
  if (longest == 0) return texts;
  const size_t width = (longest + 3) / 4 * 4;
  std::vector<char> padded(width, '\0');
  std::memcpy(padded.data(), text.data(), text.size());
  const std::vector<char> all = all_gather_bytes(comm, device, padded.data(), width);
  for (int r = 0; r < n; ++r) texts[r].assign(all.data() + r * width, lengths[r]);
  return texts;
}

}  // namespace tandem
