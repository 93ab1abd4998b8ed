// Device helpers shared by the backward's kernels: 16-bit loads, stores of the gradients, amax.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace fp4attn::bwd {

__device__ __forceinline__ float load16(const uint16_t* p, bool f16) {
  const uint16_t b = *p;
  return f16 ? __half2float(__ushort_as_half(b)) : __bfloat162float(__ushort_as_bfloat16(b));
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
