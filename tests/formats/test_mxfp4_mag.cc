// The MXFP4 fast path of the GPU quantizers (packed::mxfp4_block_mag, packed_blocks.cuh) drops the
// E2M1 clamp at 6 for the round-up exponent rule. Checked here on the host: (1) the unclamped term
// e2m1_mag_term_le6 equals e2m1_mag_term on [0, 6] (a prime stride over every float there, plus
// every grid point and midpoint and their neighbours); (2) the precondition: with the reference's
// round-up exponent (mxfp4_quantize_block's scale code), every |x| 2^-e of a block is <= 6, on
// random blocks over the whole exponent range (E8M0 clamps included) and on adversarial amaxes
// (significands just above 1.5, powers of two, FLT_MAX, subnormals).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "cuda/quantize/packed_common.cuh"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"

namespace fp4attn {
namespace {

TEST(Mxfp4MagTerm, UnclampedTermEqualsClampedOnZeroToSix) {
  const uint32_t hi = float_bits(6.f);
  int64_t bad = 0, checked = 0;
  for (uint32_t b = 0; b <= hi; b += 13) {
    const float a = bits_float(b);
    bad += packed::e2m1_mag_term_le6(a) != packed::e2m1_mag_term(a);
    ++checked;
  }
  for (float g :
       {0.f, 0.25f, 0.5f, 0.75f, 1.f, 1.25f, 1.5f, 1.75f, 2.f, 2.5f, 3.f, 3.5f, 4.f, 5.f, 6.f}) {
    for (int k = -3; k <= 3; ++k) {
      const uint32_t b = float_bits(g) + static_cast<uint32_t>(k);
      const float a = bits_float(b);
      if (!(a >= 0.f && a <= 6.f)) continue;
      bad += packed::e2m1_mag_term_le6(a) != packed::e2m1_mag_term(a);
      ++checked;
    }
  }
  EXPECT_EQ(bad, 0) << "of " << checked;
}

// max_i |x_i| 2^-e for the reference's round-up scale code (exact: a power-of-two scaling in
// double).
double scaled_amax(const float* x, int n) {
  uint8_t codes[kMxfp4Block];
  const uint8_t scale = mxfp4_quantize_block(x, n, MxScaleRule::kRoundUp, codes);
  if (scale == 0xFF || scale == 0x00) return 0.0;
  double m = 0.0;
  for (int i = 0; i < n; ++i) {
    m = std::fmax(m, std::ldexp(std::fabs(static_cast<double>(x[i])), 127 - int{scale}));
  }
  return m;
}

TEST(Mxfp4MagTerm, RoundUpScaledValuesAtMostSix) {
  std::mt19937_64 rng(46);
  std::normal_distribution<float> normal(0.f, 1.f);
  double worst = 0.0;
  int64_t blocks = 0;
  for (int b = 0; b < 200'000; ++b) {
    float x[kMxfp4Block];
    const int e = static_cast<int>(rng() % 300) - 170;  // subnormals .. near FLT_MAX
    for (float& v : x) v = std::ldexp(normal(rng), e);
    worst = std::fmax(worst, scaled_amax(x, kMxfp4Block));
    ++blocks;
  }
  // Adversarial amaxes: significands around 1.5 (the round-up boundary), powers of two, the
  // extremes of the range.
  for (int e = -149; e <= 127; ++e) {
    for (float sig : {1.f, 0x1.7ffffep0f, 1.5f, 0x1.800002p0f, 0x1.fffffep0f}) {
      float x[kMxfp4Block] = {};
      x[0] = std::ldexp(sig, e);
      x[1] = -x[0];
      if (!std::isfinite(x[0]) || x[0] == 0.f) continue;
      worst = std::fmax(worst, scaled_amax(x, kMxfp4Block));
      ++blocks;
    }
  }
  float x[kMxfp4Block] = {};
  x[3] = 3.4028235e38f;
  worst = std::fmax(worst, scaled_amax(x, kMxfp4Block));
  EXPECT_LE(worst, 6.0) << "over " << blocks << " blocks";
  EXPECT_GT(worst, 5.99);  // the bound is reached (amax = 1.5 * 2^k)
}

}  // namespace
}  // namespace fp4attn
