// Device helpers shared by the backward's kernels: 16-bit loads, stores of the gradients, amax.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/bwd/bits.h"

namespace fp4attn::bwd {

__device__ __forceinline__ float load16(const uint16_t* p, bool f16) {
  const uint16_t b = *p;
  return f16 ? __half2float(__ushort_as_half(b)) : __bfloat162float(__ushort_as_bfloat16(b));
}

// Eight consecutive 16-bit values from p: one 16-byte load when p is 16-byte aligned (the usual
// BSHD strides), eight 2-byte loads otherwise (any strides stay valid).
__device__ __forceinline__ void load8x16(const uint16_t* p, bool f16, float (&x)[8]) {
  if ((reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
    const uint4 w = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint16_t lo = uint16_t(words[i]), hi = uint16_t(words[i] >> 16);
      x[2 * i] =
          f16 ? __half2float(__ushort_as_half(lo)) : __bfloat162float(__ushort_as_bfloat16(lo));
      x[2 * i + 1] =
          f16 ? __half2float(__ushort_as_half(hi)) : __bfloat162float(__ushort_as_bfloat16(hi));
    }
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = load16(p + i, f16);
  }
}

__device__ __forceinline__ void store_grad(void* base, int64_t off, bool f32, float x) {
  if (f32) {
    static_cast<float*>(base)[off] = x;
  } else {
    static_cast<__nv_bfloat16*>(base)[off] = __float2bfloat16_rn(x);
  }
}

// Max of non-negative floats through their bit patterns (ordered as unsigned ints), so the
// result does not depend on the order of the updates. NaN never reaches here (fmaxf drops it).
__device__ __forceinline__ void atomic_max_nonneg(float* addr, float x) {
  atomicMax(reinterpret_cast<unsigned int*>(addr), __float_as_uint(x));
}

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

}  // namespace fp4attn::bwd
