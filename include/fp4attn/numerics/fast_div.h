// Correctly rounded FP32 quotients without the division routine, for the two divisions of
// nvfp4-all's P quantization (a per-block scale and its inverse): one reciprocal multiply and one
// FMA correction. Equal to IEEE x / y on the domains below, checked exhaustively by
// tests/formats/test_fast_div.cc; outside them the plain division is used.
#pragma once

#include <cmath>

#include "fp4attn/numerics/config.h"
#include "fp4attn/numerics/formats.h"

namespace fp4attn {

namespace detail {
FP4ATTN_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
FP4ATTN_HD float rcp_rn(float x) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(x);
#else
  return 1.f / x;
#endif
}
}  // namespace detail

// x / 6 for every x in [2^-125, 1] (below, the quotient is subnormal and the correction can be
// off by one unit, so the division is kept).
FP4ATTN_HD float div6_rn(float x) {
  if (!(x >= 0x1p-125f && x <= 1.f)) return detail::div_rn(x, 6.f);
  constexpr float kSixth = 1.f / 6.f;
  const float q0 = detail::mul_rn(x, kSixth);
  const float r = detail::fma_rn(-q0, 6.f, x);
  return detail::fma_rn(r, kSixth, q0);
}

// n / f for f any positive finite E4M3 value and n = 2688 (nvfp4-all's global P scale).
FP4ATTN_HD float div_2688_by_e4m3_rn(float f) {
  const float rc = detail::rcp_rn(f);
  const float q0 = detail::mul_rn(2688.f, rc);
  const float r = detail::fma_rn(-q0, f, 2688.f);
  return detail::fma_rn(r, rc, q0);
}

}  // namespace fp4attn
