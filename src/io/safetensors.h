// The safetensors format (https://github.com/huggingface/safetensors), the subset tandem
// uses to import and export weights: dtypes F32, BF16 and I32, optional string metadata.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tandem {

// One tensor: its raw little-endian bytes, exactly numel(shape) * dtype size of them.
struct SafeTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16" or "I32"
  std::vector<int64_t> shape;
  std::vector<uint8_t> data;

  int64_t numel() const;
};

// Bytes per element of a safetensors dtype tandem handles; throws for any other dtype.
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

// Reads and validates a whole file: length prefix, JSON header, dtypes, shapes against
// byte counts, and data offsets (in range, no overlaps, no gaps, nothing after the last).
SafeTensorsFile safetensors_read(const std::string& path);

}  // namespace tandem
