// Fault specs and the injected faults.
#include "core/fault.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "core/error.h"

namespace tandem {

namespace {

struct Fault {
  bool armed = false;
  int rank = -1;
  std::string point, action;
};

Fault parse(const std::string& s) {
  Fault f;
  const size_t a = s.find(':'), b = s.find(':', a == std::string::npos ? a : a + 1);
  if (a == std::string::npos || b == std::string::npos) return f;
  f.rank = std::atoi(s.substr(0, a).c_str());
  f.point = s.substr(a + 1, b - a - 1);
  f.action = s.substr(b + 1);
  f.armed = f.action == "exit" || f.action == "hang" || f.action == "nan";
  return f;
}

// The armed fault; points are reached from stream worker threads.
std::mutex g_mutex;
Fault g_fault;

}  // namespace

void fault_configure(const std::string& spec) {
  const Fault f = parse(spec);
  std::lock_guard<std::mutex> lock(g_mutex);
  g_fault = f;
}

void fault_point(const std::string& point, int64_t number) {
  Fault fault;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_fault.armed) return;
    fault = g_fault;
  }
  if (fault.rank != error_rank()) return;
  const std::string here = point == "step" ? "step" + std::to_string(number) : point;
  if (here != fault.point || fault.action == "nan") return;
  std::fprintf(stderr, "tandem: injected fault: rank %d %ss at %s\n", fault.rank,
               fault.action.c_str(), here.c_str());
  std::fflush(stderr);
  if (fault.action == "exit") std::_Exit(3);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(60));
}

bool fault_nan(const std::string& point, int64_t number) {
  Fault fault;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (!g_fault.armed || g_fault.action != "nan") return false;
    fault = g_fault;
  }
  if (fault.rank != error_rank()) return false;
  const std::string here = point == "step" ? "step" + std::to_string(number) : point;
  if (here != fault.point) return false;
  std::fprintf(stderr, "tandem: injected fault: rank %d puts a NaN in its gradients at %s\n",
               fault.rank, here.c_str());
  std::fflush(stderr);
  return true;
}

}  // namespace tandem
