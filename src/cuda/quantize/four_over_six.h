// Four-Over-Six block choice (nvfp4_quantize_block, kFourOverSix) on the fast paths of the packed
// and operand quantizers. Host+device (FP4ATTN_HD): tests/formats/test_four_over_six.cc runs
// this very function against the reference on millions of blocks.
#pragma once

#include <math.h>

#include <cstdint>

#include "cuda/quantize/packed_common.cuh"  // e2m1_pack8_magnitudes
#include "fp4attn/numerics/config.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"

namespace fp4attn::packed {

// What the quantizers keep per E4M3 scale code c (a per-CTA table on the device): inv =
// s_enc / f (div_rn), f = e4m3_to_float(c); code 0: (0, 0).
struct ScaleEntry {
  float inv, f;
};

FP4ATTN_HD ScaleEntry nvfp4_scale_entry(float s_enc, uint32_t code) {
  const float f = code < 127u ? e4m3_to_float(static_cast<uint8_t>(code)) : 0.f;
  return {f == 0.f ? 0.f : detail::div_rn(s_enc, f), f};
}

// The candidates' codes of a block with amax (finite, >= 0): c6 = E4M3((amax / 6) * s_enc), c4 =
// E4M3((amax / 4) * s_enc), products above FLT_MAX saturating as the reference's. a6 is amax / 6
// (div_rn, or div6_16bit for 16-bit amax values).
struct FosCodes {
  uint32_t c6, c4;
};

FP4ATTN_HD FosCodes four_over_six_codes(float amax, float a6, float s_enc) {
  const float flt_max = bits_float(detail::kFltMaxBits);
  const float sf6 = fminf(detail::mul_rn(a6, s_enc), flt_max);
  const float sf4 = fminf(detail::mul_rn(detail::mul_rn(amax, 0.25f), s_enc), flt_max);
  const uint32_t c = e4m3_codes_nearest2(sf6, sf4);  // device: one E4M3 conversion for both
  return {c & 0xFFu, c >> 8};
}

// The chosen scale code of the block x (finite values, s_enc finite > 0 with every table entry
// finite; kClamp6 false: four_over_six_fast_ok(c)), e6 / e4 the entries of c6 / c4; mag: the E2M1
// magnitudes of the chosen candidate (element i in bits 4i..4i+2, bit 4i+3 zero; the caller adds
// x's signs, none when the code is 0).
//
// Exactly the reference's choice, in its arithmetic: per candidate and value the FMA sum m of
// e2m1_mag_term (the code follows from its bits), r = m - p 2^22 the E2M1 magnitude (exact), the
// error term d = |x| s_enc - r f as one FMA on xs = RN(|x| s_enc) (r f is exact, E2M1 x E4M3, and
// |d| is the reference's |x s_enc - e2m1 f|: the code has x's sign), err = fmaf(d, d, err) in
// order; c4 only if err4 < err6 (ties keep /6). No data-dependent branch: a warp runs one path.
// * c4 == c6 (both saturated at 448, or both 0): the candidates are the same computation, so
//   the reference keeps /6 whatever the errors; candidate 4 is then not evaluated meaningfully.
// * Candidate 4 needs no clamp at 6 when c4 != c6: |x| inv4 < 7, so RN(|x| inv4) rounds onto
//   the E2M1 grid like min(., 6) (e2m1_mag_term's sum stays in the binade of 4 * 2^22).
//   c4 < 0x7E: f4 = E4M3(sf4) with sf4 ~ amax s_enc / 4; f4 normal: sf4 <= f4 (1 + 2^-4), so
//   |x| inv4 <~ 4.25; f4 = k 2^-9 subnormal: sf4 < (k + 1/2) 2^-9, so |x| inv4 <~ 4 (k + 1/2) / k
//   <= 6 (the ~ are FP32 roundings, a few 2^-24 relative). c4 == 0x7E != c6: c6 <= 0x7D means
//   sf6 < 432 (E4M3's midpoint below 448), amax s_enc <~ 2592, |x| * RN(s_enc / 448) <~ 5.79.
// * Candidate 6 needs its clamp at 6 only when c6 is 1..3 or 0x7E (four_over_six_fast_ok false):
//   as for candidate 4, f6 normal gives |x| inv6 <~ 6.375, f6 = k 2^-9 with k >= 4 gives
//   <~ 6 (k + 1/2) / k <= 6.75; c6 = k <= 3 allows ~9, and c6 = 0x7E (c4 == c6, /6 chosen) any
//   value. c6 == 0: inv6 = 0, every term 0. kClamp6 true is valid for every c.
FP4ATTN_HD bool four_over_six_fast_ok(FosCodes c) { return c.c6 == 0 || c.c6 - 4u < 0x7Au; }

template <bool kClamp6>
FP4ATTN_HD uint32_t four_over_six_select(const float (&x)[kNvfp4Block], float s_enc, FosCodes c,
                                         ScaleEntry e6, ScaleEntry e4, uint32_t (&mag)[2]) {
  constexpr float kMagic = 4194304.f;  // 2^22
  float m6[kNvfp4Block], m4[kNvfp4Block];
  float err6 = 0.f, err4 = 0.f;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int i = 0; i < kNvfp4Block; ++i) {
    const float ax = fabsf(x[i]);
    const float xs = detail::mul_rn(ax, s_enc);
    float a6 = detail::mul_rn(ax, e6.inv);
    if constexpr (kClamp6) a6 = fminf(a6, kE2m1Max);
    const float p6 = bits_float(float_bits(fmaxf(a6, 1.f)) & 0x7F800000u);
    m6[i] = fmaf(p6, kMagic, a6);
    const float d6 = fmaf(-fmaf(-p6, kMagic, m6[i]), e6.f, xs);
    err6 = fmaf(d6, d6, err6);
    const float a4 = detail::mul_rn(ax, e4.inv);
    const float p4 = bits_float(float_bits(fmaxf(a4, 1.f)) & 0x7F800000u);
    m4[i] = fmaf(p4, kMagic, a4);
    const float d4 = fmaf(-fmaf(-p4, kMagic, m4[i]), e4.f, xs);
    err4 = fmaf(d4, d4, err4);
  }
  const bool use4 = c.c4 != c.c6 && err4 < err6;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int j = 0; j < 2; ++j) {
    uint32_t t[8];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < 8; ++i) t[i] = float_bits(use4 ? m4[8 * j + i] : m6[8 * j + i]) * 0x400001u;
    mag[j] = e2m1_pack8_magnitudes(t);
  }
  return use4 ? c.c4 : c.c6;
}

}  // namespace fp4attn::packed
