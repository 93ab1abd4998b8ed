// Packed-pair arithmetic and conversions on 32-bit registers: BF16x2 multiplies and packing,
// E4M3x2 -> FP32 pairs.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace fp4attn::sm90 {

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// a * {b.half, b.half}: the half broadcast is an operand selector of HMUL2 (.H0_H0 / .H1_H1), no
// extra instruction.
template <int kHalf>
__device__ __forceinline__ uint32_t bf16x2_mul_bcast(uint32_t a, uint32_t b) {
  uint32_t d;
  if constexpr (kHalf == 0) {
    asm("{\n .reg .b16 l, h;\n .reg .b32 t;\n mov.b32 {l, h}, %2;\n mov.b32 t, {l, l};\n"
        " mul.rn.bf16x2 %0, %1, t;\n}"
        : "=r"(d)
        : "r"(a), "r"(b));
  } else {
    asm("{\n .reg .b16 l, h;\n .reg .b32 t;\n mov.b32 {l, h}, %2;\n mov.b32 t, {h, h};\n"
        " mul.rn.bf16x2 %0, %1, t;\n}"
        : "=r"(d)
        : "r"(a), "r"(b));
  }
  return d;
}

// Two FP32 -> BF16x2 (RNE), lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// Two E4M3 codes (low byte first) -> FP32, exact (NaN kept).
__device__ __forceinline__ float2 e4m3x2_to_float2(uint32_t two_codes) {
  const __half2_raw h =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes), __NV_E4M3);
  return __half22float2(*reinterpret_cast<const __half2*>(&h));
}

}  // namespace fp4attn::sm90
