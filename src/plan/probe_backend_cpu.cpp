// The probes' CPU backend: streams are worker threads (one kind, `dedicated`), the GEMM is
// OpenBLAS's cblas_sgemm, a copy is memcpy on the stream, and the topology is the host name,
// the usable cores and the CPU model.
#include <cblas.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "core/error.h"
#include "plan/probe_backend.h"

namespace tandem {

namespace {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    size_t begin = colon + 1;
    while (begin < line.size() && line[begin] == ' ') ++begin;
    return line.substr(begin);
  }
  return "unknown";
}

// The 1-minute load average, or a negative number when unknown.
double load_average() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  if (!(in >> load)) return -1;
  return load;
}

// The cgroup memory limit in bytes (v2, then v1), or 0 when there is none.
uint64_t cgroup_memory_limit() {
  for (const char* path :
       {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    std::string text;
    if (!(in >> text) || text == "max") continue;
    try {
      return std::stoull(text);
    } catch (const std::exception&) {
      continue;
    }
  }
  return 0;
}

class CpuProbeBackend final : public ProbeBackend {
 public:
  explicit CpuProbeBackend(Device& device) : device_(device) {
    TD_CHECK(device.kind() == DeviceKind::cpu, "the cpu probe backend needs the cpu device, got {}",
             device.name());
  }

  Device& device() override { return device_; }

  std::vector<StreamKind> compute_stream_kinds() const override { return {StreamKind::dedicated}; }
  std::vector<StreamKind> comm_stream_kinds() const override { return {StreamKind::dedicated}; }

  std::unique_ptr<Stream> stream_create(StreamKind kind, const std::string& name,
                                        int priority) override {
    TD_CHECK(kind == StreamKind::dedicated,
             "the cpu device has no {} stream (cpu streams are worker threads: dedicated only)",
             stream_kind_name(kind));
    return device_.stream_create(name, priority);
  }

  void gemm_f32(Stream& s, int n, const float* a, const float* b, float* c) override {
    TD_CHECK(n > 0, "gemm size must be positive, got {}", n);
    device_.submit(s, [n, a, b, c] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    });
  }

  // The call the decoder's linear makes for one row (matmul_forward, device/cpu).
  bool has_matvec_f32() const override { return true; }
  void matvec_f32(Stream& s, int rows, int cols, const float* w, const float* x,
                  float* y) override {
    TD_CHECK(rows > 0 && cols > 0, "matrix-vector size {} x {}", rows, cols);
    device_.submit(s, [rows, cols, w, x, y] {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, rows, cols, 1.0f, w, cols, x, 1, 0.0f, y, 1);
    });
  }

  void copy(Stream& s, void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    device_.submit(s, [dst, src, bytes] { std::memcpy(dst, src, bytes); });
  }

  void delay(Stream& s, double ms) override {
    if (ms <= 0) return;
    device_.submit(
        s, [ms] { std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms)); });
  }

  int max_gemm_n() const override { return 4096; }
  size_t max_overlap_bytes() const override { return size_t{256} << 20; }
  size_t default_links_max_bytes() const override { return size_t{64} << 20; }
  std::vector<int> default_gemm_sizes() const override { return {256, 512, 1024, 2048}; }
  size_t default_copy_bytes() const override { return size_t{128} << 20; }

  double mem_GiB() const override {
    double bytes =
        static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    const uint64_t limit = cgroup_memory_limit();
    if (limit > 0) bytes = std::min(bytes, static_cast<double>(limit));
    return bytes / (1024.0 * 1024.0 * 1024.0);
  }

  nlohmann::json local_topology() const override {
    return {{"host", host_name()},
            {"device", "cpu"},
            {"cores", usable_cores()},
            {"cpu", cpu_model()},
            {"mem_GiB", mem_GiB()}};
  }

  std::string timing_caveat(int ranks_on_host) const override {
    const int cores = usable_cores();
    std::string text = fmt::format(
        "cpu: {} usable core(s) shared by {} rank(s) on this host; every stream is a thread, so "
        "two streams overlap only while each gets a core",
        cores, ranks_on_host);
    const double load = load_average();
    if (load >= 0) text += fmt::format(" (load average now {:.2f})", load);
    return text;
  }

 private:
  Device& device_;
};

}  // namespace

std::unique_ptr<ProbeBackend> probe_backend_cpu(Device& device) {
  return std::make_unique<CpuProbeBackend>(device);
}

}  // namespace tandem
