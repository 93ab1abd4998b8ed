// fp4-direct's Direct-P pieces (include/fp4attn/numerics/direct_p.h): the block exponent rounds to
// the nearest power of two, the affine surrogate stays within one E2M1 code of Q_E2M1(2^x), and the
// paper's MXFP4 V reconstructs alpha * q / 6 within half an E2M1 step.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "fp4attn/numerics/direct_p.h"
#include "fp4attn/numerics/formats.h"

namespace fp4attn {
namespace {

TEST(DirectP, BlockExponentIsTheNearestPowerOfTwo) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> g(-40.f, 0.f);
  for (int i = 0; i < 100000; ++i) {
    const float x = g(rng);
    const double ratio = std::exp2(double(x) - direct_block_exponent(x));
    EXPECT_GE(ratio, 0.75 * (1 - 1e-6)) << x;
    EXPECT_LT(ratio, 1.5 * (1 + 1e-6)) << x;
  }
  // The switch sits at 1.5 * 2^k and goes up there.
  EXPECT_EQ(direct_block_exponent(static_cast<float>(std::log2(1.5))), 1);
  EXPECT_EQ(direct_block_exponent(static_cast<float>(std::log2(1.49))), 0);
  EXPECT_EQ(direct_block_exponent(0.f), 0);
  EXPECT_EQ(direct_block_exponent(-1.f), -1);
}

// The surrogate max(0, 1.5 x + 1.2) against the ideal code of 2^x over the range a block's
// values take (x up to log2(9), the largest block max before saturation): never more than one
// code apart; agreement over a uniform sweep of [-4, 3.1] measured 55.6% (guarded at 50%).
TEST(DirectP, SurrogateIsWithinOneCodeOfTheIdealCode) {
  const int n = 200000;
  int agree = 0;
  for (int i = 0; i < n; ++i) {
    const float x = -4.f + 7.1f * (i + 0.5f) / n;
    const int a = direct_p_code(x, kDirectA, kDirectB);
    const int b = float_to_e2m1(std::exp2(x));
    EXPECT_LE(std::abs(a - b), 1) << "x=" << x;
    agree += a == b;
  }
  EXPECT_GT(double(agree) / n, 0.50);
  // Far below the block max the surrogate gives code 0, as Q_E2M1(2^x) does below x = -2.
  EXPECT_EQ(direct_p_code(-5.f, kDirectA, kDirectB), 0);
  EXPECT_EQ(direct_p_code(4.f, kDirectA, kDirectB), 7);  // satfinite at 6
  EXPECT_EQ(direct_p_code(std::nanf(""), kDirectA, kDirectB), 0);
}

TEST(DirectP, VBlocksReconstructWithinHalfAStep) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  std::vector<float> v(kDirectBlock);
  uint8_t codes[kDirectBlock];
  for (int trial = 0; trial < 2000; ++trial) {
    const float mag = std::ldexp(1.f, trial % 60 - 30);
    for (float& x : v) x = nd(rng) * mag;
    const int e = direct_v_quantize_block(v.data(), kDirectBlock, 1, codes);
    float amax = 0;
    for (float x : v) amax = std::max(amax, std::fabs(x));
    const double alpha = std::ldexp(1.0, e);
    EXPECT_GE(amax / alpha, 0.75);
    EXPECT_LT(amax / alpha, 1.5);
    for (int i = 0; i < kDirectBlock; ++i) {
      const double value = alpha * e2m1_to_float(codes[i]) / 6;
      const double err = std::fabs(value - v[i]);
      // Half of the widest E2M1 step (2, between 4 and 6) in value units, or saturation at 6.
      if (std::fabs(v[i]) * 6 / alpha <= 6) {
        EXPECT_LE(err, alpha / 6 + 1e-12 * alpha) << trial << " " << i;
      } else {
        EXPECT_EQ(std::fabs(e2m1_to_float(codes[i])), 6.f);
      }
    }
  }
  // NaN and Inf mark the block; an all-zero block gets zero codes.
  v.assign(kDirectBlock, 1.f);
  v[3] = std::numeric_limits<float>::infinity();
  EXPECT_EQ(direct_v_quantize_block(v.data(), kDirectBlock, 1, codes), kDirectNanExp);
  v.assign(kDirectBlock, 0.f);
  EXPECT_EQ(direct_v_quantize_block(v.data(), kDirectBlock, 1, codes), -127);
  for (uint8_t c : codes) EXPECT_EQ(c, 0);
}

}  // namespace
}  // namespace fp4attn
