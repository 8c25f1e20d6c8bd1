// The NCCL communicator: the Communicator of a CUDA device. Each collective is enqueued
// on the native stream of the Stream it is given and completes there, ordered with other
// work through events like any kernel; the host never waits for it.
//
// See [NCCL bootstrap], [NCCL timeouts], [NCCL issue order], [NVLS off] and
// [NCCL versions] in nccl.cu.
#pragma once

#include <functional>
#include <memory>

#include "comm/communicator.h"

struct CUstream_st;  // cudaStream_t is CUstream_st*; this header stays free of CUDA headers

namespace tandem {

// The NCCL world over a CUDA device. Under an MPI launcher its ranks are MPI's world
// (MPI is initialised once, with MPI_THREAD_MULTIPLE, only to broadcast NCCL's unique id);
// otherwise it is a one-rank NCCL communicator and MPI is never touched. Each rank must
// own a different GPU (NCCL's rule): the caller picks the device, e.g. by local rank.
std::unique_ptr<Communicator> nccl_world(Device& device, const CommOptions& options);

// The version of the NCCL library loaded at run time (NCCL_VERSION_CODE encoding, e.g.
// 22809 for 2.28.9); throws when it is older than tandem supports.
int nccl_version();

// Tests only: called on the host with the collective's native stream between the event
// that starts a collective's timeout clock and the NCCL call itself, so a test can make a
// collective overrun its timeout on one rank. An empty function removes the hook.
void nccl_set_test_hook(std::function<void(CUstream_st* stream)> hook);

}  // namespace tandem
