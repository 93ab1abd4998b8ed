// Device block quantizers of the packed kernels: the same results as nvfp4_quantize_block /
// mxfp4_quantize_block (quantize.h) for 16 / 32 values, with the per-element work on fast paths
// (packed::e2m1_code_fast) and the reference function itself for the rare blocks outside the
// fast paths' preconditions (s_enc / scale overflowing to Inf).
#pragma once

#include <cstdint>

#include "cuda/quantize/packed_common.cuh"
#include "fp4attn/formats.h"
#include "fp4attn/quantize.h"

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
// nvfp4_block_reference_raw for every block.
__device__ __forceinline__ bool nvfp4_table_finite(float s_enc) {
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

// Four-Over-Six choice of one block (nvfp4_quantize_block, kFourOverSix), shared by the packed
// and the operand quantizers. x: the 16 values; xs[i] = RN(|x[i]| * s_enc); c6, c4 the candidate
// scale codes (neither 0x7F) with their table entries e = (s_enc / f, f); sg: bit 4i+3 = sign of
// x[i] (other bits ignored). Returns the chosen code, packed codes in w.
// Per candidate and value: the FMA sum m of e2m1_mag_term (from which the code follows) and the
// reference's error sum in its order, d = x * s_enc - e2m1 * f as one FMA on xs (r * f is exact,
// E2M1 x E4M3; |x| * s_enc - r * f has d's magnitude as the code's sign is x's), err = fmaf(d, d,
// err). Only the winner's codes are extracted (one select per value).
// kClamp4 false skips candidate 4's clamp at 6 (|x| * inv4 then is one FMUL with |.|): exact
// whenever c4 < 0x7E, as then y4 = RN(|x| * RN(s_enc / f4)) < 7 rounds onto the grid like
// min(y4, 6): f4 = E4M3(sf4) is within 2^-4 of sf4 (normal, so y4 <~ 4 (1 + 2^-4)), or a
// subnormal k 2^-9 with sf4 < (k + 1/2) 2^-9 (y4 <~ 4 (k + 1/2) / k <= 6), and 4 sf4 / f4 bounds
// y4 up to two FP32 roundings, which cannot carry it to 7.
template <bool kClamp4>
__device__ __forceinline__ uint32_t four_over_six_pick(const float (&x)[kNvfp4Block],
                                                       const float (&xs)[kNvfp4Block], uint32_t c6,
                                                       uint32_t c4, float2 e6, float2 e4,
                                                       const uint32_t (&sg)[2],
                                                       uint32_t (&w)[2]) {
  float m6[kNvfp4Block], m4[kNvfp4Block];
  float err6 = 0.f, err4 = 0.f;
#pragma unroll
  for (int i = 0; i < kNvfp4Block; ++i) {
    const float a6 = fminf(fabsf(detail::mul_rn(x[i], e6.x)), kE2m1Max);
    const float p6 = bits_float(float_bits(fmaxf(a6, 1.f)) & 0x7F800000u);
    m6[i] = fmaf(p6, 4194304.f, a6);
    const float d6 = fmaf(-fmaf(-p6, 4194304.f, m6[i]), e6.y, xs[i]);
    err6 = fmaf(d6, d6, err6);
    float a4 = detail::mul_rn(fabsf(x[i]), e4.x);
    if constexpr (kClamp4) a4 = fminf(a4, kE2m1Max);
    const float p4 = bits_float(float_bits(fmaxf(a4, 1.f)) & 0x7F800000u);
    m4[i] = fmaf(p4, 4194304.f, a4);
    const float d4 = fmaf(-fmaf(-p4, 4194304.f, m4[i]), e4.y, xs[i]);
    err4 = fmaf(d4, d4, err4);
  }
  const bool use4 = err4 < err6;  // ties keep /6
  const uint32_t c = use4 ? c4 : c6;
  const uint32_t sign_mask = c != 0 ? 0x88888888u : 0u;  // scale 0: all codes +0
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    uint32_t t[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) t[i] = float_bits(use4 ? m4[8 * j + i] : m6[8 * j + i]) * 0x400001u;
    w[j] = e2m1_pack8_magnitudes(t) | (sg[j] & sign_mask);
  }
  return c;
}

// four_over_six_pick for any pair of codes (neither 0x7F).
__device__ __forceinline__ uint32_t four_over_six(const float (&x)[kNvfp4Block],
                                                  const float (&xs)[kNvfp4Block], uint32_t c6,
                                                  uint32_t c4, const float2* table,
                                                  const uint32_t (&sg)[2], uint32_t (&w)[2]) {
  const float2 e6 = table[c6], e4 = table[c4];
  return c4 < 0x7Eu ? four_over_six_pick<false>(x, xs, c6, c4, e6, e4, sg, w)
                    : four_over_six_pick<true>(x, xs, c6, c4, e6, e4, sg, w);
}

// nvfp4_quantize_block with kFourOverSix on the 16 values in a, b (preconditions as
// nvfp4_block_vec).
template <typename T>
__device__ __forceinline__ uint32_t nvfp4_block_vec_46(const uint4& a, const uint4& b,
                                                       float s_enc, const float2* table,
                                                       uint32_t (&w)[2]) {
  const float amax = amax16<T>(a, b);
  if (__float_as_uint(amax) >= 0x7F800000u) {
    w[0] = w[1] = 0;
    return 0x7F;
  }
  const float flt_max = bits_float(detail::kFltMaxBits);
  const float sf6 = fminf(detail::mul_rn(div6_16bit(amax), s_enc), flt_max);
  const float sf4 = fminf(detail::mul_rn(detail::mul_rn(amax, 0.25f), s_enc), flt_max);
  float x[kNvfp4Block], xs[kNvfp4Block];
  unpack8<T>(a, x);
  unpack8<T>(b, x + 8);
#pragma unroll
  for (int i = 0; i < kNvfp4Block; ++i) xs[i] = detail::mul_rn(fabsf(x[i]), s_enc);
  const uint32_t sg[2] = {sign_nibbles8(a.x, a.y, a.z, a.w), sign_nibbles8(b.x, b.y, b.z, b.w)};
  return four_over_six(x, xs, e4m3_code_nearest(sf6), e4m3_code_nearest(sf4), table, sg, w);
}

// MXFP4 block of 32 values with amax = block_amax(x). Returns the E8M0 code, codes in w.
// The scaling x * 2^-e is a single multiply: e <= floor_log2(FLT_MAX) - 2 + 1 = 126, so
// scale_pow2 never takes its two-factor branch.
template <MxScaleRule kRule>
__device__ __forceinline__ uint8_t mxfp4_block(const float (&x)[kMxfp4Block], float amax,
                                               uint32_t (&w)[4]) {
  const bool bad = !detail::is_finite(amax);
  if (bad || amax == 0.f) {
    w[0] = w[1] = w[2] = w[3] = 0;
    return bad ? 0xFF : 0x00;
  }
  int e = floor_log2(amax) - 2;
  if (kRule == MxScaleRule::kRoundUp &&
      detail::normalized_fraction(float_bits(amax)) > 0x400000u) {
    ++e;
  }
  const uint8_t scale = ue8m0_from_exponent(e);
  const float p = detail::pow2_normal(127 - static_cast<int>(scale));  // 2^-e, -e in [-126, 127]
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t c[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) c[i] = e2m1_code_fast(detail::mul_rn(x[8 * j + i], p));
    w[j] = pack8(c);
  }
  return scale;
}

}  // namespace fp4attn::packed
