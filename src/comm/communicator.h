// The Communicator interface: collectives over a group of ranks, each enqueued on a
// stream like any other op, completing through events recorded after it on that stream.
// MPI implements it on CPU; NCCL will implement it on GPU.
//
// [Collective timeouts] Every collective carries a label (the operation and the unit it
// serves) and runs under the communicator's timeout. A collective that has not completed
// when the timeout expires makes the stream fail with a tandem::Error naming the
// operation, the label and the rank; the CLI then aborts the whole job, so a dead rank
// ends the run with a message instead of hanging every other rank.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "device/device.h"

namespace tandem {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // rank within this communicator's group
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // e.g. "world", "all-gather", "shard"

  // recv[size * count] = concatenation of every rank's send[count], in rank order.
  virtual void all_gather(Stream& s, const void* send, void* recv, size_t count, DType dtype,
                          const std::string& label) = 0;
  // recv[count] = sum over ranks of send[rank * count, (rank + 1) * count).
  virtual void reduce_scatter(Stream& s, const void* send, void* recv, size_t count, DType dtype,
                              const std::string& label) = 0;
  // recv[count] = sum over ranks of send[count]; send may equal recv (in place).
  virtual void all_reduce(Stream& s, const void* send, void* recv, size_t count, DType dtype,
                          const std::string& label) = 0;
  virtual void broadcast(Stream& s, void* buf, size_t count, DType dtype, int root,
                         const std::string& label) = 0;
  virtual void barrier(Stream& s, const std::string& label) = 0;
  // Point to point: `count` elements to rank `peer` of this group, which receives them
  // with recv(..., peer = this rank). Messages from one rank to another arrive in the order
  // they were sent. Both sides name the same count and dtype; a rank never sends to itself.
  virtual void send(Stream& s, const void* buf, size_t count, DType dtype, int peer,
                    const std::string& label) = 0;
  virtual void recv(Stream& s, void* buf, size_t count, DType dtype, int peer,
                    const std::string& label) = 0;

  // A new communicator over the same ranks with its own message space, so collectives on
  // the two never queue behind each other (all-gather and reduce-scatter each get one).
  virtual std::unique_ptr<Communicator> duplicate(const std::string& name) const = 0;
  // Ranks with the same color form a group, ordered by key (MPI_Comm_split semantics).
  virtual std::unique_ptr<Communicator> split(int color, int key,
                                              const std::string& name) const = 0;
};

// Process-wide setup of the communication runtime.
struct CommOptions {
  double timeout_s = 300;  // per collective; see [Collective timeouts]
  // This process is a rank of a job that an MPI launcher (mpirun, mpiexec, srun) started,
  // as its environment says (LaunchEnvironment::mpi in api/environment.h): the world is
  // then MPI's. false: the world is this one rank.
  bool mpi = false;
};

// The world communicator over the given device. With options.mpi this initialises MPI
// with MPI_THREAD_MULTIPLE (once per process) and returns the MPI world; otherwise a
// one-rank communicator that needs no MPI at all. A CUDA device communicates through NCCL,
// bootstrapped over MPI with options.mpi.
std::unique_ptr<Communicator> comm_world(Device& device, const CommOptions& options);
// Finalises MPI if it was initialised (safe to call when it was not).
void comm_finalize();
// Ends every rank of the job at once after a fatal error on this one (MPI_Abort under
// MPI; exit otherwise). Never returns.
[[noreturn]] void comm_abort(int code);

// The two-dimensional mesh of the hybrid strategy: ranks form groups of `shard_size`
// consecutive ranks that shard parameters among themselves, and the ranks holding the
// same shard in different groups form a replicate group. shard_size must divide the
// world size; shard_size == world size gives one shard group (plain FSDP) and replicate
// groups of one rank.
struct Mesh {
  std::unique_ptr<Communicator> shard;      // within a group of shard_size ranks
  std::unique_ptr<Communicator> replicate;  // across groups, world / shard_size ranks
};
Mesh comm_mesh(const Communicator& world, int shard_size);

}  // namespace tandem
