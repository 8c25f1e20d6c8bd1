// The one place that reads the process environment.
#include "api/environment.h"

#include <unistd.h>

#include <cstdlib>
#include <initializer_list>
#include <string>
#include <utility>

#include "core/error.h"

namespace tandem {

namespace {

// A variable's value, or nullptr when it is unset.
const char* variable(const char* name) {
  return std::getenv(name);
}

bool present(const char* name) {
  return variable(name) != nullptr;
}

bool present_not_empty(const char* name) {
  const char* value = variable(name);
  return value != nullptr && *value != '\0';
}

// A whole decimal number in [low, high] that makes up the variable's entire value, or
// `fallback`.
long whole(const char* name, long low, long high, long fallback) {
  const char* value = variable(name);
  if (value == nullptr || *value == '\0') return fallback;
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || n < low || n > high) return fallback;
  return n;
}

// A count that is present and positive (a leading number is enough, as launchers write it).
bool count_positive(const char* name) {
  const char* value = variable(name);
  if (value == nullptr || *value == '\0') return false;
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  return end != value && n > 0;
}

// The first of names whose value is a whole number in [low, high], or fallback.
int first_whole(std::initializer_list<const char*> names, long low, long high, int fallback) {
  for (const char* name : names) {
    const long n = whole(name, low, high, -1);
    if (n >= low) return static_cast<int>(n);
  }
  return fallback;
}

LaunchEnvironment launch_from_process() {
  constexpr long kMaxRanks = 1 << 20;
  LaunchEnvironment l;
  l.mpi = count_positive("OMPI_COMM_WORLD_SIZE") || count_positive("PMI_SIZE") ||
          count_positive("SLURM_NTASKS") || present_not_empty("PMIX_RANK");
  l.mpirun = present("OMPI_COMM_WORLD_SIZE") || present("PMI_SIZE") || present("PMIX_RANK");
  l.world_size = first_whole({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, 1, kMaxRanks, 0);
  l.world_rank = first_whole({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "PMIX_RANK"}, 0,
                             kMaxRanks - 1, -1);
  l.local_rank = first_whole({"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                              "PMIX_LOCAL_RANK", "LOCAL_RANK"},
                             0, kMaxRanks - 1, 0);
  return l;
}

}  // namespace

// The setting a variable names among `choices` (value, setting), or `fallback` when it is
// unset or empty. Any other value is an error naming the variable, the value and `known`: a
// misspelt value would otherwise run the default while the user compares.
template <class Setting>
Setting named_choice(const char* name,
                     std::initializer_list<std::pair<const char*, Setting>> choices,
                     Setting fallback, const char* known, const char* unset_means) {
  const char* value = variable(name);
  if (value == nullptr || *value == '\0') return fallback;
  for (const auto& [text, setting] : choices)
    if (std::string(value) == text) return setting;
  TD_THROW("{}='{}' is not {} (unset it for {})", name, value, known, unset_means);
}

Environment environment_from_process() {
  Environment e;
  e.launch = launch_from_process();
  if (const char* fault = variable("TANDEM_FAULT")) e.fault = fault;
  const char* tty = variable("TANDEM_STDOUT_IS_TTY");
  e.stdout_terminal = tty != nullptr ? tty[0] == '1' : ::isatty(STDOUT_FILENO) != 0;
  e.attention = named_choice<AttentionImpl>("TANDEM_ATTENTION",
                                            {{"gemm", AttentionImpl::gemm},
                                             {"flash", AttentionImpl::flash},
                                             {"wgmma", AttentionImpl::flash_wgmma}},
                                            AttentionImpl::automatic, "gemm, flash or wgmma",
                                            "the fastest attention that runs");
  e.flash_backward = named_choice<FlashBackward>(
      "TANDEM_FLASH_BACKWARD",
      {{flash_backward_name(FlashBackward::one_pass), FlashBackward::one_pass},
       {flash_backward_name(FlashBackward::two_pass), FlashBackward::two_pass}},
      FlashBackward::automatic, "one-pass or two-pass", "the default");
  e.verbose_errors = present_not_empty("TANDEM_VERBOSE_ERRORS");
  if (const char* dir = variable("TANDEM_LAUNCHER_DIR")) e.launcher_dir = dir;
  return e;
}

}  // namespace tandem
