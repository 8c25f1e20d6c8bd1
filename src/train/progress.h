// Progress output of long runs: a redrawn bar on a terminal, plain lines otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "train/trainer.h"

namespace tandem {

class Progress {
 public:
  // mode: auto (bar on a terminal, lines otherwise), bar, lines, none.
  Progress(const std::string& mode, int64_t first_step, int64_t last_step, int log_every);
  void update(const StepMetrics& m);
  void finish();

 private:
  bool bar_ = false, quiet_ = false;
  int64_t first_, last_;
  int log_every_;
  std::chrono::steady_clock::time_point start_;
  bool drawn_ = false;
};

}  // namespace tandem
