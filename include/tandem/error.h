// tandem::Error: the one exception type of the public API. Every failure tandem detects (a
// bad option, a missing or corrupt file, a plan that does not fit, a collective that timed
// out) reaches the caller as this type, carrying the message, the library function that
// detected it and the rank it happened on.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

// The public API is declared in namespace tandem::api and re-exported into namespace tandem
// at the end of each header, so programs write tandem::Trainer and tandem::Error. The
// library's internal code also lives in namespace tandem and has types of the same names
// (its own Trainer, Error, StepMetrics, ...): keeping the public types in a namespace of
// their own gives them distinct linker symbols inside the one static library. The
// re-export is left out while the library itself is compiled (TANDEM_BUILDING_LIBRARY,
// defined privately by its build), since there both sets of names are visible: the
// library's src/api/ files name the public types api::X and the internal ones ::tandem::X.
namespace tandem::api {

class Error : public std::runtime_error {
 public:
  Error(std::string message, std::string call, int rank)
      : std::runtime_error(message),
        message_(std::move(message)),
        call_(std::move(call)),
        rank_(rank) {}

  // The message alone, one line; what() returns the same text.
  const std::string& message() const noexcept { return message_; }
  // The library function that detected the failure.
  const std::string& call() const noexcept { return call_; }
  // The rank of the process that detected it (0 in a one-rank run).
  int rank() const noexcept { return rank_; }

 private:
  std::string message_, call_;
  int rank_ = 0;
};

}  // namespace tandem::api

#if !defined(TANDEM_BUILDING_LIBRARY)
namespace tandem {
using namespace api;  // NOLINT(build/namespaces): the re-export (see tandem/error.h)
}  // namespace tandem
#endif
