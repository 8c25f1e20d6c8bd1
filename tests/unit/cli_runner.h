// Runs the real tandem executable (TANDEM_BINARY) in a child process and captures its
// stdout, stderr and exit status, killing it when it outlives a deadline; and checks that
// a failed run printed exactly one "tandem: error: ..." line.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <vector>

extern char** environ;

namespace tandem::cli_test {

struct RunResult {
  int exit_code = -1;  // valid when the child exited normally
  int signal = 0;      // the signal that killed it, or 0
  bool timed_out = false;
  std::string out, err;

  std::string describe() const {
    std::string s = timed_out ? "TIMED OUT (killed)"
                    : signal  ? "killed by signal " + std::to_string(signal)
                              : "exit " + std::to_string(exit_code);
    return s + "\n--- stdout ---\n" + out + "--- stderr ---\n" + err + "--------------";
  }
};

// The environment of a tandem child: this process's without TANDEM_VERBOSE_ERRORS (so
// messages are the plain ones), with OMP_NUM_THREADS=1 unless set (tiny runs on shared cores).
inline std::vector<std::string> child_environment() {
  std::vector<std::string> env;
  bool omp = false;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    if (kv.rfind("TANDEM_VERBOSE_ERRORS=", 0) == 0) continue;
    omp = omp || kv.rfind("OMP_NUM_THREADS=", 0) == 0;
    env.push_back(kv);
  }
  if (!omp) env.push_back("OMP_NUM_THREADS=1");
  return env;
}

// Runs TANDEM_BINARY with args. The child gets the parent's environment without
// TANDEM_VERBOSE_ERRORS (so messages are the plain ones) and with OMP_NUM_THREADS=1 unless
// set (tiny runs on shared cores), and an empty stdin.
inline RunResult run_tandem(const std::vector<std::string>& args, int timeout_s = 60) {
  // Everything the child needs is built before fork: only async-signal-safe calls after it.
  std::vector<std::string> argv_s = {TANDEM_BINARY};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s = child_environment();
  std::vector<char*> envp;
  for (auto& kv : env_s) envp.push_back(kv.data());
  envp.push_back(nullptr);

  RunResult r;
  int out_pipe[2], err_pipe[2];
  if (::pipe(out_pipe) != 0 || ::pipe(err_pipe) != 0) {
    r.err = std::string("pipe failed: ") + std::strerror(errno);
    return r;
  }
  const pid_t pid = ::fork();
  if (pid < 0) {
    r.err = std::string("fork failed: ") + std::strerror(errno);
    return r;
  }
  if (pid == 0) {
    const int devnull = ::open("/dev/null", O_RDONLY);
    if (devnull >= 0) ::dup2(devnull, 0);
    ::dup2(out_pipe[1], 1);
    ::dup2(err_pipe[1], 2);
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    ::close(err_pipe[0]);
    ::close(err_pipe[1]);
    ::execve(argv[0], argv.data(), envp.data());
    static const char msg[] = "cli_runner: execve failed\n";
    [[maybe_unused]] auto n = ::write(2, msg, sizeof msg - 1);
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      r.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    const int n = ::poll(fds, 2, static_cast<int>(std::min<long long>(left, 1000)));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      const ssize_t got = ::read(fds[i].fd, buf, sizeof buf);
      if (got > 0) {
        sinks[i]->append(buf, static_cast<size_t>(got));
      } else if (got == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  return r;
}

// A failed run as a user needs it: a normal exit with `code` (1: runtime error, 2: flag
// parsing), nothing killed by a signal or the deadline, and stderr exactly one line
// "tandem: error: <message>" whose message contains every needle.
inline ::testing::AssertionResult one_error_line(const RunResult& r, int code,
                                                 std::initializer_list<std::string> needles) {
  auto fail = [&](const std::string& why) {
    return ::testing::AssertionFailure() << why << "\n" << r.describe();
  };
  if (r.timed_out) return fail("the command hung");
  if (r.signal != 0) return fail("the command crashed");
  if (r.exit_code == 0) return fail("the command succeeded; an error was expected");
  for (const char* crash : {"terminate called", "Segmentation fault", "Aborted", "core dumped",
                            "AddressSanitizer", "runtime error:"})
    if (r.err.find(crash) != std::string::npos || r.out.find(crash) != std::string::npos)
      return fail(std::string("the output shows a crash: ") + crash);
  const std::string prefix = "tandem: error: ";
  if (r.err.rfind(prefix, 0) != 0) return fail("stderr does not start with '" + prefix + "'");
  const size_t nl = r.err.find('\n');
  if (nl == std::string::npos || nl + 1 != r.err.size())
    return fail("stderr is not exactly one line");
  const std::string line = r.err.substr(0, nl);
  if (line.size() <= prefix.size()) return fail("the error message is empty");
  for (const auto& needle : needles)
    if (line.find(needle) == std::string::npos)
      return fail("the error line does not mention '" + needle + "'");
  if (r.exit_code != code)
    return fail("exit status " + std::to_string(r.exit_code) + ", expected " +
                std::to_string(code));
  return ::testing::AssertionSuccess();
}

inline ::testing::AssertionResult succeeded(const RunResult& r) {
  if (r.exit_code == 0 && r.signal == 0 && !r.timed_out) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "the command failed\n" << r.describe();
}

// A fresh directory per test (not named after the test, so that error messages that
// quote paths cannot match a needle by accident), removed afterwards.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("tandem_cli_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace tandem::cli_test
