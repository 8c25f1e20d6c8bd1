// What the probes (overlap, links, compute) need from a device beyond the Device interface:
// the stream kinds it has, a GEMM, a device-to-device copy, its memory and its topology.
// probe_backend_cpu.cpp implements it for the CPU device, cuda/probe_backend_cuda.cu for CUDA.
//
// [Stream kinds] The overlap probe runs every combination of the compute and communication
// stream kinds the backend lists. CPU streams are worker threads: there is no default stream
// and no blocking/non-blocking flag, so the CPU lists `dedicated` only (a stream of its own).
// `shared` (compute and communication on one stream, serialised by construction) is the
// probe's own control configuration on every device; backends never create it. The CUDA
// backend lists legacy_default, blocking and non_blocking for compute (legacy_default is
// stream 0 and is never created anew) and blocking and non_blocking for communication
// (docs/diagnosis.md, "Configurations"). The last kind of each list is the kind the engine
// itself uses (CPU: dedicated; CUDA: non_blocking); the probes' own streams (calibration,
// links, compute, the shared control) are of that kind.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"

namespace tandem {

enum class StreamKind {
  dedicated,       // a stream of its own (CPU: a worker thread)
  shared,          // compute and communication on one stream (the probe's control)
  legacy_default,  // CUDA: the legacy default stream (stream 0)
  blocking,        // CUDA: cudaStreamCreate (synchronises with the legacy default stream)
  non_blocking,    // CUDA: cudaStreamNonBlocking
};
// "dedicated", "shared", "legacy-default", "blocking", "non-blocking".
const char* stream_kind_name(StreamKind kind);

class ProbeBackend {
 public:
  virtual ~ProbeBackend() = default;
  virtual Device& device() = 0;

  // See [Stream kinds].
  virtual std::vector<StreamKind> compute_stream_kinds() const = 0;
  virtual std::vector<StreamKind> comm_stream_kinds() const = 0;
  // A stream of the given kind (any listed kind but `shared`); its name is its trace track.
  // priority as in Device::stream_create. legacy_default returns a handle to the one default
  // stream each time.
  virtual std::unique_ptr<Stream> stream_create(StreamKind kind, const std::string& name,
                                                int priority) = 0;

  // c = a b for row-major n x n fp32 matrices, enqueued on s.
  virtual void gemm_f32(Stream& s, int n, const float* a, const float* b, float* c) = 0;
  // The same in bf16 with fp32 accumulation, where the device has it (not on CPU).
  virtual bool has_gemm_bf16() const { return false; }
  virtual void gemm_bf16(Stream& s, int n, const void* a, const void* b, void* c);
  // y = W x for a row-major rows x cols fp32 W, the decoder's matrix-vector product, where
  // the backend has it (the CPU's).
  virtual bool has_matvec_f32() const { return false; }
  virtual void matvec_f32(Stream& s, int rows, int cols, const float* w, const float* x, float* y);
  // dst = src (device memory, not overlapping), enqueued on s.
  virtual void copy(Stream& s, void* dst, const void* src, size_t bytes) = 0;
  // [Probe offload] The one-rank overlap probe's communication, where the backend has one:
  // `bytes` of device memory moved off the device on s by a copy engine, holding none of the
  // compute units, as a transfer to another rank leaves most of them to the GEMMs (CUDA:
  // device-to-host into pinned host memory the backend keeps). Without it (CPU, where the
  // one-rank all-gather is already a copy on the stream's own thread), the one-rank
  // all-gather stands in.
  virtual bool has_offload() const { return false; }
  virtual void offload(Stream& s, const void* src, size_t bytes);
  // Keeps s busy for ms milliseconds without using the host (CPU: the worker sleeps; CUDA:
  // a spin kernel). The overlap probe's test hook.
  virtual void delay(Stream& s, double ms) = 0;

  // Sizes the probes use by default on this device.
  virtual int max_gemm_n() const = 0;                  // overlap calibration cap
  virtual size_t max_overlap_bytes() const = 0;        // overlap calibration cap
  virtual size_t default_links_max_bytes() const = 0;  // links sweep end
  virtual std::vector<int> default_gemm_sizes() const = 0;
  virtual size_t default_copy_bytes() const = 0;

  // Device memory in GiB (CPU: physical memory, or the cgroup limit when lower).
  virtual double mem_GiB() const = 0;
  // This process's view: host, cores, device; on GPU also the GPU, its peers and the links
  // between them (NVLink/PCIe via NVML). The links probe gathers it from every rank.
  virtual nlohmann::json local_topology() const = 0;
  // One line on what may distort timings here (CPU: cores shared with other work), or "".
  virtual std::string timing_caveat(int ranks_on_host) const = 0;
};

// The backend of the device's kind. Throws for CUDA when tandem was built without it.
std::unique_ptr<ProbeBackend> probe_backend_create(Device& device);
std::unique_ptr<ProbeBackend> probe_backend_cpu(Device& device);
// tools/cuda/probe_backend_cuda.cu; defined in CUDA builds only (TANDEM_HAVE_CUDA).
std::unique_ptr<ProbeBackend> probe_backend_cuda(Device& device);

// Device memory of one probe buffer. A stream that may still use it must be destroyed
// (drained) first: declare the buffer before the stream. (On CUDA, destroying a stream does
// not drain it, but cudaFree waits for the whole device.)
using ProbeBuffer = DeviceBuffer;

// Helpers shared by the probes.
// "cpu" or "cuda": the device's kind, as the saved probe files (the planner's) name it.
const char* probe_device_kind(const Device& device);
double probe_median(std::vector<double> values);  // 0 for none
std::string probe_bytes_text(double bytes);       // "1 KiB", "64 MiB", "1.5 GiB", "900 B"
// "4096", "64KiB", "64K", "1.5GiB", "1 GB" (k/K, M, G, T with or without B/iB: powers of
// 1024). Throws naming `flag` on anything else, or on a size that is not a whole byte count.
size_t probe_parse_bytes(const std::string& text, const std::string& flag);

}  // namespace tandem
