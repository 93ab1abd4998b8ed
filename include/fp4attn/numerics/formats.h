// Element codecs: E2M1 (FP4), E4M3fn and E5M2 (FP8), UE8M0 (MX block scales).
//
// Header-only, usable from host and device (FP4ATTN_HD). Every encoder works on the bits of the
// float with integer arithmetic, so the result is exact for every float input (subnormals
// included) and identical on host and device. No double anywhere.
//
// Rounding: RNE on the exact value of the input, ties to the even code. "satfinite" applies to
// finite values only: a finite value beyond the format's largest finite value encodes as that
// value. NaN and Inf follow the per-function rules below.
//
// Nibble order of packed E2M1 pairs (pack_e2m1x2): element 0 of a pair ("first") goes in the LOW
// nibble (bits 3..0), element 1 ("second") in the HIGH nibble (bits 7..4). Sources:
//  * CUDA 13.0, /usr/local/cuda/include/cuda_fp4.hpp, __nv_cvt_float2_to_fp4x2: the software path
//    computes `cvt(x.y) << 4 | cvt(x.x)`, and the PTX path passes x.y as operand a (upper half)
//    and x.x as operand b (lower half) of cvt.rn.satfinite.e2m1x2.f32; __nv_cvt_fp4x2_to_halfraw2
//    decodes the low nibble into .x. So float2.x (the first component) is the low nibble.
//  * PyTorch, torch/headeronly/util/Float4_e2m1fn_x2.h (c10::Float4_e2m1fn_x2, the storage of
//    torch.float4_e2m1fn_x2): "val1 : val0 / bit index 7654 : 3210", i.e. val0 in bits 3..0.
//  * ml_dtypes (0.6.0) has no packed FP4 type: float4_e2m1fn stores one code per byte in the low
//    nibble (high nibble zero), which is exactly our unpacked layout; packing is then ours/torch's.
#pragma once

#include <cstdint>
#include <cstring>

#include "fp4attn/numerics/config.h"

namespace fp4attn {

// ---- float <-> bits ---------------------------------------------------------------------------

FP4ATTN_HD uint32_t float_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

FP4ATTN_HD float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

// Count of leading zero bits of a nonzero word.
FP4ATTN_HD int clz32(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __clz(static_cast<int>(u));
#else
  return __builtin_clz(u);
#endif
}

namespace detail {

constexpr uint32_t kSignMask = 0x80000000u;
constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kInfBits = 0x7F800000u;
constexpr uint32_t kQuietNan = 0x7FC00000u;

// Single IEEE FP32 ops that nvcc never contracts into an FMA (the __f*_rn intrinsics on the
// device; plain operators on the host, built without contraction).
FP4ATTN_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

FP4ATTN_HD float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

FP4ATTN_HD float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

FP4ATTN_HD bool abs_bits_is_nan(uint32_t abs_bits) { return abs_bits > kInfBits; }
FP4ATTN_HD bool abs_bits_is_finite(uint32_t abs_bits) { return abs_bits < kInfBits; }

// Round-to-nearest-even of m / 2^shift, 1 <= shift <= 31.
FP4ATTN_HD uint32_t shift_right_rne(uint32_t m, int shift) {
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return (rem > half || (rem == half && (q & 1u))) ? q + 1u : q;
}

// Magnitude code of a finite, non-negative float (given as bits) in a minifloat with `kMant`
// mantissa bits and exponent bias `kBias`, rounded RNE, with no upper limit: the result can exceed
// the format's largest code and the caller saturates. Codes are laid out as (biased exp << kMant)
// | mantissa, so a carry out of the mantissa bumps the exponent, and the code's parity is the
// parity of the rounded integer (ties to the even code).
template <int kMant, int kBias>
FP4ATTN_HD uint32_t encode_magnitude(uint32_t abs_bits) {
  constexpr int kEmin = 1 - kBias;  // exponent of the smallest normal
  const int biased = static_cast<int>(abs_bits >> 23);
  const uint32_t frac = abs_bits & 0x7FFFFFu;
  // value = sig * 2^(exp - 23), sig a 24-bit integer (no implicit bit for float subnormals).
  const uint32_t sig = biased == 0 ? frac : (frac | 0x800000u);
  const int exp = biased == 0 ? -126 : biased - 127;
  // Target exponent: the value's own, or the subnormal exponent of the format.
  const int target = exp > kEmin ? exp : kEmin;
  const int shift = 23 - kMant + (target - exp);  // >= 23 - kMant >= 20
  if (shift > 24) return 0;  // value < 2^(target-kMant-1) = half the quantum: rounds to 0
  const uint32_t rounded = shift_right_rne(sig, shift);
  // For a normal target, rounded includes the implicit bit: (target - kEmin) << kMant + rounded
  // is (target + kBias) << kMant | mantissa. For the subnormal range, target - kEmin == 0.
  return (static_cast<uint32_t>(target - kEmin) << kMant) + rounded;
}

// Value of a magnitude code (no NaN/Inf handling), exact.
template <int kMant, int kBias>
FP4ATTN_HD float decode_magnitude(uint32_t mag) {
  const uint32_t e = mag >> kMant;
  const uint32_t m = mag & ((1u << kMant) - 1u);
  if (e == 0) {
    // Subnormal: m * 2^(1 - kBias - kMant). Both factors exact, the product is exact.
    return mul_rn(static_cast<float>(m),
                  bits_float(static_cast<uint32_t>(127 + 1 - kBias - kMant) << 23));
  }
  return bits_float((static_cast<uint32_t>(static_cast<int>(e) - kBias + 127) << 23) |
                    (m << (23 - kMant)));
}

FP4ATTN_HD float with_sign(float x, bool negative) {
  return bits_float(float_bits(x) | (negative ? kSignMask : 0u));
}

}  // namespace detail

// ---- E2M1 -------------------------------------------------------------------------------------
// bit 3 sign, bits 2..1 exponent (bias 1), bit 0 mantissa. Magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}.

FP4ATTN_HD float e2m1_to_float(uint8_t code) {
  return detail::with_sign(detail::decode_magnitude<1, 1>(code & 0x7u), (code & 0x8u) != 0);
}

// RNE, finite overflow saturates to +-6, +-Inf -> +-6, NaN -> 0x0 (the block scale carries the
// NaN). -0 and negative values that round to zero give 0x8.
FP4ATTN_HD uint8_t float_to_e2m1(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t a = u & detail::kAbsMask;
  if (detail::abs_bits_is_nan(a)) return 0x0;
  const uint8_t sign = (u >> 28) & 0x8u;
  if (!detail::abs_bits_is_finite(a)) return sign | 0x7u;
  const uint32_t mag = detail::encode_magnitude<1, 1>(a);
  return sign | static_cast<uint8_t>(mag > 0x7u ? 0x7u : mag);
}

// ---- E4M3fn -----------------------------------------------------------------------------------
// Bias 7, no Inf, 0x7F/0xFF NaN, max 448 (0x7E), subnormals m * 2^-9.

FP4ATTN_HD float e4m3_to_float(uint8_t code) {
  const bool negative = (code & 0x80u) != 0;
  const uint32_t mag = code & 0x7Fu;
  if (mag == 0x7Fu) return detail::with_sign(bits_float(detail::kQuietNan), negative);
  return detail::with_sign(detail::decode_magnitude<3, 7>(mag), negative);
}

// RNE, finite overflow saturates to +-448, NaN and +-Inf -> 0x7F | sign (fn has no Inf), -0 ->
// 0x80.
FP4ATTN_HD uint8_t float_to_e4m3(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t a = u & detail::kAbsMask;
  const uint8_t sign = (u >> 24) & 0x80u;
  if (!detail::abs_bits_is_finite(a)) return sign | 0x7Fu;
  const uint32_t mag = detail::encode_magnitude<3, 7>(a);
  return sign | static_cast<uint8_t>(mag > 0x7Eu ? 0x7Eu : mag);
}

// ---- E5M2 -------------------------------------------------------------------------------------
// IEEE-like: bias 15, max 57344 (0x7B), Inf 0x7C/0xFC, NaN exponent 31 with mantissa != 0.

FP4ATTN_HD float e5m2_to_float(uint8_t code) {
  const bool negative = (code & 0x80u) != 0;
  const uint32_t mag = code & 0x7Fu;
  if (mag == 0x7Cu) return detail::with_sign(bits_float(detail::kInfBits), negative);
  if (mag > 0x7Cu) return detail::with_sign(bits_float(detail::kQuietNan), negative);
  return detail::with_sign(detail::decode_magnitude<2, 15>(mag), negative);
}

// RNE, finite overflow saturates to +-57344 (also values that RNE would round up to 65536),
// +-Inf -> +-Inf, NaN -> 0x7E | sign.
FP4ATTN_HD uint8_t float_to_e5m2(float x) {
  const uint32_t u = float_bits(x);
  const uint32_t a = u & detail::kAbsMask;
  const uint8_t sign = (u >> 24) & 0x80u;
  if (detail::abs_bits_is_nan(a)) return sign | 0x7Eu;
  if (!detail::abs_bits_is_finite(a)) return sign | 0x7Cu;
  const uint32_t mag = detail::encode_magnitude<2, 15>(a);
  return sign | static_cast<uint8_t>(mag > 0x7Bu ? 0x7Bu : mag);
}

// ---- UE8M0 (MX scale) -------------------------------------------------------------------------

// 2^(code - 127); code 0 is 2^-127 (a float subnormal, exact); 0xFF is NaN.
FP4ATTN_HD float ue8m0_to_float(uint8_t code) {
  if (code == 0xFFu) return bits_float(detail::kQuietNan);
  if (code == 0) return bits_float(0x00400000u);  // 2^-127
  return bits_float(static_cast<uint32_t>(code) << 23);
}

// Clamps e to [-127, 127] and returns e + 127 (never the NaN code 0xFF).
FP4ATTN_HD uint8_t ue8m0_from_exponent(int e) {
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  return static_cast<uint8_t>(e + 127);
}

// floor(log2 |x|) for finite x != 0, exact (float subnormals too). The sign of x is ignored.
FP4ATTN_HD int floor_log2(float x) {
  const uint32_t a = float_bits(x) & detail::kAbsMask;
  const int biased = static_cast<int>(a >> 23);
  if (biased != 0) return biased - 127;
  // Subnormal: frac * 2^-149, the leading one of frac is at bit 31 - clz.
  return (31 - clz32(a)) - 149;
}

namespace detail {
// True when finite nonzero |x| is an exact power of two.
FP4ATTN_HD bool is_pow2(uint32_t abs_bits) {
  const uint32_t frac = abs_bits & 0x7FFFFFu;
  return (abs_bits >> 23) != 0 ? frac == 0 : (frac & (frac - 1u)) == 0;
}
}  // namespace detail

enum class Ue8m0Round { kFloor, kCeil };

// x finite > 0: floor or ceil of log2 x, clamped to [-127, 127] (so a ceil above 2^127 is not
// possible and gives 2^127); x == +-0 -> 0x00; NaN, +-Inf, x < 0 -> 0xFF.
FP4ATTN_HD uint8_t float_to_ue8m0(float x, Ue8m0Round r) {
  const uint32_t u = float_bits(x);
  const uint32_t a = u & detail::kAbsMask;
  if (a == 0) return 0x00;
  if (!detail::abs_bits_is_finite(a) || (u & detail::kSignMask)) return 0xFF;
  int e = floor_log2(x);
  if (r == Ue8m0Round::kCeil && !detail::is_pow2(a)) ++e;
  return ue8m0_from_exponent(e);
}

// ---- E2M1 pairs -------------------------------------------------------------------------------
// first -> low nibble, second -> high nibble (see the top of this file for the sources).

FP4ATTN_HD uint8_t pack_e2m1x2(uint8_t first, uint8_t second) {
  return static_cast<uint8_t>((first & 0xFu) | ((second & 0xFu) << 4));
}
FP4ATTN_HD uint8_t e2m1x2_first(uint8_t byte) { return byte & 0xFu; }
FP4ATTN_HD uint8_t e2m1x2_second(uint8_t byte) { return byte >> 4; }

}  // namespace fp4attn
