// Progress output of long runs: a redrawn bar on a terminal, plain lines otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "train/options.h"
#include "train/trainer.h"

namespace tandem {

class Progress {
 public:
  // mode automatic draws a bar when stdout_terminal (whether stdout is a terminal, as the
  // process environment says: api/environment.h), plain lines otherwise.
  Progress(ProgressMode mode, bool stdout_terminal, int64_t first_step, int64_t last_step,
           int log_every);
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
