// Progress bar and plain progress lines for `tandem train`.
#include "train/progress.h"

#include <cstdio>

#include <fmt/format.h>

namespace tandem {

namespace {
std::string duration(double s) {
  if (s < 0 || s > 1e7) return "--";
  int t = static_cast<int>(s + 0.5);
  if (t >= 3600) return fmt::format("{}h{:02d}m", t / 3600, t / 60 % 60);
  return fmt::format("{}m{:02d}s", t / 60, t % 60);
}
}  // namespace

Progress::Progress(ProgressMode mode, bool stdout_terminal, int64_t first_step, int64_t last_step,
                   int log_every)
    : first_(first_step),
      last_(last_step),
      log_every_(log_every),
      start_(std::chrono::steady_clock::now()) {
  quiet_ = mode == ProgressMode::none;
  bar_ = mode == ProgressMode::bar || (mode == ProgressMode::automatic && stdout_terminal);
}

void Progress::update(const StepMetrics& m) {
  if (quiet_) return;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double done = static_cast<double>(m.step - first_);
  const double eta = done > 0 ? elapsed / done * static_cast<double>(last_ - m.step) : -1;
  const std::string stats = fmt::format(
      "loss {:.4f} | lr {:.2e} | {:.0f} tok/s | {:.0f} ms/step | exposed comm {:.1f}% | "
      "eta {}",
      m.loss, m.lr, m.tokens_per_s, m.step_ms,
      m.step_ms > 0 ? 100.0 * m.exposed_comm_ms / m.step_ms : 0.0, duration(eta));
  if (bar_) {
    const int width = 24;
    const double frac =
        last_ > first_ ? static_cast<double>(m.step - first_) / static_cast<double>(last_ - first_)
                       : 1.0;
    const int fill = static_cast<int>(frac * width + 0.5);
    std::string b(static_cast<size_t>(fill), '#');
    b.resize(width, '.');
    fmt::print("\r\033[2Kstep {}/{} [{}] {}", m.step, last_, b, stats);
    std::fflush(stdout);
    drawn_ = true;
  } else if (m.step % log_every_ == 0 || m.step == last_ || m.step == first_ + 1) {
    fmt::print("step {}/{} | {}\n", m.step, last_, stats);
    std::fflush(stdout);
  }
}

void Progress::finish() {
  if (bar_ && drawn_) fmt::print("\n");
  std::fflush(stdout);
}

}  // namespace tandem
