// The CUDA device. See [CUDA streams], [CUDA probe streams], [CUDA submit], [CUDA stream
// failure] and [CUDA threads] in cuda_device.h.
//
// This file is host code only; it is a .cu so that it is built into tandem_cuda alone
// (the tandem_lib glob takes every src/**/*.cpp, also in CPU-only builds).
#include "device/cuda/cuda_device.h"

#include <nvtx3/nvToolsExtCudaRt.h>

#include <algorithm>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/error.h"

namespace tandem {

// --- stream failure ----------------------------------------------------------------------

class CudaStreamHealth {
 public:
  void fail(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::move(error);
  }

  // Records that the owner waited on an event of `source`; see [CUDA stream failure].
  void add_upstream(const std::shared_ptr<CudaStreamHealth>& source) {
    if (source.get() == this) return;
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = upstream_.begin(); it != upstream_.end();) {
      if (it->expired()) {
        it = upstream_.erase(it);
        continue;
      }
      if (!it->owner_before(source) && !source.owner_before(*it)) return;  // already there
      ++it;
    }
    upstream_.push_back(source);
  }

  // The failure of this stream or of any stream it transitively waited on (null if none).
  // Nodes are locked one at a time, so concurrent queries never deadlock.
  std::exception_ptr error() const {
    std::vector<const CudaStreamHealth*> todo{this};
    std::vector<std::shared_ptr<CudaStreamHealth>> keep;  // keeps visited nodes alive
    std::unordered_set<const CudaStreamHealth*> seen{this};
    while (!todo.empty()) {
      const CudaStreamHealth* node = todo.back();
      todo.pop_back();
      std::lock_guard<std::mutex> lock(node->mu_);
      if (node->error_) return node->error_;
      for (const auto& weak : node->upstream_) {
        std::shared_ptr<CudaStreamHealth> up = weak.lock();
        if (up && seen.insert(up.get()).second) {
          todo.push_back(up.get());
          keep.push_back(std::move(up));
        }
      }
    }
    return nullptr;
  }

 private:
  mutable std::mutex mu_;
  std::exception_ptr error_;
  std::vector<std::weak_ptr<CudaStreamHealth>> upstream_;
};

void cuda_stream_fail(CudaStreamHealth& health, std::exception_ptr error) {
  health.fail(std::move(error));
}

namespace {

// TD_CUDA_CALL for a result already in hand.
void check_result(cudaError_t rc, const char* call, int line) {
  if (rc == cudaSuccess) return;
  (void)cudaGetLastError();
  cuda::detail::throw_cuda(rc, call, __FILE__, line);
}

void rethrow_if(const std::exception_ptr& error) {
  if (error) std::rethrow_exception(error);
}

// --- streams and events ------------------------------------------------------------------

class CudaStream final : public Stream {
 public:
  // owned: the object destroys the stream (false for the legacy default stream, which CUDA
  // owns). health: shared by every handle of one stream (null: a new one).
  CudaStream(std::string name, cudaStream_t handle, int gpu, bool owned = true,
             std::shared_ptr<CudaStreamHealth> health = nullptr)
      : name_(std::move(name)),
        handle_(handle),
        gpu_(gpu),
        owned_(owned),
        health_(health ? std::move(health) : std::make_shared<CudaStreamHealth>()) {}

  // Work still queued completes; CUDA releases the stream afterwards. Errors (such as the
  // runtime already unloading at exit) are ignored: a destructor must not throw.
  ~CudaStream() override {
    if (!owned_) return;
    if (cudaSetDevice(gpu_) == cudaSuccess) (void)cudaStreamDestroy(handle_);
    (void)cudaGetLastError();
  }

  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  const std::string& name() const override { return name_; }
  cudaStream_t handle() const { return handle_; }
  int gpu() const { return gpu_; }
  const std::shared_ptr<CudaStreamHealth>& health() const { return health_; }

 private:
  const std::string name_;
  const cudaStream_t handle_;
  const int gpu_;
  const bool owned_;
  const std::shared_ptr<CudaStreamHealth> health_;
};

class CudaEvent final : public Event {
 public:
  CudaEvent(cudaEvent_t handle, bool timing, int gpu)
      : handle_(handle), timing_(timing), gpu_(gpu) {}

  ~CudaEvent() override {
    if (cudaSetDevice(gpu_) == cudaSuccess) (void)cudaEventDestroy(handle_);
    (void)cudaGetLastError();
  }

  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  cudaEvent_t handle() const { return handle_; }
  bool timing() const { return timing_; }
  int gpu() const { return gpu_; }

  void recorded_on(const std::shared_ptr<CudaStreamHealth>& health) {
    std::lock_guard<std::mutex> lock(mu_);
    source_ = health;
  }
  // The health of the stream of the latest record (null when never recorded).
  std::shared_ptr<CudaStreamHealth> source() const {
    std::lock_guard<std::mutex> lock(mu_);
    return source_;
  }

 private:
  const cudaEvent_t handle_;
  const bool timing_;
  const int gpu_;
  mutable std::mutex mu_;
  std::shared_ptr<CudaStreamHealth> source_;
};

// A captured stream, instantiated: replayed by graph_launch on any stream of the same GPU.
class CudaGraph final : public Graph {
 public:
  CudaGraph(cudaGraphExec_t exec, int gpu) : exec_(exec), gpu_(gpu) {}
  ~CudaGraph() override {
    if (cudaSetDevice(gpu_) == cudaSuccess) (void)cudaGraphExecDestroy(exec_);
    (void)cudaGetLastError();
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  cudaGraphExec_t exec() const { return exec_; }
  int gpu() const { return gpu_; }

 private:
  const cudaGraphExec_t exec_;
  const int gpu_;
};

void check_source(const CudaEvent& event) {
  if (std::shared_ptr<CudaStreamHealth> source = event.source()) rethrow_if(source->error());
}

// --- the device --------------------------------------------------------------------------

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int gpu) : gpu_(gpu) {
    int count = 0;
    const cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      TD_THROW(
          "cannot create CUDA device {}: no CUDA GPU is available to this process "
          "(cudaGetDeviceCount: {}: {})",
          gpu, cudaGetErrorName(rc), cudaGetErrorString(rc));
    }
    TD_CHECK(gpu >= 0 && gpu < count,
             "cannot create CUDA device {}: this process sees {} GPU(s) (CUDA_VISIBLE_DEVICES "
             "may restrict them)",
             gpu, count);
    TD_CUDA_CALL(cudaSetDevice(gpu_));
    cudaDeviceProp prop{};
    TD_CUDA_CALL(cudaGetDeviceProperties(&prop, gpu_));
    name_ = fmt::format("cuda:{} ({})", gpu_, prop.name);
    TD_CUDA_CALL(cudaDeviceGetStreamPriorityRange(&least_priority_, &greatest_priority_));
    TD_CUDA_CALL(
        cudaStreamCreateWithPriority(&copy_stream_, cudaStreamNonBlocking, least_priority_));
    nvtxNameCudaStreamA(copy_stream_, "tandem:copy");
  }

  ~CudaDevice() override {
    if (cudaSetDevice(gpu_) == cudaSuccess) (void)cudaStreamDestroy(copy_stream_);
    (void)cudaGetLastError();
  }

  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  DeviceKind kind() const override { return DeviceKind::cuda; }
  std::string name() const override { return name_; }
  int gpu() const { return gpu_; }

  // alloc(0) returns nullptr; free(nullptr) is a no-op (both as cudaMalloc/cudaFree).
  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    activate();
    void* ptr = nullptr;
    const cudaError_t rc = cudaMalloc(&ptr, bytes);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      (void)cudaMemGetInfo(&free_bytes, &total_bytes);
      (void)cudaGetLastError();
      error_throw("cudaMalloc", __FILE__, __LINE__,
                  fmt::format("cudaMalloc of {} bytes failed on GPU {}: {}: {} ({} of {} bytes "
                              "free)",
                              bytes, gpu_, cudaGetErrorName(rc), cudaGetErrorString(rc), free_bytes,
                              total_bytes));
    }
    return ptr;
  }

  // cudaFree waits for the whole device first (CUDA's rule); memory is freed rarely (the
  // arena takes one allocation for the run).
  void free(void* ptr) override {
    if (ptr == nullptr) return;
    activate();
    TD_CUDA_CALL(cudaFree(ptr));
  }

  void copy_to_device(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_async(void* dst, const void* src, size_t bytes, Stream& stream) override {
    if (bytes == 0) return;
    TD_CHECK(dst != nullptr && src != nullptr, "copy of {} bytes with a null pointer", bytes);
    CudaStream& s = own(stream);
    activate();
    TD_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s.handle()));
  }

  std::unique_ptr<Stream> stream_create(const std::string& name, int priority) override {
    return create_stream(name, priority, cudaStreamNonBlocking);
  }

  // A new stream with the given creation flags; see [CUDA streams] and [CUDA probe streams].
  std::unique_ptr<Stream> create_stream(const std::string& name, int priority, unsigned flags) {
    TD_CHECK(priority == 0 || priority == 1,
             "stream '{}': priority {} is neither 0 (normal) nor 1 (communication)", name,
             priority);
    activate();
    cudaStream_t handle = nullptr;
    TD_CUDA_CALL(cudaStreamCreateWithPriority(
        &handle, flags, priority == 1 ? greatest_priority_ : least_priority_));
    nvtxNameCudaStreamA(handle, name.c_str());
    return std::make_unique<CudaStream>(name, handle, gpu_);
  }

  // A handle to the legacy default stream; see [CUDA probe streams].
  std::unique_ptr<Stream> legacy_default_stream(const std::string& name) {
    activate();
    nvtxNameCudaStreamA(cudaStreamLegacy, name.c_str());
    return std::make_unique<CudaStream>(name, cudaStreamLegacy, gpu_, false, legacy_health_);
  }

  std::unique_ptr<Event> event_create(bool timing) override {
    activate();
    cudaEvent_t handle = nullptr;
    TD_CUDA_CALL(
        cudaEventCreateWithFlags(&handle, timing ? cudaEventDefault : cudaEventDisableTiming));
    return std::make_unique<CudaEvent>(handle, timing, gpu_);
  }

  void submit(Stream& stream, std::function<void()> work) override {
    TD_CHECK(work != nullptr, "empty task submitted to stream '{}'", stream.name());
    own(stream);
    activate();
    work();
  }

  void event_record(Event& event, Stream& stream) override {
    CudaEvent& e = own(event);
    CudaStream& s = own(stream);
    activate();
    TD_CUDA_CALL(cudaEventRecord(e.handle(), s.handle()));
    e.recorded_on(s.health());
  }

  // [Graphs] of device.h: inside a capture, a record the graph replays (an event record
  // node, cudaEventRecordExternal), so the event times each launch.
  void event_record_node(Event& event, Stream& stream) override {
    CudaEvent& e = own(event);
    CudaStream& s = own(stream);
    activate();
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    TD_CUDA_CALL(cudaStreamIsCapturing(s.handle(), &status));
    TD_CUDA_CALL(cudaEventRecordWithFlags(e.handle(), s.handle(),
                                          status == cudaStreamCaptureStatusActive
                                              ? cudaEventRecordExternal
                                              : cudaEventRecordDefault));
    e.recorded_on(s.health());
  }

  void stream_wait(Stream& stream, Event& event) override {
    CudaStream& s = own(stream);
    CudaEvent& e = own(event);
    activate();
    TD_CUDA_CALL(cudaStreamWaitEvent(s.handle(), e.handle(), 0));
    if (std::shared_ptr<CudaStreamHealth> source = e.source()) s.health()->add_upstream(source);
  }

  void event_wait(Event& event) override {
    CudaEvent& e = own(event);
    activate();
    TD_CUDA_CALL(cudaEventSynchronize(e.handle()));
    check_source(e);
  }

  bool event_query(Event& event) override {
    CudaEvent& e = own(event);
    check_source(e);
    activate();
    const cudaError_t rc = cudaEventQuery(e.handle());
    if (rc == cudaErrorNotReady) return false;
    check_result(rc, "cudaEventQuery", __LINE__);
    return true;
  }

  void stream_sync(Stream& stream) override {
    CudaStream& s = own(stream);
    activate();
    const cudaError_t rc = cudaStreamSynchronize(s.handle());
    // A failed collective explains more than what CUDA saw after it was aborted.
    rethrow_if(s.health()->error());
    check_result(rc, "cudaStreamSynchronize", __LINE__);
  }

  double event_elapsed_ms(Event& start, Event& end) override {
    CudaEvent& e0 = timing_event(start, "start");
    CudaEvent& e1 = timing_event(end, "end");
    activate();
    float ms = 0;
    const cudaError_t rc = cudaEventElapsedTime(&ms, e0.handle(), e1.handle());
    if (rc == cudaErrorNotReady) {
      (void)cudaGetLastError();
      TD_THROW("event_elapsed_ms: the {} event has not completed",
               cudaEventQuery(e0.handle()) == cudaErrorNotReady ? "start" : "end");
    }
    check_result(rc, "cudaEventElapsedTime", __LINE__);
    return ms;
  }

  // [Graphs] of device.h. Capture is thread-local: a call that is not allowed while capturing
  // (an allocation, a synchronisation) made by the capturing thread fails and invalidates the
  // capture, which capture_end then reports; other threads are not affected. Streams that
  // joined the capture through an event are captured with it (CUDA's cross-stream capture).
  bool supports_graphs() const override { return true; }

  void capture_begin(Stream& stream) override {
    CudaStream& s = own(stream);
    activate();
    const cudaError_t rc = cudaStreamBeginCapture(s.handle(), cudaStreamCaptureModeThreadLocal);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      TD_THROW("cannot capture stream '{}' into a graph: cudaStreamBeginCapture: {}: {}",
               stream.name(), cudaGetErrorName(rc), cudaGetErrorString(rc));
    }
  }

  std::unique_ptr<Graph> capture_end(Stream& stream) override {
    CudaStream& s = own(stream);
    activate();
    cudaGraph_t graph = nullptr;
    const cudaError_t rc = cudaStreamEndCapture(s.handle(), &graph);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      if (graph) (void)cudaGraphDestroy(graph);
      TD_THROW(
          "the capture of stream '{}' failed: cudaStreamEndCapture: {}: {} (was capture_begin "
          "called on this stream, did the captured work only enqueue, with no allocation or "
          "synchronisation, and did every stream that joined the capture rejoin this one?)",
          stream.name(), cudaGetErrorName(rc), cudaGetErrorString(rc));
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t irc = cudaGraphInstantiate(&exec, graph, 0);
    (void)cudaGraphDestroy(graph);
    if (irc != cudaSuccess) {
      (void)cudaGetLastError();
      TD_THROW(
          "cannot instantiate the graph captured from stream '{}': cudaGraphInstantiate: {}: {}",
          stream.name(), cudaGetErrorName(irc), cudaGetErrorString(irc));
    }
    return std::make_unique<CudaGraph>(exec, gpu_);
  }

  void graph_launch(Graph& graph, Stream& stream) override {
    auto* g = dynamic_cast<CudaGraph*>(&graph);
    TD_CHECK(g != nullptr, "graph_launch: the graph was not captured on a cuda device");
    TD_CHECK(g->gpu() == gpu_, "graph_launch: the graph belongs to GPU {}, not to {}", g->gpu(),
             name_);
    CudaStream& s = own(stream);
    activate();
    TD_CUDA_CALL(cudaGraphLaunch(g->exec(), s.handle()));
  }

  size_t free_bytes() const override {
    activate();
    size_t free_now = 0, total = 0;
    TD_CUDA_CALL(cudaMemGetInfo(&free_now, &total));
    return free_now;
  }

 private:
  void activate() const { TD_CUDA_CALL(cudaSetDevice(gpu_)); }

  CudaStream& own(Stream& stream) const {
    auto* s = dynamic_cast<CudaStream*>(&stream);
    TD_CHECK(s != nullptr, "stream '{}' does not belong to a cuda device", stream.name());
    TD_CHECK(s->gpu() == gpu_, "stream '{}' belongs to GPU {}, not to {}", stream.name(), s->gpu(),
             name_);
    return *s;
  }

  CudaEvent& own(Event& event) const {
    auto* e = dynamic_cast<CudaEvent*>(&event);
    TD_CHECK(e != nullptr, "event does not belong to a cuda device");
    TD_CHECK(e->gpu() == gpu_, "event belongs to GPU {}, not to {}", e->gpu(), name_);
    return *e;
  }

  CudaEvent& timing_event(Event& event, const char* which) const {
    CudaEvent& e = own(event);
    TD_CHECK(e.timing(), "event_elapsed_ms: the {} event was not created with timing=true", which);
    TD_CHECK(e.source() != nullptr, "event_elapsed_ms: the {} event was never recorded", which);
    check_source(e);
    return e;
  }

  // Synchronous: an async copy on the device's own non-blocking stream, then a wait for
  // that stream only. cudaMemcpyDefault lets CUDA infer the direction from the pointers.
  void copy(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    TD_CHECK(dst != nullptr && src != nullptr, "copy of {} bytes with a null pointer", bytes);
    activate();
    TD_CUDA_CALL(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, copy_stream_));
    TD_CUDA_CALL(cudaStreamSynchronize(copy_stream_));
  }

  const int gpu_;
  std::string name_;
  int least_priority_ = 0;     // normal streams
  int greatest_priority_ = 0;  // communication streams (numerically lowest)
  cudaStream_t copy_stream_ = nullptr;
  // The failure state of the legacy default stream, shared by all its handles.
  const std::shared_ptr<CudaStreamHealth> legacy_health_ = std::make_shared<CudaStreamHealth>();
};

CudaDevice& cuda_device_of(Device& device) {
  auto* d = dynamic_cast<CudaDevice*>(&device);
  TD_CHECK(d != nullptr, "device {} is not a cuda device", device.name());
  return *d;
}

}  // namespace

std::unique_ptr<Device> cuda_device_create(int gpu) {
  return std::make_unique<CudaDevice>(gpu);
}

std::unique_ptr<Stream> cuda_stream_create_blocking(Device& device, const std::string& name,
                                                    int priority) {
  return cuda_device_of(device).create_stream(name, priority, cudaStreamDefault);
}

std::unique_ptr<Stream> cuda_stream_legacy_default(Device& device, const std::string& name) {
  return cuda_device_of(device).legacy_default_stream(name);
}

cudaStream_t cuda_stream_of(Stream& stream) {
  auto* s = dynamic_cast<CudaStream*>(&stream);
  TD_CHECK(s != nullptr, "stream '{}' does not belong to a cuda device", stream.name());
  return s->handle();
}

int cuda_gpu_of(const Device& device) {
  const auto* d = dynamic_cast<const CudaDevice*>(&device);
  TD_CHECK(d != nullptr, "device {} is not a cuda device", device.name());
  return d->gpu();
}

std::shared_ptr<CudaStreamHealth> cuda_stream_health(Stream& stream) {
  auto* s = dynamic_cast<CudaStream*>(&stream);
  TD_CHECK(s != nullptr, "stream '{}' does not belong to a cuda device", stream.name());
  return s->health();
}

}  // namespace tandem
