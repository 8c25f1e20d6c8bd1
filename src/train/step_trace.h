// Step traces: when each op of the traced steps ran on each rank, written as one Chrome
// trace / Perfetto JSON per run: one process per rank, one named thread per stream
// (compute, all-gather, reduce-scatter), every op labelled with its unit, phase and step,
// and the compute stream's waits on communication as their own slices.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "shard/engine.h"

namespace tandem {

// A --trace-steps window "A:B" (or "A", which is "A:A"), inclusive, with lowest <= A <= B;
// throws naming the window and `what` (how steps count) otherwise.
std::pair<int64_t, int64_t> step_window_parse(const std::string& window, int64_t lowest,
                                              const std::string& what);

class StepTrace {
 public:
  // window: "A:B", 1-based optimizer steps, inclusive ("3" is "3:3").
  StepTrace(std::string path, const std::string& window);
  bool wants(int64_t step) const { return step >= first_ && step <= last_; }
  int64_t last() const { return last_; }
  // Keeps step `step`'s op timings; offset_ms: when the step started, from the run's start.
  void add(int64_t step, double offset_ms, const StepResult& r);
  // Collective over world: gathers every rank's timings; rank 0 writes the file.
  void write(const ModelLayout& model, const Program& program, Communicator& world, Device& device,
             Stream& stream);
  bool written() const { return written_; }

 private:
  std::string path_;
  int64_t first_ = 1, last_ = 0;
  std::vector<int64_t> steps_;
  std::vector<double> values_;  // per step: offset, then (start, end, wait) per op
  bool written_ = false;
};

}  // namespace tandem
