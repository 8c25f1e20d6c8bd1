// The Device interface: memory, streams, events and work submission. CPU and CUDA
// implement it; the step program and every tool talk to this interface only.
//
// [Stream semantics] Work submitted to one stream runs in submission order. Work on
// different streams is unordered unless an event orders it: event_record(e, s) marks the
// point in s reached so far; stream_wait(t, e) makes later work on t wait until that
// point of s has completed (the most recent record of e at the time of the wait call; a
// wait on a never-recorded event is a no-op, as in CUDA). The host blocks only in
// event_wait, stream_sync and the synchronous copies.
//
// [CPU streams] A CPU stream is a worker thread draining a FIFO queue, and a CPU event is
// a fence. submit() queues a closure that the worker runs. On CUDA, submit() calls the
// closure at once on the host; the closure launches asynchronous work onto the stream.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

namespace tandem {

enum class DeviceKind { cpu, cuda };

class Stream {
 public:
  virtual ~Stream() = default;
  virtual const std::string& name() const = 0;
};

class Event {
 public:
  virtual ~Event() = default;
};

// Work recorded once from a stream and replayed as a whole (a CUDA graph); see [Graphs].
class Graph {
 public:
  virtual ~Graph() = default;
};

class Device {
 public:
  virtual ~Device() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;

  // Memory. On CPU, device memory is host memory.
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* ptr) = 0;
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;  // synchronous
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;    // synchronous
  // A copy between two buffers of this device's memory, ordered on `stream` like its other
  // work (and recorded into a graph under capture).
  virtual void copy_async(void* dst, const void* src, size_t bytes, Stream& stream) = 0;

  // Streams live as long as the returned object. priority: 0 normal, 1 high (the
  // communication streams; ignored on CPU).
  virtual std::unique_ptr<Stream> stream_create(const std::string& name, int priority = 0) = 0;
  // timing=true makes the event record a timestamp usable by event_elapsed_ms.
  virtual std::unique_ptr<Event> event_create(bool timing = false) = 0;

  virtual void submit(Stream& stream, std::function<void()> work) = 0;
  virtual void event_record(Event& event, Stream& stream) = 0;
  virtual void stream_wait(Stream& stream, Event& event) = 0;
  virtual void event_wait(Event& event) = 0;     // host blocks until the event completes
  virtual bool event_query(Event& event) = 0;    // has the event completed?
  virtual void stream_sync(Stream& stream) = 0;  // host blocks until the stream drains
  // Milliseconds between two completed timing events.
  virtual double event_elapsed_ms(Event& start, Event& end) = 0;

  // [Graphs] Between capture_begin(s) and capture_end(s), work submitted to s is recorded
  // rather than run (it must only enqueue: no allocation, no host synchronisation);
  // graph_launch(g, s) then runs all of it, in order, with the pointers and arguments it had
  // at capture. Another stream joins the capture by waiting on an event recorded on a
  // capturing stream; from then on its work is recorded too, ordered by the events between
  // the streams as when run, and it must rejoin (s waits on an event recorded on it) before
  // capture_end(s). Inside a capture event_record only orders the captured streams: its
  // event is not recorded when the graph runs. event_record_node records the event as a step
  // of the graph instead, at every launch, so its time can be read after each launch (and
  // outside a capture it is event_record). A device without graphs (the CPU) returns false
  // from supports_graphs and throws from capture_begin, capture_end and graph_launch.
  virtual bool supports_graphs() const { return false; }
  virtual void capture_begin(Stream& stream);
  virtual std::unique_ptr<Graph> capture_end(Stream& stream);
  virtual void graph_launch(Graph& graph, Stream& stream);
  virtual void event_record_node(Event& event, Stream& stream) { event_record(event, stream); }
  // Bytes of device memory free now (the CPU: the host's available memory).
  virtual size_t free_bytes() const = 0;
};

// Device memory freed on every path (RAII over Device::alloc/free). Work still queued on a
// stream that uses it must be drained first: declare the buffer before the stream.
class DeviceBuffer {
 public:
  DeviceBuffer(Device& device, size_t bytes) : device_(device), ptr_(device.alloc(bytes)) {}
  ~DeviceBuffer() { device_.free(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  float* f32() const { return as<float>(); }

 private:
  Device& device_;
  void* ptr_;
};

// CPU device: streams are worker threads. Errors thrown by submitted work are captured
// and rethrown by the next event_wait or stream_sync that depends on them.
std::unique_ptr<Device> device_create_cpu();
// CUDA device on the given GPU (throws when tandem was built without CUDA).
std::unique_ptr<Device> device_create_cuda(int gpu);
std::unique_ptr<Device> device_create(DeviceKind kind, int gpu = 0);

// "cpu" | "cuda"; throws "unknown device '<name>' (expected cpu or cuda)" for anything else.
DeviceKind device_kind_parse(const std::string& name);
const char* device_kind_name(DeviceKind kind);  // "cpu" | "cuda"

}  // namespace tandem
