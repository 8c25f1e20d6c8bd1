// The process environment, read once at the top (the tandem command's main, a program of
// the library API) and turned into typed settings. No layer below src/api/ reads the
// environment: each receives what it needs from here as a parameter (docs/layers.md).
#pragma once

#include <string>

#include "device/kernels.h"

namespace tandem {

// What the launcher of this process says about it: Open MPI's mpirun, MPICH's mpiexec
// (Hydra), Slurm's srun and PMIx each set their own variables.
struct LaunchEnvironment {
  // A rank of a job an MPI launcher started: OMPI_COMM_WORLD_SIZE, PMI_SIZE or
  // SLURM_NTASKS holds a positive count, or PMIX_RANK is set. The world communicator is
  // then MPI's; otherwise it is this one rank and needs no MPI.
  bool mpi = false;
  // Started by mpirun or mpiexec itself: OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK is
  // present. Unlike `mpi` this leaves out SLURM_NTASKS, which every Slurm batch shell has
  // (where the local launcher of `--ranks N` may still start its own mpirun).
  bool mpirun = false;
  // The job's rank of this process and its number of ranks, as the launcher gives them
  // (OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/SIZE, SLURM_PROCID/NTASKS, PMIX_RANK); -1 and 0
  // when it gives none. The communicator's own rank and size come from MPI.
  int world_rank = -1;
  int world_size = 0;
  // This process's rank among the ranks of its node (OMPI_COMM_WORLD_LOCAL_RANK,
  // MPI_LOCALRANKID, SLURM_LOCALID, PMIX_LOCAL_RANK or LOCAL_RANK, the first valid one); 0
  // when not launched. Rank r of a node drives the node's GPU r.
  int local_rank = 0;
};

struct Environment {
  LaunchEnvironment launch;
  // TANDEM_FAULT: "<rank>:<point>:<action>", the fault to inject (core/fault.h); empty
  // when unset.
  std::string fault;
  // Whether stdout is a terminal, where progress `auto` redraws a bar: TANDEM_STDOUT_IS_TTY
  // ("1": yes, anything else: no) when set, as the local launcher sets it for its ranks,
  // whose stdout is mpirun's pipe; otherwise isatty(stdout).
  bool stdout_terminal = false;
  // TANDEM_ATTENTION: how the CUDA kernels compute attention, "gemm" (saved
  // probabilities), "flash" (the mma.sync flash kernels) or "wgmma" (flash on Hopper's
  // warpgroup MMA); unset or empty: automatic (wgmma where it runs, else flash where the head
  // size allows it). Any other value is an error (environment_from_process throws).
  AttentionImpl attention = AttentionImpl::automatic;
  // TANDEM_FLASH_BACKWARD: how the wgmma flash backward forms dQ, "one-pass" (faster at head
  // size 128, not bitwise repeatable) or "two-pass" (FlashBackward in device/kernels.h); unset
  // or empty: automatic (two passes).
  // Any other value is an error.
  FlashBackward flash_backward = FlashBackward::automatic;
  // TANDEM_VERBOSE_ERRORS set and not empty: an error names its call site, not only its
  // message.
  bool verbose_errors = false;
  // TANDEM_LAUNCHER_DIR: set by the local launcher (`--ranks N`) for the ranks it starts, a
  // directory where each rank leaves its error line for the launcher to print last (after
  // the MPI launcher's own messages); empty when this process was not started that way.
  std::string launcher_dir;
};

// Reads every variable above from this process's environment.
Environment environment_from_process();

}  // namespace tandem
