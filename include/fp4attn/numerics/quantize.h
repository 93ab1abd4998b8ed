// Block quantizers: NVFP4 (E2M1 + E4M3 scale per 16), MXFP4 (E2M1 + UE8M0 scale per 32), FP8
// and INT8 with an FP32 scale per block. Header-only and FP4ATTN_HD, plus host tensor helpers at
// the end.
//
// The order of the FP32 operations below is part of the contract: GPU kernels reproduce it bit
// for bit. Each rounding op goes through the *_rn helpers, which are plain operators on the host
// and the __f*_rn intrinsics on the device: nvcc never contracts those into an FMA, and the
// division stays IEEE even with -prec-div=false. Where a fused op is meant, fmaf is written
// explicitly. Host code must not be built with FP contraction (GCC's default for -std=c++20 is
// -ffp-contract=off), and nothing may be built with flush-to-zero (-ftz=true, implied by
// --use_fast_math; -ffast-math on the host): subnormal scales and products must stay exact.
#pragma once

#include <math.h>  // ::fmaf, host and device

#include <cstdint>

#include "fp4attn/numerics/config.h"
#include "fp4attn/numerics/formats.h"

namespace fp4attn {

constexpr int kNvfp4Block = 16, kMxfp4Block = 32;
constexpr float kE2m1Max = 6.f, kE4m3Max = 448.f, kE5m2Max = 57344.f;

namespace detail {

constexpr uint32_t kFltMaxBits = 0x7F7FFFFFu;

FP4ATTN_HD bool is_finite(float x) { return abs_bits_is_finite(float_bits(x) & kAbsMask); }

// 2^k as a float for k in [-126, 127] (normal range).
FP4ATTN_HD float pow2_normal(int k) { return bits_float(static_cast<uint32_t>(k + 127) << 23); }

// x * 2^k for k in [-252, 127], exact whenever the result is a normal float: 2^k is split into two
// normal factors when it is not itself normal.
FP4ATTN_HD float scale_pow2(float x, int k) {
  if (k >= -126) return mul_rn(x, pow2_normal(k));
  const int k1 = k / 2;
  return mul_rn(mul_rn(x, pow2_normal(k1)), pow2_normal(k - k1));
}

// The normalized 23-bit fraction of a finite nonzero float (subnormals normalized first).
FP4ATTN_HD uint32_t normalized_fraction(uint32_t abs_bits) {
  if ((abs_bits >> 23) != 0) return abs_bits & 0x7FFFFFu;
  return (abs_bits << (clz32(abs_bits) - 8)) & 0x7FFFFFu;
}

}  // namespace detail

// max |x[i * stride]| over i < n, NaN-propagating: any NaN -> NaN; else any Inf -> Inf; n == 0 ->
// 0. Works on the bits: for non-negative floats the integer order is the float order, and every
// NaN's bits are above Inf's.
FP4ATTN_HD float strided_amax(const float* x, int n, int64_t stride) {
  uint32_t m = 0;
  for (int i = 0; i < n; ++i) {
    const uint32_t a = float_bits(x[i * stride]) & detail::kAbsMask;
    m = a > m ? a : m;
  }
  return bits_float(m);
}

FP4ATTN_HD float block_amax(const float* x, int n) { return strided_amax(x, n, 1); }

enum class Nvfp4ScaleRule { kNearest, kRoundUp, kFourOverSix, kRestricted };
enum class MxScaleRule { kOcpFloor, kRoundUp };

inline const char* scale_rule_name(Nvfp4ScaleRule r) {
  switch (r) {
    case Nvfp4ScaleRule::kNearest:
      return "nearest";
    case Nvfp4ScaleRule::kRoundUp:
      return "round-up";
    case Nvfp4ScaleRule::kFourOverSix:
      return "four-over-six";
    case Nvfp4ScaleRule::kRestricted:
      return "restricted";
  }
  return "unknown";
}

inline const char* scale_rule_name(MxScaleRule r) {
  switch (r) {
    case MxScaleRule::kOcpFloor:
      return "ocp-floor";
    case MxScaleRule::kRoundUp:
      return "round-up";
  }
  return "unknown";
}

// ---- NVFP4 ------------------------------------------------------------------------------------

// The largest scale kRestricted may use: 1.5 * 2^8.
constexpr float kRestrictedScaleMax = 384.f;

// Per-tensor encode scale s_enc = (top * 6) / amax_tensor (decode: x = e2m1 * scale / s_enc), top =
// 448, or 384 for kRestricted. top * 6 is exact; one FP32 division. amax_tensor == 0, negative,
// NaN or Inf -> 1; a quotient that overflows (tiny amax) -> FLT_MAX.
FP4ATTN_HD float nvfp4_tensor_scale(float amax_tensor, Nvfp4ScaleRule rule) {
  if (!(amax_tensor > 0.f) || !detail::is_finite(amax_tensor)) return 1.f;
  const float top = rule == Nvfp4ScaleRule::kRestricted ? kRestrictedScaleMax : kE4m3Max;
  const float s = detail::div_rn(top * kE2m1Max, amax_tensor);
  return detail::is_finite(s) ? s : bits_float(detail::kFltMaxBits);
}

// (e2m1 * scale) / s_enc; the product is exact. NaN scale (0x7F/0xFF) -> NaN.
FP4ATTN_HD float nvfp4_dequantize(uint8_t code, uint8_t scale, float s_enc) {
  return detail::div_rn(detail::mul_rn(e2m1_to_float(code), e4m3_to_float(scale)), s_enc);
}

namespace detail {

// Smallest E4M3 value >= sf, saturating at 448; sf == 0 -> 0. sf >= 0.
FP4ATTN_HD uint8_t e4m3_round_up(float sf) {
  if (!(sf < kE4m3Max)) return 0x7E;
  const uint8_t c = float_to_e4m3(sf);
  return e4m3_to_float(c) < sf ? static_cast<uint8_t>(c + 1) : c;
}

// Smallest of {1, 1.25, 1.5} * 2^e, e in [-3, 8], that is >= sf (sf > 384 -> 384; sf == 0 -> 0),
// as an E4M3 code (mantissa bits 000, 010 or 100).
FP4ATTN_HD uint8_t e4m3_restricted_up(float sf) {
  if (sf == 0.f) return 0x00;
  if (!(sf <= kRestrictedScaleMax)) return float_to_e4m3(kRestrictedScaleMax);
  if (sf <= 0.125f) return float_to_e4m3(0.125f);
  const int e = floor_log2(sf);  // in [-3, 8]: 2^e <= sf < 2^(e+1)
  const float p = pow2_normal(e);
  float v;
  if (sf == p) {
    v = p;
  } else if (sf <= mul_rn(1.25f, p)) {
    v = mul_rn(1.25f, p);
  } else if (sf <= mul_rn(1.5f, p)) {
    v = mul_rn(1.5f, p);
  } else {
    v = mul_rn(2.f, p);  // e <= 7 here: for e == 8, sf <= 384 = 1.5 * 2^8 was caught above
  }
  return float_to_e4m3(v);
}

// Codes for a block whose E4M3 scale is `scale`: inv = s_enc / f, code = e2m1(x * inv).
FP4ATTN_HD void nvfp4_encode_with_scale(const float* x, int n, float s_enc, uint8_t scale,
                                        uint8_t* codes) {
  const float f = e4m3_to_float(scale);
  if (f == 0.f) {
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return;
  }
  const float inv = div_rn(s_enc, f);
  for (int i = 0; i < n; ++i) codes[i] = float_to_e2m1(mul_rn(x[i], inv));
}

// Sum of squared reconstruction errors in s_enc units, in order: err = fmaf(d, d, err) with
// d = x[i] * s_enc - e2m1 * scale. No division (the GPU does this for two candidates per block).
FP4ATTN_HD float nvfp4_block_sq_error(const float* x, int n, float s_enc, uint8_t scale,
                                      const uint8_t* codes) {
  const float f = e4m3_to_float(scale);
  float err = 0.f;
  for (int i = 0; i < n; ++i) {
    const float d = sub_rn(mul_rn(x[i], s_enc), mul_rn(e2m1_to_float(codes[i]), f));
    err = fmaf(d, d, err);
  }
  return err;
}

}  // namespace detail

// NVFP4 block x[0..n), n <= 16 (a short tail is quantized as if padded with zeros). Writes n E2M1
// codes (one per byte) and returns the E4M3 scale code.
//   amax = block_amax(x, n); NaN or Inf -> scale 0x7F (NaN), all codes 0.
//   sf = (amax / 6) * s_enc (two FP32 ops, this order); s_enc is meant to be finite and > 0.
//   sf == +Inf (FP32 overflow of finite inputs) counts as finite overflow: every rule then
//   saturates as for sf = FLT_MAX. sf NaN (NaN s_enc) -> scale 0x7F, codes 0.
//   kNearest:     float_to_e4m3(sf).
//   kRoundUp:     smallest E4M3 value >= sf, saturating at 448; sf == 0 -> 0.
//   kFourOverSix: c6 = float_to_e4m3(sf), c4 = float_to_e4m3((amax / 4) * s_enc); quantize with
//                 each, error = sum_i fmaf(d, d, err), d = x[i] * s_enc - e2m1_i * scale (FP32,
//                 in this order); c4 only if its error is strictly smaller.
//   kRestricted:  smallest {1, 1.25, 1.5} * 2^e, e in [-3, 8], >= sf; sf > 384 -> 384; sf == 0
//                 -> 0. Every product e2m1 * scale / 8 is then exact in E4M3.
//   codes: f = e4m3_to_float(scale); f == 0 -> all 0; else inv = s_enc / f, code = e2m1(x * inv).
FP4ATTN_HD uint8_t nvfp4_quantize_block(const float* x, int n, float s_enc, Nvfp4ScaleRule rule,
                                        uint8_t* codes) {
  const float amax = block_amax(x, n);
  if (!detail::is_finite(amax)) {
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return 0x7F;
  }
  const float flt_max = bits_float(detail::kFltMaxBits);
  float sf = detail::mul_rn(detail::div_rn(amax, kE2m1Max), s_enc);
  if (detail::abs_bits_is_nan(float_bits(sf) & detail::kAbsMask)) {  // NaN s_enc: no finite scale
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return 0x7F;
  }
  sf = sf > flt_max ? flt_max : sf;
  uint8_t scale = 0;
  switch (rule) {
    case Nvfp4ScaleRule::kNearest:
      scale = float_to_e4m3(sf);
      break;
    case Nvfp4ScaleRule::kRoundUp:
      scale = detail::e4m3_round_up(sf);
      break;
    case Nvfp4ScaleRule::kRestricted:
      scale = detail::e4m3_restricted_up(sf);
      break;
    case Nvfp4ScaleRule::kFourOverSix: {
      float sf4 = detail::mul_rn(detail::div_rn(amax, 4.f), s_enc);
      sf4 = sf4 > flt_max ? flt_max : sf4;
      const uint8_t c6 = float_to_e4m3(sf);
      const uint8_t c4 = float_to_e4m3(sf4);
      uint8_t codes4[kNvfp4Block];
      detail::nvfp4_encode_with_scale(x, n, s_enc, c6, codes);
      detail::nvfp4_encode_with_scale(x, n, s_enc, c4, codes4);
      const float err6 = detail::nvfp4_block_sq_error(x, n, s_enc, c6, codes);
      const float err4 = detail::nvfp4_block_sq_error(x, n, s_enc, c4, codes4);
      if (err4 < err6) {
        for (int i = 0; i < n; ++i) codes[i] = codes4[i];
        return c4;
      }
      return c6;
    }
  }
  detail::nvfp4_encode_with_scale(x, n, s_enc, scale, codes);
  return scale;
}

// ---- MXFP4 ------------------------------------------------------------------------------------

// e2m1 * 2^(scale - 127) (exact, 2^-127 included); NaN if scale is 0xFF.
FP4ATTN_HD float mxfp4_dequantize(uint8_t code, uint8_t scale) {
  return detail::mul_rn(e2m1_to_float(code), ue8m0_to_float(scale));
}

// MXFP4 block x[0..n), n <= 32. Writes n E2M1 codes and returns the UE8M0 scale code.
//   amax NaN/Inf -> 0xFF, codes 0.   amax == 0 -> 0x00 (2^-127), codes 0.
//   kOcpFloor: e = floor_log2(amax) - 2 (OCP MX v1.0: emax of E2M1 is 2); |x| / 2^e in (6, 8)
//              saturates to 6.
//   kRoundUp:  smallest e with amax <= 6 * 2^e (no saturation).
//   e clamped to [-127, 127]; code_i = float_to_e2m1(x[i] * 2^-e), exact scaling.
FP4ATTN_HD uint8_t mxfp4_quantize_block(const float* x, int n, MxScaleRule rule, uint8_t* codes) {
  const float amax = block_amax(x, n);
  const bool bad = !detail::is_finite(amax);
  if (bad || amax == 0.f) {
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return bad ? 0xFF : 0x00;
  }
  int e = floor_log2(amax) - 2;  // amax / 2^e in [4, 8)
  // kRoundUp: amax <= 6 * 2^e iff amax's normalized significand <= 1.5.
  if (rule == MxScaleRule::kRoundUp && detail::normalized_fraction(float_bits(amax)) > 0x400000u) {
    ++e;
  }
  const uint8_t scale = ue8m0_from_exponent(e);
  e = static_cast<int>(scale) - 127;
  for (int i = 0; i < n; ++i) codes[i] = float_to_e2m1(detail::scale_pow2(x[i], -e));
  return scale;
}

// ---- FP8 with an FP32 scale -------------------------------------------------------------------

enum class Fp8Format { kE4M3, kE5M2 };

FP4ATTN_HD float fp8_to_float(uint8_t code, Fp8Format fmt) {
  return fmt == Fp8Format::kE4M3 ? e4m3_to_float(code) : e5m2_to_float(code);
}

FP4ATTN_HD uint8_t float_to_fp8(float x, Fp8Format fmt) {
  return fmt == Fp8Format::kE4M3 ? float_to_e4m3(x) : float_to_e5m2(x);
}

// Block of n values x[i * stride] (a stride lets per-channel blocks walk a column); writes codes[i]
// (contiguous, i < n) and returns the scale (decode: x = fp8 * scale).
//   amax NaN/Inf -> scale NaN, codes NaN (E4M3 0x7F / E5M2 0x7E).  amax == 0 -> scale 1, codes 0.
//   else scale = amax / fmax; inv = fmax / amax (Inf -> FLT_MAX); code = fp8(x * inv).
FP4ATTN_HD float fp8_quantize_block(const float* x, int n, int64_t stride, Fp8Format fmt,
                                    uint8_t* codes) {
  const float amax = strided_amax(x, n, stride);
  if (!detail::is_finite(amax)) {
    const uint8_t nan_code = fmt == Fp8Format::kE4M3 ? 0x7F : 0x7E;
    for (int i = 0; i < n; ++i) codes[i] = nan_code;
    return bits_float(detail::kQuietNan);
  }
  if (amax == 0.f) {
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return 1.f;
  }
  const float fmax = fmt == Fp8Format::kE4M3 ? kE4m3Max : kE5m2Max;
  const float scale = detail::div_rn(amax, fmax);
  float inv = detail::div_rn(fmax, amax);
  if (!detail::is_finite(inv)) inv = bits_float(detail::kFltMaxBits);
  for (int i = 0; i < n; ++i) codes[i] = float_to_fp8(detail::mul_rn(x[i * stride], inv), fmt);
  return scale;
}

// ---- INT8 with an FP32 scale ------------------------------------------------------------------

constexpr float kInt8Max = 127.f;  // symmetric: -128 is never written

// Block of n values x[i * stride] (contiguous codes, i < n) as INT8 codes; returns the scale
// (decode: x = code * scale). The int8 recipes' Q and K (numerics.md §3).
//   amax NaN/Inf -> scale NaN, codes 0 (the NaN reaches every score of the block's tokens).
//   amax == 0 -> scale 1, codes 0.
//   else scale = amax / 127; inv = 127 / amax (Inf -> FLT_MAX); code = RNE(x * inv), which
//   |x| <= amax keeps within [-127, 127] (the clamp guards the rounding of inv).
FP4ATTN_HD float int8_quantize_block(const float* x, int n, int64_t stride, int8_t* codes) {
  const float amax = strided_amax(x, n, stride);
  if (!detail::is_finite(amax) || amax == 0.f) {
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return amax == 0.f ? 1.f : bits_float(detail::kQuietNan);
  }
  const float scale = detail::div_rn(amax, kInt8Max);
  float inv = detail::div_rn(kInt8Max, amax);
  if (!detail::is_finite(inv)) inv = bits_float(detail::kFltMaxBits);
  for (int i = 0; i < n; ++i) {
    const float r = ::rintf(detail::mul_rn(x[i * stride], inv));  // ties to even
    codes[i] = static_cast<int8_t>(r > kInt8Max ? kInt8Max : (r < -kInt8Max ? -kInt8Max : r));
  }
  return scale;
}

// ---- Host tensor helpers (src/formats/*.cc) ---------------------------------------------------

// Row-wise block quantization of a row-major float matrix [rows, cols] with leading dimension ld
// (blocks along cols; a tail block when cols % block != 0). codes: rows * cols unpacked bytes
// (row-major, ld = cols); scales: rows * ceil(cols / block) bytes, row-major. Multithreaded for
// large inputs.
void nvfp4_quantize_rows(const float* x, int64_t rows, int64_t cols, int64_t ld, float s_enc,
                         Nvfp4ScaleRule rule, uint8_t* codes, uint8_t* scales);
void mxfp4_quantize_rows(const float* x, int64_t rows, int64_t cols, int64_t ld, MxScaleRule rule,
                         uint8_t* codes, uint8_t* scales);

// Packing of unpacked codes [rows, cols] into [rows, cols / 2] bytes (cols even; element 2j in the
// low nibble of byte j, as pack_e2m1x2) and back.
void pack_e2m1_rows(const uint8_t* codes, int64_t rows, int64_t cols, uint8_t* packed);
void unpack_e2m1_rows(const uint8_t* packed, int64_t rows, int64_t cols, uint8_t* codes);

}  // namespace fp4attn
