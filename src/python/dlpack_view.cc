#include "python/dlpack_view.h"

#include <string>

namespace fp4attn::py {
namespace {

namespace dl = nb::dlpack;

// DLPack's kDLFloat8_e4m3fn, spelled out: older nanobind releases have no enumerator for it.
constexpr uint8_t kDLFloat8E4M3FN = 10;

bool dtype_of(dl::dtype t, DType* out) {
  using Code = dl::dtype_code;
  struct Entry {
    uint8_t code, bits;
    DType dtype;
  };
  static constexpr Entry kTable[] = {
      {uint8_t(Code::Float), 64, DType::kF64}, {uint8_t(Code::Float), 32, DType::kF32},
      {uint8_t(Code::Float), 16, DType::kF16}, {uint8_t(Code::Bfloat), 16, DType::kBF16},
      {uint8_t(Code::UInt), 8, DType::kU8},    {uint8_t(Code::Int), 32, DType::kI32},
      {uint8_t(Code::Int), 64, DType::kI64},   {kDLFloat8E4M3FN, 8, DType::kE4M3},
      {uint8_t(Code::Int), 8, DType::kI8},
  };
  if (t.lanes != 1) return false;
  for (const Entry& e : kTable) {
    if (e.code == t.code && e.bits == t.bits) {
      *out = e.dtype;
      return true;
    }
  }
  return false;
}

}  // namespace

TensorView to_view(const nb::ndarray<>& a, const char* name, bool as_e4m3) {
  TensorView v;
  if (!dtype_of(a.dtype(), &v.dtype)) {
    throw nb::type_error((std::string(name) + ": unsupported dtype (code " +
                          std::to_string(a.dtype().code) + ", " + std::to_string(a.dtype().bits) +
                          " bits)")
                             .c_str());
  }
  if (as_e4m3) {
    if (v.dtype != DType::kU8 && v.dtype != DType::kE4M3) {
      throw nb::type_error(
          (std::string(name) + ": E4M3 codes must be float8_e4m3fn or uint8").c_str());
    }
    v.dtype = DType::kE4M3;
  }
  if (a.ndim() > static_cast<size_t>(kMaxRank)) {
    throw nb::value_error((std::string(name) + ": rank " + std::to_string(a.ndim()) +
                           " is above the maximum of " + std::to_string(kMaxRank))
                              .c_str());
  }
  v.data = a.data();
  v.rank = static_cast<int>(a.ndim());
  for (int i = 0; i < v.rank; ++i) {
    v.shape[i] = static_cast<int64_t>(a.shape(i));
    v.stride[i] = a.stride(i);  // DLPack strides are in elements, as TensorView's
  }
  return v;
}

bool is_host(const nb::ndarray<>& a) {
  const int t = a.device_type();
  return t == nb::device::cpu::value || t == nb::device::cuda_host::value;
}

bool is_cuda(const nb::ndarray<>& a) { return a.device_type() == nb::device::cuda::value; }

}  // namespace fp4attn::py
