// TANDEM_FAULT parsing and the injected faults.
#include "core/fault.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/error.h"

namespace tandem {

namespace {

struct Fault {
  bool armed = false;
  int rank = -1;
  std::string point, action;
};

Fault parse() {
  Fault f;
  const char* env = std::getenv("TANDEM_FAULT");
  if (env == nullptr || *env == '\0') return f;
  const std::string s = env;
  const size_t a = s.find(':'), b = s.find(':', a == std::string::npos ? a : a + 1);
  if (a == std::string::npos || b == std::string::npos) return f;
  f.rank = std::atoi(s.substr(0, a).c_str());
  f.point = s.substr(a + 1, b - a - 1);
  f.action = s.substr(b + 1);
  f.armed = f.action == "exit" || f.action == "hang";
  return f;
}

}  // namespace

void fault_point(const std::string& point, int64_t number) {
  static const Fault fault = parse();
  if (!fault.armed || fault.rank != error_rank()) return;
  const std::string here = point == "step" ? "step" + std::to_string(number) : point;
  if (here != fault.point) return;
  std::fprintf(stderr, "tandem: injected fault: rank %d %ss at %s\n", fault.rank,
               fault.action.c_str(), here.c_str());
  std::fflush(stderr);
  if (fault.action == "exit") std::_Exit(3);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
}

}  // namespace tandem
