// Tensor views: a pointer with a dtype, a shape and strides (in elements). A view never
// owns memory; buffers come from a device arena or from the caller.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

constexpr int kMaxDims = 4;

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t stride[kMaxDims] = {};

  // A contiguous row-major view of `data`.
  static Tensor of(void* data, DType dtype, std::initializer_list<int64_t> shape);

  int64_t numel() const;
  size_t bytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool contiguous() const;
  // The same elements under another contiguous shape; the view must be contiguous.
  Tensor reshape(std::initializer_list<int64_t> shape) const;
  // Rows [begin, end) of the first dimension.
  Tensor slice(int64_t begin, int64_t end) const;
  float* f32() const;
  uint16_t* bf16() const;
  std::string describe() const;  // "f32[2, 3]"
};

}  // namespace tandem
