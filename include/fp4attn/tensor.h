// TensorView: a non-owning view (pointer, dtype, shape, strides in elements) used by every
// public entry point, host or device memory alike.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "fp4attn/status.h"

namespace fp4attn {

enum class DType : int { kF64, kF32, kBF16, kF16, kU8, kE4M3, kE5M2, kI32, kI64, kI8 };

const char* dtype_name(DType t);
int dtype_size(DType t);

constexpr int kMaxRank = 4;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int rank = 0;
  int64_t shape[kMaxRank] = {0, 0, 0, 0};
  int64_t stride[kMaxRank] = {0, 0, 0, 0};  // in elements

  bool defined() const { return rank > 0; }
  int64_t numel() const;
  bool is_contiguous() const;
  std::string shape_str() const;  // "(2, 128, 8, 64)"
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

// A contiguous (row-major) view of `shape`.
TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> shape);
// A view with explicit strides (elements).
TensorView make_strided_view(void* data, DType dtype, std::initializer_list<int64_t> shape,
                             std::initializer_list<int64_t> stride);

// Element read/write as double for the host golden model (f64, f32, bf16, f16 only).
double load_as_double(const TensorView& t, int64_t offset);
void store_from_double(const TensorView& t, int64_t offset, double value);

// Argument checks shared by the entry points; `name` is the argument's name in messages.
Status check_rank(const TensorView& t, const char* name, int rank, const char* dims);
Status check_dtype(const TensorView& t, const char* name, std::initializer_list<DType> allowed);
Status check_not_null(const TensorView& t, const char* name);
Status check_strides(const TensorView& t, const char* name);  // non-negative, inner dim stride 1
// A non-null (unless empty), contiguous tensor of exactly `shape` and `dtype`: outputs and
// operands whose layout is fixed by the API.
Status check_contiguous_shape(const TensorView& t, const char* name,
                              std::initializer_list<int64_t> shape, DType dtype);

}  // namespace fp4attn
