// Private helpers of the packed-storage kernels (packed_*.cu, amax.cu): fast E2M1 encoding
// equal to float_to_e2m1, 16-byte vector loads of BF16/FP16, fast 64-bit division, row maps of
// BSHD tensors. The FP4ATTN_HD parts compile on the host too, where they are tested
// exhaustively against the codecs of formats.h.
#pragma once

#include <math.h>

#include <cstdint>

#include "fp4attn/config.h"
#include "fp4attn/formats.h"
#include "fp4attn/quantize.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace fp4attn::packed {

// ---- E2M1 encoding ----------------------------------------------------------------------------

// float_to_e2m1(y) for every y that is not NaN, in ~8 instructions instead of the generic
// integer rounding. a = min(|y|, 6) (+-Inf and finite overflow saturate to 6). The E2M1 grid has
// step 0.5 on [0, 2], 1 on [2, 4] and 2 on [4, 6], i.e. half the unit of a's binade (the binade of
// max(a, 1)). Adding p * 2^22 (p = 2^floor(log2 max(a, 1))) puts the sum M in the binade whose ulp
// is that step, so the one rounding of the FMA is RNE onto the grid (ties to the even grid
// point = the even code). M = p * 2^22 + j * p / 2 has mantissa field j <= 12 and exponent
// 149 + log2 p, and the code is j + 2 log2 p = (bits(M) >> 22) + j - 298. The sign bit is y's
// (-0 and negative values that round to 0 give 0x8, as float_to_e2m1).
// *r receives the magnitude of the E2M1 value (0, 0.5, ... 6), exact.
FP4ATTN_HD uint32_t e2m1_code_fast(float y, float* r) {
  const float a = fminf(fabsf(y), kE2m1Max);
  const float p = bits_float(float_bits(fmaxf(a, 1.f)) & 0x7F800000u);
  const float magic = detail::mul_rn(p, 4194304.f);  // exact
  const float m = fmaf(p, 4194304.f, a);
  *r = detail::sub_rn(m, magic);  // exact
  const uint32_t mb = float_bits(m);
  return ((mb >> 22) + (mb & 0xFu) - 298u) | ((float_bits(y) >> 28) & 0x8u);
}

FP4ATTN_HD uint32_t e2m1_code_fast(float y) {
  float r;
  return e2m1_code_fast(y, &r);
}

// Eight codes, element i in bits 4i..4i+3 (pack_e2m1x2 order: element 2j in the low nibble of
// byte j, little-endian words).
FP4ATTN_HD uint32_t pack8(const uint32_t (&c)[8]) {
  uint32_t w = 0;
  for (int i = 0; i < 8; ++i) w |= c[i] << (4 * i);
  return w;
}

// ---- 64-bit division by a runtime constant ------------------------------------------------------

// n / d for n < 2^63 and 1 <= d < 2^62 (Granlund-Montgomery: m = floor(2^64 (2^l - d) / d) + 1, l = ceil(log2 d),
// q = (umulhi(m, n) + n) >> l; the sum cannot overflow for n < 2^63).
struct FastDiv {
  uint64_t d = 1, m = 1;
  int l = 0;

  static FastDiv make(uint64_t divisor) {
    FastDiv f;
    f.d = divisor < 1 ? 1 : divisor;
    f.l = 0;
    while (f.l < 62 && (uint64_t{1} << f.l) < f.d) ++f.l;
    const unsigned __int128 num = static_cast<unsigned __int128>((uint64_t{1} << f.l) - f.d) << 64;
    f.m = static_cast<uint64_t>(num / f.d) + 1;
    return f;
  }

  FP4ATTN_HD uint64_t div(uint64_t n) const {
#if defined(__CUDA_ARCH__)
    const uint64_t t = __umul64hi(m, n);
#else
    const uint64_t t =
        static_cast<uint64_t>((static_cast<unsigned __int128>(m) * n) >> 64);
#endif
    return (t + n) >> l;
  }
};

// Element offset of row r of a BSHD tensor viewed as rows = b * s * h rows of d values.
struct RowMap {
  FastDiv div_h, div_s;
  int64_t stride_b = 0, stride_s = 0, stride_h = 0;

  FP4ATTN_HD int64_t offset(int64_t r) const {
    const uint64_t bs = div_h.div(static_cast<uint64_t>(r));
    const int64_t hi = r - static_cast<int64_t>(bs * div_h.d);
    const uint64_t bi = div_s.div(bs);
    const int64_t si = static_cast<int64_t>(bs - bi * div_s.d);
    return static_cast<int64_t>(bi) * stride_b + si * stride_s + hi * stride_h;
  }
};

#if defined(__CUDACC__)

// ---- 16-byte vectors of BF16 / FP16 -----------------------------------------------------------

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

// Launch geometry: grid-stride loops over `items`, at most `waves` CTAs per SM.
int grid_for(int64_t items, int threads, int waves = 8);

#endif  // __CUDACC__

}  // namespace fp4attn::packed
