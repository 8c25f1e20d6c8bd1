// The one error type of tandem. Library code throws tandem::Error carrying the failing
// call, file:line and the rank; only the CLI turns it into a message and an exit code.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  Error(std::string message, std::string call, std::string file, int line, int rank);

  const std::string& message() const { return message_; }
  const std::string& call() const { return call_; }
  const std::string& file() const { return file_; }
  int line() const { return line_; }
  int rank() const { return rank_; }
  // "message (call at file:line, rank r)" on one line.
  std::string describe() const;

 private:
  std::string message_, call_, file_;
  int line_, rank_;
};

// The rank recorded in errors thrown by this process (0 until the communicator sets it).
void error_set_rank(int rank);
int error_rank();

[[noreturn]] void error_throw(const char* call, const char* file, int line, std::string message);

}  // namespace tandem

#define TD_THROW(...) ::tandem::error_throw(__func__, __FILE__, __LINE__, fmt::format(__VA_ARGS__))
#define TD_CHECK(cond, ...)             \
  do {                                  \
    if (!(cond)) TD_THROW(__VA_ARGS__); \
  } while (0)
