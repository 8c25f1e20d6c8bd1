// The local launcher: `--ranks N` becomes `mpirun -np N <flags> /proc/self/exe <args>`,
// run as a child process that this one waits for, forwarding SIGINT/SIGTERM.
//
// [Launcher flags] With Open MPI (4.x or 5.x) the launcher adds:
//  - --allow-run-as-root when the effective uid is 0 (containers often run as root, and
//    mpirun refuses root without it);
//  - --oversubscribe: N may exceed the cores mpirun counts (tests run 4 ranks on 2 cores);
//  - --bind-to none: by default Open MPI binds each rank to a core (or socket), which
//    would squeeze each rank's OpenMP/OpenBLAS threads onto that core;
//  - --mca btl_vader_single_copy_mechanism none (btl_sm_... on Open MPI 5) only when
//    cross-process memory access (CMA: process_vm_readv) is forbidden here, as under
//    Docker's default seccomp profile without CAP_SYS_PTRACE or a Yama ptrace_scope >= 1.
//    There every message past the eager size fails its single copy ("Read -1, expected N,
//    errno = 1" from each rank; Open MPI 4.1 then recovers, older versions corrupt or hang,
//    open-mpi/ompi#4948). A one-fork probe (a child reading its parent's memory, the same
//    relation as between sibling ranks) decides; an explicit OMPI_MCA_ setting of that
//    parameter in the environment wins.
// With another MPI (MPICH's mpiexec) only `-n N` is passed. OMP_NUM_THREADS, when unset,
// is set to the usable cores divided by N (at least 1) so the ranks do not oversubscribe.
//
// [Launcher signals] mpirun runs in a process group of its own (with Open MPI's stdin
// forwarding off, since it no longer owns the terminal), so a Ctrl-C at the terminal
// reaches only this process. The first SIGINT or SIGTERM is noted in the ranks' directory
// (below) and passed on as SIGUSR2, which mpirun forwards to every rank: each finishes its step,
// the ranks save together and exit (train/trainer.h, [Interrupts]), and this process returns 128 +
// the signal it got. A second SIGINT or SIGTERM is passed on as SIGTERM, and mpirun ends the job at
// once. When this process dies, even by SIGKILL, mpirun receives SIGTERM (PR_SET_PDEATHSIG) and
// ends the ranks: no orphans. The ranks leave their error lines in a directory of this process
// (TANDEM_LAUNCHER_DIR), printed after mpirun has ended, so that they come last.
#include "cli/launch.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"

extern char** environ;

namespace tandem {

namespace {

volatile sig_atomic_t g_child_pid = 0;  // the running mpirun, 0 when none
volatile sig_atomic_t g_forwarded = 0;  // the first SIGINT/SIGTERM passed on, 0 when none
const char* g_signal_file = nullptr;    // where the ranks read which signal that was

void forward_signal(int sig) {
  const pid_t child = g_child_pid;
  if (child <= 0) return;
  if (g_forwarded == 0) {
    g_forwarded = sig;
    // Which signal it was, for the ranks' line (open, write and close are async-signal-safe).
    if (g_signal_file != nullptr) {
      const int fd = open(g_signal_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) {
        const char* text = sig == SIGINT ? "2\n" : "15\n";
        const ssize_t ignored = write(fd, text, sig == SIGINT ? 2 : 3);
        (void)ignored;
        close(fd);
      }
    }
    // Stop after the step and save (see [Launcher signals]).
    kill(child, SIGUSR2);
  } else {
    kill(child, SIGTERM);  // a second signal: end the job now
  }
}

// The error lines the ranks left in dir (rank order, each message once), then the
// directory itself removed. *interrupted: the status rank 0 left when the ranks stopped on
// a signal (128 + the signal), or 0.
std::string collect_rank_errors(const std::string& dir, int* interrupted = nullptr) {
  std::vector<std::pair<int, std::string>> lines;
  std::error_code ec;
  if (interrupted != nullptr) {
    std::ifstream in(std::filesystem::path(dir) / "interrupted");
    int code = 0;
    *interrupted = in >> code ? code : 0;
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("rank-", 0) != 0) continue;
    std::ifstream in(entry.path());
    std::string line;
    if (std::getline(in, line) && !line.empty())
      lines.emplace_back(std::atoi(name.c_str() + 5), line);
  }
  std::filesystem::remove_all(dir, ec);
  std::sort(lines.begin(), lines.end());
  std::string out;
  std::vector<std::string> seen;
  for (const auto& [rank, line] : lines) {
    // "tandem: error: [rank r] message": the same message from several ranks once.
    const size_t at = line.find("] ");
    const std::string message = at == std::string::npos ? line : line.substr(at + 2);
    if (std::find(seen.begin(), seen.end(), message) != seen.end()) continue;
    seen.push_back(message);
    out += line + "\n";
  }
  return out;
}

// The first executable `name` in a PATH directory, or "".
std::string find_on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t begin = 0;
  for (;;) {
    const size_t end = dirs.find(':', begin);
    std::string dir =
        dirs.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
    if (dir.empty()) dir = ".";
    const std::string candidate = fmt::format("{}/{}", dir, name);
    struct stat st {};
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (end == std::string::npos) return "";
    begin = end + 1;
  }
}

std::string self_executable() {
  std::vector<char> buf(PATH_MAX + 1);
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  TD_CHECK(n > 0, "cannot find this executable through /proc/self/exe: {}", std::strerror(errno));
  return std::string(buf.data(), static_cast<size_t>(n));
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

pid_t wait_child(pid_t pid, int* status) {
  pid_t r;
  do {
    r = waitpid(pid, status, 0);
  } while (r < 0 && errno == EINTR);
  return r;
}

// stdout and stderr of `exe --version`, or "" when it cannot run.
std::string version_text(const std::string& exe) {
  std::vector<std::string> args = {exe, "--version"};
  std::vector<char*> argv = c_strings(args);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return "";
  const pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return "";
  }
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  close(fds[1]);
  std::string text;
  char buf[512];
  for (;;) {
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  wait_child(pid, &status);
  return text;
}

// Open MPI's major version from "mpirun (Open MPI) 4.1.4" (or "mpiexec (OpenRTE) 4.1.4"),
// or 0 for another MPI.
int open_mpi_major(const std::string& version) {
  for (const std::string tag : {"(Open MPI) ", "(OpenRTE) "}) {
    const size_t at = version.find(tag);
    if (at != std::string::npos) return std::max(1, std::atoi(version.c_str() + at + tag.size()));
  }
  return 0;
}

// Whether one process may read another's memory with process_vm_readv here; see
// [Launcher flags].
bool cma_works() {
  static volatile uint64_t probe = 0x74616e64656d3031ull;
  const pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    uint64_t value = 0;
    iovec local{&value, sizeof value};
    iovec remote{const_cast<uint64_t*>(&probe), sizeof probe};
    const ssize_t n = process_vm_readv(getppid(), &local, 1, &remote, 1, 0);
    _exit(n == static_cast<ssize_t>(sizeof value) && value == probe ? 0 : 1);
  }
  int status = 0;
  if (wait_child(pid, &status) != pid) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
}

bool whole_number(const std::string& s) {
  return !s.empty() && s.size() <= 9 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

int launch_local_ranks(int ranks, const std::vector<std::string>& args,
                       const LaunchEnvironment& launch) {
  TD_CHECK(ranks >= 1, "--ranks must be at least 1, got {}", ranks);
  // Not launch.mpi: SLURM_NTASKS is set in any batch shell, where --ranks is fine.
  TD_CHECK(!launch.mpirun,
           "--ranks starts its own mpirun and cannot be used in a process that an MPI "
           "launcher started (drop --ranks, or drop the outer mpirun)");
  std::string launcher = find_on_path("mpirun");
  if (launcher.empty()) launcher = find_on_path("mpiexec");
  TD_CHECK(!launcher.empty(),
           "--ranks {} needs an MPI launcher, but neither mpirun nor mpiexec is on PATH; install "
           "OpenMPI (scripts/install-deps.sh, or the openmpi-bin and libopenmpi-dev packages)",
           ranks);

  std::vector<std::string> cmd = {launcher};
  const int major = open_mpi_major(version_text(launcher));
  if (major > 0) {
    cmd.insert(cmd.end(), {"-np", std::to_string(ranks)});
    if (geteuid() == 0) cmd.push_back("--allow-run-as-root");
    cmd.insert(cmd.end(), {"--oversubscribe", "--bind-to", "none", "--stdin", "none"});
    const std::string cma_param =
        major >= 5 ? "btl_sm_single_copy_mechanism" : "btl_vader_single_copy_mechanism";
    if (std::getenv(fmt::format("OMPI_MCA_{}", cma_param).c_str()) == nullptr && !cma_works())
      cmd.insert(cmd.end(), {"--mca", cma_param, "none"});
  } else {
    cmd.insert(cmd.end(), {"-n", std::to_string(ranks)});
  }
  cmd.push_back(self_executable());
  cmd.insert(cmd.end(), args.begin(), args.end());

  // The ranks' error lines come back through this directory (see [Launcher signals]).
  std::string tmpl = (std::filesystem::temp_directory_path() / "tandem-launch-XXXXXX").string();
  TD_CHECK(mkdtemp(tmpl.data()) != nullptr, "cannot create a directory for the ranks' errors: {}",
           std::strerror(errno));
  const std::string errors_dir = tmpl;
  const std::string signal_file = errors_dir + "/signal";

  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::string(*e).rfind("TANDEM_LAUNCHER_DIR=", 0) != 0) env.emplace_back(*e);
  env.push_back("TANDEM_LAUNCHER_DIR=" + errors_dir);
  if (std::getenv("OMP_NUM_THREADS") == nullptr)
    env.push_back(fmt::format("OMP_NUM_THREADS={}", std::max(1, usable_cores() / ranks)));

  // Everything the child needs is built before fork: it only calls async-signal-safe
  // functions until execve. A CLOEXEC pipe carries errno back when execve fails.
  std::vector<char*> argv = c_strings(cmd);
  std::vector<char*> envp = c_strings(env);
  int fds[2];
  TD_CHECK(pipe2(fds, O_CLOEXEC) == 0, "cannot start {}: pipe: {}", launcher, std::strerror(errno));

  struct sigaction action = {};
  action.sa_handler = forward_signal;
  action.sa_flags = SA_RESTART;
  sigemptyset(&action.sa_mask);
  struct sigaction old_int = {};
  struct sigaction old_term = {};
  sigaction(SIGINT, &action, &old_int);
  sigaction(SIGTERM, &action, &old_term);
  g_forwarded = 0;
  g_signal_file = signal_file.c_str();
  const pid_t parent = getpid();
  auto restore = [&] {
    g_child_pid = 0;
    g_signal_file = nullptr;
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  };

  // Both signals stay blocked across fork until g_child_pid is set, so none is lost; the
  // child restores the mask (execve keeps it) before it runs mpirun.
  sigset_t block, old_mask;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  sigprocmask(SIG_BLOCK, &block, &old_mask);
  const pid_t pid = fork();
  if (pid < 0) {
    const int err = errno;
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    close(fds[0]);
    close(fds[1]);
    restore();
    collect_rank_errors(errors_dir);
    TD_THROW("cannot start {}: fork: {}", launcher, std::strerror(err));
  }
  if (pid == 0) {
    close(fds[0]);
    // See [Launcher signals]: a process group of its own, and SIGTERM when this process
    // dies (checked after arming, in case it died before).
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(128 + SIGTERM);
    sigprocmask(SIG_SETMASK, &old_mask, nullptr);
    execve(argv[0], argv.data(), envp.data());
    const int err = errno;
    ssize_t ignored = write(fds[1], &err, sizeof err);
    (void)ignored;
    _exit(127);
  }
  g_child_pid = pid;
  sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  close(fds[1]);
  int exec_errno = 0;
  ssize_t n;
  do {
    n = read(fds[0], &exec_errno, sizeof exec_errno);
  } while (n < 0 && errno == EINTR);
  close(fds[0]);

  int status = 0;
  const pid_t waited = wait_child(pid, &status);
  const int wait_errno = errno;
  const int forwarded = g_forwarded;
  restore();
  int interrupted = 0;
  const std::string errors = collect_rank_errors(errors_dir, &interrupted);
  TD_CHECK(n != static_cast<ssize_t>(sizeof exec_errno), "cannot run {}: {}", launcher,
           std::strerror(exec_errno));
  TD_CHECK(waited == pid, "waiting for {} failed: {}", launcher, std::strerror(wait_errno));
  if (!errors.empty()) {
    std::fputs(errors.c_str(), stderr);
    std::fflush(stderr);
  }
  if (forwarded != 0 && errors.empty()) return 128 + forwarded;
  if (interrupted != 0 && errors.empty()) return interrupted;
  if (WIFEXITED(status))
    return WEXITSTATUS(status) == 0 && !errors.empty() ? 1 : WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::vector<std::string> launch_strip_ranks(int argc, const char* const* argv) {
  std::vector<std::string> out;
  bool positional = false;  // after "--" nothing is an option
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (positional) {
      out.push_back(arg);
    } else if (arg == "--") {
      positional = true;
      out.push_back(arg);
    } else if (arg == "--ranks") {
      TD_CHECK(i + 1 < argc, "--ranks needs a value: the number of local ranks");
      const std::string value = argv[++i];
      TD_CHECK(whole_number(value), "--ranks expects a whole number of ranks, got '{}'", value);
    } else if (arg.rfind("--ranks=", 0) == 0) {
      const std::string value = arg.substr(8);
      TD_CHECK(whole_number(value), "--ranks expects a whole number of ranks, got '{}'", value);
    } else {
      out.push_back(arg);
    }
  }
  return out;
}

}  // namespace tandem
