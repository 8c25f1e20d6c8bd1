// Internal to src/comm: the backend entry points behind comm_world and the argument
// checks shared by the MPI and one-rank communicators, so both reject the same misuse on
// the host at call time (never later on a stream worker).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace tandem {

// One-rank communicator (self.cpp).
std::unique_ptr<Communicator> comm_self(Device& device, const std::string& name);

// MPI backend (mpi.cpp). mpi_world initialises MPI on first use (see [MPI lifetime]).
std::unique_ptr<Communicator> mpi_world(Device& device, const CommOptions& options);
bool mpi_active();  // initialised and not yet finalised
void mpi_finalize();
[[noreturn]] void mpi_abort(int code);

// What a collective moves, for the checks below: the bytes read from send and written to
// recv on this rank.
struct CommSpan {
  const void* send;
  size_t send_bytes;
  const void* recv;
  size_t recv_bytes;
};

// Throws unless the buffers are non-null when non-empty and either do not overlap or are
// exactly the in-place layout of the operation (in_place_ok: send/recv equal that).
void comm_check_buffers(const Communicator& comm, const char* op, const std::string& label,
                        const CommSpan& span, bool in_place_ok);
// Throws unless 0 <= root < comm.size().
void comm_check_root(const Communicator& comm, int root, const std::string& label);
// Throws unless 0 <= peer < comm.size() and peer is not this rank (send and recv).
void comm_check_peer(const Communicator& comm, const char* op, int peer, const std::string& label);
// count * factor without overflow, or throws.
size_t comm_total(const Communicator& comm, const char* op, const std::string& label, size_t count,
                  size_t factor);

}  // namespace tandem
