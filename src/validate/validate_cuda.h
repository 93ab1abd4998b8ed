// Argument checks shared by the GPU entry points (quantize_cuda.h and friends). Every message
// starts with the argument's name, e.g. "x: data pointer must be 16-byte aligned (got 0x...)".
// Host-only code (compiled into fp4attn_cuda through validate_cuda.cu).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "fp4attn/status.h"
#include "fp4attn/tensor.h"

namespace fp4attn::cuda_check {

// A BSHD input read in vectors of `vector_bytes` along the last dim: rank 4, dtype in `allowed`,
// non-negative sizes and strides, last dim contiguous, non-null when non-empty, data aligned to
// vector_bytes and every outer stride (of a dim with size > 1) a multiple of the vector's
// element count.
Status bshd_input(const TensorView& x, const char* name, std::initializer_list<DType> allowed,
                  int vector_bytes);

// head_dim (the last dim of x) a multiple of `block`.
Status head_dim_multiple(const TensorView& x, const char* name, int64_t block);

// A contiguous output of exactly `shape` (rank = shape.size()) and a dtype in `allowed`, non-null
// when non-empty, data aligned to `align_bytes`.
Status output(const TensorView& t, const char* name, std::initializer_list<int64_t> shape,
              std::initializer_list<DType> allowed, int align_bytes);

// A contiguous output of `numel` elements of any rank listed in `shapes` (each an exact shape),
// for buffers with more than one accepted view (e.g. swizzled scales: [n] or [rows, cols]).
Status output_one_of(const TensorView& t, const char* name,
                     std::initializer_list<std::initializer_list<int64_t>> shapes,
                     std::initializer_list<DType> allowed, int align_bytes);

// Pointer alignment alone.
Status aligned(const void* p, const char* name, int align_bytes);

// Same shape (all dims) as `ref`: "out: expected shape (2, 7, 3, 64) (as x), got (...)".
Status same_shape(const TensorView& t, const char* name, const TensorView& ref,
                  const char* ref_name);

}  // namespace fp4attn::cuda_check
