// `tandem trace analyze`: how much communication a Chrome trace's device streams exposed,
// from tandem's traces and from PyTorch's profiler (`export_chrome_trace`).
//
// [Trace analysis] A stream is a (pid, tid) track that holds device work: in a PyTorch trace
// the events of category kernel, gpu_memcpy or gpu_memset (tid = the CUDA stream; stream 7
// is the legacy default stream); in a tandem trace every op on every track (compute,
// all-gather, reduce-scatter, decode, pipeline; category the op's kind, "probe" or none), not
// its waits (category "exposed"). An event is
// communication when its name matches the communication patterns (NCCL and RCCL kernels, memory
// copies, tandem's gathers, reduces, sends and receives; more with comm_patterns), compute
// otherwise: a memory set moves nothing between devices (cuBLAS sets its workspace before GEMMs
// on the compute stream), so it is compute; tandem's update ops are neither (TraceEvent::neither).
// Per process (one device): a stream's busy time is the
// union of its events; a communication interval is overlapped where any compute of another stream
// of the process runs at the same time, and exposed elsewhere; perfect overlap could save the
// exposed time. Steps are PyTorch's ProfilerStep#N windows or tandem's args.step; each event counts
// towards the step its start falls in.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct TraceAnalyzeOptions {
  // Extra patterns (ECMAScript regular expressions, searched in event names) that mark
  // communication, beside the built-in ones.
  std::vector<std::string> comm_patterns;
};

// Busy, communication and overlap times in milliseconds.
struct TraceTimes {
  double busy_ms = 0;        // the union of the events
  double compute_ms = 0;     // the union of the compute events
  double comm_ms = 0;        // the union of the communication events
  double overlapped_ms = 0;  // communication while another stream computes
  double exposed_ms = 0;     // communication while no other stream computes
  int events = 0, comm_events = 0;
};

struct TraceStream {
  int64_t pid = 0, tid = 0;
  // The process's label where the trace gives one (PyTorch's "GPU 0"), else its name ("rank 0"),
  // else "pid N".
  std::string process;
  std::string name;             // the track's name, or "" when the trace names none
  bool legacy_default = false;  // PyTorch's stream 7
  TraceTimes times;
};

// One device event as the analysis saw it (the timeline of `tandem report` draws these).
struct TraceEvent {
  int64_t pid = 0, tid = 0;
  std::string name;
  double start_ms = 0, end_ms = 0;
  bool comm = false;
  // Neither compute nor communication: tandem's update ops (category "update", [Update at
  // gather]), which the step's own report counts as neither. They are busy time of their
  // stream, and cover no other stream's communication.
  bool neither = false;
  int step = -1;  // index into TraceAnalysis::steps; -1 outside every step
};

struct TraceStep {
  std::string name;  // "ProfilerStep#3", "step 3"
  double start_ms = 0, end_ms = 0;
  TraceTimes times;  // every stream of every process, added
};

struct TraceAnalysis {
  std::string format;  // "pytorch" or "tandem"
  std::vector<TraceStream> streams;
  std::vector<TraceStep> steps;
  TraceTimes total;
  std::vector<std::string> warnings;
  std::vector<TraceEvent> events;  // the device events, in the trace's order
};

// Throws a tandem::Error when the document is not a Chrome trace or holds no device work.
TraceAnalysis trace_analyze(const nlohmann::json& doc, const TraceAnalyzeOptions& options = {});
// Reads a trace file, plain or gzipped JSON.
nlohmann::json trace_read(const std::string& path);
// The analysis as text (one table per streams and steps, then the warnings) and as JSON.
std::string trace_analysis_text(const TraceAnalysis& a);
nlohmann::json trace_analysis_json(const TraceAnalysis& a);

}  // namespace tandem
