// The probes' CUDA backend (docs/diagnosis.md): the stream kinds of [Stream kinds] in
// tools/probe_backend.h as streams of the CUDA device ([CUDA probe streams] in
// device/cuda/cuda_device.h), fp32 and bf16 GEMMs through cuBLASLt, device-to-device copies,
// a sleep kernel for the delays, the device's memory, and the topology from CUDA and NVML
// (opened at run time, so tandem neither links against NVML nor needs it to run).
//
// Host code apart from the spin kernel. It is a .cu under src/tools/cuda/ so that only CUDA
// builds compile it (cmake/cuda.cmake), as C++17 like all of tandem's CUDA sources.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "device/cuda/cuda_check.h"
#include "device/cuda/cuda_device.h"
#include "device/cuda/kernels.cuh"
#include "plan/probe_backend.h"

namespace tandem {

namespace {

// --- GEMMs -------------------------------------------------------------------------------
//
// [Probe GEMMs] C = A B for row-major n x n matrices is, read column-major, C^T = B^T A^T:
// the column-major product of the B buffer by the A buffer, with no transposes ([cuBLASLt
// layout] in device/cuda/matmul.cu). fp32 computes with CUBLAS_COMPUTE_32F (fp32 throughout,
// no TF32); bf16 has bf16 A, B and C with fp32 accumulation and scaling, as the engine's
// GEMMs. The algorithm is cuBLASLt's heuristic choice, once per (type, n, pointer alignment).
// MatmulContext (device/cuda/matmul.h) takes bf16 operands only, so this file drives
// cuBLASLt itself for both types, with one code path.
//
// [Probe GEMM workspaces] A cuBLASLt workspace must not serve two GEMMs at once. The backend
// keeps up to kGemmSlots workspaces. A GEMM takes the one last used on its stream, else the
// least recently used one, and its stream first waits (on the GPU, cudaStreamWaitEvent) for
// the previous GEMM that used that workspace, whichever stream ran it; so streams created
// anew every iteration, or a new stream that got a destroyed one's handle, are ordered after
// the last user of their workspace. The probes run their GEMMs on one stream at a time and
// synchronise between phases, so these waits are on completed work and cost nothing.

constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;  // as MatmulContext's default
constexpr size_t kGemmSlots = 4;

struct GemmPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t layout = nullptr;  // A, B, C and D alike: n x n, leading dimension n
  cublasLtMatmulAlgo_t algo{};
};

void plan_destroy(GemmPlan& p) {
  if (p.layout != nullptr) (void)cublasLtMatrixLayoutDestroy(p.layout);
  if (p.op != nullptr) (void)cublasLtMatmulDescDestroy(p.op);
  p.layout = nullptr;
  p.op = nullptr;
}

struct GemmSlot {
  cudaStream_t stream = nullptr;  // the stream of its latest GEMM
  uint64_t used = 0;              // when (a counter) it was last taken
  void* workspace = nullptr;
  cudaEvent_t done = nullptr;  // recorded after its latest GEMM
};

// The largest power of two, at most 256, that divides every pointer (cudaMalloc gives 256).
uint32_t common_alignment(const void* a, const void* b, const void* c) {
  const uintptr_t bits = reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                         reinterpret_cast<uintptr_t>(c) | uintptr_t{256};
  return static_cast<uint32_t>(bits & (~bits + 1));
}

class ProbeGemms {
 public:
  // Create with the GPU it serves; every call makes that GPU current.
  explicit ProbeGemms(int gpu) : gpu_(gpu) {
    TD_CUDA_CALL(cudaSetDevice(gpu_));
    CUBLAS_CHECK(cublasLtCreate(&handle_));
  }

  // cudaFree waits for the whole device, so no GEMM still uses a workspace freed here.
  ~ProbeGemms() {
    (void)cudaSetDevice(gpu_);
    for (GemmSlot& s : slots_) {
      if (s.workspace != nullptr) (void)cudaFree(s.workspace);
      if (s.done != nullptr) (void)cudaEventDestroy(s.done);
    }
    for (auto& [key, plan] : plans_) plan_destroy(plan);
    (void)cublasLtDestroy(handle_);
    (void)cudaGetLastError();
  }

  ProbeGemms(const ProbeGemms&) = delete;
  ProbeGemms& operator=(const ProbeGemms&) = delete;

  // c = a b (row-major n x n, fp32 or bf16 per `bf16`), enqueued on `stream`. See [Probe
  // GEMMs] and [Probe GEMM workspaces].
  void run(cudaStream_t stream, bool bf16, int n, const void* a, const void* b, void* c) {
    TD_CHECK(n > 0, "gemm size must be positive, got {}", n);
    TD_CHECK(a != nullptr && b != nullptr && c != nullptr, "gemm of size {} with a null operand",
             n);
    std::lock_guard<std::mutex> lock(mu_);
    TD_CUDA_CALL(cudaSetDevice(gpu_));
    const GemmPlan& p = plan(bf16, n, common_alignment(a, b, c));
    GemmSlot& s = slot(stream);
    TD_CUDA_CALL(cudaStreamWaitEvent(stream, s.done, 0));
    const float alpha = 1.0f, beta = 0.0f;
    CUBLAS_CHECK(cublasLtMatmul(handle_, p.op, &alpha, b, p.layout, a, p.layout, &beta, c, p.layout,
                                c, p.layout, &p.algo, s.workspace, kGemmWorkspaceBytes, stream));
    TD_CUDA_CALL(cudaEventRecord(s.done, stream));
    s.stream = stream;
  }

 private:
  const GemmPlan& plan(bool bf16, int n, uint32_t alignment) {
    const std::array<int64_t, 3> key{bf16 ? 1 : 0, n, alignment};
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;

    GemmPlan p;
    cublasLtMatmulPreference_t pref = nullptr;
    try {
      const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
      CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
      CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.layout, type, n, n, n));
      CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
      const uint64_t workspace = kGemmWorkspaceBytes;
      CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
      for (cublasLtMatmulPreferenceAttributes_t attr :
           {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
            CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
        CUBLAS_CHECK(
            cublasLtMatmulPreferenceSetAttribute(pref, attr, &alignment, sizeof alignment));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
          handle_, p.op, p.layout, p.layout, p.layout, p.layout, pref, 1, &result, &found);
      TD_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0 && result.state == CUBLAS_STATUS_SUCCESS,
               "cuBLASLt has no {} GEMM algorithm for n = {} on GPU {} ({})",
               bf16 ? "bf16" : "fp32", n, gpu_, cublasLtGetStatusName(st));
      p.algo = result.algo;
      (void)cublasLtMatmulPreferenceDestroy(pref);
    } catch (...) {
      if (pref != nullptr) (void)cublasLtMatmulPreferenceDestroy(pref);
      plan_destroy(p);
      throw;
    }
    return plans_.emplace(key, p).first->second;
  }

  // The workspace slot for a GEMM on `stream`; see [Probe GEMM workspaces].
  GemmSlot& slot(cudaStream_t stream) {
    GemmSlot* pick = nullptr;
    for (GemmSlot& s : slots_)
      if (s.stream == stream) pick = &s;
    if (pick == nullptr && slots_.size() < kGemmSlots) {
      GemmSlot fresh;
      TD_CUDA_CALL(cudaEventCreateWithFlags(&fresh.done, cudaEventDisableTiming));
      const cudaError_t rc = cudaMalloc(&fresh.workspace, kGemmWorkspaceBytes);
      if (rc != cudaSuccess) {
        (void)cudaEventDestroy(fresh.done);
        TD_CUDA_CALL(rc);
      }
      slots_.push_back(fresh);
      pick = &slots_.back();
    }
    if (pick == nullptr)
      pick =
          &*std::min_element(slots_.begin(), slots_.end(),
                             [](const GemmSlot& x, const GemmSlot& y) { return x.used < y.used; });
    pick->used = ++clock_;
    return *pick;
  }

  const int gpu_;
  cublasLtHandle_t handle_ = nullptr;
  std::mutex mu_;
  std::map<std::array<int64_t, 3>, GemmPlan> plans_;
  std::vector<GemmSlot> slots_;
  uint64_t clock_ = 0;
};

// --- NVML, opened at run time ------------------------------------------------------------
//
// [Probe NVML] The links between GPUs come from NVML, the driver's management library,
// opened with dlopen("libnvidia-ml.so.1") when the topology is first asked for: tandem
// neither links against NVML nor needs its header, and where it cannot be used (no driver
// library in a container, an entry point an old driver lacks, nvmlInit failing) the topology
// says "nvml": "unavailable" with the reason, and the probe carries on. The declarations
// below are the few parts of NVML's C API used here, as NVML's documentation gives them.
// PCI information is received into a buffer with room to spare beyond NVML's structure.

using NvmlReturn = int;  // nvmlReturn_t; 0 is success
struct NvmlDeviceOpaque;
using NvmlDevice = NvmlDeviceOpaque*;  // nvmlDevice_t

constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlInsufficientSize = 7;  // NVML_ERROR_INSUFFICIENT_SIZE
constexpr int kNvmlP2PCapsNvlink = 2;            // NVML_P2P_CAPS_INDEX_NVLINK
constexpr int kNvmlP2PStatusOk = 0;              // NVML_P2P_STATUS_OK
constexpr int kNvmlFeatureEnabled = 1;           // NVML_FEATURE_ENABLED
constexpr unsigned kNvmlMaxLinks = 18;           // NVML_NVLINK_MAX_LINKS

struct NvmlPciInfo {  // nvmlPciInfo_t
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};
struct NvmlPciInfoBuffer {
  NvmlPciInfo info;
  char spare[64];
};

class Nvml {
 public:
  Nvml() {
    lib_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
      const char* why = dlerror();
      error_ = fmt::format("cannot open libnvidia-ml.so.1 ({})", why != nullptr ? why : "?");
      return;
    }
    bool required = load(init_, "nvmlInit_v2") && load(shutdown_, "nvmlShutdown") &&
                    load(error_string_, "nvmlErrorString") &&
                    load(handle_by_bus_id_, "nvmlDeviceGetHandleByPciBusId_v2");
    load(p2p_status_, "nvmlDeviceGetP2PStatus");
    load(common_ancestor_, "nvmlDeviceGetTopologyCommonAncestor");
    load(nvlink_state_, "nvmlDeviceGetNvLinkState");
    load(nvlink_remote_pci_, "nvmlDeviceGetNvLinkRemotePciInfo_v2");
    for (const char* name :
         {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
          "nvmlDeviceGetComputeRunningProcesses"})
      if (processes_ == nullptr) load(processes_, name);
    if (!required) {
      error_ = "libnvidia-ml.so.1 lacks an entry point tandem needs (driver too old?)";
      return;
    }
    const NvmlReturn rc = init_();
    if (rc != kNvmlSuccess) {
      error_ = fmt::format("nvmlInit failed: {}", text(rc));
      return;
    }
    initialised_ = true;
  }

  ~Nvml() {
    if (initialised_) (void)shutdown_();
    if (lib_ != nullptr) dlclose(lib_);
  }

  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool ok() const { return initialised_; }
  const std::string& error() const { return error_; }

  // The NVML handle of the GPU with this PCI bus id, or null.
  NvmlDevice device(const std::string& bus_id) const {
    NvmlDevice d = nullptr;
    if (!ok() || handle_by_bus_id_(bus_id.c_str(), &d) != kNvmlSuccess) return nullptr;
    return d;
  }

  // Active NVLinks of `a`: how many reach the GPU at (domain, bus, device) directly (*direct)
  // and how many there are in all (*active). False when NVML cannot tell.
  bool nvlinks(NvmlDevice a, unsigned domain, unsigned bus, unsigned dev, int* direct,
               int* active) const {
    *direct = *active = 0;
    if (nvlink_state_ == nullptr) return false;
    for (unsigned link = 0; link < kNvmlMaxLinks; ++link) {
      int state = 0;
      if (nvlink_state_(a, link, &state) != kNvmlSuccess || state != kNvmlFeatureEnabled) continue;
      ++*active;
      NvmlPciInfoBuffer remote{};
      if (nvlink_remote_pci_ != nullptr &&
          nvlink_remote_pci_(a, link, &remote.info) == kNvmlSuccess &&
          remote.info.domain == domain && remote.info.bus == bus && remote.info.device == dev)
        ++*direct;
    }
    return true;
  }

  // 1: peer-to-peer over NVLink works between a and b; 0: it does not; -1: unknown.
  int p2p_nvlink(NvmlDevice a, NvmlDevice b) const {
    int status = -1;
    if (p2p_status_ == nullptr || p2p_status_(a, b, kNvmlP2PCapsNvlink, &status) != kNvmlSuccess)
      return -1;
    return status == kNvmlP2PStatusOk ? 1 : 0;
  }

  // The PCIe path between a and b in nvidia-smi's words (PIX, PXB, PHB, NODE, SYS), or "".
  std::string pcie_path(NvmlDevice a, NvmlDevice b) const {
    int level = -1;
    if (common_ancestor_ == nullptr || common_ancestor_(a, b, &level) != kNvmlSuccess) return "";
    switch (level) {  // nvmlGpuTopologyLevel_t
      case 0:
        return "same board";
      case 10:
        return "PIX";
      case 20:
        return "PXB";
      case 30:
        return "PHB";
      case 40:
        return "NODE";
      case 50:
        return "SYS";
      default:
        return "";
    }
  }

  // Processes with a compute context on d (this one included), or -1 when unknown.
  int compute_processes(NvmlDevice d) const {
    if (processes_ == nullptr) return -1;
    unsigned count = 0;  // 0 with no buffer: NVML only counts
    const NvmlReturn rc = processes_(d, &count, nullptr);
    if (rc == kNvmlSuccess) return 0;
    return rc == kNvmlInsufficientSize ? static_cast<int>(count) : -1;
  }

 private:
  template <typename Fn>
  bool load(Fn& fn, const char* name) {
    fn = reinterpret_cast<Fn>(dlsym(lib_, name));
    return fn != nullptr;
  }

  std::string text(NvmlReturn rc) const {
    const char* s = error_string_ != nullptr ? error_string_(rc) : nullptr;
    return s != nullptr ? fmt::format("{} (code {})", s, rc) : fmt::format("code {}", rc);
  }

  void* lib_ = nullptr;
  bool initialised_ = false;
  std::string error_;
  NvmlReturn (*init_)() = nullptr;
  NvmlReturn (*shutdown_)() = nullptr;
  const char* (*error_string_)(NvmlReturn) = nullptr;
  NvmlReturn (*handle_by_bus_id_)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*p2p_status_)(NvmlDevice, NvmlDevice, int, int*) = nullptr;
  NvmlReturn (*common_ancestor_)(NvmlDevice, NvmlDevice, int*) = nullptr;
  NvmlReturn (*nvlink_state_)(NvmlDevice, unsigned, int*) = nullptr;
  NvmlReturn (*nvlink_remote_pci_)(NvmlDevice, unsigned, NvmlPciInfo*) = nullptr;
  NvmlReturn (*processes_)(NvmlDevice, unsigned*, void*) = nullptr;
};

// --- topology ----------------------------------------------------------------------------

struct GpuAddress {
  std::string bus_id;  // CUDA's form, e.g. "0000:19:00.0"
  unsigned domain = 0, bus = 0, device = 0;
};

GpuAddress gpu_address(int gpu) {
  GpuAddress out;
  char bus_id[64] = {};
  TD_CUDA_CALL(cudaDeviceGetPCIBusId(bus_id, sizeof bus_id - 1, gpu));
  out.bus_id = bus_id;
  int domain = 0, bus = 0, device = 0;
  TD_CUDA_CALL(cudaDeviceGetAttribute(&domain, cudaDevAttrPciDomainId, gpu));
  TD_CUDA_CALL(cudaDeviceGetAttribute(&bus, cudaDevAttrPciBusId, gpu));
  TD_CUDA_CALL(cudaDeviceGetAttribute(&device, cudaDevAttrPciDeviceId, gpu));
  out.domain = static_cast<unsigned>(domain);
  out.bus = static_cast<unsigned>(bus);
  out.device = static_cast<unsigned>(device);
  return out;
}

std::string host_name() {
  char buf[256] = {};
  if (gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

// [Probe GPU links] One entry per pair of GPUs visible to the process (CUDA's indices):
// "link" is "NVLink" when the pair has direct NVLinks ("via": "direct", "nvlinks": how many)
// or NVML reports peer-to-peer over NVLink without one, i.e. through NVSwitches ("via":
// "NVSwitch", "nvlinks": the first GPU's active links), else "PCIe"; "pcie_path" is the
// PCIe path between them as nvidia-smi topo -m names it (PIX: one PCIe switch, PXB: several,
// PHB: a host bridge, NODE: within a NUMA node, SYS: across NUMA nodes). "label" is the
// short form: NV<nvlinks>, or the PCIe path.
nlohmann::json gpu_links(const Nvml& nvml, const std::vector<GpuAddress>& gpus) {
  nlohmann::json out = nlohmann::json::array();
  std::vector<NvmlDevice> handles;
  for (const GpuAddress& g : gpus) handles.push_back(nvml.device(g.bus_id));
  for (size_t i = 0; i < gpus.size(); ++i)
    for (size_t j = i + 1; j < gpus.size(); ++j) {
      nlohmann::json pair = {{"gpus", {i, j}}, {"link", "unknown"}, {"label", "?"}};
      if (handles[i] == nullptr || handles[j] == nullptr) {
        out.push_back(std::move(pair));
        continue;
      }
      int direct = 0, active = 0;
      const bool known =
          nvml.nvlinks(handles[i], gpus[j].domain, gpus[j].bus, gpus[j].device, &direct, &active);
      const int p2p = nvml.p2p_nvlink(handles[i], handles[j]);
      const std::string path = nvml.pcie_path(handles[i], handles[j]);
      if (!path.empty()) pair["pcie_path"] = path;
      if (direct > 0 || (p2p == 1 && active > 0)) {
        const int links = direct > 0 ? direct : active;
        pair["link"] = "NVLink";
        pair["via"] = direct > 0 ? "direct" : "NVSwitch";
        pair["nvlinks"] = links;
        pair["label"] = fmt::format("NV{}", links);
      } else if (known || p2p == 0) {
        pair["link"] = "PCIe";
        pair["label"] = path.empty() ? "PCIe" : path;
      }
      out.push_back(std::move(pair));
    }
  return out;
}

// --- the backend -------------------------------------------------------------------------

class CudaProbeBackend final : public ProbeBackend {
 public:
  explicit CudaProbeBackend(Device& device)
      : device_(device), gpu_(gpu_checked(device)), gemms_(gpu_) {}
  ~CudaProbeBackend() override {
    if (host_ == nullptr) return;
    (void)cudaSetDevice(gpu_);
    (void)cudaDeviceSynchronize();
    (void)cudaFreeHost(host_);
  }
  CudaProbeBackend(const CudaProbeBackend&) = delete;
  CudaProbeBackend& operator=(const CudaProbeBackend&) = delete;

  Device& device() override { return device_; }

  // The last kind of each list is the engine's own (non-blocking); see [Stream kinds].
  std::vector<StreamKind> compute_stream_kinds() const override {
    return {StreamKind::legacy_default, StreamKind::blocking, StreamKind::non_blocking};
  }
  std::vector<StreamKind> comm_stream_kinds() const override {
    return {StreamKind::blocking, StreamKind::non_blocking};
  }

  // legacy_default ignores the priority: stream 0 has CUDA's, which cannot be chosen.
  std::unique_ptr<Stream> stream_create(StreamKind kind, const std::string& name,
                                        int priority) override {
    switch (kind) {
      case StreamKind::legacy_default:
        return cuda_stream_legacy_default(device_, name);
      case StreamKind::blocking:
        return cuda_stream_create_blocking(device_, name, priority);
      case StreamKind::non_blocking:
        return device_.stream_create(name, priority);
      case StreamKind::dedicated:
      case StreamKind::shared:
        break;
    }
    TD_THROW("the cuda device has no {} stream (its kinds: legacy-default, blocking, non-blocking)",
             stream_kind_name(kind));
  }

  void gemm_f32(Stream& s, int n, const float* a, const float* b, float* c) override {
    device_.submit(s, [&] { gemms_.run(cuda_stream_of(s), false, n, a, b, c); });
  }

  bool has_gemm_bf16() const override { return true; }
  void gemm_bf16(Stream& s, int n, const void* a, const void* b, void* c) override {
    device_.submit(s, [&] { gemms_.run(cuda_stream_of(s), true, n, a, b, c); });
  }

  void copy(Stream& s, void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    TD_CHECK(dst != nullptr && src != nullptr, "copy of {} bytes with a null pointer", bytes);
    device_.submit(s, [&] {
      TD_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, cuda_stream_of(s)));
    });
  }

  // [Probe offload]: device-to-host into a pinned buffer, grown to the largest request.
  // cudaMemcpyAsync from device to pinned host memory runs on a copy engine and is ordered
  // on its stream like a kernel, so the stream rules apply to it as to NCCL's kernels.
  bool has_offload() const override { return true; }
  void offload(Stream& s, const void* src, size_t bytes) override {
    if (bytes == 0) return;
    TD_CHECK(src != nullptr, "offload of {} bytes from a null pointer", bytes);
    device_.submit(s, [&] {
      TD_CUDA_CALL(cudaSetDevice(gpu_));
      if (bytes > host_bytes_) {
        // Earlier copies into the old buffer must end before it is freed.
        TD_CUDA_CALL(cudaDeviceSynchronize());
        if (host_ != nullptr) TD_CUDA_CALL(cudaFreeHost(host_));
        host_ = nullptr;
        host_bytes_ = 0;
        TD_CUDA_CALL(cudaHostAlloc(&host_, bytes, cudaHostAllocDefault));
        host_bytes_ = bytes;
      }
      TD_CUDA_CALL(cudaMemcpyAsync(host_, src, bytes, cudaMemcpyDeviceToHost, cuda_stream_of(s)));
    });
  }

  void delay(Stream& s, double ms) override {
    if (!(ms > 0)) return;
    TD_CHECK(ms < 1e7, "delay of {} ms is too long", ms);
    // One thread sleeping on the GPU's global timer: takes no issue slots from kernels beside it.
    device_.submit(s, [&] { cuda::sleep_kernel(ms, cuda_stream_of(s)); });
  }

  // An H200 has 141 GB: an fp32 GEMM of n = 16384 (3 GiB of operands) takes ~0.2 s, and an
  // 8 GiB all-gather ~20 ms over 8 GPUs on NVLink; both caps are far above the calibration's
  // 20 ms target at the GPU's speed, and far below its memory.
  int max_gemm_n() const override { return 16384; }
  size_t max_overlap_bytes() const override { return size_t{8} << 30; }
  size_t default_links_max_bytes() const override { return size_t{1} << 30; }
  std::vector<int> default_gemm_sizes() const override { return {1024, 2048, 4096, 8192}; }
  size_t default_copy_bytes() const override { return size_t{1} << 30; }

  double mem_GiB() const override {
    TD_CUDA_CALL(cudaSetDevice(gpu_));
    size_t free_bytes = 0, total_bytes = 0;
    TD_CUDA_CALL(cudaMemGetInfo(&free_bytes, &total_bytes));
    return static_cast<double>(total_bytes) / (1024.0 * 1024.0 * 1024.0);
  }

  nlohmann::json local_topology() const override {
    TD_CUDA_CALL(cudaSetDevice(gpu_));
    cudaDeviceProp prop{};
    TD_CUDA_CALL(cudaGetDeviceProperties(&prop, gpu_));
    int count = 0;
    TD_CUDA_CALL(cudaGetDeviceCount(&count));
    std::vector<GpuAddress> gpus;
    for (int g = 0; g < count; ++g) gpus.push_back(gpu_address(g));
    nlohmann::json out = {{"host", host_name()},
                          {"device", "cuda"},
                          {"gpu", prop.name},
                          {"gpu_index", gpu_},
                          {"pci_bus_id", gpus[gpu_].bus_id},
                          {"gpus_visible", count},
                          {"mem_GiB", mem_GiB()}};
    const Nvml& nv = nvml();
    if (nv.ok()) {
      out["nvml"] = "ok";
      out["gpu_links"] = gpu_links(nv, gpus);  // see [Probe GPU links]
    } else {
      out["nvml"] = "unavailable";
      out["nvml_error"] = nv.error();
    }
    return out;
  }

  // Other processes with a context on this GPU (NVML counts them cheaply), whose kernels
  // would share its SMs and memory with the probe's: other work, or ranks of this job that
  // were given the same GPU. Ranks with GPUs of their own do not count.
  std::string timing_caveat(int /*ranks_on_host*/) const override {
    const Nvml& nv = nvml();
    if (!nv.ok()) return "";
    TD_CUDA_CALL(cudaSetDevice(gpu_));
    const NvmlDevice d = nv.device(gpu_address(gpu_).bus_id);
    const int processes = d != nullptr ? nv.compute_processes(d) : -1;
    // This process has a context on the GPU by now (the device made one), so it is one of
    // them, whether or not NVML can see this container's process ids.
    const int others = processes - 1;
    if (others <= 0) return "";
    return fmt::format(
        "cuda: {} other process(es) have a context on this GPU (NVML); any work they run "
        "shares its SMs and memory bandwidth with the probe and makes the timings slower and "
        "noisier",
        others);
  }

 private:
  static int gpu_checked(Device& device) {
    TD_CHECK(device.kind() == DeviceKind::cuda,
             "the cuda probe backend needs a cuda device, got {}", device.name());
    return cuda_gpu_of(device);
  }

  const Nvml& nvml() const {
    std::call_once(nvml_once_, [this] { nvml_ = std::make_unique<Nvml>(); });
    return *nvml_;
  }

  Device& device_;
  const int gpu_;
  ProbeGemms gemms_;
  void* host_ = nullptr;  // [Probe offload]
  size_t host_bytes_ = 0;
  mutable std::once_flag nvml_once_;
  mutable std::unique_ptr<Nvml> nvml_;
};

}  // namespace

std::unique_ptr<ProbeBackend> probe_backend_cuda(Device& device) {
  return std::make_unique<CudaProbeBackend>(device);
}

}  // namespace tandem
