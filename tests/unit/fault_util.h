// Helpers of the failure tests that run real `tandem train` jobs: environment variables
// scoped to a test, a tag that finds every process of a job afterwards, metrics files,
// tiny token files and the arguments of a tiny run.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli_runner.h"
#include "io/tokens.h"

namespace tandem::cli_test {

namespace fs = std::filesystem;

// Each job gets this long; the faults below must end it far sooner (seconds).
inline constexpr int kDeadlineS = 60;

// Sets an environment variable for the runs of one test (run_tandem passes the test's
// environment to the child) and restores the previous value afterwards.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::string& value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str())) old_ = old;
    ::setenv(name_.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) {
      ::setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      ::unsetenv(name_.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Tags every process of one job (the launcher, mpirun and the ranks all inherit it), so the
// test can tell afterwards whether any of them outlived the job.
class JobTag {
 public:
  JobTag()
      : entry_("TANDEM_FAULT_TEST_JOB=" + std::to_string(::getpid()) + "-" +
               std::to_string(counter_++)),
        env_("TANDEM_FAULT_TEST_JOB", entry_.substr(entry_.find('=') + 1)) {}
  const std::string& entry() const { return entry_; }

 private:
  static inline int counter_ = 0;
  std::string entry_;
  ScopedEnv env_;
};

// Processes other than this one whose initial environment holds `entry`.
inline std::vector<pid_t> tagged_processes(const std::string& entry) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    if (pid == ::getpid()) continue;
    std::ifstream in(e.path() / "environ", std::ios::binary);
    std::string var;
    while (std::getline(in, var, '\0'))
      if (var == entry) {
        out.push_back(pid);
        break;
      }
  }
  return out;
}

// Every process of the job is gone within a few seconds of its end. Any that is not is
// killed (it was started by this test: it carries the job's tag) and reported.
inline ::testing::AssertionResult nothing_left_running(const JobTag& tag) {
  std::vector<pid_t> left;
  for (int i = 0; i < 100; ++i) {
    left = tagged_processes(tag.entry());
    if (left.empty()) return ::testing::AssertionSuccess();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::ostringstream msg;
  msg << "processes of the job still run 10 s after it ended:";
  for (pid_t pid : left) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
    std::string cmd(std::istreambuf_iterator<char>(in), {});
    for (char& c : cmd)
      if (c == '\0') c = ' ';
    msg << "\n  " << pid << ": " << cmd;
    ::kill(pid, SIGKILL);
  }
  return ::testing::AssertionFailure() << msg.str();
}

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The per-step lines of a metrics file, without the summary line a finished run ends it
// with ({"summary": true, ...}, docs/formats.md).
inline std::vector<nlohmann::json> read_metrics(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(read_file(path));
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line);
    if (!j.value("summary", false)) lines.push_back(std::move(j));
  }
  return lines;
}

inline std::string token_file(const TempDir& dir) {
  std::vector<uint32_t> tokens(800);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 32 + static_cast<uint32_t>(i * 13 % 90);
  const std::string path = dir / "data.tok";
  tokens_write(path, tokens, 2);
  return path;
}

// `tandem train` on tiny sequences at `ranks` ranks, plus `extra`. The learning rate is
// constant (--min-lr-ratio 1), so runs of different lengths take the same steps and a
// resumed run can be compared with an unbroken one.
inline std::vector<std::string> train_args(const std::string& data, int ranks,
                                           const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"train", "--data",         data, "--seq",      "16",  "--batch",
                                   "1",     "--min-lr-ratio", "1",  "--progress", "none"};
  if (ranks > 1) args.insert(args.end(), {"--ranks", std::to_string(ranks)});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

struct Timed {
  RunResult r;
  double seconds = 0;
};

inline Timed run_timed(const std::vector<std::string>& args) {
  const auto t0 = std::chrono::steady_clock::now();
  Timed t{run_tandem(args, kDeadlineS), 0};
  t.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t;
}

// The job failed on its own: a nonzero exit, not the test's deadline.
inline ::testing::AssertionResult ended_with_failure(const Timed& t) {
  if (t.r.timed_out)
    return ::testing::AssertionFailure()
           << "the job was still running after " << kDeadlineS << " s\n"
           << t.r.describe();
  if (t.r.exit_code == 0 && t.r.signal == 0)
    return ::testing::AssertionFailure() << "the job succeeded despite the fault\n"
                                         << t.r.describe();
  return ::testing::AssertionSuccess();
}

inline bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

}  // namespace tandem::cli_test

namespace tandem::cli_test {

// A tandem job running in the background, with its stdout and stderr in files, for the
// tests that signal or kill it while it runs.
class BackgroundJob {
 public:
  BackgroundJob(const std::vector<std::string>& args, const std::string& out_path,
                const std::string& err_path)
      : out_(out_path), err_(err_path) {
    std::vector<std::string> argv_s = {TANDEM_BINARY};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_s = child_environment();
    std::vector<char*> envp;
    for (auto& kv : env_s) envp.push_back(kv.data());
    envp.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      const int in = ::open("/dev/null", O_RDONLY);
      const int o = ::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = ::open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (in >= 0) ::dup2(in, 0);
      if (o >= 0) ::dup2(o, 1);
      if (e >= 0) ::dup2(e, 2);
      ::execve(argv[0], argv.data(), envp.data());
      ::_exit(127);
    }
  }
  ~BackgroundJob() {
    if (pid_ > 0 && !done_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  BackgroundJob(const BackgroundJob&) = delete;
  BackgroundJob& operator=(const BackgroundJob&) = delete;

  pid_t pid() const { return pid_; }
  // Waits for the job to end (killing it after timeout_s) and returns what it printed.
  RunResult wait(int timeout_s = kDeadlineS) {
    RunResult r;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    int status = 0;
    for (;;) {
      const pid_t got = ::waitpid(pid_, &status, WNOHANG);
      if (got == pid_) break;
      if (std::chrono::steady_clock::now() > deadline) {
        r.timed_out = true;
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    done_ = true;
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    r.out = read_file(out_);
    r.err = read_file(err_);
    return r;
  }

 private:
  std::string out_, err_;
  pid_t pid_ = -1;
  bool done_ = false;
};

// Waits until the file holds at least `lines` lines (false after timeout_s).
inline bool wait_for_lines(const std::string& path, size_t lines, int timeout_s = kDeadlineS) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    const std::string text = read_file(path);
    if (static_cast<size_t>(std::count(text.begin(), text.end(), '\n')) >= lines) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

// The last line of text that is not empty.
inline std::string last_line(const std::string& text) {
  std::istringstream in(text);
  std::string last;
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) last = l;
  return last;
}

}  // namespace tandem::cli_test
