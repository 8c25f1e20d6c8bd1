// The MPI communicator: each collective is a nonblocking MPI call that a stream's worker
// posts and then polls to completion under the communicator's timeout. Also MPI's
// process lifetime (init with MPI_THREAD_MULTIPLE, finalize, abort) and the bf16 sum.
//
// [MPI threads] MPI calls are made from every stream worker that runs a collective and
// from the host thread (init, duplicate, split, finalize), concurrently and on different
// communicators. MPI_THREAD_MULTIPLE makes that legal; init refuses any lower level. This
// file keeps no MPI state of its own besides the bf16 op, which is created once under a
// mutex before any communicator exists.
//
// [Issue order] MPI matches the collectives of one communicator by the order in which each
// rank issues them, so that order must be the same on every rank. Here a collective is
// issued when its closure runs on the stream worker, so the collectives of one
// communicator must come from one stream, or from streams ordered by events; the
// all-gather and reduce-scatter streams therefore each get their own duplicate. As a
// safety net a collective (or a duplicate/split) that starts while another one of the
// same communicator is still in flight throws instead of risking a cross-rank mismatch.
//
// [Polling] The worker tests its request with MPI_Test, yielding for the first polls and
// then sleeping with exponential backoff up to kMaxPause. Every MPI_Test also drives Open
// MPI's progress engine, which advances all pending nonblocking collectives of the
// process, not only the one tested.
//
// [Timed-out requests] MPI cannot cancel or free a pending nonblocking collective, so a
// collective that times out leaves its request behind: its buffers may still be read and
// written if the peers arrive later, and the communicator's later collectives would be
// mismatched. The only sound continuation is to abort the job (the CLI does); tests that
// time out on purpose keep the buffers alive and let the late peers complete the request.
//
// [Counts] MPI counts are int: a collective whose total element count (size * count for
// all-gather and reduce-scatter, count otherwise) exceeds INT_MAX throws on the host at
// call time; it is not chunked. At 2^31 elements per call this never limits a unit in
// practice, and a caller that needs more splits the unit itself.
//
// [MPI lifetime] The first comm_world initialises MPI; comm_finalize finalises it and must
// run on the same thread (MPI's rule), after every stream with collectives has drained.
// Communicators destroyed after finalisation skip MPI_Comm_free.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "comm/comm_internal.h"
#include "comm/communicator.h"
#include "core/error.h"

namespace tandem {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kSpinPolls = 64;
constexpr std::chrono::microseconds kMaxPause{100};

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<size_t>(len));
}

// Throws with the MPI error text when call fails; the rest is a fmt message.
#define TD_MPI(call, ...)                                                        \
  do {                                                                           \
    const int td_mpi_rc = (call);                                                \
    if (td_mpi_rc != MPI_SUCCESS)                                                \
      TD_THROW("{}: {}", fmt::format(__VA_ARGS__), mpi_error_string(td_mpi_rc)); \
  } while (0)

// inout[i] = bf16(f32(in[i]) + f32(inout[i])): each pairwise combine sums in fp32 and rounds
// to nearest even, so sums of many ranks round once per combine (as NCCL's bf16 sum does).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype* /*type*/) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = bf16_from_f32(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

struct MpiState {
  std::mutex mu;
  MPI_Op bf16_sum = MPI_OP_NULL;
};

MpiState& mpi_state() {
  static MpiState state;
  return state;
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "an unknown level";
}

// Initialises MPI once per process (see [MPI lifetime]); returns the bf16 sum op.
MPI_Op mpi_init() {
  MpiState& state = mpi_state();
  std::lock_guard<std::mutex> lock(state.mu);
  int finalized = 0;
  MPI_Finalized(&finalized);
  TD_CHECK(!finalized, "MPI was already finalised in this process and cannot be started again");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    // MPI_ERRORS_ARE_FATAL is still in force here: a failing init aborts inside MPI.
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
  } else {
    MPI_Query_thread(&provided);
  }
  TD_CHECK(provided >= MPI_THREAD_MULTIPLE,
           "the MPI library provides {} but tandem needs MPI_THREAD_MULTIPLE (several streams "
           "issue collectives at once); use an MPI built with thread support, such as the "
           "distribution's OpenMPI (scripts/install-deps.sh)",
           thread_level_name(provided));
  if (state.bf16_sum == MPI_OP_NULL) {
    // Errors come back as codes and become tandem::Error; new communicators inherit this.
    TD_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    TD_MPI(MPI_Op_create(&bf16_sum, 1, &state.bf16_sum), "MPI_Op_create for the bf16 sum");
  }
  return state.bf16_sum;
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(Device& device, MPI_Comm comm, std::string name, double timeout_s,
                  MPI_Op bf16_sum_op)
      : device_(device),
        comm_(comm),
        name_(std::move(name)),
        timeout_s_(timeout_s),
        timeout_(
            std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s))),
        bf16_sum_(bf16_sum_op) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_set_name(comm_, name_.c_str());
  }

  ~MpiCommunicator() override {
    if (comm_ != MPI_COMM_WORLD && mpi_active()) MPI_Comm_free(&comm_);
  }

  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  // In place when send is this rank's block of recv (NCCL's layout): MPI_IN_PLACE.
  void all_gather(Stream& s, const void* send, void* recv, size_t count, DType dtype,
                  const std::string& label) override {
    const char* op = "all-gather";
    const size_t es = dtype_size(dtype);
    const int n = mpi_count(op, label, comm_total(*this, op, label, count, size_), count);
    const size_t bytes = count * es;
    const bool in_place = bytes > 0 && address(send) == address(recv) + rank_ * bytes;
    comm_check_buffers(*this, op, label, {send, bytes, recv, bytes * size_}, in_place);
    const MPI_Datatype type = mpi_type(dtype);
    const void* from = in_place ? MPI_IN_PLACE : send;
    enqueue(s, op, label, [this, from, recv, n, type](MPI_Request* req) {
      return MPI_Iallgather(from, n, type, recv, n, type, comm_, req);
    });
  }

  // In place when recv is this rank's block of send (NCCL's layout): MPI_IN_PLACE, which
  // leaves the result at the start of the buffer, then a move to this rank's block.
  void reduce_scatter(Stream& s, const void* send, void* recv, size_t count, DType dtype,
                      const std::string& label) override {
    const char* op = "reduce-scatter";
    const size_t es = dtype_size(dtype);
    const int n = mpi_count(op, label, comm_total(*this, op, label, count, size_), count);
    const size_t bytes = count * es;
    const bool in_place = bytes > 0 && address(recv) == address(send) + rank_ * bytes;
    comm_check_buffers(*this, op, label, {send, bytes * size_, recv, bytes}, in_place);
    const MPI_Datatype type = mpi_type(dtype);
    const MPI_Op sum = mpi_sum(dtype);
    if (!in_place) {
      enqueue(s, op, label, [this, send, recv, n, type, sum](MPI_Request* req) {
        return MPI_Ireduce_scatter_block(send, recv, n, type, sum, comm_, req);
      });
      return;
    }
    void* buf = const_cast<void*>(send);  // recv lies inside it, so it is writable
    enqueue(
        s, op, label,
        [this, buf, n, type, sum](MPI_Request* req) {
          return MPI_Ireduce_scatter_block(MPI_IN_PLACE, buf, n, type, sum, comm_, req);
        },
        [buf, recv, bytes] {
          if (recv != buf) std::memmove(recv, buf, bytes);
        });
  }

  void all_reduce(Stream& s, const void* send, void* recv, size_t count, DType dtype,
                  const std::string& label) override {
    const char* op = "all-reduce";
    const int n = mpi_count(op, label, count, count);
    const size_t bytes = count * dtype_size(dtype);
    const bool in_place = send == recv;
    comm_check_buffers(*this, op, label, {send, bytes, recv, bytes}, in_place);
    const MPI_Datatype type = mpi_type(dtype);
    const MPI_Op sum = mpi_sum(dtype);
    const void* from = in_place ? MPI_IN_PLACE : send;
    enqueue(s, op, label, [this, from, recv, n, type, sum](MPI_Request* req) {
      return MPI_Iallreduce(from, recv, n, type, sum, comm_, req);
    });
  }

  void broadcast(Stream& s, void* buf, size_t count, DType dtype, int root,
                 const std::string& label) override {
    const char* op = "broadcast";
    comm_check_root(*this, root, label);
    const int n = mpi_count(op, label, count, count);
    const size_t bytes = count * dtype_size(dtype);
    comm_check_buffers(*this, op, label, {buf, bytes, buf, bytes}, true);
    const MPI_Datatype type = mpi_type(dtype);
    enqueue(s, op, label, [this, buf, n, type, root](MPI_Request* req) {
      return MPI_Ibcast(buf, n, type, root, comm_, req);
    });
  }

  void barrier(Stream& s, const std::string& label) override {
    enqueue(s, "barrier", label, [this](MPI_Request* req) { return MPI_Ibarrier(comm_, req); });
  }

  void send(Stream& s, const void* buf, size_t count, DType dtype, int peer,
            const std::string& label) override {
    p2p(s, "send", const_cast<void*>(buf), count, dtype, peer, label);
  }
  void recv(Stream& s, void* buf, size_t count, DType dtype, int peer,
            const std::string& label) override {
    p2p(s, "recv", buf, count, dtype, peer, label);
  }

  // Nonblocking dup under the timeout, so a dead peer cannot hang the host here.
  std::unique_ptr<Communicator> duplicate(const std::string& name) const override {
    InFlight in_flight(*this, "duplicate", name, "host");
    MPI_Comm dup = MPI_COMM_NULL;
    MPI_Request req = MPI_REQUEST_NULL;
    TD_MPI(MPI_Comm_idup(comm_, &dup, &req), "duplicate of communicator {} into {}", name_, name);
    wait(req, "duplicate", name);
    return std::make_unique<MpiCommunicator>(device_, dup, name, timeout_s_, bf16_sum_);
  }

  // MPI has no nonblocking split: a barrier under the timeout first makes sure every peer
  // has arrived, so the blocking MPI_Comm_split after it cannot wait on a dead one.
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) const override {
    TD_CHECK(color >= 0, "split of communicator {} into {}: color {} is negative", name_, name,
             color);
    InFlight in_flight(*this, "split", name, "host");
    MPI_Request req = MPI_REQUEST_NULL;
    TD_MPI(MPI_Ibarrier(comm_, &req), "split of communicator {} into {}", name_, name);
    wait(req, "split", name);
    MPI_Comm part = MPI_COMM_NULL;
    TD_MPI(MPI_Comm_split(comm_, color, key, &part), "split of communicator {} into {}", name_,
           name);
    return std::make_unique<MpiCommunicator>(device_, part, name, timeout_s_, bf16_sum_);
  }

 private:
  // Marks the communicator busy for the life of one collective; see [Issue order].
  class InFlight {
   public:
    InFlight(const MpiCommunicator& comm, const char* op, const std::string& label,
             const std::string& stream)
        : comm_(comm) {
      std::lock_guard<std::mutex> lock(comm_.busy_mu_);
      TD_CHECK(comm_.busy_.empty(),
               "{} '{}' on communicator {} started from stream '{}' while {} is still in "
               "flight: collectives of one communicator must be issued in the same order on "
               "every rank (issue them from one stream, or order the streams with events)",
               op, label, comm_.name_, stream, comm_.busy_);
      comm_.busy_ = fmt::format("{} '{}' from stream '{}'", op, label, stream);
    }
    ~InFlight() {
      std::lock_guard<std::mutex> lock(comm_.busy_mu_);
      comm_.busy_.clear();
    }
    InFlight(const InFlight&) = delete;
    InFlight& operator=(const InFlight&) = delete;

   private:
    const MpiCommunicator& comm_;
  };

  static uintptr_t address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

  static MPI_Datatype mpi_type(DType dtype) {
    return dtype == DType::f32 ? MPI_FLOAT : MPI_UINT16_T;  // bf16 moves as raw 2 bytes
  }

  MPI_Op mpi_sum(DType dtype) const { return dtype == DType::f32 ? MPI_SUM : bf16_sum_; }

  // The per-rank MPI count, after checking the total against INT_MAX; see [Counts].
  int mpi_count(const char* op, const std::string& label, size_t total, size_t count) const {
    TD_CHECK(total <= static_cast<size_t>(INT_MAX),
             "{} '{}' on communicator {}: {} elements in one call exceed MPI's int count limit "
             "of {}; split it into smaller collectives",
             op, label, name_, total, INT_MAX);
    return static_cast<int>(count);
  }

  // MPI_Isend / MPI_Irecv with tag 0: messages between two ranks of one communicator are
  // matched in the order they were posted (MPI's non-overtaking rule).
  void p2p(Stream& s, const char* op, void* buf, size_t count, DType dtype, int peer,
           const std::string& label) {
    comm_check_peer(*this, op, peer, label);
    const int n = mpi_count(op, label, count, count);
    const size_t bytes = count * dtype_size(dtype);
    comm_check_buffers(*this, op, label, {buf, bytes, buf, bytes}, true);
    const MPI_Datatype type = mpi_type(dtype);
    const bool sending = op[0] == 's';
    enqueue(s, op, label, [this, buf, n, type, peer, sending](MPI_Request* req) {
      return sending ? MPI_Isend(buf, n, type, peer, 0, comm_, req)
                     : MPI_Irecv(buf, n, type, peer, 0, comm_, req);
    });
  }

  // Queues one collective on the stream: `start` posts the nonblocking call, the worker
  // polls it to completion, then `after` runs (if any).
  void enqueue(Stream& s, const char* op, const std::string& label,
               std::function<int(MPI_Request*)> start, std::function<void()> after = {}) {
    device_.submit(s, [this, op, label, stream = s.name(), start = std::move(start),
                       after = std::move(after)] {
      InFlight in_flight(*this, op, label, stream);
      MPI_Request req = MPI_REQUEST_NULL;
      TD_MPI(start(&req), "{} '{}' could not start on rank {} of {} (communicator {})", op, label,
             rank_, size_, name_);
      wait(req, op, label);
      if (after) after();
    });
  }

  // Polls req to completion; see [Polling] and [Collective timeouts] in communicator.h.
  void wait(MPI_Request& req, const char* op, const std::string& label) const {
    const Clock::time_point deadline = Clock::now() + timeout_;
    int polls = 0;
    std::chrono::microseconds pause{1};
    for (;;) {
      int done = 0;
      TD_MPI(MPI_Test(&req, &done, MPI_STATUS_IGNORE),
             "{} '{}' failed on rank {} of {} (communicator {})", op, label, rank_, size_, name_);
      if (done) return;
      // See [Timed-out requests]: req is abandoned, still pending.
      TD_CHECK(Clock::now() < deadline,
               "{} '{}' timed out after {} s on rank {} of {} (communicator {}): a peer rank may "
               "have died",
               op, label, timeout_s_, rank_, size_, name_);
      if (++polls <= kSpinPolls) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, kMaxPause);
      }
    }
  }

  Device& device_;
  MPI_Comm comm_;
  const std::string name_;
  const double timeout_s_;
  const Clock::duration timeout_;
  const MPI_Op bf16_sum_;
  int rank_ = 0;
  int size_ = 1;
  mutable std::mutex busy_mu_;
  mutable std::string busy_;  // what is in flight; empty when idle
};

}  // namespace

bool mpi_active() {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

std::unique_ptr<Communicator> mpi_world(Device& device, const CommOptions& options) {
  TD_CHECK(device.kind() == DeviceKind::cpu,
           "the MPI communicator works on the cpu device only (GPU runs need the NCCL "
           "communicator, which is not implemented yet)");
  const MPI_Op bf16_sum_op = mpi_init();
  return std::make_unique<MpiCommunicator>(device, MPI_COMM_WORLD, "world", options.timeout_s,
                                           bf16_sum_op);
}

void mpi_finalize() {
  MpiState& state = mpi_state();
  std::lock_guard<std::mutex> lock(state.mu);
  if (!mpi_active()) return;
  if (state.bf16_sum != MPI_OP_NULL) MPI_Op_free(&state.bf16_sum);
  TD_MPI(MPI_Finalize(), "MPI_Finalize");
}

void mpi_abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this is for the compiler and the paranoid
}

}  // namespace tandem
