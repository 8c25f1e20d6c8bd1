// The boundary of the public API: internal errors leave it as the public tandem::Error.
#pragma once

#include <tandem/error.h>
#include <nlohmann/json.hpp>

#include <utility>

#include "core/error.h"

// The public headers re-export their types into namespace tandem unless this is defined,
// which would clash with the internal types of the same names (include/tandem/error.h).
#if !defined(TANDEM_BUILDING_LIBRARY)
#error "src/api/ is compiled into tandem_lib, whose build defines TANDEM_BUILDING_LIBRARY"
#endif

namespace tandem::api {

// Runs f and returns what it returns; the internal error becomes the public one with the
// same message, call and rank. A JSON error (a malformed file read through the library)
// does too, so no third-party exception type crosses the API.
template <typename F>
decltype(auto) translate_errors(F&& f) {
  try {
    return std::forward<F>(f)();
  } catch (const ::tandem::Error& e) {
    throw Error(e.message(), e.call(), e.rank());
  } catch (const nlohmann::json::exception& e) {
    throw Error(e.what(), "nlohmann::json", ::tandem::error_rank());
  }
}

}  // namespace tandem::api
