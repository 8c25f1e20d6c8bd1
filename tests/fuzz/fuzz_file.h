// The shared part of tandem's fuzz harnesses: most parsers read files, so a harness writes
// the fuzz input to one file of a per-process temporary folder (the same path every time)
// and calls the real reader on it. tandem::Error is the reader's normal way of refusing an
// input; anything else (a crash, another exception, a sanitizer report, a leak) escapes
// and fails the run.
//
// A harness for a new file format is one file, tests/fuzz/fuzz_<name>.cpp:
//
//   #include "fuzz_file.h"
//   #include "io/myformat.h"
//   TANDEM_FUZZ_FILE_READER("input.myformat",
//                           [](const std::string& path) { tandem::myformat_read(path); })
//
// and its seeds go into tests/fuzz/corpus/<name>/.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "core/error.h"

namespace tandem::fuzz {

// This process's temporary folder, created on first use and removed when it exits
// (libFuzzer's -jobs and -workers run several processes, each with its own).
inline const std::filesystem::path& temp_dir() {
  static const std::filesystem::path dir = [] {
    const std::filesystem::path d =
        std::filesystem::temp_directory_path() / ("tandem-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  // Registered once `dir` is complete, so the removal runs before dir's destructor.
  static const bool cleanup = std::atexit([] {
                                std::error_code ignored;
                                std::filesystem::remove_all(temp_dir(), ignored);
                              }) == 0;
  (void)cleanup;
  return dir;
}

// Writes data to temp_dir()/name, replacing what was there; returns the path.
inline std::string write_input(const uint8_t* data, size_t size, const std::string& name) {
  const std::string path = (temp_dir() / name).string();
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || (size > 0 && std::fwrite(data, 1, size, f) != size) || std::fclose(f) != 0) {
    std::perror(path.c_str());
    std::abort();  // the harness's own failure, not the reader's
  }
  return path;
}

// Runs read(args...); a tandem::Error is a refused input, which is fine.
template <typename F, typename... Args>
void accept_errors(F&& read, Args&&... args) {
  try {
    read(std::forward<Args>(args)...);
  } catch (const Error&) {
  }
}

}  // namespace tandem::fuzz

// The whole harness of a reader that takes a path: the input becomes the file `name`,
// and the remaining arguments are the reader (a function or lambda taking the path).
#define TANDEM_FUZZ_FILE_READER(name, ...)                                                     \
  extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {                    \
    ::tandem::fuzz::accept_errors(__VA_ARGS__, ::tandem::fuzz::write_input(data, size, name)); \
    return 0;                                                                                  \
  }
