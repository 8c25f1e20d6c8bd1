// A small Chrome-trace ("Trace Event Format") JSON writer for chrome://tracing and Perfetto:
// one process per rank, one named thread (track) per stream. Events can only be placed on a
// track that was named first, so a trace never shows an unnamed stream.
//
// [Trace layout] A Trace holds one process's part: pid = the rank, a process_name metadata
// event ("rank r") and a thread_name metadata event for every track. Times are microseconds
// from the process's own zero (the probes take it right after a barrier, so ranks line up to
// the barrier's skew); trace_gather concatenates every rank's part on rank 0.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "device/device.h"

namespace tandem {

class Trace {
 public:
  // pid: the rank; process_name: what the viewer shows for it (e.g. "rank 0").
  Trace(int pid, const std::string& process_name);

  // The track named `name` (a stream's name), created with its thread_name metadata on first
  // use; the same name always gives the same track. Throws on an empty name.
  int track(const std::string& name);
  // A complete event ("ph": "X") on a track returned by track(); throws on an unknown track.
  // start_us and dur_us are microseconds; args is shown by the viewer (an object or null).
  void complete(int track, const std::string& name, double start_us, double dur_us,
                const nlohmann::json& args = nullptr, const std::string& category = "");
  // An instant event ("ph": "i", thread scope) on a named track.
  void instant(int track, const std::string& name, double ts_us,
               const nlohmann::json& args = nullptr);

  int pid() const { return pid_; }
  size_t event_count() const { return events_.size(); }
  // This process's part: metadata events first, then the events in the order they were added.
  nlohmann::json events() const;

 private:
  void check_track(int track) const;

  int pid_;
  nlohmann::json metadata_ = nlohmann::json::array();
  nlohmann::json events_ = nlohmann::json::array();
  std::map<std::string, int> tracks_;
};

// A trace document ({"traceEvents": [...], "displayTimeUnit": "ms"}) from the parts of
// every process (Trace::events() of each).
nlohmann::json trace_document(const std::vector<nlohmann::json>& parts);

// Collective over comm (every rank calls it): returns the document of every rank's part on
// rank 0 and null elsewhere.
nlohmann::json trace_gather(const Trace& mine, Communicator& comm, Device& device);

// The problems of a document, empty when there are none: every event needs a pid and tid
// whose track has a non-empty thread_name, and every pid a process_name. Tests use it, and
// trace_write refuses a document that has any.
std::vector<std::string> trace_check(const nlohmann::json& doc);

// Writes the document to path (atomically), after trace_check.
void trace_write(const std::string& path, const nlohmann::json& doc);

// Collective over comm: every rank's text, in rank order, on every rank. Moves the bytes
// through device buffers (so it works on GPU communicators too); the probes gather their
// topology with it.
std::vector<std::string> all_gather_text(Communicator& comm, Device& device,
                                         const std::string& text);

}  // namespace tandem
