// Private fast paths of the Q/K operand kernels (operand_qk.cu).
//
// * e4m3_code_fast: float_to_e4m3 in ~10 instructions (an FMA onto a magic binade, as
//   packed::e2m1_code_fast does for E2M1). Equal to float_to_e4m3 for every float (NaN and Inf
//   included); FP4ATTN_HD so the host can sweep all 2^32 inputs against the reference.
// * Fold tables: the folded operand byte E4M3(e2m1 * scale ...) depends only on the element's
//   E2M1 code and its block's scale code, so it is looked up: one 8-byte row per scale code (the
//   8 magnitudes' folded E4M3 codes, computed on the device with the exact expression of the
//   reference fold), and each element selects its byte with a PRMT (selector = magnitude bits),
//   then takes its sign by XOR (the fold is odd in the code: E4M3(-v) = E4M3(v) ^ 0x80, -0
//   included, for every finite block factor; non-finite factors are NaN scale codes, which the
//   caller replaces by 0x7F bytes as the reference does).
#pragma once

#include <cstdint>

#include "fp4attn/formats.h"
#include "fp4attn/quantize.h"

#include "cuda/quantize/packed_common.cuh"  // packed::e2m1_code_fast

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

namespace fp4attn::operand_fast {

// float_to_e4m3(y) for every float y. a = min(|y|, 448) (values in (448, 464) round to 448 anyway
// and larger ones saturate there). p = 2^floor(log2 max(a, 2^-6)) is the binade of a (or the
// subnormal binade); a + p * 2^20 lies in the binade whose ulp is p / 8, the E4M3 quantum of a, so
// the FMA's single RNE rounds a onto the E4M3 grid (ties to the even mantissa = the even code).
// M = p * 2^20 + j * p / 8 with j in [0, 16]; the code is 8 (log2 p + 6) + j
// = (bits(M) >> 20) + j - 1128 (bits(M) >> 20 = 8 * biased exponent, j < 2^20).
FP4ATTN_HD uint32_t e4m3_code_fast(float y) {
  const uint32_t u = float_bits(y);
  const float a = fminf(fabsf(y), kE4m3Max);
  const float p = bits_float(float_bits(fmaxf(a, 0.015625f)) & 0x7F800000u);
  const uint32_t mb = float_bits(fmaf(p, 1048576.f, a));
  const uint32_t mag = (mb >> 20) + (mb & 0x1Fu) - 1128u;
  const uint32_t sign = (u >> 24) & 0x80u;
  return sign | ((u & 0x7FFFFFFFu) >= 0x7F800000u ? 0x7Fu : mag);
}

// float_to_e4m3(y) for finite y, as the code in bits 24..31 of the result (bits 0..23 zero): the
// FMA of e4m3_code_fast rounds a onto the E4M3 grid; r = M - p * 2^20 is that E4M3 value (exact),
// and r * 2^-120 rebiases its exponent from FP32's 127 to E4M3's 7: its bits are the E4M3
// magnitude code << 20 (E4M3 subnormals j * 2^-9 become the FP32 subnormals j * 2^-129, whose bits
// are j << 20 as well). Four of them pack into a word with byte permutes (e4m3x4_finite).
FP4ATTN_HD uint32_t e4m3_code_hi_finite(float y) {
  const float a = fminf(fabsf(y), kE4m3Max);
  const float p = bits_float(float_bits(fmaxf(a, 0.015625f)) & 0x7F800000u);
  const float m = fmaf(p, 1048576.f, a);
  const float r = fmaf(p, -1048576.f, m);  // exact
  const float q = detail::mul_rn(r, 0x1p-120f);  // 2^-120: exact
  return (float_bits(q) << 4) | (float_bits(y) & 0x80000000u);
}

// e4m3_to_float(c) for the finite non-negative codes c in [0, 0x7E]: bits c << 20 are the FP32
// value 2^-120 times the E4M3 value (the rebias of e4m3_code_hi_finite, subnormals included);
// the product by 2^120 is exact.
FP4ATTN_HD float e4m3_value_fast(uint32_t c) {
  return detail::mul_rn(bits_float(c << 20), 0x1p120f);
}

// The 8 folded bytes of one NVFP4 scale code sc: byte m = E4M3((e2m1(m) * f) / 8), f = E4M3(sc)
// (the reference fold's expression, golden_operands.cc / quantize_kernel).
FP4ATTN_HD uint64_t nvfp4_fold_row(uint32_t sc) {
  const float f = e4m3_to_float(static_cast<uint8_t>(sc));
  uint64_t row = 0;
  for (uint32_t m = 0; m < 8; ++m) {
    const uint8_t b = float_to_e4m3(
        detail::mul_rn(detail::mul_rn(e2m1_to_float(static_cast<uint8_t>(m)), f), 0.125f));
    row |= uint64_t{b} << (8 * m);
  }
  return row;
}

// MXFP4: byte m = E4M3(e2m1(m) * 2^k), k = block exponent - slice offset, k in [-248, 6]
// (row k + 248).
constexpr int kMxFoldMinK = -248, kMxFoldRows = 255;
FP4ATTN_HD uint64_t mxfp4_fold_row(int k) {
  uint64_t row = 0;
  for (uint32_t m = 0; m < 8; ++m) {
    const uint8_t b =
        float_to_e4m3(detail::scale_pow2(e2m1_to_float(static_cast<uint8_t>(m)), k));
    row |= uint64_t{b} << (8 * m);
  }
  return row;
}

#if defined(__CUDACC__)
#define FP4ATTN_OPERAND_NOINLINE __host__ __device__ __noinline__
#else
#define FP4ATTN_OPERAND_NOINLINE inline
#endif

// Codes of one NVFP4 block by the reference function (packed words: element i at bits 4i of
// w[i / 8]); for the blocks outside the fast path's preconditions. Out of line: rare.
template <Nvfp4ScaleRule kRule>
FP4ATTN_OPERAND_NOINLINE uint32_t nvfp4_block_generic(const float* x, float s_enc, uint32_t* w) {
  uint8_t codes[kNvfp4Block];
  const uint8_t scale = nvfp4_quantize_block(x, kNvfp4Block, s_enc, kRule, codes);
  for (int j = 0; j < 2; ++j) {
    uint32_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint32_t>(codes[8 * j + i]) << (4 * i);
    w[j] = v;
  }
  return scale;
}

// nvfp4_block_generic on copies made at the (rare) call site: passing the caller's arrays would
// make them escape, and the compiler then keeps them in local memory on every path.
template <Nvfp4ScaleRule kRule>
FP4ATTN_HD uint32_t block_generic_copy(const float (&x)[kNvfp4Block], float s_enc,
                                       uint32_t (&w)[2]) {
  float xc[kNvfp4Block];
  for (int i = 0; i < kNvfp4Block; ++i) xc[i] = x[i];
  uint32_t wc[2];
  const uint32_t sc = nvfp4_block_generic<kRule>(xc, s_enc, wc);
  w[0] = wc[0];
  w[1] = wc[1];
  return sc;
}

// One Four-Over-Six candidate without its codes: for each element the FMA sum m of
// packed::e2m1_code_fast (from which the code follows, see codes_from_m) and the reference's FP32
// squared error sum (nvfp4_block_sq_error: d = x * s_enc - e2m1 * f, err = fmaf(d, d, err), in
// order; |x| * s_enc - r * f has d's magnitude since the code's sign is x's). The codes are only
// extracted for the winner. Returns false when s_enc / f overflows (the reference path then).
FP4ATTN_HD bool fos_eval(const float (&x)[kNvfp4Block], const float (&xs)[kNvfp4Block],
                         uint32_t scale, float s_enc, float (&m)[kNvfp4Block], float& err_out) {
  const float f = e4m3_value_fast(scale);
  float inv = 0.f;  // f == 0: the codes are masked to 0 by the caller; e2m1 * f = 0
  if (f != 0.f) {
    inv = detail::div_rn(s_enc, f);
    if (!(inv <= 3.4028234e38f)) return false;
  }
  float err = 0.f;
#pragma unroll
  for (int i = 0; i < kNvfp4Block; ++i) {
    const float a = fminf(fabsf(detail::mul_rn(x[i], inv)), kE2m1Max);
    const float p = bits_float(float_bits(fmaxf(a, 1.f)) & 0x7F800000u);
    m[i] = fmaf(p, 4194304.f, a);
    const float r = fmaf(p, -4194304.f, m[i]);  // exact: the E2M1 magnitude
    const float d = detail::sub_rn(xs[i], detail::mul_rn(r, f));
    err = fmaf(d, d, err);
  }
  err_out = err;
  return true;
}

// Bits 4i+3 = sign of x[i] (i < 8), other bits zero. Byte k of `odd` holds x[2k+1]'s top byte
// (sign at bit 8k+7 = bit 4(2k+1)+3), byte k of `even` x[2k]'s (moved down 4 bits to 8k+3).
FP4ATTN_HD uint32_t sign_nibbles_f8(const float* x) {
  const uint32_t e01 = packed::prmt(float_bits(x[0]), float_bits(x[2]), 0x0073u);
  const uint32_t e23 = packed::prmt(float_bits(x[4]), float_bits(x[6]), 0x7300u);
  const uint32_t o01 = packed::prmt(float_bits(x[1]), float_bits(x[3]), 0x0073u);
  const uint32_t o23 = packed::prmt(float_bits(x[5]), float_bits(x[7]), 0x7300u);
  const uint32_t even = packed::prmt(e01, e23, 0x7610u);
  const uint32_t odd = packed::prmt(o01, o23, 0x7610u);
  return ((even >> 4) & 0x08080808u) | (odd & 0x80808080u);
}

// Codes 8j..8j+7 from the FMA sums (packed::e2m1_pack8_magnitudes of the terms) with the sign
// of x (that of x * inv for inv > 0; sign_nibbles_f8).
FP4ATTN_HD uint32_t codes_from_m(const float (&x)[kNvfp4Block], const float (&m)[kNvfp4Block],
                                 int j) {
  // bits(m) * (2^22 + 1) is packed::e2m1_mag_term's term (m is its FMA sum).
  uint32_t t[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) t[i] = float_bits(m[8 * j + i]) * 0x400001u;
  return packed::e2m1_pack8_magnitudes(t) | sign_nibbles_f8(x + 8 * j);
}

// nvfp4_quantize_block for 16 values with amax = block_amax(x) and s_enc finite > 0 (the caller
// checks), codes packed as above. The same steps as packed::nvfp4_block, with the per-block scale
// encodes on the fast exact paths: sf is finite and >= 0 after the clamp, so
// float_to_e4m3(sf) = e4m3_code_hi_finite(sf) >> 24 (swept over all finite floats) and the code
// is <= 0x7E; amax / 4 = amax * 0.25 exactly (both the correctly rounded amax / 4).
template <Nvfp4ScaleRule kRule>
FP4ATTN_HD uint32_t nvfp4_block_fast(const float (&x)[kNvfp4Block], float amax,
                                                     float s_enc, uint32_t (&w)[2]) {
  if (!detail::is_finite(amax)) {
    w[0] = w[1] = 0;
    return 0x7F;
  }
  const float flt_max = bits_float(detail::kFltMaxBits);
  float sf = detail::mul_rn(detail::div_rn(amax, kE2m1Max), s_enc);
  if (!(sf == sf)) return block_generic_copy<kRule>(x, s_enc, w);
  sf = fminf(sf, flt_max);
  if constexpr (kRule == Nvfp4ScaleRule::kFourOverSix) {
    const float sf4 = fminf(detail::mul_rn(detail::mul_rn(amax, 0.25f), s_enc), flt_max);
    const uint32_t c6 = e4m3_code_hi_finite(sf) >> 24;
    const uint32_t c4 = e4m3_code_hi_finite(sf4) >> 24;
    float xs[kNvfp4Block], m6[kNvfp4Block], m4[kNvfp4Block];
#pragma unroll
    for (int i = 0; i < kNvfp4Block; ++i) xs[i] = detail::mul_rn(fabsf(x[i]), s_enc);
    float e6, e4;
    if (!fos_eval(x, xs, c6, s_enc, m6, e6) || !fos_eval(x, xs, c4, s_enc, m4, e4)) {
      return block_generic_copy<kRule>(x, s_enc, w);
    }
    const bool use4 = e4 < e6;
    const uint32_t c = use4 ? c4 : c6;
    float mc[kNvfp4Block];
#pragma unroll
    for (int i = 0; i < kNvfp4Block; ++i) mc[i] = use4 ? m4[i] : m6[i];
    const uint32_t keep = c != 0 ? 0xFFFFFFFFu : 0u;  // scale 0: f == 0, codes 0
    w[0] = codes_from_m(x, mc, 0) & keep;
    w[1] = codes_from_m(x, mc, 1) & keep;
    return c;
  } else {
    const uint32_t scale = packed::e4m3_code_for_rule<kRule>(sf);  // sf finite >= 0 here
    const float f = e4m3_value_fast(scale);
    if (f == 0.f) {
      w[0] = w[1] = 0;
      return scale;
    }
    const float inv = detail::div_rn(s_enc, f);
    if (!(inv <= 3.4028234e38f)) return block_generic_copy<kRule>(x, s_enc, w);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      // Magnitudes by multiply-add (packed::e2m1_mag_term: x * inv is never NaN here, x finite
      // and inv finite), signs those of x (inv > 0), gathered by byte permutes.
      uint32_t t[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) t[i] = packed::e2m1_mag_term(detail::mul_rn(x[8 * j + i], inv));
      w[j] = packed::e2m1_pack8_magnitudes(t) | sign_nibbles_f8(x + 8 * j);
    }
    return scale;
  }
}

#if defined(__CUDACC__)

// 16-bit input words (two values each, element 0 low) as floats: BF16 is the high half of the
// FP32 bits; FP16 converts exactly.
template <bool kF16>
__device__ __forceinline__ float lo16(uint32_t w) {
  if constexpr (kF16) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w & 0xFFFFu)));
  } else {
    return __uint_as_float(w << 16);
  }
}
template <bool kF16>
__device__ __forceinline__ float hi16(uint32_t w) {
  if constexpr (kF16) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16)));
  } else {
    return __uint_as_float(w & 0xFFFF0000u);
  }
}
template <bool kF16>
__device__ __forceinline__ void unpack8(const uint4& r, float* v) {
  v[0] = lo16<kF16>(r.x), v[1] = hi16<kF16>(r.x), v[2] = lo16<kF16>(r.y), v[3] = hi16<kF16>(r.y);
  v[4] = lo16<kF16>(r.z), v[5] = hi16<kF16>(r.z), v[6] = lo16<kF16>(r.w), v[7] = hi16<kF16>(r.w);
}

// Per-lane max of the |.| bits of two 16-bit values: for BF16 and FP16 the unsigned order of
// |.| bits is the order of magnitudes with every NaN above Inf, so this is NaN-propagating.
__device__ __forceinline__ uint32_t abs_max2(uint32_t acc, uint32_t w) {
  return __vmaxu2(acc, w & 0x7FFF7FFFu);
}

// The FP32 bits of the larger |.| of the two lanes (NaN stays NaN, Inf stays Inf).
template <bool kF16>
__device__ __forceinline__ uint32_t abs_max2_to_f32_bits(uint32_t acc) {
  const uint32_t m = max(acc & 0xFFFFu, acc >> 16);
  if constexpr (kF16) {
    return __float_as_uint(__half2float(__ushort_as_half(static_cast<unsigned short>(m))));
  } else {
    return m << 16;
  }
}

using packed::prmt;  // PTX prmt.b32 (default mode)

// Eight packed E2M1 codes (element i in bits 4i..4i+3) -> eight folded bytes (o0: elements 0..3,
// o1: 4..7) through the row (t0: magnitudes 0..3, t1: 4..7).
__device__ __forceinline__ void fold8(uint32_t w, uint32_t t0, uint32_t t1, uint32_t& o0,
                                      uint32_t& o1) {
  // Magnitudes: selector nibbles with the sign bit cleared (PRMT's plain byte select).
  const uint32_t m0 = prmt(t0, t1, w & 0x7777u);
  const uint32_t m1 = prmt(t0, t1, (w >> 16) & 0x7777u);
  // Signs: bit 3 of nibble i. (w << 4) holds the signs of the even elements 0, 2, 4, 6 at bit 7
  // of bytes 0..3; w those of the odd elements 1, 3, 5, 7. Interleave the bytes, keep bit 7.
  const uint32_t ev = w << 4;
  o0 = m0 ^ (prmt(ev, w, 0x5140u) & 0x80808080u);
  o1 = m1 ^ (prmt(ev, w, 0x7362u) & 0x80808080u);
}

// float_to_e4m3 of four finite floats, element i in byte i.
__device__ __forceinline__ uint32_t e4m3x4_finite(float y0, float y1, float y2, float y3) {
  const uint32_t lo = prmt(e4m3_code_hi_finite(y0), e4m3_code_hi_finite(y1), 0x7373u);
  const uint32_t hi = prmt(e4m3_code_hi_finite(y2), e4m3_code_hi_finite(y3), 0x7373u);
  return prmt(lo, hi, 0x5410u);
}

#endif  // __CUDACC__

}  // namespace fp4attn::operand_fast
