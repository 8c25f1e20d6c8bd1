// The NCCL communicator. Host code only; it is a .cu so that it is built into tandem_cuda
// alone (the tandem_lib glob takes every src/**/*.cpp, also in CPU-only builds).
//
// [NCCL bootstrap] Rank 0 creates an ncclUniqueId; under an MPI launcher MPI broadcasts
// it (a nonblocking MPI_Ibcast polled under the timeout, so a dead peer cannot hang the
// host); without one the world has one rank and MPI is never initialised. Every
// communicator is nonblocking (config.blocking = 0): init, split and finalize return at
// once and the host polls ncclCommGetAsyncError until the communicator is ready, under
// the timeout, aborting it (ncclCommAbort) when the deadline passes. duplicate() is
// ncclCommSplit with one color for all ranks, split() is ncclCommSplit(color, key).
//
// [NCCL timeouts] See [Collective timeouts] in comm/communicator.h. A collective records
// an event before and after it on its stream. Each communicator has a watchdog thread
// that polls the pending events of its collectives: the timeout clock of a collective
// starts when its start event completes (when the stream reaches it, not when the host
// enqueued it, so time spent waiting for producers does not count), and a collective whose
// end event has not completed within the timeout fails. The watchdog also polls
// ncclCommGetAsyncError (NCCL's own network and peer errors). On a failure it builds one
// tandem::Error naming the operation, the label and the rank (the MPI communicator's
// wording), marks the streams of every pending collective failed (so stream_sync,
// event_wait and friends on the CUDA device rethrow it, see [CUDA stream failure] in
// device/cuda/cuda_device.h) and then calls ncclCommAbort, which makes the hung NCCL
// kernels exit so the streams drain. Failure is sticky: every later call on the
// communicator (collectives, duplicate, split) rethrows the same error. As with MPI, the
// only sound continuation is to abort the job (the CLI does).
//
// [Captured collectives] A collective enqueued while its stream is being captured into a
// graph ([Step graph], docs/design.md) is recorded, not run: its events would be recorded
// once, at the capture, and never by the graph's launches, so it gets no watchdog entry. In
// a replayed step NCCL's own asynchronous errors are still reported when a later eager
// collective polls them, but a collective waiting on a dead peer is not timed out; that
// step's host wait then lasts until the launcher ends the job (docs/usage.md, --cuda-graph).
//
// [NCCL issue order] NCCL matches the collectives of one communicator by the order in
// which each rank issues them. On CUDA a collective is issued when the host calls it (the
// host enqueues, the GPU runs it later), so issue order is host program order; the NCCL
// calls of one communicator are serialised by a mutex (NCCL communicators are not thread
// safe), and callers issuing from several threads must order those threads themselves.
// duplicate() and split() are collective over the communicator and must also be called in
// the same order on every rank.
//
// [NVLS off] NVLink SHARP (NVLS: reductions done by NVSwitch multicast) is turned off by
// setting NCCL_NVLS_ENABLE=0 before the first NCCL call when the environment does not set
// it; a user's value is never overwritten. In this workplace a program that uses NVLink
// multicast can put the host's shared GPUs out of service, and NVLS also changes the order
// in which sums are formed (in the switch), which would make the tests' results depend on
// the machine's topology.
//
// [NCCL versions] Everything that depends on NCCL's version is in the "NCCL versions"
// section below: the minimum at compile and run time and the communicator config.
#include "comm/cuda/nccl.h"

#include <cuda_runtime.h>
#include <nccl.h>
// The C API of MPI only (as mpi.cpp gets through MPI::MPI_CXX's definitions).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>
#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/comm_internal.h"
#include "core/error.h"
#include "device/cuda/cuda_device.h"

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;

// --- NCCL versions -----------------------------------------------------------------------
// ncclCommSplit needs 2.18; nonblocking communicators 2.14; ncclBfloat16 2.10.

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "tandem needs NCCL 2.18 or newer (ncclCommSplit, nonblocking communicators, bf16)"
#endif
constexpr int kMinNcclVersion = NCCL_VERSION(2, 18, 0);

// The config of every communicator: nonblocking, named for NCCL's logs where supported.
// commName must stay valid until the communicator is ready (the caller's string does).
ncclConfig_t nccl_config(const std::string& name) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
  config.commName = name.c_str();
#endif
  return config;
}

// A split's child communicator: NCCL 2.28 writes *newcomm only when the split completes,
// on its own thread, and completes it when the parent is polled; older versions return
// the child at once in ncclInProgress. Polling the parent until it is ready, then the
// child, is right for both (the child pointer is read only after the parent is ready).
// See NcclCore::split.

// --- process-wide setup ------------------------------------------------------------------

// Runs once before any other NCCL call: [NVLS off], then the version check.
int nccl_process_init() {
  static const int version = [] {
    // setenv with overwrite = 0 keeps a value the user set; see [NVLS off].
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    int v = 0;
    const ncclResult_t rc = ncclGetVersion(&v);
    TD_CHECK(rc == ncclSuccess, "ncclGetVersion failed: {}", ncclGetErrorString(rc));
    TD_CHECK(v >= kMinNcclVersion,
             "the NCCL library loaded at run time is version code {}, but tandem needs {} or "
             "newer (it was compiled against {})",
             v, kMinNcclVersion, NCCL_VERSION_CODE);
    return v;
  }();
  return version;
}

std::string nccl_text(ncclResult_t rc) {
  std::string text = ncclGetErrorString(rc);
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') text += fmt::format(" ({})", last);
  return text;
}

std::exception_ptr error_ptr(const char* call, const char* file, int line, std::string message) {
  try {
    error_throw(call, file, line, std::move(message));
  } catch (...) {
    return std::current_exception();
  }
}
#define TD_ERROR_PTR(...) error_ptr(__func__, __FILE__, __LINE__, fmt::format(__VA_ARGS__))

ncclDataType_t nccl_type(DType dtype) {
  return dtype == DType::f32 ? ncclFloat32 : ncclBfloat16;
}

std::mutex& hook_mutex() {
  static std::mutex mu;
  return mu;
}
std::function<void(CUstream_st*)>& hook() {
  static std::function<void(CUstream_st*)> h;
  return h;
}

// Backoff for host polls: yield for the first polls, then sleep up to kMaxPause.
class Backoff {
 public:
  void pause() {
    if (++polls_ <= 64) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(pause_);
    pause_ = std::min(pause_ * 2, std::chrono::microseconds(100));
  }

 private:
  int polls_ = 0;
  std::chrono::microseconds pause_{1};
};

// Polls a nonblocking communicator until it leaves ncclInProgress or the deadline passes
// (*timed_out then). Returns its state, or the error of ncclCommGetAsyncError itself.
ncclResult_t poll_ready(ncclComm_t comm, Clock::time_point deadline, bool* timed_out) {
  Backoff backoff;
  for (;;) {
    ncclResult_t state = ncclInProgress;
    const ncclResult_t rc = ncclCommGetAsyncError(comm, &state);
    if (rc != ncclSuccess) return rc;
    if (state != ncclInProgress) return state;
    if (Clock::now() >= deadline) {
      *timed_out = true;
      return ncclInProgress;
    }
    backoff.pause();
  }
}

Clock::duration to_duration(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// --- MPI, for the bootstrap only ---------------------------------------------------------

// Initialises MPI once (as mpi.cpp does: MPI_THREAD_MULTIPLE, errors returned as codes).
void mpi_bootstrap_init() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  int finalized = 0;
  MPI_Finalized(&finalized);
  TD_CHECK(!finalized, "MPI was already finalised in this process and cannot be started again");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  } else {
    MPI_Query_thread(&provided);
  }
  TD_CHECK(provided >= MPI_THREAD_MULTIPLE,
           "the MPI library does not provide MPI_THREAD_MULTIPLE, which tandem needs; use an "
           "MPI built with thread support, such as the distribution's OpenMPI");
}

// Broadcasts rank 0's unique id to every rank of MPI's world, under the timeout. A timed
// out request is abandoned; the job is aborted anyway.
void mpi_broadcast_id(ncclUniqueId& id, int rank, int size, double timeout_s) {
  MPI_Request req = MPI_REQUEST_NULL;
  int rc = MPI_Ibcast(&id, static_cast<int>(sizeof id), MPI_BYTE, 0, MPI_COMM_WORLD, &req);
  TD_CHECK(rc == MPI_SUCCESS, "broadcast of the NCCL unique id could not start on rank {} of {}",
           rank, size);
  const Clock::time_point deadline = Clock::now() + to_duration(timeout_s);
  Backoff backoff;
  for (;;) {
    int done = 0;
    rc = MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    TD_CHECK(rc == MPI_SUCCESS, "broadcast of the NCCL unique id failed on rank {} of {}", rank,
             size);
    if (done) return;
    TD_CHECK(Clock::now() < deadline,
             "broadcast of the NCCL unique id timed out after {} s on rank {} of {}: a peer rank "
             "may have died or not started a CUDA run",
             timeout_s, rank, size);
    backoff.pause();
  }
}

// --- the communicator's state and watchdog -----------------------------------------------

constexpr std::chrono::milliseconds kWatchPoll{2};
constexpr std::chrono::milliseconds kAsyncErrorPoll{100};
constexpr size_t kScratchBytes = 256;  // the barrier's one-element all-reduce

// One enqueued collective the watchdog follows.
struct Pending {
  cudaEvent_t start = nullptr;
  cudaEvent_t end = nullptr;
  const char* op = "";
  std::string label;
  std::shared_ptr<CudaStreamHealth> stream;
  bool started = false;
  Clock::time_point started_at;
};

// Everything of one communicator that changes: the NCCL handle, the pending collectives,
// the sticky failure and the watchdog thread. Lock order: nccl_mu_ before mu_.
class NcclCore {
 public:
  NcclCore(Device& device, ncclComm_t comm, int rank, int size, std::string name, double timeout_s)
      : gpu_(cuda_gpu_of(device)),
        rank_(rank),
        size_(size),
        name_(std::move(name)),
        timeout_s_(timeout_s),
        timeout_(to_duration(timeout_s)),
        comm_(comm) {
    try {
      TD_CUDA_CALL(cudaSetDevice(gpu_));
      TD_CUDA_CALL(cudaMalloc(&scratch_, kScratchBytes));
      const std::vector<unsigned char> zeros(kScratchBytes, 0);
      device.copy_to_device(scratch_, zeros.data(), kScratchBytes);
      watchdog_ = std::thread([this] { watch(); });
    } catch (...) {
      if (scratch_ != nullptr) (void)cudaFree(scratch_);
      (void)ncclCommAbort(comm_);
      throw;
    }
  }

  // Waits until every pending collective has completed or failed (the watchdog times out
  // the ones that never start, counting from here), stops the watchdog, then finalises
  // the communicator (or aborts it when that does not finish within the timeout).
  ~NcclCore() {
    {
      std::unique_lock<std::mutex> lock(mu_);
      draining_ = true;
      drain_start_ = Clock::now();
      work_cv_.notify_all();
      idle_cv_.wait(lock, [&] { return pending_.empty(); });
      stop_ = true;
    }
    work_cv_.notify_all();
    watchdog_.join();
    close();
    (void)cudaSetDevice(gpu_);
    for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
    for (cudaEvent_t e : retired_events_) (void)cudaEventDestroy(e);
    (void)cudaFree(scratch_);
    (void)cudaGetLastError();
  }

  NcclCore(const NcclCore&) = delete;
  NcclCore& operator=(const NcclCore&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  double timeout_s() const { return timeout_s_; }
  void* scratch() const { return scratch_; }

  // Enqueues one collective on `stream`: call(comm, native stream) makes the NCCL call.
  template <class Call>
  void enqueue(Stream& stream, const char* op, const std::string& label, Call call) {
    cudaStream_t native = cuda_stream_of(stream);
    std::shared_ptr<CudaStreamHealth> health = cuda_stream_health(stream);
    std::lock_guard<std::mutex> nccl_lock(nccl_mu_);
    rethrow_failure();
    TD_CUDA_CALL(cudaSetDevice(gpu_));
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    TD_CUDA_CALL(cudaStreamIsCapturing(native, &capture));
    if (capture != cudaStreamCaptureStatusNone) {
      // [Captured collectives]: recorded into the graph, without a watchdog entry.
      ncclResult_t rc = call(comm_, native);
      if (rc == ncclInProgress) {
        bool timed_out = false;
        rc = poll_ready(comm_, Clock::now() + timeout_, &timed_out);
        TD_CHECK(!timed_out,
                 "{} '{}' timed out after {} s on rank {} of {} (communicator {}) "
                 "while NCCL recorded it into a graph",
                 op, label, timeout_s_, rank_, size_, name_);
      }
      TD_CHECK(rc == ncclSuccess,
               "{} '{}' could not be recorded into a graph on rank {} of {} "
               "(communicator {}): {}",
               op, label, rank_, size_, name_, nccl_text(rc));
      return;
    }
    Pending p;
    p.op = op;
    p.label = label;
    p.stream = health;
    p.start = take_event();
    p.end = take_event();
    try {
      TD_CUDA_CALL(cudaEventRecord(p.start, native));
      {
        std::function<void(CUstream_st*)> h;
        {
          std::lock_guard<std::mutex> lock(hook_mutex());
          h = hook();
        }
        if (h) h(native);
      }
      ncclResult_t rc = call(comm_, native);
      if (rc == ncclInProgress) {
        // Enqueueing continues on NCCL's thread (e.g. connecting to peers on first use);
        // the GPU work exists only once the communicator is ready again.
        bool timed_out = false;
        rc = poll_ready(comm_, Clock::now() + timeout_, &timed_out);
        if (timed_out)
          fail_now(TD_ERROR_PTR("{} '{}' timed out after {} s on rank {} of {} (communicator "
                                "{}) while NCCL enqueued it: a peer rank may have died",
                                op, label, timeout_s_, rank_, size_, name_),
                   health);
      }
      if (rc != ncclSuccess)
        fail_now(TD_ERROR_PTR("{} '{}' could not start on rank {} of {} (communicator {}): {}", op,
                              label, rank_, size_, name_, nccl_text(rc)),
                 health);
      TD_CUDA_CALL(cudaEventRecord(p.end, native));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      retired_events_.push_back(p.start);
      retired_events_.push_back(p.end);
      throw;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_) {
      // The watchdog failed the communicator while this call ran; its result is lost.
      retired_events_.push_back(p.start);
      retired_events_.push_back(p.end);
      cuda_stream_fail(*health, failure_);
      std::rethrow_exception(failure_);
    }
    pending_.push_back(std::move(p));
    work_cv_.notify_all();
  }

  // A new communicator from ncclCommSplit(color, key), ready to use.
  ncclComm_t split(int color, int key, const std::string& name, const char* what, int* rank,
                   int* size) {
    std::lock_guard<std::mutex> nccl_lock(nccl_mu_);
    rethrow_failure();
    TD_CUDA_CALL(cudaSetDevice(gpu_));
    ncclConfig_t config = nccl_config(name);
    ncclComm_t child = nullptr;
    const Clock::time_point deadline = Clock::now() + timeout_;
    ncclResult_t rc = ncclCommSplit(comm_, color, key, &child, &config);
    bool timed_out = false;
    if (rc == ncclSuccess || rc == ncclInProgress) rc = poll_ready(comm_, deadline, &timed_out);
    if (timed_out)
      fail_now(TD_ERROR_PTR("{} of communicator {} into {} timed out after {} s on rank {} of "
                            "{}: a peer rank may have died",
                            what, name_, name, timeout_s_, rank_, size_),
               nullptr);
    if (rc != ncclSuccess)
      fail_now(TD_ERROR_PTR("{} of communicator {} into {} failed on rank {} of {}: {}", what,
                            name_, name, rank_, size_, nccl_text(rc)),
               nullptr);
    TD_CHECK(child != nullptr, "{} of communicator {} into {}: NCCL returned no communicator", what,
             name_, name);
    rc = poll_ready(child, deadline, &timed_out);
    if (rc == ncclSuccess) rc = ncclCommUserRank(child, rank);
    if (rc == ncclSuccess) rc = ncclCommCount(child, size);
    if (timed_out || rc != ncclSuccess) {
      (void)ncclCommAbort(child);
      TD_THROW("{} of communicator {} into {} failed on rank {} of {}: {}", what, name_, name,
               rank_, size_,
               timed_out ? fmt::format("timed out after {} s", timeout_s_) : nccl_text(rc));
    }
    return child;
  }

  // Rethrows the communicator's failure, if any; see [NCCL timeouts].
  void rethrow_failure() {
    std::lock_guard<std::mutex> lock(mu_);
    if (failure_) std::rethrow_exception(failure_);
  }

 private:
  // An ordering event from the pool. Called with nccl_mu_ held and the device current.
  cudaEvent_t take_event() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_events_.empty()) {
        cudaEvent_t e = free_events_.back();
        free_events_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    TD_CUDA_CALL(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }

  // Records `error` as the communicator's failure, fails `stream` and every pending
  // collective's stream, aborts the communicator and throws. nccl_mu_ is held.
  [[noreturn]] void fail_now(std::exception_ptr error,
                             const std::shared_ptr<CudaStreamHealth>& stream) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!failure_) failure_ = error;
      if (stream) cuda_stream_fail(*stream, failure_);
      fail_pending_locked();
    }
    abort_locked();
    std::rethrow_exception(error);
  }

  // mu_ is held: every pending collective's stream fails with failure_.
  void fail_pending_locked() {
    for (Pending& p : pending_) {
      cuda_stream_fail(*p.stream, failure_);
      retired_events_.push_back(p.start);
      retired_events_.push_back(p.end);
    }
    pending_.clear();
    idle_cv_.notify_all();
  }

  // nccl_mu_ is held. Makes NCCL's kernels exit and frees the communicator.
  void abort_locked() {
    if (comm_ == nullptr) return;
    (void)cudaSetDevice(gpu_);
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // Finalises (flushes) and destroys the communicator, or aborts it when finalising fails
  // or outlasts the timeout. Never throws.
  void close() {
    std::lock_guard<std::mutex> nccl_lock(nccl_mu_);
    if (comm_ == nullptr) return;
    (void)cudaSetDevice(gpu_);
    ncclResult_t rc = ncclCommFinalize(comm_);
    bool timed_out = false;
    if (rc == ncclSuccess || rc == ncclInProgress)
      rc = poll_ready(comm_, Clock::now() + timeout_, &timed_out);
    if (rc == ncclSuccess && !timed_out)
      (void)ncclCommDestroy(comm_);
    else
      (void)ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  void watch() {
#if defined(__linux__)
    pthread_setname_np(pthread_self(), "nccl-watchdog");
#endif
    (void)cudaSetDevice(gpu_);
    Clock::time_point next_async_check = Clock::now() + kAsyncErrorPoll;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (pending_.empty()) {
        idle_cv_.notify_all();
        if (stop_) return;
        work_cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
        continue;
      }
      work_cv_.wait_for(lock, kWatchPoll);
      std::exception_ptr failure = poll_events_locked();
      if (!failure && Clock::now() >= next_async_check && !pending_.empty()) {
        next_async_check = Clock::now() + kAsyncErrorPoll;
        failure = poll_async_error(lock);
      }
      if (!failure) continue;
      if (!failure_) failure_ = failure;
      fail_pending_locked();  // the streams fail before the abort lets them drain
      lock.unlock();
      {
        std::lock_guard<std::mutex> nccl_lock(nccl_mu_);
        abort_locked();
      }
      lock.lock();
    }
  }

  // mu_ is held. Retires completed collectives; returns a failure for the first one that
  // timed out or whose events report a CUDA error.
  std::exception_ptr poll_events_locked() {
    const Clock::time_point now = Clock::now();
    for (auto it = pending_.begin(); it != pending_.end();) {
      Pending& p = *it;
      if (!p.started) {
        const cudaError_t rc = cudaEventQuery(p.start);
        if (rc == cudaSuccess) {
          p.started = true;
          p.started_at = now;
        } else if (rc != cudaErrorNotReady) {
          return cuda_failure(p, rc);
        } else if (draining_ && now - drain_start_ >= timeout_) {
          return timeout_failure(p, " (it never started before its communicator was destroyed)");
        }
      }
      if (p.started) {
        const cudaError_t rc = cudaEventQuery(p.end);
        if (rc == cudaSuccess) {
          free_events_.push_back(p.start);
          free_events_.push_back(p.end);
          it = pending_.erase(it);
          continue;
        }
        if (rc != cudaErrorNotReady) return cuda_failure(p, rc);
        if (now - p.started_at >= timeout_) return timeout_failure(p, "");
      }
      ++it;
    }
    return nullptr;
  }

  // Asks NCCL for an asynchronous error (a peer or network failure). Skipped while the
  // host is inside an NCCL call on this communicator (NCCL calls are serialised).
  std::exception_ptr poll_async_error(std::unique_lock<std::mutex>& lock) {
    lock.unlock();
    ncclResult_t state = ncclSuccess;
    if (nccl_mu_.try_lock()) {
      if (comm_ != nullptr) {
        const ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
        if (rc != ncclSuccess) state = rc;
      }
      nccl_mu_.unlock();
    }
    lock.lock();
    if (state == ncclSuccess || state == ncclInProgress || pending_.empty()) return nullptr;
    const Pending& p = pending_.front();
    return TD_ERROR_PTR("{} '{}' failed on rank {} of {} (communicator {}): {}", p.op, p.label,
                        rank_, size_, name_, nccl_text(state));
  }

  std::exception_ptr timeout_failure(const Pending& p, const char* detail) const {
    return TD_ERROR_PTR(
        "{} '{}' timed out after {} s on rank {} of {} (communicator {}){}: a "
        "peer rank may have died",
        p.op, p.label, timeout_s_, rank_, size_, name_, detail);
  }

  std::exception_ptr cuda_failure(const Pending& p, cudaError_t rc) const {
    return TD_ERROR_PTR("{} '{}' failed on rank {} of {} (communicator {}): {}: {}", p.op, p.label,
                        rank_, size_, name_, cudaGetErrorName(rc), cudaGetErrorString(rc));
  }

  const int gpu_;
  const int rank_;
  const int size_;
  const std::string name_;
  const double timeout_s_;
  const Clock::duration timeout_;
  void* scratch_ = nullptr;

  std::mutex nccl_mu_;  // serialises every NCCL call on comm_
  ncclComm_t comm_;     // null once aborted or closed (written under nccl_mu_)

  std::mutex mu_;                    // everything below
  std::condition_variable work_cv_;  // the watchdog waits for pending work or stop_
  std::condition_variable idle_cv_;  // the destructor waits for pending_ to empty
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> free_events_;
  std::vector<cudaEvent_t> retired_events_;  // of failed collectives; destroyed at the end
  std::exception_ptr failure_;               // the first failure; sticky
  bool draining_ = false;
  Clock::time_point drain_start_;
  bool stop_ = false;
  std::thread watchdog_;  // started last
};

// --- the communicator --------------------------------------------------------------------

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Device& device, ncclComm_t comm, int rank, int size, std::string name,
                   double timeout_s)
      : device_(device),
        core_(std::make_unique<NcclCore>(device, comm, rank, size, std::move(name), timeout_s)) {}

  int rank() const override { return core_->rank(); }
  int size() const override { return core_->size(); }
  const std::string& name() const override { return core_->name(); }

  // In place when send is this rank's block of recv.
  void all_gather(Stream& s, const void* send, void* recv, size_t count, DType dtype,
                  const std::string& label) override {
    const char* op = "all-gather";
    const size_t bytes = comm_total(*this, op, label, count, dtype_size(dtype));
    const size_t total = comm_total(*this, op, label, bytes, static_cast<size_t>(size()));
    const bool in_place = bytes > 0 && address(send) == address(recv) + rank() * bytes;
    comm_check_buffers(*this, op, label, {send, bytes, recv, total}, in_place);
    if (bytes == 0) return;
    const ncclDataType_t type = nccl_type(dtype);
    core_->enqueue(s, op, label, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllGather(send, recv, count, type, comm, stream);
    });
  }

  // In place when recv is this rank's block of send.
  void reduce_scatter(Stream& s, const void* send, void* recv, size_t count, DType dtype,
                      const std::string& label) override {
    const char* op = "reduce-scatter";
    const size_t bytes = comm_total(*this, op, label, count, dtype_size(dtype));
    const size_t total = comm_total(*this, op, label, bytes, static_cast<size_t>(size()));
    const bool in_place = bytes > 0 && address(recv) == address(send) + rank() * bytes;
    comm_check_buffers(*this, op, label, {send, total, recv, bytes}, in_place);
    if (bytes == 0) return;
    const ncclDataType_t type = nccl_type(dtype);
    core_->enqueue(s, op, label, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclReduceScatter(send, recv, count, type, ncclSum, comm, stream);
    });
  }

  void all_reduce(Stream& s, const void* send, void* recv, size_t count, DType dtype,
                  const std::string& label) override {
    const char* op = "all-reduce";
    const size_t bytes = comm_total(*this, op, label, count, dtype_size(dtype));
    comm_check_buffers(*this, op, label, {send, bytes, recv, bytes}, send == recv);
    if (bytes == 0) return;
    const ncclDataType_t type = nccl_type(dtype);
    core_->enqueue(s, op, label, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(send, recv, count, type, ncclSum, comm, stream);
    });
  }

  void broadcast(Stream& s, void* buf, size_t count, DType dtype, int root,
                 const std::string& label) override {
    const char* op = "broadcast";
    comm_check_root(*this, root, label);
    const size_t bytes = comm_total(*this, op, label, count, dtype_size(dtype));
    comm_check_buffers(*this, op, label, {buf, bytes, buf, bytes}, true);
    if (bytes == 0) return;
    const ncclDataType_t type = nccl_type(dtype);
    core_->enqueue(s, op, label, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclBroadcast(buf, buf, count, type, root, comm, stream);
    });
  }

  // A one-element all-reduce of zeros in the communicator's scratch buffer.
  void barrier(Stream& s, const std::string& label) override {
    float* scratch = static_cast<float*>(core_->scratch());
    core_->enqueue(s, "barrier", label, [=](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(scratch, scratch, 1, ncclFloat32, ncclSum, comm, stream);
    });
  }

  void send(Stream& s, const void* buf, size_t count, DType dtype, int peer,
            const std::string& label) override {
    p2p(s, "send", const_cast<void*>(buf), count, dtype, peer, label);
  }

  void recv(Stream& s, void* buf, size_t count, DType dtype, int peer,
            const std::string& label) override {
    p2p(s, "recv", buf, count, dtype, peer, label);
  }

  std::unique_ptr<Communicator> duplicate(const std::string& name) const override {
    int rank = 0, size = 0;
    ncclComm_t child = core_->split(0, core_->rank(), name, "duplicate", &rank, &size);
    return make(child, rank, size, name);
  }

  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) const override {
    TD_CHECK(color >= 0, "split of communicator {} into {}: color {} is negative", core_->name(),
             name, color);
    int rank = 0, size = 0;
    ncclComm_t child = core_->split(color, key, name, "split", &rank, &size);
    return make(child, rank, size, name);
  }

 private:
  static uintptr_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

  // ncclSend / ncclRecv: messages between two ranks of one communicator arrive in order.
  void p2p(Stream& s, const char* op, void* buf, size_t count, DType dtype, int peer,
           const std::string& label) {
    comm_check_peer(*this, op, peer, label);
    const size_t bytes = comm_total(*this, op, label, count, dtype_size(dtype));
    comm_check_buffers(*this, op, label, {buf, bytes, buf, bytes}, true);
    if (bytes == 0) return;
    const ncclDataType_t type = nccl_type(dtype);
    const bool sending = op[0] == 's';
    core_->enqueue(s, op, label, [=](ncclComm_t comm, cudaStream_t stream) {
      return sending ? ncclSend(buf, count, type, peer, comm, stream)
                     : ncclRecv(buf, count, type, peer, comm, stream);
    });
  }

  std::unique_ptr<Communicator> make(ncclComm_t comm, int rank, int size,
                                     const std::string& name) const {
    return std::make_unique<NcclCommunicator>(device_, comm, rank, size, name, core_->timeout_s());
  }

  Device& device_;
  const std::unique_ptr<NcclCore> core_;
};

}  // namespace

int nccl_version() {
  return nccl_process_init();
}

void nccl_set_test_hook(std::function<void(CUstream_st*)> h) {
  std::lock_guard<std::mutex> lock(hook_mutex());
  hook() = std::move(h);
}

std::unique_ptr<Communicator> nccl_world(Device& device, const CommOptions& options) {
  TD_CHECK(device.kind() == DeviceKind::cuda, "the NCCL communicator needs a cuda device, not {}",
           device.name());
  const int gpu = cuda_gpu_of(device);
  nccl_process_init();
  int rank = 0;
  int size = 1;
  const bool mpi = options.mpi;
  if (mpi) {
    mpi_bootstrap_init();
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  error_set_rank(rank);
  ncclUniqueId id{};
  if (rank == 0) {
    const ncclResult_t rc = ncclGetUniqueId(&id);
    TD_CHECK(rc == ncclSuccess, "ncclGetUniqueId failed on rank 0: {}", nccl_text(rc));
  }
  if (mpi) mpi_broadcast_id(id, rank, size, options.timeout_s);

  TD_CUDA_CALL(cudaSetDevice(gpu));
  const std::string name = "world";
  ncclConfig_t config = nccl_config(name);
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  bool timed_out = false;
  if ((rc == ncclSuccess || rc == ncclInProgress) && comm != nullptr)
    rc = poll_ready(comm, Clock::now() + to_duration(options.timeout_s), &timed_out);
  if (timed_out || rc != ncclSuccess) {
    if (comm != nullptr) (void)ncclCommAbort(comm);
    TD_THROW("NCCL world on GPU {} failed to start on rank {} of {}: {}", gpu, rank, size,
             timed_out
                 ? fmt::format("timed out after {} s: a peer rank may have died", options.timeout_s)
                 : nccl_text(rc));
  }
  return std::make_unique<NcclCommunicator>(device, comm, rank, size, name, options.timeout_s);
}

}  // namespace tandem
