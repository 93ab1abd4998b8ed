// Device block quantizers of the packed kernels: the same results as nvfp4_quantize_block /
// mxfp4_quantize_block (quantize.h) for 16 / 32 values, with the per-element work on fast paths
// (packed::e2m1_code_fast) and the reference function itself for the rare blocks outside the
// fast paths' preconditions (s_enc / scale overflowing to Inf).
#pragma once

#include <cstdint>

#include "cuda/quantize/four_over_six.h"
#include "cuda/quantize/half16_vectors.cuh"
#include "cuda/quantize/packed_common.cuh"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"

namespace fp4attn::packed {

// Codes of a block from the reference function, packed.
template <Nvfp4ScaleRule kRule>
__device__ __noinline__ uint32_t nvfp4_block_reference(const float* x, float s_enc, uint32_t* w) {
  uint8_t codes[kNvfp4Block];
  const uint8_t scale = nvfp4_quantize_block(x, kNvfp4Block, s_enc, kRule, codes);
  for (int j = 0; j < 2; ++j) {
    uint32_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint32_t>(codes[8 * j + i]) << (4 * i);
    w[j] = v;
  }
  return scale;
}

// ---- Table-driven NVFP4 blocks on raw 16-bit vectors (the packed quantizer's hot path) --------

// Per-CTA table of the 127 non-NaN E4M3 scale codes: (inv, f) = (div_rn(s_enc, f), f) with
// f = e4m3_to_float(code); code 0: (0, 0). inv may be +Inf (huge s_enc): callers then take the
// reference path. Filled by threads 0..127; the caller synchronizes.
__device__ __forceinline__ void nvfp4_fill_scale_table(float s_enc, float2* table) {
  const unsigned c = threadIdx.x;
  if (c < 128) {
    const float f = c < 127 ? e4m3_to_float(static_cast<uint8_t>(c)) : 0.f;
    table[c] = make_float2(f == 0.f ? 0.f : detail::div_rn(s_enc, f), f);
  }
}

// Exact NaN-propagating max |x| of the 16 values in two 16-byte vectors, as a float.
template <typename T>
__device__ __forceinline__ float amax16(const uint4& a, const uint4& b) {
  uint32_t m0 = abs_max2(a.x & 0x7FFF7FFFu, a.y);
  uint32_t m1 = abs_max2(a.z & 0x7FFF7FFFu, a.w);
  uint32_t m2 = abs_max2(b.x & 0x7FFF7FFFu, b.y);
  uint32_t m3 = abs_max2(b.z & 0x7FFF7FFFu, b.w);
  m0 = __vmaxu2(__vmaxu2(m0, m1), __vmaxu2(m2, m3));
  return __uint_as_float(Half16<T>::abs16_to_f32_bits(fold_max2(m0)));
}

// The reference block quantizer on the 16 values of two raw vectors (rare path, out of line so
// the hot loop keeps no float array and no stack frame live).
template <typename T, Nvfp4ScaleRule kRule>
__device__ __noinline__ uint32_t nvfp4_block_reference_raw(uint4 a, uint4 b, float s_enc,
                                                           uint32_t* w) {
  float x[kNvfp4Block];
  unpack8<T>(a, x);
  unpack8<T>(b, x + 8);
  return nvfp4_block_reference<kRule>(x, s_enc, w);
}

// Eight floats x * inv -> codes (see e2m1_encode8), from one raw vector.
template <typename T>
__device__ __forceinline__ uint32_t encode_vec8(const uint4& v, float inv, uint32_t sign_mask) {
  float x[8];
  unpack8<T>(v, x);
  return e2m1_encode8(x, inv, v.x, v.y, v.z, v.w, sign_mask);
}

// True when every table entry's inv is finite (s_enc / 2^-9, the largest, does not overflow):
// the precondition of nvfp4_block_vec / nvfp4_block_vec_46. Otherwise use
// nvfp4_block_reference_raw for every block. Host and device: the launchers pick the kernels by
// the same test.
FP4ATTN_HD bool nvfp4_table_finite(float s_enc) {
  return detail::mul_rn(s_enc, 512.f) <= 3.4028234e38f;
}

// nvfp4_quantize_block (kNearest / kRoundUp / kRestricted) of the 16 values in a, b (s_enc finite
// > 0 with nvfp4_table_finite, table from nvfp4_fill_scale_table). Returns the scale code, codes
// in w.
template <typename T, Nvfp4ScaleRule kRule>
__device__ __forceinline__ uint32_t nvfp4_block_vec(const uint4& a, const uint4& b, float s_enc,
                                                    const float2* table, uint32_t (&w)[2]) {
  static_assert(kRule != Nvfp4ScaleRule::kFourOverSix, "use nvfp4_block_vec_46");
  const float amax = amax16<T>(a, b);
  if (__float_as_uint(amax) >= 0x7F800000u) {  // NaN or Inf
    w[0] = w[1] = 0;
    return 0x7F;
  }
  // (amax / 6) * s_enc; never NaN (s_enc finite); +Inf saturates like FLT_MAX.
  const float sf = fminf(detail::mul_rn(div6_16bit(amax), s_enc), bits_float(detail::kFltMaxBits));
  const uint32_t code = e4m3_code_for_rule<kRule>(sf);
  const float inv = table[code].x;
  const uint32_t sign_mask = code != 0 ? 0x88888888u : 0u;
  w[0] = encode_vec8<T>(a, inv, sign_mask);
  w[1] = encode_vec8<T>(b, inv, sign_mask);
  return code;
}

// nvfp4_quantize_block with kFourOverSix on the 16 values in a, b (preconditions as
// nvfp4_block_vec): four_over_six_select (four_over_six.h) with the signs from the input bits.
template <typename T>
__device__ __forceinline__ uint32_t nvfp4_block_vec_46(const uint4& a, const uint4& b, float s_enc,
                                                       const float2* table, uint32_t (&w)[2]) {
  const float amax = amax16<T>(a, b);
  if (__float_as_uint(amax) >= 0x7F800000u) {
    w[0] = w[1] = 0;
    return 0x7F;
  }
  const FosCodes c = four_over_six_codes(amax, div6_16bit(amax), s_enc);
  const float2 e6 = table[c.c6], e4 = table[c.c4];
  float x[kNvfp4Block];
  unpack8<T>(a, x);
  unpack8<T>(b, x + 8);
  uint32_t mag[2], code;
  if (four_over_six_fast_ok(c)) {
    code = four_over_six_select<false>(x, s_enc, c, {e6.x, e6.y}, {e4.x, e4.y}, mag);
  } else {  // tiny or saturated /6 scale: rare (a warp diverges only where it occurs)
    code = four_over_six_select<true>(x, s_enc, c, {e6.x, e6.y}, {e4.x, e4.y}, mag);
  }
  const uint32_t sign_mask = code != 0 ? 0x88888888u : 0u;  // scale 0: all codes +0
  w[0] = mag[0] | (sign_nibbles8(a.x, a.y, a.z, a.w) & sign_mask);
  w[1] = mag[1] | (sign_nibbles8(b.x, b.y, b.z, b.w) & sign_mask);
  return code;
}

// MXFP4 blocks: packed::mxfp4_block_mag / mxfp4_block_codes (packed_common.cuh, host-tested).

}  // namespace fp4attn::packed
