// The local launcher behind `--ranks N`: reruns this executable as N MPI ranks on this
// machine through mpirun, so multi-rank runs need no hand-written mpirun line.
#pragma once

#include <string>
#include <vector>

#include "api/environment.h"

namespace tandem {

// Runs `mpirun -np <ranks> <flags> <this executable> <args...>` and waits for it; returns
// its exit status (128 + signal number when it was killed by a signal). SIGINT and SIGTERM
// sent to this process are forwarded to mpirun while it runs. The flags make mpirun work
// for local ranks in containers too: see [Launcher flags] in launch.cpp. `launch` is this
// process's own launcher: inside an mpirun or mpiexec job (launch.mpirun) no second one is
// started. Throws tandem::Error there, and when no MPI launcher is on PATH or it cannot be
// started.
int launch_local_ranks(int ranks, const std::vector<std::string>& args,
                       const LaunchEnvironment& launch);

// The arguments after argv[0] without every "--ranks N" and "--ranks=N" (up to a "--",
// after which arguments are left alone), ready to pass to launch_local_ranks. Throws
// tandem::Error when a --ranks value is missing or not an integer.
std::vector<std::string> launch_strip_ranks(int argc, const char* const* argv);

}  // namespace tandem
