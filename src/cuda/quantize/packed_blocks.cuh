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

// Encodes x[0..16) with inv = s_enc / f into two packed words.
__device__ __forceinline__ void nvfp4_encode16(const float (&x)[kNvfp4Block], float inv,
                                               uint32_t (&w)[2]) {
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    uint32_t c[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) c[i] = e2m1_code_fast(detail::mul_rn(x[8 * j + i], inv));
    w[j] = pack8(c);
  }
}

// One Four-Over-Six candidate: codes and the FP32 sum of squared errors in s_enc units, in the
// reference's order (nvfp4_block_sq_error: d = x * s_enc - e2m1 * scale, err = fmaf(d, d, err)).
// e2m1 * scale is exact; |x| * s_enc - |e2m1| * scale has the magnitude of the reference's d
// (the code's sign is x's), so d * d agrees. Returns false when s_enc / scale overflows (then
// 0 * inv would be NaN: the caller takes the reference path).
struct Candidate {
  uint32_t w[2];
  float err;
};

__device__ __forceinline__ bool four_over_six_candidate(const float (&x)[kNvfp4Block],
                                                        uint8_t scale, float s_enc,
                                                        Candidate* out) {
  const float f = e4m3_to_float(scale);
  float inv = 0.f;  // f == 0: codes 0 (masked below), e2m1 * scale = 0
  uint32_t keep = 0;
  if (f != 0.f) {
    inv = detail::div_rn(s_enc, f);
    if (!(inv <= 3.4028234e38f)) return false;
    keep = 0xFFFFFFFFu;
  }
  float err = 0.f;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    uint32_t c[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float xi = x[8 * j + i];
      float r;
      c[i] = e2m1_code_fast(detail::mul_rn(xi, inv), &r);
      const float d = detail::sub_rn(detail::mul_rn(fabsf(xi), s_enc), detail::mul_rn(r, f));
      err = fmaf(d, d, err);
    }
    out->w[j] = pack8(c) & keep;
  }
  out->err = err;
  return true;
}

// NVFP4 block of 16 values with amax = block_amax(x) (computed by the caller from the 16-bit
// inputs). s_enc finite > 0. Returns the E4M3 scale code, codes in w.
template <Nvfp4ScaleRule kRule>
__device__ __forceinline__ uint8_t nvfp4_block(const float (&x)[kNvfp4Block], float amax,
                                               float s_enc, uint32_t (&w)[2]) {
  if (!detail::is_finite(amax)) {
    w[0] = w[1] = 0;
    return 0x7F;
  }
  const float flt_max = bits_float(detail::kFltMaxBits);
  float sf = detail::mul_rn(detail::div_rn(amax, kE2m1Max), s_enc);
  if (!(sf == sf)) return static_cast<uint8_t>(nvfp4_block_reference<kRule>(x, s_enc, w));
  sf = sf > flt_max ? flt_max : sf;
  if constexpr (kRule == Nvfp4ScaleRule::kFourOverSix) {
    float sf4 = detail::mul_rn(detail::div_rn(amax, 4.f), s_enc);
    sf4 = sf4 > flt_max ? flt_max : sf4;
    const uint8_t c6 = float_to_e4m3(sf);
    const uint8_t c4 = float_to_e4m3(sf4);
    Candidate k6, k4;
    if (!four_over_six_candidate(x, c6, s_enc, &k6) ||
        !four_over_six_candidate(x, c4, s_enc, &k4)) {
      return static_cast<uint8_t>(nvfp4_block_reference<kRule>(x, s_enc, w));
    }
    const bool use4 = k4.err < k6.err;
    w[0] = use4 ? k4.w[0] : k6.w[0];
    w[1] = use4 ? k4.w[1] : k6.w[1];
    return use4 ? c4 : c6;
  } else {
    uint8_t scale;
    if constexpr (kRule == Nvfp4ScaleRule::kNearest) {
      scale = float_to_e4m3(sf);
    } else if constexpr (kRule == Nvfp4ScaleRule::kRoundUp) {
      scale = detail::e4m3_round_up(sf);
    } else {
      scale = detail::e4m3_restricted_up(sf);
    }
    const float f = e4m3_to_float(scale);
    if (f == 0.f) {
      w[0] = w[1] = 0;
      return scale;
    }
    const float inv = detail::div_rn(s_enc, f);
    if (!(inv <= 3.4028234e38f)) {  // Inf: 0 * inv would be NaN (code 0, not the sign)
      return static_cast<uint8_t>(nvfp4_block_reference<kRule>(x, s_enc, w));
    }
    nvfp4_encode16(x, inv, w);
    return scale;
  }
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
