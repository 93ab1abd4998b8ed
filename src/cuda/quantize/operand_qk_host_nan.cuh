// The host reference's NaN rules on the device, for the Q/K outputs that keep NaN payloads (the
// bf16 recipe and the K mean). The reference reads inputs through float -> double -> float (x86
// quiets signaling NaNs) and smooths with a double subtraction; these functions reproduce that
// bit for bit: quieting, x86's operand order, and its default NaN for Inf - Inf. Every other
// output maps NaN to a fixed code and uses the plain loads of operand_qk_input.cuh.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace fp4attn::detail::qk_operand {

constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu, kF32Inf = 0x7F800000u;
constexpr uint32_t kF32QuietBit = 0x00400000u;
constexpr uint32_t kX86DefaultNanF32 = 0xFFC00000u;
constexpr uint64_t kX86DefaultNanF64 = 0xFFF8000000000000ull;

__device__ __forceinline__ bool f32_is_nan(float v) {
  return (__float_as_uint(v) & kF32AbsMask) > kF32Inf;
}

// A 16-bit input as the host reads it: exact, NaNs quieted (the float -> double conversion).
template <bool kF16>
__device__ __forceinline__ float load_value(uint32_t h16) {
  if constexpr (kF16) {
    const float f = __half2float(__ushort_as_half(static_cast<unsigned short>(h16)));
    const uint32_t nan = ((h16 & 0x8000u) << 16) | kF32Inf | kF32QuietBit | ((h16 & 0x3FFu) << 13);
    return (h16 & 0x7FFFu) > 0x7C00u ? __uint_as_float(nan) : f;
  } else {
    uint32_t u = h16 << 16;
    if ((u & kF32AbsMask) > kF32Inf) u |= kF32QuietBit;
    return __uint_as_float(u);
  }
}

// float(double(x) - double(m)) on x86: one FP32 subtraction for numbers (double rounding through
// FP64 is innocuous for a subtraction), x's NaN first, then m's, Inf - Inf the default NaN.
__device__ __forceinline__ float host_sub(float x, float m) {
  if (f32_is_nan(x)) return x;
  if (f32_is_nan(m)) return m;
  const float r = __fsub_rn(x, m);
  return f32_is_nan(r) ? __uint_as_float(kX86DefaultNanF32) : r;
}

// double(float) and float(double) as x86 converts them (payload kept, quiet bit set).
__device__ __forceinline__ double host_f2d(float v) {
  const uint32_t u = __float_as_uint(v);
  if ((u & kF32AbsMask) > kF32Inf) {
    const uint64_t d = (uint64_t{u >> 31} << 63) | (uint64_t{0x7FF} << 52) |
                       (uint64_t{u & 0x7FFFFFu} << 29) | (uint64_t{1} << 51);
    return __longlong_as_double(static_cast<long long>(d));
  }
  return static_cast<double>(v);
}

__device__ __forceinline__ float host_d2f(double v) {
  const uint64_t d = static_cast<uint64_t>(__double_as_longlong(v));
  if ((d & 0x7FFFFFFFFFFFFFFFull) > 0x7FF0000000000000ull) {
    return __uint_as_float(static_cast<uint32_t>((d >> 63) << 31) | kF32Inf | kF32QuietBit |
                           static_cast<uint32_t>((d >> 29) & 0x7FFFFFu));
  }
  return __double2float_rn(v);
}

__device__ __forceinline__ bool f64_is_nan(double v) {
  return (static_cast<uint64_t>(__double_as_longlong(v)) & 0x7FFFFFFFFFFFFFFFull) >
         0x7FF0000000000000ull;
}

// acc + v in double as `mean[c] += v` computes it on x86 (acc's NaN first).
__device__ __forceinline__ double host_add(double acc, double v) {
  if (f64_is_nan(acc)) return acc;
  if (f64_is_nan(v)) return v;
  const double r = __dadd_rn(acc, v);
  return f64_is_nan(r) ? __longlong_as_double(static_cast<long long>(kX86DefaultNanF64)) : r;
}

}  // namespace fp4attn::detail::qk_operand
