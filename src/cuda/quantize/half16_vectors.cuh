// 16-byte vectors of BF16 / FP16 on the device: the element conversions (Half16), streaming
// loads, and the NaN-propagating packed max of |.| bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace fp4attn::packed {

template <typename T>
struct Half16;  // 16-bit element type tag -> conversions

template <>
struct Half16<__nv_bfloat16> {
  __device__ __forceinline__ static float lo(uint32_t w) { return __uint_as_float(w << 16); }
  __device__ __forceinline__ static float hi(uint32_t w) {
    return __uint_as_float(w & 0xFFFF0000u);
  }
  // |.| bits of one element (16 bits) to the FP32 bits of that magnitude (monotone, NaN stays
  // NaN, Inf stays Inf).
  __device__ __forceinline__ static uint32_t abs16_to_f32_bits(uint32_t h) { return h << 16; }
};

template <>
struct Half16<__half> {
  __device__ __forceinline__ static float lo(uint32_t w) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xFFFFu)));
  }
  __device__ __forceinline__ static float hi(uint32_t w) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  }
  __device__ __forceinline__ static uint32_t abs16_to_f32_bits(uint32_t h) {
    return __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(h))));
  }
};

// Streaming 16-byte load (read once: evict first).
__device__ __forceinline__ uint4 load16(const void* p) {
  return __ldcs(reinterpret_cast<const uint4*>(p));
}

// Per-lane max of the |.| bits of two 16-bit elements (for IEEE halves and BF16 the unsigned
// order of |.| bits is the order of magnitudes, and NaN bits are above Inf's).
__device__ __forceinline__ uint32_t abs_max2(uint32_t acc, uint32_t w) {
  return __vmaxu2(acc, w & 0x7FFF7FFFu);
}

// The 16-bit amax bits held in the two lanes of acc.
__device__ __forceinline__ uint32_t fold_max2(uint32_t acc) {
  const uint32_t lo = acc & 0xFFFFu, hi = acc >> 16;
  return lo > hi ? lo : hi;
}

// Eight floats of one 16-byte vector.
template <typename T>
__device__ __forceinline__ void unpack8(const uint4& v, float* x) {
  x[0] = Half16<T>::lo(v.x);
  x[1] = Half16<T>::hi(v.x);
  x[2] = Half16<T>::lo(v.y);
  x[3] = Half16<T>::hi(v.y);
  x[4] = Half16<T>::lo(v.z);
  x[5] = Half16<T>::hi(v.z);
  x[6] = Half16<T>::lo(v.w);
  x[7] = Half16<T>::hi(v.w);
}

}  // namespace fp4attn::packed
