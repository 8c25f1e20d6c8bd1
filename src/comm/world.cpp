// Process-wide entry points of communication: choosing the MPI or one-rank world, ending
// the job, the two-dimensional mesh of the hybrid strategy, and the argument checks that
// both communicators share.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "comm/comm_internal.h"
#include "comm/communicator.h"
#include "core/error.h"

#if defined(TANDEM_HAVE_CUDA)
#include "comm/cuda/nccl.h"
#endif

namespace tandem {

std::unique_ptr<Communicator> comm_world(Device& device, const CommOptions& options) {
  TD_CHECK(options.timeout_s > 0 && options.timeout_s <= 1e9,
           "communication timeout must be positive and finite, got {} s", options.timeout_s);
#if defined(TANDEM_HAVE_CUDA)
  // A CUDA device communicates through NCCL, launched by MPI or not (comm/cuda/nccl.h).
  if (device.kind() == DeviceKind::cuda) {
    std::unique_ptr<Communicator> world = nccl_world(device, options);
    error_set_rank(world->rank());
    return world;
  }
#endif
  if (!options.mpi) {
    error_set_rank(0);
    return comm_self(device, "world");
  }
  std::unique_ptr<Communicator> world = mpi_world(device, options);
  error_set_rank(world->rank());
  return world;
}

void comm_finalize() {
  mpi_finalize();
}

void comm_abort(int code) {
  // The caller has just printed the reason; neither path below flushes stdio.
  std::fflush(stdout);
  std::fflush(stderr);
  if (mpi_active()) mpi_abort(code);
  std::_Exit(code);
}

Mesh comm_mesh(const Communicator& world, int shard_size) {
  const int size = world.size();
  TD_CHECK(shard_size >= 1 && shard_size <= size && size % shard_size == 0,
           "shard size {} does not divide the world of {} ranks (it must be a divisor of the "
           "rank count, e.g. {} for plain FSDP)",
           shard_size, size, size);
  const int rank = world.rank();
  Mesh mesh;
  // [Mesh split order] Both splits are collective over the world; every rank makes them in
  // this order. Keys keep world order inside each group.
  mesh.shard = world.split(rank / shard_size, rank, "shard");
  mesh.replicate = world.split(rank % shard_size, rank, "replicate");
  return mesh;
}

void comm_check_buffers(const Communicator& comm, const char* op, const std::string& label,
                        const CommSpan& span, bool in_place_ok) {
  TD_CHECK(span.send_bytes == 0 || span.send != nullptr,
           "{} '{}' on communicator {}: null send buffer for {} bytes", op, label, comm.name(),
           span.send_bytes);
  TD_CHECK(span.recv_bytes == 0 || span.recv != nullptr,
           "{} '{}' on communicator {}: null receive buffer for {} bytes", op, label, comm.name(),
           span.recv_bytes);
  if (span.send_bytes == 0 || span.recv_bytes == 0 || in_place_ok) return;
  const auto s = reinterpret_cast<uintptr_t>(span.send);
  const auto r = reinterpret_cast<uintptr_t>(span.recv);
  const bool overlap = s < r + span.recv_bytes && r < s + span.send_bytes;
  TD_CHECK(!overlap,
           "{} '{}' on communicator {}: send and receive buffers overlap without being the "
           "in-place layout of the operation",
           op, label, comm.name());
}

void comm_check_root(const Communicator& comm, int root, const std::string& label) {
  TD_CHECK(root >= 0 && root < comm.size(),
           "broadcast '{}' on communicator {}: root {} is not a rank of a group of {}", label,
           comm.name(), root, comm.size());
}

void comm_check_peer(const Communicator& comm, const char* op, int peer, const std::string& label) {
  TD_CHECK(peer >= 0 && peer < comm.size() && peer != comm.rank(),
           "{} '{}' on communicator {}: peer {} is not another rank of a group of {} (this is "
           "rank {})",
           op, label, comm.name(), peer, comm.size(), comm.rank());
}

size_t comm_total(const Communicator& comm, const char* op, const std::string& label, size_t count,
                  size_t factor) {
  TD_CHECK(factor == 0 || count <= std::numeric_limits<size_t>::max() / factor,
           "{} '{}' on communicator {}: {} x {} overflows", op, label, comm.name(), count, factor);
  return count * factor;
}

}  // namespace tandem
