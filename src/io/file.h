// Durable file writes (temporary name, fsync, rename), read-only memory maps, JSON that
// refuses duplicate keys, and the checksum used by checkpoints.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

// Writes `bytes` bytes to path atomically: to path + ".tmp", fsync, rename, fsync of the
// directory. A crash leaves either the old file or the new one, never a mix.
void file_write_atomic(const std::string& path, const void* data, size_t bytes);
// Appends chunks in order to one atomic write.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // removes the temporary file unless commit() ran
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  void write(const void* data, size_t bytes);
  void commit();  // fsync, rename into place, fsync the directory
  uint64_t checksum() const { return hash_; }
  size_t bytes() const { return bytes_; }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
  size_t bytes_ = 0;
  uint64_t hash_;
};

std::vector<char> file_read_all(const std::string& path);

// A text file written a line at a time, each line handed to the kernel at once and every
// failure (a full disk, an I/O error) reported with the file's name: metrics and other
// logs that a run appends to as it goes.
class LineFile {
 public:
  // Creates or truncates path, or appends to it; throws naming the file.
  LineFile(std::string path, bool append);
  ~LineFile();
  LineFile(const LineFile&) = delete;
  LineFile& operator=(const LineFile&) = delete;
  // Writes line and a newline; throws naming the file when not all of it was written.
  void write_line(const std::string& line);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// An exclusive advisory lock (flock) on `dir`/.tandem-lock, held for the object's life: a
// second process asking for the same directory is refused, told which process holds it.
// `what` names the directory's use in the message ("checkpoint directory").
class DirectoryLock {
 public:
  DirectoryLock(const std::string& dir, const std::string& what);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

// A whole file mapped read-only (mmap): pages are read from disk only when touched, so a
// reader of a few byte ranges of a large file reads just those.
class MappedFile {
 public:
  explicit MappedFile(std::string path);  // throws naming the file when it cannot be mapped
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }  // nullptr for an empty file
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// Parses JSON text, refusing a key that appears twice in one object (a plain parse keeps
// the last silently). Errors name `what` (a file, usually) and the repeated key.
nlohmann::ordered_json json_parse_unique(const std::string& text, const std::string& what);
// The same for a whole file; a missing or unreadable file is an error naming it.
nlohmann::ordered_json json_read_unique(const std::string& path);

// 64-bit FNV-1a over the bytes, continued from `seed` (checksum_init() to start).
uint64_t checksum_init();
uint64_t checksum_update(uint64_t h, const void* data, size_t bytes);
std::string checksum_hex(uint64_t h);

}  // namespace tandem
