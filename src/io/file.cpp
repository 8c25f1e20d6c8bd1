// POSIX file helpers: atomic writes through a temporary name and checksums.
#include "io/file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "core/json.h"

namespace tandem {

namespace {
void fsync_dir(const std::string& path) {
  std::string dir = std::filesystem::path(path).parent_path().string();
  if (dir.empty()) dir = ".";
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;  // best effort: some filesystems refuse directory handles
  ::fsync(fd);
  ::close(fd);
}
}  // namespace

uint64_t checksum_init() {
  return 0xcbf29ce484222325ull;
}

uint64_t checksum_update(uint64_t h, const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

std::string checksum_hex(uint64_t h) {
  return fmt::format("{:016x}", h);
}

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), tmp_(fmt::format("{}.tmp", path_)), hash_(checksum_init()) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TD_CHECK(fd_ >= 0, "cannot create '{}': {}", tmp_, std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, size_t bytes) {
  TD_CHECK(fd_ >= 0, "write to '{}' after commit", path_);
  const char* p = static_cast<const char*>(data);
  size_t left = bytes;
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    TD_CHECK(n > 0, "cannot write '{}': {}", tmp_, std::strerror(errno));
    p += n;
    left -= static_cast<size_t>(n);
  }
  hash_ = checksum_update(hash_, data, bytes);
  bytes_ += bytes;
}

void AtomicFile::commit() {
  TD_CHECK(fd_ >= 0, "commit of '{}' twice", path_);
  TD_CHECK(::fsync(fd_) == 0, "cannot sync '{}': {}", tmp_, std::strerror(errno));
  ::close(fd_);
  fd_ = -1;
  TD_CHECK(::rename(tmp_.c_str(), path_.c_str()) == 0, "cannot rename '{}' to '{}': {}", tmp_,
           path_, std::strerror(errno));
  fsync_dir(path_);
}

void file_write_atomic(const std::string& path, const void* data, size_t bytes) {
  AtomicFile f(path);
  f.write(data, bytes);
  f.commit();
}

LineFile::LineFile(std::string path, bool append) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (append ? O_APPEND : O_TRUNC), 0644);
  TD_CHECK(fd_ >= 0, "cannot open '{}' for writing: {}", path_, std::strerror(errno));
}

LineFile::~LineFile() {
  if (fd_ >= 0) ::close(fd_);
}

void LineFile::write_line(const std::string& line) {
  const std::string text = line + "\n";
  const char* p = text.data();
  size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    TD_CHECK(n > 0, "cannot write to '{}': {}", path_,
             n < 0 ? std::strerror(errno) : "no bytes written");
    p += n;
    left -= static_cast<size_t>(n);
  }
}

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& what) {
  const std::string path = (std::filesystem::path(dir) / ".tandem-lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  TD_CHECK(fd_ >= 0, "cannot create the lock file '{}' of {} '{}': {}", path, what, dir,
           std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char holder[32] = {};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    ::close(fd_);
    fd_ = -1;
    const std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : "";
    TD_CHECK(err != EWOULDBLOCK,
             "{} '{}' is in use by another tandem run{}: two runs must not "
             "write one directory",
             what, dir,
             pid.empty() ? "" : fmt::format(" (process {})", pid.substr(0, pid.find('\n'))));
    TD_THROW("cannot lock {} '{}': {}", what, dir, std::strerror(err));
  }
  // The holder's process id, for the message another run gets.
  const std::string pid = fmt::format("{}\n", ::getpid());
  if (::ftruncate(fd_, 0) == 0) {
    const ssize_t ignored = ::pwrite(fd_, pid.data(), pid.size(), 0);
    (void)ignored;
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing releases the lock
}

std::vector<char> file_read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  TD_CHECK(in.good(), "cannot open '{}'", path);
  std::streamsize n = in.tellg();
  in.seekg(0);
  std::vector<char> buf(static_cast<size_t>(n));
  TD_CHECK(n == 0 || in.read(buf.data(), n), "cannot read '{}'", path);
  return buf;
}

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  TD_CHECK(!std::filesystem::is_directory(path_, ec), "'{}' is a directory, not a file", path_);
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  TD_CHECK(fd >= 0, "cannot open '{}': {}", path_, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    TD_THROW("cannot stat '{}': {}", path_, why);
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      TD_THROW("cannot map '{}' ({} bytes): {}", path_, size_, why);
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file open
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

nlohmann::ordered_json json_parse_unique(const std::string& text, const std::string& what) {
  return json_parse_ordered(text, what);  // core/json.h: one strict parser for every reader
}

nlohmann::ordered_json json_read_unique(const std::string& path) {
  std::error_code ec;
  TD_CHECK(std::filesystem::is_regular_file(path, ec), "'{}' does not exist or is not a file",
           path);
  const std::vector<char> bytes = file_read_all(path);
  return json_parse_unique(std::string(bytes.begin(), bytes.end()), fmt::format("'{}'", path));
}

}  // namespace tandem
