// JSON files as tandem reads them: parsed with nlohmann, but strict where nlohmann is lax.
// A key that appears twice in one object is an error (nlohmann would keep the last value
// silently, so a config or header edited by hand could mean something other than it
// says), and integers are read only from JSON integers that fit the field.
#pragma once

#include <nlohmann/json.hpp>

#include <limits>
#include <string>

#include "core/error.h"

namespace tandem {

// Parses text; `what` names the source in errors ("checkpoint index 'ckpt/index.json'").
// Throws "<what> is not valid JSON: ..." or "<what> has the key 'k' twice (in 'a.b')".
nlohmann::json json_parse(const std::string& text, const std::string& what);
nlohmann::ordered_json json_parse_ordered(const std::string& text, const std::string& what);

// Reads and parses a whole file: "<what> '<path>'" names it in errors; a missing file, a
// directory or anything but a regular file is an error too.
nlohmann::json json_read_file(const std::string& path, const std::string& what);

// The integer j[key] as T: throws naming `what` and the key unless j is an object holding
// key with an integer (not a float, not a string) within T's range.
template <typename T>
T json_get_int(const nlohmann::json& j, const char* key, const std::string& what) {
  static_assert(std::is_integral_v<T>);
  TD_CHECK(j.is_object() && j.contains(key), "{} has no key '{}'", what, key);
  const nlohmann::json& v = j.at(key);
  TD_CHECK(v.is_number_integer(), "{}: key '{}' must be an integer, got {}", what, key, v.dump());
  using limits = std::numeric_limits<T>;
  const bool fits =
      v.is_number_unsigned()
          ? v.get<uint64_t>() <= static_cast<uint64_t>(limits::max())
          : v.get<int64_t>() >= static_cast<int64_t>(limits::min()) &&
                (std::is_unsigned_v<T> || v.get<int64_t>() <= static_cast<int64_t>(limits::max()));
  TD_CHECK(fits, "{}: key '{}' is out of range: {}", what, key, v.dump());
  return v.get<T>();
}

}  // namespace tandem
