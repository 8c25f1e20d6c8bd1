// The safetensors format (https://github.com/huggingface/safetensors): whole-file reads and
// writes of the dtypes tandem computes with (F32, F16, BF16, I32), and a memory-mapped view
// that validates the header of any file (every standard dtype) and hands out tensors'
// bytes in place, for Hugging Face model directories.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/file.h"

namespace tandem {

// One tensor: its raw little-endian bytes, exactly numel(shape) * dtype size of them.
struct SafeTensor {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16" or "I32"
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  int64_t numel() const;
};

// Bytes per element of a safetensors dtype tandem reads and writes whole (F32, F16, BF16,
// I32); throws for any other dtype.
size_t safetensors_dtype_size(const std::string& dtype);

// Writes the tensors (names unique and non-empty, shapes and byte counts consistent) and
// the metadata to path + ".tmp", then renames it over path. The header lists the tensors
// in the given order; their data is laid out by descending element size, so every tensor
// starts aligned to its element size.
void safetensors_write(const std::string& path, const std::vector<SafeTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

struct SafeTensorsFile {
  std::string path;
  std::vector<SafeTensor> tensors;  // in header order
  std::map<std::string, std::string> metadata;

  bool contains(const std::string& name) const;
  // Throws tandem::Error naming the file and the missing tensor.
  const SafeTensor& get(const std::string& name) const;
};

// Reads and validates a whole file: length prefix, JSON header (no key twice), dtypes,
// shapes against byte counts, and data offsets (in range, no overlaps, no gaps, nothing
// after the last).
SafeTensorsFile safetensors_read(const std::string& path);

// Where one tensor's bytes lie in a mapped file.
struct SafeTensorInfo {
  std::string name;
  std::string dtype;  // any standard safetensors dtype ("F32", "BOOL", "U8", "F64", ...)
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte offsets within the data section
  int64_t numel() const;
};

// A safetensors file mapped read-only. The constructor validates the header as
// safetensors_read does, for every standard dtype, and reads no tensor data; data() points
// into the mapping, so only the pages of the bytes a caller reads come from disk.
class SafeTensorsMap {
 public:
  explicit SafeTensorsMap(const std::string& path);
  const std::string& path() const { return file_->path(); }
  const std::vector<SafeTensorInfo>& tensors() const { return tensors_; }  // header order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafeTensorInfo* find(const std::string& name) const;  // nullptr when absent
  const uint8_t* data(const SafeTensorInfo& t) const {
    return file_->data() + data_start_ + t.begin;
  }

 private:
  std::unique_ptr<MappedFile> file_;
  uint64_t data_start_ = 0;  // 8 + header length
  std::vector<SafeTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace tandem
