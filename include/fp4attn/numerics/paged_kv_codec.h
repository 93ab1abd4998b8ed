// The paged KV cache's codecs of one token, host and device: the GPU append writes the bytes
// the host reference (golden/paged_kv.h) writes by calling these same functions.
#pragma once

#include <cstdint>

#include "fp4attn/numerics/config.h"
#include "fp4attn/numerics/quantize.h"
#include "fp4attn/paged_kv.h"

namespace fp4attn {

// ---- Codecs of one token (host and device) -----------------------------------------------------

// One token of one head: d values (d % 16 == 0) -> d / 2 packed bytes and d / 16 E4M3 scales,
// block by block with nvfp4_quantize_block, so the bytes equal nvfp4_quantize_rows +
// pack_e2m1_rows on the same row.
FP4ATTN_HD void paged_kv_encode_nvfp4(const float* x, int d, float s_enc, Nvfp4ScaleRule rule,
                                      uint8_t* packed, uint8_t* scales) {
  uint8_t codes[kNvfp4Block];
  for (int b = 0; b < d / kNvfp4Block; ++b) {
    scales[b] = nvfp4_quantize_block(x + b * kNvfp4Block, kNvfp4Block, s_enc, rule, codes);
    for (int j = 0; j < kNvfp4Block / 2; ++j) {
      packed[b * (kNvfp4Block / 2) + j] = pack_e2m1x2(codes[2 * j], codes[2 * j + 1]);
    }
  }
}

// Element c of a packed NVFP4 token: the codec's FP32 value, e2m1 * scale / s_enc.
FP4ATTN_HD float paged_kv_decode_nvfp4(const uint8_t* packed, const uint8_t* scales, int c,
                                       float s_enc) {
  const uint8_t byte = packed[c / 2];
  const uint8_t code = (c & 1) ? e2m1x2_second(byte) : e2m1x2_first(byte);
  return nvfp4_dequantize(code, scales[c / kNvfp4Block], s_enc);
}

// The FP8 multiplier of a decode scale: 1 / scale in FP32, FLT_MAX when that overflows (a tiny
// scale). One division per append, then one multiply per element.
FP4ATTN_HD float paged_kv_fp8_inverse(float scale) {
  const float inv = detail::div_rn(1.f, scale);
  return detail::is_finite(inv) ? inv : bits_float(detail::kFltMaxBits);
}

// E4M3_RNE(x * inv), satfinite; NaN and +-Inf give 0x7F/0xFF (NaN), per element.
FP4ATTN_HD uint8_t paged_kv_encode_fp8(float x, float inv) {
  return float_to_e4m3(detail::mul_rn(x, inv));
}

// e4m3 * scale, rounded to FP32.
FP4ATTN_HD float paged_kv_decode_fp8(uint8_t code, float scale) {
  return detail::mul_rn(e4m3_to_float(code), scale);
}

// Calibration of an uncalibrated global (0) from an append. amax is the largest |x| over that
// append's *finite* values (so one NaN token cannot pin the layer's scale; its own blocks still
// carry the NaN).
//   NVFP4: nvfp4_tensor_scale(amax, rule) = 2688 / amax (2304 / amax for kRestricted).
//   FP8:   amax / 448.
// amax 0 (only zeros and non-finite values) gives 0: the global stays uncalibrated, and a later
// append with data sets it. Such tokens lose nothing: zero blocks are zero codes and scales, and
// non-finite ones NaN, under any global (paged_kv_encode_global, paged_kv_decode_factor).
FP4ATTN_HD float paged_kv_calibrate_nvfp4(float amax_finite, Nvfp4ScaleRule rule) {
  return amax_finite > 0.f ? nvfp4_tensor_scale(amax_finite, rule) : 0.f;
}
FP4ATTN_HD float paged_kv_calibrate_fp8(float amax_finite) {
  if (!(amax_finite > 0.f)) return 0.f;
  const float s = detail::div_rn(amax_finite, kE4m3Max);
  return s > 0.f ? s : bits_float(1);  // amax below 448 * 2^-149 would round to 0
}

// The global an append encodes with: the stored one, or 1 for an uncalibrated one (0), which only
// an append of zeros and non-finite values leaves (their bytes do not depend on the global).
FP4ATTN_HD float paged_kv_encode_global(float stored) { return stored == 0.f ? 1.f : stored; }

// A reader's multiplier of a side's global, once per call: num / s_enc for NVFP4 (num: the
// constant the reader folds in; FP32 division), the decode scale itself for FP8. An uncalibrated
// global (0) gives 0: its tokens decode as their codes say, zero codes to 0, NaN to NaN.
FP4ATTN_HD float paged_kv_decode_factor(bool nvfp4, float global, float num) {
  if (!nvfp4) return global;
  return global == 0.f ? 0.f : detail::div_rn(num, global);
}

// Max |x| over the finite values of x[0..n) (NaN and Inf skipped); 0 if none.
FP4ATTN_HD float finite_amax(const float* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t a = float_bits(x[i]) & detail::kAbsMask;
    if (detail::abs_bits_is_finite(a) && a > m) m = a;
  }
  return bits_float(m);
}

}  // namespace fp4attn
