// Shared argument checks of the GPU entry points (validate_cuda.h). Host code only.
#include <cstdio>
#include <string>
#include <vector>

#include "validate/validate_cuda.h"

namespace fp4attn::cuda_check {
namespace {

std::string shape_string(std::initializer_list<int64_t> shape) {
  std::string s = "(";
  bool first = true;
  for (int64_t v : shape) {
    s += (first ? "" : ", ") + std::to_string(v);
    first = false;
  }
  return s + ")";
}

bool shape_equals(const TensorView& t, std::initializer_list<int64_t> shape) {
  if (t.rank != static_cast<int>(shape.size())) return false;
  int i = 0;
  for (int64_t v : shape) {
    if (t.shape[i++] != v) return false;
  }
  return true;
}

std::string pointer_string(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

}  // namespace

Status aligned(const void* p, const char* name, int align_bytes) {
  if (align_bytes > 1 && reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(align_bytes)) {
    return Status::Invalid(std::string(name) + ": data pointer must be " +
                           std::to_string(align_bytes) + "-byte aligned (got " + pointer_string(p) +
                           ")");
  }
  return Status::Ok();
}

Status bshd_input(const TensorView& x, const char* name, std::initializer_list<DType> allowed,
                  int vector_bytes) {
  FP4ATTN_RETURN_IF_ERROR(check_rank(x, name, 4, "(batch, seqlen, heads, head_dim)"));
  FP4ATTN_RETURN_IF_ERROR(check_dtype(x, name, allowed));
  FP4ATTN_RETURN_IF_ERROR(check_strides(x, name));
  FP4ATTN_RETURN_IF_ERROR(check_not_null(x, name));
  if (x.numel() == 0) return Status::Ok();
  FP4ATTN_RETURN_IF_ERROR(aligned(x.data, name, vector_bytes));
  const int64_t vec = vector_bytes / dtype_size(x.dtype);
  for (int i = 0; i < 3; ++i) {
    if (x.shape[i] > 1 && x.stride[i] % vec != 0) {
      return Status::Invalid(std::string(name) + ": stride of dimension " + std::to_string(i) +
                             " must be a multiple of " + std::to_string(vec) + " elements (" +
                             std::to_string(vector_bytes) + " bytes), got " +
                             std::to_string(x.stride[i]));
    }
  }
  return Status::Ok();
}

Status head_dim_multiple(const TensorView& x, const char* name, int64_t block) {
  const int64_t d = x.shape[x.rank - 1];
  if (d % block != 0) {
    return Status::Invalid(std::string(name) + ": head_dim (" + std::to_string(d) +
                           ") must be a multiple of the block size " + std::to_string(block));
  }
  return Status::Ok();
}

Status output_one_of(const TensorView& t, const char* name,
                     std::initializer_list<std::initializer_list<int64_t>> shapes,
                     std::initializer_list<DType> allowed, int align_bytes) {
  if (!t.defined()) {
    return Status::Invalid(std::string(name) +
                           ": output tensor is required (got an undefined "
                           "view)");
  }
  bool match = false;
  std::string expected;
  for (auto shape : shapes) {
    match = match || shape_equals(t, shape);
    expected += (expected.empty() ? "" : " or ") + shape_string(shape);
  }
  if (!match) {
    return Status::Invalid(std::string(name) + ": expected shape " + expected + ", got " +
                           t.shape_str());
  }
  FP4ATTN_RETURN_IF_ERROR(check_dtype(t, name, allowed));
  if (!t.is_contiguous()) {
    return Status::Invalid(std::string(name) + ": must be contiguous (row-major)");
  }
  FP4ATTN_RETURN_IF_ERROR(check_not_null(t, name));
  if (t.numel() == 0) return Status::Ok();
  return aligned(t.data, name, align_bytes);
}

Status output(const TensorView& t, const char* name, std::initializer_list<int64_t> shape,
              std::initializer_list<DType> allowed, int align_bytes) {
  return output_one_of(t, name, {shape}, allowed, align_bytes);
}

Status same_shape(const TensorView& t, const char* name, const TensorView& ref,
                  const char* ref_name) {
  bool equal = t.rank == ref.rank;
  for (int i = 0; equal && i < t.rank; ++i) equal = t.shape[i] == ref.shape[i];
  if (!equal) {
    return Status::Invalid(std::string(name) + ": expected shape " + ref.shape_str() + " (as " +
                           ref_name + "), got " + t.shape_str());
  }
  return Status::Ok();
}

}  // namespace fp4attn::cuda_check
