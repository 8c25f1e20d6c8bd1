// Parsing byte sizes.
#include "core/size.h"

#include <cmath>
#include <exception>
#include <utility>

#include "core/error.h"

namespace tandem {

uint64_t parse_size(const std::string& text, const std::string& flag) {
  auto bad = [&] {
    TD_THROW("{} '{}' is not a size (expected e.g. 4096, 64KiB, 16MiB or 1GiB)", flag, text);
  };
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    bad();
  }
  std::string unit = text.substr(used);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  constexpr double K = 1024.0, M = K * K, G = M * K, T = G * K;
  static const std::pair<const char*, double> kUnits[] = {
      {"", 1},    {"B", 1}, {"k", K},  {"K", K},   {"KB", K}, {"KiB", K}, {"M", M},  {"MB", M},
      {"MiB", M}, {"G", G}, {"GB", G}, {"GiB", G}, {"T", T},  {"TB", T},  {"TiB", T}};
  double scale = 0;
  for (const auto& [name, s] : kUnits)
    if (unit == name) scale = s;
  const double bytes = value * scale;
  if (!(scale > 0) || !(bytes >= 0) || bytes > 4 * T * M || bytes != std::floor(bytes)) bad();
  return static_cast<uint64_t>(bytes);
}

std::string format_size(uint64_t bytes) {
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double v = static_cast<double>(bytes) / 1024;
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  if (u >= 2) return fmt::format("{:.2f} {}", v, kUnits[u]);
  return fmt::format("{:.1f} {}", v, kUnits[u]);
}

}  // namespace tandem
