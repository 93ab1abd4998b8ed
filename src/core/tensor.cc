#include "fp4attn/tensor.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <sstream>

#include "core/checked_size.h"
#include "core/half.h"

namespace fp4attn {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kF64:
      return "float64";
    case DType::kF32:
      return "float32";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF16:
      return "float16";
    case DType::kU8:
      return "uint8";
    case DType::kE4M3:
      return "float8_e4m3fn";
    case DType::kE5M2:
      return "float8_e5m2";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
    case DType::kI8:
      return "int8";
  }
  return "unknown";
}

int dtype_size(DType t) {
  switch (t) {
    case DType::kF64:
    case DType::kI64:
      return 8;
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kU8:
    case DType::kE4M3:
    case DType::kE5M2:
    case DType::kI8:
      return 1;
  }
  return 0;
}

int64_t TensorView::numel() const {
  if (rank == 0) return 0;
  for (int i = 0; i < rank; ++i) {
    if (shape[i] == 0) return 0;  // whatever the other sizes, as numpy and torch count
  }
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) {
    if (__builtin_mul_overflow(n, shape[i], &n)) return INT64_MAX;  // check_rank refuses it
  }
  return n;
}

bool TensorView::is_contiguous() const {
  // An empty tensor has no element to misplace: its strides are whatever its maker chose (torch
  // gives (128, 64, 64, 1) to shape (1, 2, 0, 64)).
  if (rank > 0 && numel() == 0) return true;
  int64_t expected = 1;
  for (int i = rank - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != expected) return false;
    if (!checked_mul(expected, shape[i], &expected)) return false;
  }
  return true;
}

std::string TensorView::shape_str() const {
  std::ostringstream s;
  s << "(";
  for (int i = 0; i < rank; ++i) s << (i ? ", " : "") << shape[i];
  s << ")";
  return s.str();
}

TensorView make_view(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.rank = static_cast<int>(shape.size());
  int i = 0;
  for (int64_t s : shape) t.shape[i++] = s;
  int64_t st = 1;
  for (int d = t.rank - 1; d >= 0; --d) {
    t.stride[d] = st;
    // A shape whose product overflows (check_rank refuses it) gets strides 0 here, not UB.
    if (__builtin_mul_overflow(st, t.shape[d], &st)) st = 0;
  }
  return t;
}

TensorView make_strided_view(void* data, DType dtype, std::initializer_list<int64_t> shape,
                             std::initializer_list<int64_t> stride) {
  TensorView t = make_view(data, dtype, shape);
  int i = 0;
  for (int64_t s : stride) t.stride[i++] = s;
  return t;
}

double load_as_double(const TensorView& t, int64_t offset) {
  switch (t.dtype) {
    case DType::kF64:
      return static_cast<const double*>(t.data)[offset];
    case DType::kF32:
      return static_cast<const float*>(t.data)[offset];
    case DType::kBF16:
      return bf16_bits_to_float(static_cast<const uint16_t*>(t.data)[offset]);
    case DType::kF16:
      return f16_bits_to_float(static_cast<const uint16_t*>(t.data)[offset]);
    default:
      return std::nan("");
  }
}

void store_from_double(const TensorView& t, int64_t offset, double value) {
  switch (t.dtype) {
    case DType::kF64:
      static_cast<double*>(t.data)[offset] = value;
      break;
    case DType::kF32:
      static_cast<float*>(t.data)[offset] = static_cast<float>(value);
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(t.data)[offset] = float_to_bf16_bits(static_cast<float>(value));
      break;
    case DType::kF16:
      static_cast<uint16_t*>(t.data)[offset] = float_to_f16_bits(static_cast<float>(value));
      break;
    default:
      break;
  }
}

Status check_not_null(const TensorView& t, const char* name) {
  if (t.data == nullptr && t.numel() > 0) {
    return Status::Invalid(std::string(name) + ": data pointer is null for a non-empty tensor");
  }
  return Status::Ok();
}

Status check_rank(const TensorView& t, const char* name, int rank, const char* dims) {
  if (t.rank != rank) {
    std::ostringstream s;
    s << name << ": expected rank " << rank << " " << dims << ", got rank " << t.rank;
    return Status::Invalid(s.str());
  }
  for (int i = 0; i < rank; ++i) {
    if (t.shape[i] < 0) {
      return Status::Invalid(std::string(name) + ": negative size in shape " + t.shape_str());
    }
  }
  // Element and byte offsets are int64 everywhere: a shape whose bytes do not fit cannot be real.
  int64_t bytes = t.numel();
  if (bytes == INT64_MAX || !checked_mul(bytes, dtype_size(t.dtype), &bytes)) {
    return Status::Invalid(std::string(name) + ": shape " + t.shape_str() +
                           " has more bytes than int64 can count");
  }
  return Status::Ok();
}

Status check_dtype(const TensorView& t, const char* name, std::initializer_list<DType> allowed) {
  std::string list;
  for (DType d : allowed) {
    if (d == t.dtype) return Status::Ok();
    list += (list.empty() ? "" : ", ");
    list += dtype_name(d);
  }
  return Status::Invalid(std::string(name) + ": expected dtype " + list + ", got " +
                         dtype_name(t.dtype));
}

Status check_contiguous_shape(const TensorView& t, const char* name,
                              std::initializer_list<int64_t> shape, DType dtype) {
  FP4ATTN_RETURN_IF_ERROR(check_not_null(t, name));
  const TensorView want = make_view(nullptr, dtype, shape);
  bool same = t.rank == want.rank && t.dtype == dtype && t.is_contiguous();
  for (int i = 0; same && i < t.rank; ++i) same = t.shape[i] == want.shape[i];
  if (!same) {
    return Status::Invalid(std::string(name) + ": expected a contiguous " + dtype_name(dtype) +
                           " tensor of shape " + want.shape_str() + ", got " + dtype_name(t.dtype) +
                           " " + t.shape_str() + (t.is_contiguous() ? "" : " (not contiguous)"));
  }
  return Status::Ok();
}

Status check_strides(const TensorView& t, const char* name) {
  for (int i = 0; i < t.rank; ++i) {
    if (t.stride[i] < 0) {
      return Status::Invalid(std::string(name) + ": negative stride in dimension " +
                             std::to_string(i));
    }
  }
  if (t.rank > 0 && t.shape[t.rank - 1] > 1 && t.stride[t.rank - 1] != 1) {
    return Status::Invalid(std::string(name) +
                           ": the last dimension must be contiguous (stride 1), got stride " +
                           std::to_string(t.stride[t.rank - 1]));
  }
  return Status::Ok();
}

}  // namespace fp4attn
