// Direct-P numerics of the `fp4-direct` recipe (arXiv 2609.04105, section 4), host and device.
// docs/numerics.md lists where fp4attn follows the paper and where it departs.
#pragma once

#include <cmath>
#include <cstdint>

#include "fp4attn/numerics/config.h"
#include "fp4attn/numerics/formats.h"

namespace fp4attn {

// Keys per P block and tokens per V block (one E8M0 exponent each).
constexpr int kDirectBlock = 32;
// log2(6): the E2M1 maximum in log2 units.
constexpr float kLog2Six = 2.5849625007211562f;
// 1 - log2(1.5): adding it before floor() rounds 2^g to the nearest power of two with the switch
// at 1.5 * 2^k (ties up), the paper's default scale select.
constexpr float kNearestPow2Shift = 0.41503749927884381f;

// The paper's generic "fast" fit of the affine surrogate u = max(0, A x + B).
constexpr float kDirectA = 1.5f;
constexpr float kDirectB = 1.2f;

// Exponent e_B of a P block whose largest log2 score relative to the row reference is g.
FP4ATTN_HD int direct_block_exponent(float g) {
  return static_cast<int>(floorf(g + kNearestPow2Shift));
}

// The block exponent as a float and the operand unit 2^(e + shift) (shift 6: fp4-direct's Hopper
// operand E4M3(q * 2^(e + 6)); the kernel takes 9 for codes kept in eighths); unit 0 for a zero
// block (e + 127 <= 0) and for g NaN or -inf. For every g <= 0 outside such a block, e ==
// direct_block_exponent(g) exactly: the kernel needs no float <-> int conversion
// (tests/reference/test_direct_fast.cc).
struct DirectBlockScale {
  float e, unit;
  int32_t field;  // unit's exponent field, less 127, << 23; -127 << 23 for a zero block (unit 0)
};
FP4ATTN_HD DirectBlockScale direct_block_scale(float g, uint32_t shift = 6) {
  const float e = floorf(g + kNearestPow2Shift);
  // 1.5 * 2^23 + e + shift holds e + shift in its low mantissa bits; << 23 moves them to the
  // exponent field and pushes the magic's own bits (0x4B400000, low 9 bits zero) out of the word.
  // A zero block takes 0x181 (-127 mod 2^9) instead.
  const uint32_t low =
      e >= -126.f ? float_bits(e + (12582912.f + static_cast<float>(shift))) : 0x181u;
  const int32_t field = static_cast<int32_t>(low << 23);
  return {e, bits_float(static_cast<uint32_t>(field + (127 << 23))), field};
}

// E2M1 rounding without compares or selects. For v in [0, cap] (cap 6 or its power-of-two
// scale), M = 2^22 * 2^max(0, floor(log2 v)) (in v's scale) has the E2M1 step of v's binade (0.5
// below 2, then 1 and 2) as its ulp, so v + M rounds v once, ties to the even step (= the even
// code), and (v + M) - M is exact. M is v's exponent field + 22 floored at the [0, 2) step (one
// integer add-max), mantissa cleared.
namespace detail {
// max(x, 0) with the GPU's NaN rule for every NaN (-> 0): x86's maxss quiets a signaling NaN.
FP4ATTN_HD float max0(float x) {
#if defined(__CUDA_ARCH__)
  return fmaxf(x, 0.f);
#else
  return x > 0.f ? x : 0.f;
#endif
}

// v >= 0 (not NaN); the constants are parameters so that the test can mutate them.
FP4ATTN_HD float e2m1_round_lifted(float v, float cap, int32_t lift, int32_t floor_bits) {
  v = fminf(v, cap);
  const int32_t lifted = static_cast<int32_t>(float_bits(v)) + lift;
  const uint32_t m_bits = static_cast<uint32_t>(lifted > floor_bits ? lifted : floor_bits);
  const float m = bits_float(m_bits & 0xFF800000u);
  return sub_rn(sub_rn(v, -m), m);
}
}  // namespace detail
constexpr int32_t kE2m1Lift = 22 << 23;         // M = 2^22 * 2^floor(log2 v)
constexpr int32_t kE2m1LiftFloor = 0x4A800000;  // 2^22: the step 0.5 of [0, 2)

// E2M1 RNE of max(0, u), satfinite at 6, as a float: e2m1_to_float(float_to_e2m1(fmaxf(0, u)))
// for every float u (NaN -> 0; the full sweep is in the test).
FP4ATTN_HD float direct_e2m1_round(float u) {
  return detail::e2m1_round_lifted(detail::max0(u), 6.f, kE2m1Lift, kE2m1LiftFloor);
}

// fma.rn.sat: clamp(RN(a b + c), 0, 1), NaN -> 0 (one FFMA.SAT on the device).
FP4ATTN_HD float fma_sat(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  float d;
  asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
  return d;
#else
  const float d = fmaf(a, b, c);
  return d > 0.f ? (d < 1.f ? d : 1.f) : 0.f;
#endif
}

// The kernel's per-key map, in eighths: with w = fma_sat(S, A c / 8, k0 / 8) = clamp(u, 0, 8) / 8
// (u = fmaf(S, A c, k0); the scaling is exact, see the test), direct_e2m1_round_eighths(w) =
// direct_e2m1_round(u) / 8. The clamp at 0 and the NaN rule come free with the FFMA.SAT.
FP4ATTN_HD float direct_e2m1_round_eighths(float w) {
  return detail::e2m1_round_lifted(w, 0.75f, kE2m1Lift, kE2m1LiftFloor - (3 << 23));
}

// The same rounding with the operand unit folded into M: for a block scale s of shift 9 (unit =
// 8 * 2^(e + 6)), direct_operand(w, s) = direct_e2m1_round_eighths(w) * s.unit = q * 2^(e + 6),
// the P operand value, in one FFMA and one FADD: r = w * unit + M * unit rounds w once as w + M
// does (scaling by a power of two commutes with RN; r >= 2^-98 is normal), and M * unit is M
// with the unit's exponent field added. A zero block (unit 0, field -127 << 23: M * 2^-127 is
// still a normal float) gives (0 + M) - M = 0.
struct DirectKeyMap {
  float unit;
  int32_t lift, floor_bits;
};
FP4ATTN_HD DirectKeyMap direct_key_map(const DirectBlockScale& s) {
  return {s.unit, kE2m1Lift + s.field, kE2m1LiftFloor - (3 << 23) + s.field};
}
namespace detail {
template <bool kCap>
FP4ATTN_HD float e2m1_operand_lifted(float w, float unit, int32_t lift, int32_t floor_bits) {
  if constexpr (kCap) w = fminf(w, 0.75f);
  const int32_t lifted = static_cast<int32_t>(float_bits(w)) + lift;
  const uint32_t m_bits = static_cast<uint32_t>(lifted > floor_bits ? lifted : floor_bits);
  const float m = bits_float(m_bits & 0xFF800000u);
  return sub_rn(fmaf(w, unit, m), m);
}
}  // namespace detail
// kCap = false skips the satfinite clamp at 6 (w <= 3/4): equal for every w < 7/8, i.e. u < 7,
// which holds for every key of a nonzero block whenever |m| <= 2^20 (direct_cap_free).
template <bool kCap = true>
FP4ATTN_HD float direct_operand(float w, const DirectKeyMap& k) {
  return detail::e2m1_operand_lifted<kCap>(w, k.unit, k.lift, k.floor_bits);
}

// When the clamp at 6 is redundant: u of a key is at most u of its block's largest score,
// 1.5 (g - e + log2 6) + 1.2 < 5.96 in exact arithmetic (g - e < 1 - (1 - log2 1.5), the
// floor), and for |m| <= 2^20 the roundings of g, A c, k0 and u move it by less than 0.3
// (relative errors 2^-24 on terms below 2^21.6), so u < 7 on every key of a nonzero block; a
// zero block's operand is 0 for any w <= 1. (tests/reference/test_direct_fast.cc hunts it.)
FP4ATTN_HD bool direct_cap_free(float m) { return fabsf(m) <= 0x1p20f; }

// E2M1 code of one probability: x = (z - m) - e_B + log2(6); RNE to E2M1, satfinite at 6.
// A NaN x gives code 0: the NaN is carried by the block (see numerics.md).
FP4ATTN_HD uint8_t direct_p_code(float x, float a, float b) {
  float u = fmaxf(0.f, fmaf(a, x, b));
  return float_to_e2m1(u);
}

// V block along tokens as the paper's MXFP4 V: alpha = nearest power of two of the block amax
// (switch at 1.5 * 2^k, ties up), codes q = RN_E2M1(v * (6 / alpha)); the value is alpha * q / 6.
// Returns the exponent of alpha (clamped to [-127, 127]); NaN/Inf blocks return kDirectNanExp.
constexpr int kDirectNanExp = 128;
FP4ATTN_HD int direct_v_quantize_block(const float* v, int n, int64_t stride, uint8_t* codes) {
  float amax = 0.f;
  bool nan = false;
  for (int i = 0; i < n; ++i) {
    float a = fabsf(v[i * stride]);
    if (!(a <= 3.402823466e38f)) nan = true;  // NaN or Inf
    amax = fmaxf(amax, a);
  }
  if (nan || amax == 0.f) {
    for (int i = 0; i < n; ++i) codes[i] = 0;
    return nan ? kDirectNanExp : -127;
  }
  int e = floor_log2(amax);
  if (amax >= 1.5f * ldexpf(1.f, e)) ++e;  // nearest power of two, ties up
  e = e < -127 ? -127 : (e > 127 ? 127 : e);
  // v * 2^-e is exact (|v| < 1.5 * 2^e cannot overflow), then one rounding by the * 6; 6 * 2^-e
  // as a single factor would overflow FP32 at e = -127.
  for (int i = 0; i < n; ++i) codes[i] = float_to_e2m1(ldexpf(v[i * stride], -e) * 6.f);
  return e;
}

}  // namespace fp4attn
