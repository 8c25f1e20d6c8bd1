// The CPU device: host memory, streams that are worker threads, events that are fences.
//
// Each CpuStream owns one worker thread draining a FIFO queue of tasks. A task is one of
// three kinds: work (a submitted closure), record (completes a fence of an event) and wait
// (blocks the worker until a fence completes). Ordering across streams therefore comes
// only from record/wait pairs, as [Stream semantics] in device/device.h requires.
//
// Every event_record creates a new Fence: the event's generation counter is bumped on the
// host at call time and the event points at the new fence. stream_wait, event_wait and
// event_query capture the event's latest fence at call time, so a later re-record of the
// same event never changes what an earlier wait waits for, and records of one event on
// different streams that complete out of order cannot satisfy each other's waiters.
//
// [CPU stream errors] A task that throws does not kill the worker. The stream catches the
// exception, keeps the first one (std::exception_ptr) and becomes failed; failure is
// sticky for the life of the stream:
//  - later work tasks of a failed stream are skipped (never run);
//  - later record tasks still run, completing their fence marked failed with the stream's
//    stored exception, so that no waiter ever hangs;
//  - later wait tasks of a failed stream do not block (nothing would run after them);
//  - a wait task that sees a failed fence makes its own stream failed with that fence's
//    exception (failure propagates along the event graph to every dependent stream);
//  - the host sees the failure where it synchronises: stream_sync rethrows the stream's
//    stored exception (every time, since failure is sticky), and event_wait, event_query
//    and event_elapsed_ms rethrow the exception carried by a failed fence. The exception
//    rethrown is the original one thrown by the failing task, wherever it propagated.
//  - destroying a failed stream drains its queue under these rules and joins; it neither
//    hangs nor throws.
#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "core/error.h"
#include "device/device.h"

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;

// Host allocations are aligned like cudaMalloc's, so arena offsets aligned to the default
// arena alignment are aligned in absolute terms too.
constexpr size_t kHostAlignment = 256;

// One recorded point of an event: completed once by the record task of the stream it was
// recorded on, possibly failed.
struct Fence {
  explicit Fence(uint64_t gen) : generation(gen) {}

  void complete(std::exception_ptr failure, bool stamp) {
    const Clock::time_point now = stamp ? Clock::now() : Clock::time_point{};
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      error = std::move(failure);
      time = now;
    }
    cv.notify_all();
  }

  // Blocks until complete; returns the failure (null when the fence completed cleanly).
  std::exception_ptr wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
    return error;
  }

  const uint64_t generation;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
  Clock::time_point time;
};

class CpuEvent final : public Event {
 public:
  explicit CpuEvent(bool timing) : timing_(timing) {}

  bool timing() const { return timing_; }

  // A new fence for a record issued now; later captures see it.
  std::shared_ptr<Fence> record() {
    std::lock_guard<std::mutex> lock(mu_);
    latest_ = std::make_shared<Fence>(++generation_);
    return latest_;
  }

  // The fence of the most recent record (null when never recorded).
  std::shared_ptr<Fence> latest() {
    std::lock_guard<std::mutex> lock(mu_);
    return latest_;
  }

 private:
  const bool timing_;
  std::mutex mu_;
  uint64_t generation_ = 0;
  std::shared_ptr<Fence> latest_;
};

struct Task {
  enum class Kind { work, record, wait };
  Kind kind = Kind::work;
  std::function<void()> work;    // Kind::work
  std::shared_ptr<Fence> fence;  // Kind::record and Kind::wait
  bool stamp = false;            // Kind::record: store a timestamp
};

class CpuStream final : public Stream {
 public:
  explicit CpuStream(std::string name) : name_(std::move(name)) {
    try {
      worker_ = std::thread([this] { run(); });
    } catch (const std::system_error& e) {
      TD_THROW("cannot start the worker thread of stream '{}': {}", name_, e.what());
    }
  }

  // Drains the queue (see [CPU stream errors] for a failed stream), then joins.
  ~CpuStream() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_one();
    worker_.join();
  }

  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;

  const std::string& name() const override { return name_; }

  void push(Task task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(task));
      ++submitted_;
    }
    work_cv_.notify_one();
  }

  // Blocks until every task pushed before the call has run; rethrows the stream's failure.
  void sync() {
    TD_CHECK(std::this_thread::get_id() != worker_.get_id(),
             "stream_sync on stream '{}' from a task of that stream would deadlock", name_);
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = submitted_;
    done_cv_.wait(lock, [&] { return finished_ >= target; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void run() {
#if defined(__linux__)
    // Linux limits thread names to 15 characters plus the terminator.
    pthread_setname_np(pthread_self(), name_.substr(0, 15).c_str());
#endif
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        work_cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      std::exception_ptr failure = execute(task);
      task = Task{};  // release the closure's captures before reporting progress
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (failure && !error_) error_ = std::move(failure);
        ++finished_;
      }
      done_cv_.notify_all();
    }
  }

  // Runs one task; returns a new failure of this stream, if any. error_ is written only by
  // this thread (under mu_), so reading it here without the lock is race-free.
  std::exception_ptr execute(Task& task) {
    switch (task.kind) {
      case Task::Kind::work:
        if (error_) return nullptr;  // skipped: the stream has failed
        try {
          task.work();
        } catch (...) {
          return std::current_exception();
        }
        return nullptr;
      case Task::Kind::record:
        task.fence->complete(error_, task.stamp);
        return nullptr;
      case Task::Kind::wait:
        if (error_) return nullptr;  // nothing after it will run anyway
        return task.fence->wait();
    }
    return nullptr;
  }

  const std::string name_;
  std::mutex mu_;
  std::condition_variable work_cv_;  // the worker waits for tasks or stop_
  std::condition_variable done_cv_;  // the host waits for finished_ to advance
  std::deque<Task> queue_;
  uint64_t submitted_ = 0;
  uint64_t finished_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;  // the first failure; sticky
  std::thread worker_;        // declared last: started once everything else exists
};

CpuStream& cpu_stream(Stream& stream) {
  auto* s = dynamic_cast<CpuStream*>(&stream);
  TD_CHECK(s != nullptr, "stream '{}' does not belong to the cpu device", stream.name());
  return *s;
}

CpuEvent& cpu_event(Event& event) {
  auto* e = dynamic_cast<CpuEvent*>(&event);
  TD_CHECK(e != nullptr, "event does not belong to the cpu device");
  return *e;
}

class CpuDevice final : public Device {
 public:
  DeviceKind kind() const override { return DeviceKind::cpu; }
  std::string name() const override { return "cpu"; }

  // alloc(0) returns nullptr (like cudaMalloc); free(nullptr) is a no-op.
  void* alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    TD_CHECK(bytes <= SIZE_MAX - (kHostAlignment - 1),
             "cpu alloc of {} bytes failed: size too large", bytes);
    // aligned_alloc wants a size that is a multiple of the alignment.
    const size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    void* ptr = std::aligned_alloc(kHostAlignment, rounded);
    TD_CHECK(ptr != nullptr, "cpu alloc of {} bytes failed: out of host memory", bytes);
    return ptr;
  }

  void free(void* ptr) override { std::free(ptr); }

  // Plain memcpy on the calling thread; they do not wait for any stream.
  void copy_to_device(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override { copy(dst, src, bytes); }
  void copy_async(void* dst, const void* src, size_t bytes, Stream& stream) override {
    submit(stream, [dst, src, bytes] { copy(dst, src, bytes); });
  }

  std::unique_ptr<Stream> stream_create(const std::string& name, int priority) override {
    return std::make_unique<CpuStream>(name);  // priority is ignored on CPU
  }

  std::unique_ptr<Event> event_create(bool timing) override {
    return std::make_unique<CpuEvent>(timing);
  }

  void submit(Stream& stream, std::function<void()> work) override {
    TD_CHECK(work != nullptr, "empty task submitted to stream '{}'", stream.name());
    Task task;
    task.kind = Task::Kind::work;
    task.work = std::move(work);
    cpu_stream(stream).push(std::move(task));
  }

  void event_record(Event& event, Stream& stream) override {
    CpuStream& s = cpu_stream(stream);
    CpuEvent& e = cpu_event(event);
    Task task;
    task.kind = Task::Kind::record;
    task.fence = e.record();
    task.stamp = e.timing();
    s.push(std::move(task));
  }

  void stream_wait(Stream& stream, Event& event) override {
    CpuStream& s = cpu_stream(stream);
    std::shared_ptr<Fence> fence = cpu_event(event).latest();
    if (!fence) return;  // never recorded: a no-op
    Task task;
    task.kind = Task::Kind::wait;
    task.fence = std::move(fence);
    s.push(std::move(task));
  }

  void event_wait(Event& event) override {
    std::shared_ptr<Fence> fence = cpu_event(event).latest();
    if (!fence) return;
    if (std::exception_ptr failure = fence->wait()) std::rethrow_exception(failure);
  }

  bool event_query(Event& event) override {
    std::shared_ptr<Fence> fence = cpu_event(event).latest();
    if (!fence) return true;
    std::lock_guard<std::mutex> lock(fence->mu);
    if (fence->error) std::rethrow_exception(fence->error);
    return fence->done;
  }

  void stream_sync(Stream& stream) override { cpu_stream(stream).sync(); }

  double event_elapsed_ms(Event& start, Event& end) override {
    const Clock::time_point t0 = completed_time(cpu_event(start), "start");
    const Clock::time_point t1 = completed_time(cpu_event(end), "end");
    return std::chrono::duration<double, std::milli>(t1 - t0).count();
  }

  size_t free_bytes() const override {
    const long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : 0;
  }

 private:
  static void copy(void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    TD_CHECK(dst != nullptr && src != nullptr, "copy of {} bytes with a null pointer", bytes);
    std::memcpy(dst, src, bytes);
  }

  static Clock::time_point completed_time(CpuEvent& event, const char* which) {
    TD_CHECK(event.timing(), "event_elapsed_ms: the {} event was not created with timing=true",
             which);
    std::shared_ptr<Fence> fence = event.latest();
    TD_CHECK(fence != nullptr, "event_elapsed_ms: the {} event was never recorded", which);
    std::lock_guard<std::mutex> lock(fence->mu);
    TD_CHECK(fence->done, "event_elapsed_ms: the {} event has not completed", which);
    if (fence->error) std::rethrow_exception(fence->error);
    return fence->time;
  }
};

}  // namespace

std::unique_ptr<Device> device_create_cpu() {
  return std::make_unique<CpuDevice>();
}

}  // namespace tandem
