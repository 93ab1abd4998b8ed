// Direct-P numerics of the `fp4-direct` recipe (arXiv 2609.04105, section 4), host and device.
// docs/numerics.md lists where fp4attn follows the paper and where it departs.
#pragma once

#include <cmath>
#include <cstdint>

#include "fp4attn/config.h"
#include "fp4attn/formats.h"

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
