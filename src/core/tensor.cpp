// Tensor view helpers.
#include "core/tensor.h"

namespace tandem {

Tensor Tensor::of(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  TD_CHECK(shape.size() <= kMaxDims, "tensor of {} dimensions (at most {})", shape.size(),
           kMaxDims);
  Tensor t;
  t.data = data;
  t.dtype = dtype;
  t.ndim = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) {
    TD_CHECK(s >= 0, "negative tensor dimension {}", s);
    t.shape[i++] = s;
  }
  int64_t st = 1;
  for (int d = t.ndim - 1; d >= 0; --d) {
    t.stride[d] = st;
    st *= t.shape[d];
  }
  return t;
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int d = 0; d < ndim; ++d) n *= shape[d];
  return n;
}

bool Tensor::contiguous() const {
  int64_t st = 1;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != st) return false;
    st *= shape[d];
  }
  return true;
}

Tensor Tensor::reshape(std::initializer_list<int64_t> new_shape) const {
  TD_CHECK(contiguous(), "reshape of a non-contiguous view {}", describe());
  Tensor t = of(data, dtype, new_shape);
  TD_CHECK(t.numel() == numel(), "reshape of {} to {} elements", describe(), t.numel());
  return t;
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  TD_CHECK(ndim >= 1 && 0 <= begin && begin <= end && end <= shape[0], "slice [{}, {}) of {}",
           begin, end, describe());
  Tensor t = *this;
  t.shape[0] = end - begin;
  t.data = static_cast<char*>(data) + begin * stride[0] * static_cast<int64_t>(dtype_size(dtype));
  return t;
}

float* Tensor::f32() const {
  TD_CHECK(dtype == DType::f32, "expected an f32 tensor, got {}", describe());
  return static_cast<float*>(data);
}

uint16_t* Tensor::bf16() const {
  TD_CHECK(dtype == DType::bf16, "expected a bf16 tensor, got {}", describe());
  return static_cast<uint16_t*>(data);
}

std::string Tensor::describe() const {
  std::string s = std::string(dtype_name(dtype)) + "[";
  for (int d = 0; d < ndim; ++d) s += (d ? ", " : "") + std::to_string(shape[d]);
  return s + "]";
}

}  // namespace tandem
