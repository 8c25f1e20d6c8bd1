// Error formatting and the per-process rank used in error messages.
#include "core/error.h"

#include <atomic>

namespace tandem {

namespace {
std::atomic<int> g_rank{0};

std::string short_path(const std::string& file) {
  // Paths relative to the source tree read better in one-line messages.
  const std::string root = TANDEM_SOURCE_DIR "/";
  return file.rfind(root, 0) == 0 ? file.substr(root.size()) : file;
}
}  // namespace

Error::Error(std::string message, std::string call, std::string file, int line, int rank)
    : std::runtime_error(message),
      message_(std::move(message)),
      call_(std::move(call)),
      file_(short_path(file)),
      line_(line),
      rank_(rank) {}

std::string Error::describe() const {
  return fmt::format("{} ({} at {}:{}, rank {})", message_, call_, file_, line_, rank_);
}

void error_set_rank(int rank) {
  g_rank.store(rank);
}
int error_rank() {
  return g_rank.load();
}

void error_throw(const char* call, const char* file, int line, std::string message) {
  throw Error(std::move(message), call, file, line, error_rank());
}

}  // namespace tandem
