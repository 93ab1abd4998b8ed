// How the Q/K operand kernels read their input (XArgs, operand_qk_config.h): the address of a
// row chunk, kN consecutive values as host-exact floats (operand_qk_host_nan.cuh) or as plain
// floats, the NaN-propagating amax of raw 16-bit vectors, and the CTA max of such amax bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/quantize/half16_vectors.cuh"
#include "cuda/quantize/operand_qk_config.h"
#include "cuda/quantize/operand_qk_fast.cuh"
#include "cuda/quantize/operand_qk_host_nan.cuh"

namespace fp4attn::detail::qk_operand {

// Unit u of a slice: token u / (kD / kBlk), block u % (kD / kBlk).
template <int kD, int kBlk>
__device__ __forceinline__ const uint16_t* row_chunk(const XArgs& a, int64_t bh, int64_t token,
                                                     int blk) {
  return a.x + (bh / a.h) * a.stride_b + token * a.stride_s + (bh % a.h) * a.stride_h + blk * kBlk;
}

// A 16-bit input as a float, NaNs unquieted (only whether it is NaN is used).
template <bool kF16>
__device__ __forceinline__ float load_plain_value(uint32_t h16) {
  if constexpr (kF16) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(h16)));
  } else {
    return __uint_as_float(h16 << 16);
  }
}

// kN consecutive values of one row (p 16-byte aligned) as the host reads them, smoothed as the
// host smooths (host_sub) when mean_c is not null.
template <bool kF16, int kN>
__device__ __forceinline__ void load_chunk(const uint16_t* p, const float* mean_c, float* v) {
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    const uint4 r = __ldg(reinterpret_cast<const uint4*>(p) + j);
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      v[8 * j + 2 * q] = load_value<kF16>(w[q] & 0xFFFFu);
      v[8 * j + 2 * q + 1] = load_value<kF16>(w[q] >> 16);
    }
  }
  if (mean_c != nullptr) {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] = host_sub(v[i], __ldg(mean_c + i));
  }
}

// kN consecutive values of one row as plain floats (no NaN quieting) minus mean_c[i] (a plain FP32
// subtraction) when mean_c is not null. For every output except bf16 and the mean only whether a
// value is NaN matters, and the plain ops give NaN exactly when host_sub / load_value do; numbers
// are identical.
template <bool kF16, int kN>
__device__ __forceinline__ void unpack_plain(const uint4* r, const float* mean_c, float* v);

template <bool kF16, int kN>
__device__ __forceinline__ void load_plain(const uint16_t* p, const float* mean_c, float* v) {
  uint4 r[kN / 8];
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) r[j] = __ldg(reinterpret_cast<const uint4*>(p) + j);
  unpack_plain<kF16, kN>(r, mean_c, v);
}

// The same from kN / 8 raw 16-byte vectors already loaded.
template <bool kF16, int kN>
__device__ __forceinline__ void unpack_plain(const uint4* r, const float* mean_c, float* v) {
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) operand_fast::unpack8<kF16>(r[j], v + 8 * j);
  if (mean_c != nullptr) {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] = __fsub_rn(v[i], __ldg(mean_c + i));
  }
}

// Max |x| FP32 bits of kN / 8 raw 16-byte vectors (see raw_amax_bits).
template <bool kF16, int kN>
__device__ __forceinline__ uint32_t raw_amax_bits_of(const uint4* r) {
  uint32_t acc = 0;
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) {
    acc = packed::abs_max2(acc, r[j].x);
    acc = packed::abs_max2(acc, r[j].y);
    acc = packed::abs_max2(acc, r[j].z);
    acc = packed::abs_max2(acc, r[j].w);
  }
  return operand_fast::abs_max2_to_f32_bits<kF16>(acc);
}

// Max |x| FP32 bits of kN raw 16-bit values (NaN-propagating: NaN bits > Inf > finite), through
// packed 16-bit maxima.
template <bool kF16, int kN>
__device__ __forceinline__ uint32_t raw_amax_bits(const uint16_t* p) {
  uint4 r[kN / 8];
#pragma unroll
  for (int j = 0; j < kN / 8; ++j) r[j] = __ldg(reinterpret_cast<const uint4*>(p) + j);
  return raw_amax_bits_of<kF16, kN>(r);
}

// Block-wide max of a uint32 (every thread of the block calls it; the result is for all).
__device__ __forceinline__ uint32_t block_max(uint32_t v, uint32_t* smem) {
  v = __reduce_max_sync(0xFFFFFFFFu, v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // smem reuse across loop iterations
  if (lane == 0) smem[warp] = v;
  __syncthreads();
  uint32_t m = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) m = max(m, smem[w]);
  return m;
}

}  // namespace fp4attn::detail::qk_operand
