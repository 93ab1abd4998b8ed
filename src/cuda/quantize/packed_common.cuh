// The fast exact codecs of the GPU quantizers' block paths: E2M1 encoding equal to float_to_e2m1,
// the NVFP4 block-scale math, E2M1 magnitudes packed by multiply-add, PRMT, MXFP4 blocks. Host and
// device (FP4ATTN_HD): the host tests sweep them against the codecs of formats.h.
#pragma once

#include <math.h>

#include <cstdint>

// Also the index math, the 16-bit vectors and grid_for, which src/cuda/paged reaches through this
// header.
#include "cuda/quantize/launch_helpers.h"
#include "cuda/quantize/row_map.h"
#include "fp4attn/numerics/config.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"

#if defined(__CUDACC__)
#include "cuda/quantize/half16_vectors.cuh"
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

// ---- Fast NVFP4 block-scale math (exact; verified exhaustively on the host)
// ----------------------

// div_rn(a, 6) for every finite a >= 0 that is a BF16 or FP16 value (the block amax of 16-bit
// inputs): one product and one FMA correction (verified on all 2 x 2^15 magnitudes; the plain
// product a * RN(1/6) differs for ~1/3 of them).
FP4ATTN_HD float div6_16bit(float a) {
  const float r6 = 0.16666667f;  // RN(1/6)
  const float q0 = detail::mul_rn(a, r6);
  return fmaf(fmaf(-q0, 6.f, a), r6, q0);
}

// float_to_e4m3(sf) for finite sf >= 0 (sign clear). Host: E4M3 subnormals (sf < 2^-6):
// RNE(sf * 2^9) by one addition in the binade of 2^14 (ulp 2^-9); normals: RNE at bit 20 of the
// FP32 bits, rebias 127 -> 7, saturate at 448 (0x7E). Device: the hardware
// cvt.rn.satfinite.e4m3x2.f32, which is float_to_e4m3 on every finite float (one conversion
// instead of ~11 instructions; PackedFastHelpersGpu sweeps this function against float_to_e4m3
// on all 2^31 non-negative floats on the device, and the same sweep checks the raw cvt).
FP4ATTN_HD uint32_t e4m3_code_nearest(float sf) {
#if defined(__CUDA_ARCH__)
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %1;" : "=h"(r) : "f"(sf));
  return r & 0xFFu;
#else
  const uint32_t b = float_bits(sf);
  if (b < 0x3C800000u) return float_bits(detail::sub_rn(sf, -16384.f)) - 0x46800000u;
  const uint32_t r = (b + 0x7FFFFu + ((b >> 20) & 1u)) >> 20;
  return r - 960u < 0x7Eu ? r - 960u : 0x7Eu;
#endif
}

// e4m3_code_nearest of two finite floats >= 0 in one conversion: lo in bits 0..7, hi in bits
// 8..15 (device: one cvt.rn.satfinite.e4m3x2.f32).
FP4ATTN_HD uint32_t e4m3_codes_nearest2(float lo, float hi) {
#if defined(__CUDA_ARCH__)
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  return e4m3_code_nearest(lo) | (e4m3_code_nearest(hi) << 8);
#endif
}

// detail::e4m3_round_up(sf) for finite sf >= 0: the smallest E4M3 value >= sf, 448 at most.
FP4ATTN_HD uint32_t e4m3_code_round_up(float sf) {
  if (!(sf < kE4m3Max)) return 0x7Eu;
  const uint32_t b = float_bits(sf);
  if (b < 0x3C800000u) {  // ceil(sf * 2^9), the product exact
#if defined(__CUDA_ARCH__)
    return __float2uint_ru(detail::mul_rn(sf, 512.f));
#else
    return static_cast<uint32_t>(ceilf(sf * 512.f));
#endif
  }
  return ((b + 0xFFFFFu) >> 20) - 960u;
}

// detail::e4m3_restricted_up(sf) for finite sf >= 0: clamp to [0.125, 384], round the FP32 bits
// up to two mantissa bits, 1.75 * 2^e -> 2^(e+1); code = (E - 120) << 3 | m2 << 1.
FP4ATTN_HD uint32_t e4m3_code_restricted(float sf) {
  if (sf == 0.f) return 0u;
  const float c = fminf(fmaxf(sf, 0.125f), kRestrictedScaleMax);
  uint32_t r = (float_bits(c) + 0x1FFFFFu) >> 21;
  r += (r & (r >> 1)) & 1u;
  return (r << 1) - 960u;
}

template <Nvfp4ScaleRule kRule>
FP4ATTN_HD uint32_t e4m3_code_for_rule(float sf) {
  if constexpr (kRule == Nvfp4ScaleRule::kRoundUp) {
    return e4m3_code_round_up(sf);
  } else if constexpr (kRule == Nvfp4ScaleRule::kRestricted) {
    return e4m3_code_restricted(sf);
  } else {
    return e4m3_code_nearest(sf);
  }
}

// ---- E2M1 magnitudes packed by multiply-add ---------------------------------------------------

// For y not NaN: t = bits(M) * (2^22 + 1) with M the FMA sum of e2m1_code_fast. bits(M) =
// (2E << 22) | j with j <= 12 in bits 0..3 (bits 4..21 zero), so t = ((2E + j) << 22) | j and
// t >> (22 - 4k) = (|code| + 298) << 4k exactly for k <= 4 (j shifted out). Eight such terms, k =
// 0..3 in a low and a high accumulator, give the magnitude nibbles (e2m1_pack8_magnitudes).
FP4ATTN_HD uint32_t e2m1_mag_term(float y) {
  const float a = fminf(fabsf(y), kE2m1Max);
  const float p = bits_float(float_bits(fmaxf(a, 1.f)) & 0x7F800000u);
  return float_bits(fmaf(p, 4194304.f, a)) * 0x400001u;
}

// Same, also returning the exact magnitude r of the E2M1 value (for error sums).
FP4ATTN_HD uint32_t e2m1_mag_term(float y, float* r) {
  const float a = fminf(fabsf(y), kE2m1Max);
  const float p = bits_float(float_bits(fmaxf(a, 1.f)) & 0x7F800000u);
  const float m = fmaf(p, 4194304.f, a);
  *r = fmaf(-p, 4194304.f, m);  // m - p * 2^22, exact (= sub_rn(m, mul_rn(p, 2^22)))
  return float_bits(m) * 0x400001u;
}

// e2m1_mag_term for a = |y| already known to lie in [0, 6] (MXFP4 with the round-up exponent:
// |x| 2^-e <= amax 2^-e <= 6): the clamp of e2m1_mag_term is then the identity and is left out
// (one FMNMX per value), so the result is e2m1_mag_term(a) by construction.
FP4ATTN_HD uint32_t e2m1_mag_term_le6(float a) {
  const float p = bits_float(float_bits(fmaxf(a, 1.f)) & 0x7F800000u);
  return float_bits(fmaf(p, 4194304.f, a)) * 0x400001u;
}

// Magnitude codes of eight terms, element i in bits 4i..4i+2 (bit 4i+3 zero).
FP4ATTN_HD uint32_t e2m1_pack8_magnitudes(const uint32_t (&t)[8]) {
  uint32_t lo = 0u - 298u * 0x11111111u, hi = 0;
  lo += t[0] >> 22;
  hi += t[4] >> 22;
  lo += t[1] >> 18;
  hi += t[5] >> 18;
  lo += t[2] >> 14;
  hi += t[6] >> 14;
  lo += t[3] >> 10;
  hi += t[7] >> 10;
  return lo + (hi << 16);
}

// Generic PRMT (PTX prmt.b32, default mode): byte n of the result is byte (sel >> 4n) & 7 of
// {b, a} (a = bytes 0..3); with bit 3 of the selector nibble set, the sign of that byte is
// replicated over all 8 bits.
FP4ATTN_HD uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
#if defined(__CUDA_ARCH__)
  uint32_t d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
  return d;
#else
  const uint64_t src = (static_cast<uint64_t>(b) << 32) | a;
  uint32_t d = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t s = (sel >> (4 * n)) & 0xFu;
    uint32_t byte = static_cast<uint32_t>(src >> (8 * (s & 7u))) & 0xFFu;
    if (s & 8u) byte = (byte & 0x80u) ? 0xFFu : 0u;
    d |= byte << (8 * n);
  }
  return d;
#endif
}

// Sign nibbles (bit 4i+3 for element i) of the eight 16-bit values (BF16 or FP16, element 2k
// in the low half of word k) in w0..w3, as a word whose bits 4i+3 are the signs (other bits
// arbitrary; AND with 0x88888888).
FP4ATTN_HD uint32_t sign_nibbles8(uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  const uint32_t a = prmt(w0, w1, 0xFBD9u);   // bytes: s0, s2, s1, s3 (sign-replicated)
  const uint32_t b = prmt(w2, w3, 0xFBD9u);   // bytes: s4, s6, s5, s7
  const uint32_t even = prmt(a, b, 0x5410u);  // s0, s2, s4, s6
  const uint32_t odd = prmt(a, b, 0x7632u);   // s1, s3, s5, s7
  return (even & 0x0F0F0F0Fu) | (odd & 0xF0F0F0F0u);
}

// Eight E2M1 codes (pack8 order) of y_i = x_i * inv for the eight 16-bit values in the words
// w0..w3 (x_i their floats): sign_nibbles8 & sign_mask (0x88888888, or 0 for an all-zero block)
// OR the magnitudes. Equal to pack8 of float_to_e2m1(mul_rn(x_i, inv)) when inv > 0 is finite
// (y then has x's sign, is never NaN, and +-Inf encodes as +-6 like float_to_e2m1).
FP4ATTN_HD uint32_t e2m1_encode8(const float (&x)[8], float inv, uint32_t w0, uint32_t w1,
                                 uint32_t w2, uint32_t w3, uint32_t sign_mask) {
  uint32_t t[8];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < 8; ++i) t[i] = e2m1_mag_term(detail::mul_rn(x[i], inv));
  return e2m1_pack8_magnitudes(t) | (sign_nibbles8(w0, w1, w2, w3) & sign_mask);
}

// ---- MXFP4 blocks (host and device: tests/formats/test_mxfp4_signs.cc drives these very
// functions against mxfp4_quantize_block) ------------------------------------------------------

// Whether the E2M1 codes of an MXFP4 block carry its values' signs: amax (>= 0, or NaN) finite
// and nonzero. Not a function of the scale code: 0x00 is both the zero block's code (codes all
// +0) and the scale 2^-127 of every nonzero block whose exponent clamps at -127 (amax <=
// 6 * 2^-127 round-up, < 2^-124 OCP floor: BF16 subnormals and the smallest normals reach it,
// FP16 cannot), whose codes keep their signs (-0 included).
FP4ATTN_HD bool mxfp4_block_signed(float amax) {
  return float_bits(amax) - 1u < detail::kFltMaxBits;  // bits in [1, FLT_MAX bits]
}

// MXFP4 block of 32 values with amax = block_amax(x): returns the E8M0 code; mag[j] holds the
// E2M1 magnitudes of x[8j..8j+8) (element i in bits 4i..4i+2, bit 4i+3 zero); the caller adds
// x's signs where mxfp4_block_signed(amax) (amax 0: codes +0; NaN/Inf: scale 0xFF, codes 0).
// The scaling x * 2^-e is a single exact multiply: e <= floor_log2(FLT_MAX) - 2 + 1 = 126, so
// scale_pow2 never takes its two-factor branch. kRoundUp: amax <= 6 * 2^e (e clamped to >= -127
// only raises 2^e), so every |x| 2^-e <= 6 and the E2M1 term needs no clamp (e2m1_mag_term_le6:
// per value FMUL, FMNMX, LOP3, FFMA, IMAD, LEA.HI). kOcpFloor: |x| 2^-e < 8, clamped at 6.
template <MxScaleRule kRule>
FP4ATTN_HD uint32_t mxfp4_block_mag(const float (&x)[kMxfp4Block], float amax, uint32_t (&mag)[4]) {
  const bool bad = !detail::is_finite(amax);
  if (bad || amax == 0.f) {
    mag[0] = mag[1] = mag[2] = mag[3] = 0;
    return bad ? 0xFFu : 0x00u;
  }
  int e = floor_log2(amax) - 2;
  if (kRule == MxScaleRule::kRoundUp && detail::normalized_fraction(float_bits(amax)) > 0x400000u) {
    ++e;
  }
  const uint8_t scale = ue8m0_from_exponent(e);
  const float p = detail::pow2_normal(127 - static_cast<int>(scale));  // 2^-e, -e in [-126, 127]
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < 4; ++j) {
    uint32_t t[8];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < 8; ++i) {
      const float a = fabsf(detail::mul_rn(x[8 * j + i], p));  // |x| 2^-e, exact sign-free
      t[i] = kRule == MxScaleRule::kRoundUp ? e2m1_mag_term_le6(a) : e2m1_mag_term(a);
    }
    mag[j] = e2m1_pack8_magnitudes(t);
  }
  return scale;
}

// The packed quantizer's MXFP4 block: the 32 values x of the 16-bit input words `in` (element 2k
// in the low half of word k; x[i] has the sign of its 16-bit value, -0 included) with amax =
// block_amax(x) -> the E8M0 code, the codes (pack8 order) in w. Equal to mxfp4_quantize_block
// packed with pack_e2m1x2: magnitudes by mxfp4_block_mag, signs from the input bits
// (sign_nibbles8) wherever mxfp4_block_signed(amax).
template <MxScaleRule kRule>
FP4ATTN_HD uint32_t mxfp4_block_codes(const float (&x)[kMxfp4Block], float amax,
                                      const uint32_t (&in)[16], uint32_t (&w)[4]) {
  const uint32_t s = mxfp4_block_mag<kRule>(x, amax, w);
  const uint32_t sign_mask = mxfp4_block_signed(amax) ? 0x88888888u : 0u;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = 0; k < 4; ++k) {
    w[k] |= sign_nibbles8(in[4 * k], in[4 * k + 1], in[4 * k + 2], in[4 * k + 3]) & sign_mask;
  }
  return s;
}

}  // namespace fp4attn::packed
