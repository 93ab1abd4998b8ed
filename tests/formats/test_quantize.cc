// Block quantizers: every NVFP4/MXFP4 scale rule, FP8 blocks, tensor scales, special blocks (zero,
// NaN, Inf, tails, tiny and huge magnitudes) and reconstruction error bounds against float64.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"
#include "support/codec_reference.h"

namespace fp4attn {
namespace {

using testing::from_bits;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr Nvfp4ScaleRule kNvRules[] = {Nvfp4ScaleRule::kNearest, Nvfp4ScaleRule::kRoundUp,
                                       Nvfp4ScaleRule::kFourOverSix, Nvfp4ScaleRule::kRestricted};
constexpr MxScaleRule kMxRules[] = {MxScaleRule::kOcpFloor, MxScaleRule::kRoundUp};

const std::vector<double>& e2m1_mags() {
  static const std::vector<double> m = testing::finite_magnitudes(testing::kE2M1);
  return m;
}
const std::vector<double>& e4m3_mags() {
  static const std::vector<double> m = testing::finite_magnitudes(testing::kE4M3);
  return m;
}
int ref_e2m1(double x) { return testing::ref_encode(testing::kE2M1, e2m1_mags(), x); }
int ref_e4m3(double x) { return testing::ref_encode(testing::kE4M3, e4m3_mags(), x); }

// Half the gap between the E2M1 values around |y| (|y| <= 6): the worst rounding error there.
double e2m1_half_step(double y) {
  y = std::fabs(y);
  return y <= 2 ? 0.25 : (y <= 4 ? 0.5 : 1.0);
}

// A block of n values: Gaussian times 2^shift, with a few exact outliers mixed in.
std::vector<float> random_block(std::mt19937_64& rng, int n, int shift) {
  std::normal_distribution<float> g;
  std::vector<float> x(n);
  for (float& v : x) v = std::ldexp(g(rng), shift);
  if (n > 3 && (rng() & 3) == 0) x[rng() % n] = std::ldexp(g(rng) * 8.f, shift);
  return x;
}

double ref_amax(const std::vector<float>& x) {
  double m = 0;
  for (float v : x) m = std::max(m, std::fabs(static_cast<double>(v)));
  return m;
}

// ---- amax and tensor scale --------------------------------------------------------------------

TEST(BlockAmax, PropagatesNanThenInf) {
  std::vector<float> x = {1.f, -3.f, 2.f, -0.f, from_bits(5u)};
  EXPECT_EQ(block_amax(x.data(), 5), 3.f);
  EXPECT_EQ(block_amax(x.data(), 0), 0.f);
  EXPECT_EQ(block_amax(x.data() + 3, 2), from_bits(5u)) << "subnormals count";
  for (int pos = 0; pos < 5; ++pos) {
    std::vector<float> y = x;
    y[pos] = -kInf;
    EXPECT_EQ(block_amax(y.data(), 5), kInf);
    y[(pos + 2) % 5] = -kNan;
    EXPECT_TRUE(std::isnan(block_amax(y.data(), 5))) << "NaN wins over Inf at " << pos;
  }
  const float zeros[] = {-0.f, 0.f, -0.f};
  EXPECT_EQ(testing::to_bits(block_amax(zeros, 3)), 0u) << "+0";
  const float strided[] = {1.f, 100.f, -2.f, 100.f, 0.5f};
  EXPECT_EQ(strided_amax(strided, 3, 2), 2.f);
}

TEST(TensorScale, EdgeCases) {
  for (Nvfp4ScaleRule r : kNvRules) {
    for (float a : {0.f, -0.f, kNan, kInf, -kInf, -1.f}) EXPECT_EQ(nvfp4_tensor_scale(a, r), 1.f);
    EXPECT_EQ(nvfp4_tensor_scale(from_bits(1u), r), FLT_MAX) << "2688 / 2^-149 overflows";
    EXPECT_GT(nvfp4_tensor_scale(FLT_MAX, r), 0.f) << "no underflow to zero";
  }
  const double top_default = 448.0 * 6, top_restricted = 384.0 * 6;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<uint32_t> bits(1u, 0x7F7FFFFFu);
  for (int i = 0; i < 100000; ++i) {
    const float a = from_bits(bits(rng));
    // A float quotient is the double quotient rounded to float (double has > 2 * 24 + 2 bits).
    const double q = top_default / a, qr = top_restricted / a;
    const auto clamp = [](double v) { return std::isinf(float(v)) ? FLT_MAX : float(v); };
    ASSERT_EQ(nvfp4_tensor_scale(a, Nvfp4ScaleRule::kNearest), clamp(q)) << a;
    ASSERT_EQ(nvfp4_tensor_scale(a, Nvfp4ScaleRule::kRoundUp), clamp(q)) << a;
    ASSERT_EQ(nvfp4_tensor_scale(a, Nvfp4ScaleRule::kRestricted), clamp(qr)) << a;
  }
}

// ---- NVFP4 ------------------------------------------------------------------------------------

// Independent re-derivation of the codes of a block for a given scale, with the reference encoder.
std::vector<uint8_t> ref_nvfp4_codes(const std::vector<float>& x, float s_enc, uint8_t scale) {
  const float f = static_cast<float>(testing::ref_value(testing::kE4M3, scale));
  std::vector<uint8_t> codes(x.size(), 0);
  if (f == 0.f) return codes;
  const float inv = s_enc / f;
  for (size_t i = 0; i < x.size(); ++i) codes[i] = static_cast<uint8_t>(ref_e2m1(x[i] * inv));
  return codes;
}

float nv_sf(const std::vector<float>& x, float s_enc) {
  return (static_cast<float>(ref_amax(x)) / 6.f) * s_enc;
}

// Random blocks with s_enc either 1 or a tensor scale for a random tensor amax.
struct NvCase {
  std::vector<float> x;
  float s_enc;
};
std::vector<NvCase> nv_cases(Nvfp4ScaleRule rule, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<NvCase> out;
  for (int i = 0; i < count; ++i) {
    const int n = 1 + static_cast<int>(rng() % kNvfp4Block);
    const int shift = static_cast<int>(rng() % 40) - 20;
    NvCase c{random_block(rng, n, shift), 1.f};
    if (i % 2) {
      const float tensor_amax = static_cast<float>(ref_amax(c.x)) * (1.f + (rng() % 64));
      c.s_enc = nvfp4_tensor_scale(tensor_amax, rule);
    }
    out.push_back(std::move(c));
  }
  return out;
}

TEST(Nvfp4Block, NearestMatchesReference) {
  for (const NvCase& c : nv_cases(Nvfp4ScaleRule::kNearest, 20000, 11)) {
    const int n = static_cast<int>(c.x.size());
    std::vector<uint8_t> codes(n);
    const uint8_t scale =
        nvfp4_quantize_block(c.x.data(), n, c.s_enc, Nvfp4ScaleRule::kNearest, codes.data());
    ASSERT_EQ(scale, ref_e4m3(nv_sf(c.x, c.s_enc)));
    ASSERT_EQ(codes, ref_nvfp4_codes(c.x, c.s_enc, scale));
  }
}

TEST(Nvfp4Block, RoundUpIsTheSmallestScaleAboveAndNeverSaturates) {
  for (const NvCase& c : nv_cases(Nvfp4ScaleRule::kRoundUp, 20000, 12)) {
    const int n = static_cast<int>(c.x.size());
    std::vector<uint8_t> codes(n);
    const uint8_t scale =
        nvfp4_quantize_block(c.x.data(), n, c.s_enc, Nvfp4ScaleRule::kRoundUp, codes.data());
    const float sf = nv_sf(c.x, c.s_enc);
    const double f = testing::ref_value(testing::kE4M3, scale);
    if (sf > 448.f) {
      ASSERT_EQ(scale, 0x7E);
      continue;
    }
    ASSERT_GE(f, sf);
    if (scale > 0) {
      ASSERT_LT(testing::ref_value(testing::kE4M3, scale - 1), sf);
    }
    ASSERT_EQ(codes, ref_nvfp4_codes(c.x, c.s_enc, scale));
    // No element maps above the largest E2M1 value, up to the FP32 rounding of sf and inv.
    for (float v : c.x) ASSERT_LE(std::fabs(v) * c.s_enc / f, 6.0 * (1 + 0x1p-20)) << v;
  }
}

// The restricted scales: {1, 1.25, 1.5} * 2^e, e in [-3, 8], ascending.
std::vector<double> restricted_scales() {
  std::vector<double> s;
  for (int e = -3; e <= 8; ++e)
    for (double m : {1.0, 1.25, 1.5}) s.push_back(std::ldexp(m, e));
  return s;
}

TEST(Nvfp4Block, RestrictedScalesFoldExactlyIntoE4m3) {
  for (double s : restricted_scales()) {
    const int code = ref_e4m3(s);
    ASSERT_EQ(testing::ref_value(testing::kE4M3, code), s) << "a restricted scale is an E4M3";
    EXPECT_TRUE((code & 0x7) == 0 || (code & 0x7) == 2 || (code & 0x7) == 4) << s;
    for (int c = 0; c < 16; ++c) {
      const double product = testing::ref_value(testing::kE2M1, c) * s / 8;
      const uint8_t q = float_to_e4m3(static_cast<float>(product));
      EXPECT_EQ(static_cast<double>(e4m3_to_float(q)), product) << c << " * " << s << " / 8";
    }
  }
}

TEST(Nvfp4Block, RestrictedPicksTheSmallestAllowedScaleAbove) {
  const std::vector<double> allowed = restricted_scales();
  for (const NvCase& c : nv_cases(Nvfp4ScaleRule::kRestricted, 20000, 13)) {
    const int n = static_cast<int>(c.x.size());
    std::vector<uint8_t> codes(n);
    const uint8_t scale =
        nvfp4_quantize_block(c.x.data(), n, c.s_enc, Nvfp4ScaleRule::kRestricted, codes.data());
    const float sf = nv_sf(c.x, c.s_enc);
    double want = 0;
    if (sf > 384.f) {
      want = 384;
    } else if (sf > 0.f) {
      want = *std::lower_bound(allowed.begin(), allowed.end(), static_cast<double>(sf));
    }
    ASSERT_EQ(testing::ref_value(testing::kE4M3, scale), want) << sf;
    ASSERT_TRUE((scale & 0x7) == 0 || (scale & 0x7) == 2 || (scale & 0x7) == 4);
    ASSERT_EQ(codes, ref_nvfp4_codes(c.x, c.s_enc, scale));
  }
  uint8_t codes[1];
  const float tiny = 1e-3f;  // sf = 1.7e-4 < 0.125: the smallest allowed scale
  EXPECT_EQ(nvfp4_quantize_block(&tiny, 1, 1.f, Nvfp4ScaleRule::kRestricted, codes),
            ref_e4m3(0.125));
  const float big = 1e6f;
  EXPECT_EQ(nvfp4_quantize_block(&big, 1, 1.f, Nvfp4ScaleRule::kRestricted, codes), ref_e4m3(384));
}

// Squared error of a block dequantized with (codes, scale), summed the way the rule does.
float f32_sq_error(const std::vector<float>& x, const std::vector<uint8_t>& codes, uint8_t scale,
                   float s_enc) {
  float err = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float deq = static_cast<float>(testing::ref_value(testing::kE2M1, codes[i]) *
                                         testing::ref_value(testing::kE4M3, scale)) /
                      s_enc;
    const float d = x[i] - deq;
    err = std::fma(d, d, err);
  }
  return err;
}

double f64_sq_error(const std::vector<float>& x, const std::vector<uint8_t>& codes, uint8_t scale,
                    float s_enc) {
  double err = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double deq = testing::ref_value(testing::kE2M1, codes[i]) *
                       testing::ref_value(testing::kE4M3, scale) / s_enc;
    err += (x[i] - deq) * (x[i] - deq);
  }
  return err;
}

TEST(Nvfp4Block, FourOverSixIsNeverWorseThanNearest) {
  int picked_four = 0;
  for (const NvCase& c : nv_cases(Nvfp4ScaleRule::kFourOverSix, 20000, 14)) {
    const int n = static_cast<int>(c.x.size());
    std::vector<uint8_t> codes(n), near_codes(n);
    const uint8_t scale =
        nvfp4_quantize_block(c.x.data(), n, c.s_enc, Nvfp4ScaleRule::kFourOverSix, codes.data());
    const uint8_t near =
        nvfp4_quantize_block(c.x.data(), n, c.s_enc, Nvfp4ScaleRule::kNearest, near_codes.data());
    const float amax = static_cast<float>(ref_amax(c.x));
    const uint8_t c4 = static_cast<uint8_t>(ref_e4m3((amax / 4.f) * c.s_enc));
    ASSERT_TRUE(scale == near || scale == c4);
    ASSERT_EQ(codes, ref_nvfp4_codes(c.x, c.s_enc, scale));
    const float err = f32_sq_error(c.x, codes, scale, c.s_enc);
    const float err_near = f32_sq_error(c.x, near_codes, near, c.s_enc);
    ASSERT_LE(err, err_near);
    if (scale != near) {
      ++picked_four;
      ASSERT_LT(err, err_near) << "c4 only when strictly better";
      ASSERT_LE(f64_sq_error(c.x, codes, scale, c.s_enc),
                f64_sq_error(c.x, near_codes, near, c.s_enc) * (1 + 1e-5));
    } else {
      const std::vector<uint8_t> codes4 = ref_nvfp4_codes(c.x, c.s_enc, c4);
      ASSERT_FALSE(f32_sq_error(c.x, codes4, c4, c.s_enc) < err_near);
    }
  }
  EXPECT_GT(picked_four, 1000) << "the rule should matter on Gaussian blocks";
}

TEST(Nvfp4Block, FourOverSixHelpsValuesBetweenFourAndSixScales) {
  // With amax scaled to 6, 5 * s lands between E2M1 4 and 6; scaled to 4, the block is exact.
  const float x[] = {4.f, 3.f, 2.f, 1.f};  // sf = 4/6: E4M3 0.625 (nearest); c4 = 1 is exact
  uint8_t codes[4];
  const uint8_t scale = nvfp4_quantize_block(x, 4, 1.f, Nvfp4ScaleRule::kFourOverSix, codes);
  EXPECT_EQ(e4m3_to_float(scale), 1.f);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(nvfp4_dequantize(codes[i], scale, 1.f), x[i]);
}

TEST(Nvfp4Block, ZeroBlocksAndScalesThatRoundToZero) {
  const float zeros[kNvfp4Block] = {0.f, -0.f};
  for (Nvfp4ScaleRule r : kNvRules) {
    std::vector<uint8_t> codes(kNvfp4Block, 0xAA);
    EXPECT_EQ(nvfp4_quantize_block(zeros, kNvfp4Block, 1.f, r, codes.data()), 0x00)
        << scale_rule_name(r);
    for (uint8_t c : codes) EXPECT_EQ(c & 0x7, 0);
  }
  // kNearest, sf = 1e-5 / 6 is below half of E4M3's smallest subnormal 2^-9: scale and codes 0.
  std::mt19937_64 rng(15);
  const std::vector<float> tiny = random_block(rng, kNvfp4Block, -20);
  std::vector<uint8_t> codes(kNvfp4Block, 0xAA);
  ASSERT_LT(nv_sf(tiny, 1.f), std::ldexp(1.f, -10));
  EXPECT_EQ(
      nvfp4_quantize_block(tiny.data(), kNvfp4Block, 1.f, Nvfp4ScaleRule::kNearest, codes.data()),
      0x00);
  for (uint8_t c : codes) EXPECT_EQ(nvfp4_dequantize(c, 0x00, 1.f), 0.f);
  // kRoundUp never rounds a nonzero block's scale to zero.
  EXPECT_EQ(
      nvfp4_quantize_block(tiny.data(), kNvfp4Block, 1.f, Nvfp4ScaleRule::kRoundUp, codes.data()),
      0x01);
}

TEST(Nvfp4Block, NanOrInfGivesNanScaleAndZeroCodes) {
  for (Nvfp4ScaleRule r : kNvRules) {
    for (float bad : {kNan, -kNan, kInf, -kInf}) {
      for (int pos : {0, 7, 15}) {
        std::vector<float> x(kNvfp4Block, 1.5f);
        x[pos] = bad;
        std::vector<uint8_t> codes(kNvfp4Block, 0xAA);
        const uint8_t scale = nvfp4_quantize_block(x.data(), kNvfp4Block, 3.f, r, codes.data());
        EXPECT_EQ(scale, 0x7F) << scale_rule_name(r);
        for (uint8_t c : codes) {
          EXPECT_EQ(c, 0);
          EXPECT_TRUE(std::isnan(nvfp4_dequantize(c, scale, 3.f)));
        }
      }
    }
    const float one = 1.f;
    uint8_t code;
    EXPECT_EQ(nvfp4_quantize_block(&one, 1, kNan, r, &code), 0x7F) << "NaN s_enc";
  }
}

TEST(Nvfp4Block, TailBlocksMatchZeroPadding) {
  std::mt19937_64 rng(16);
  for (Nvfp4ScaleRule r : kNvRules) {
    for (int n = 1; n < kNvfp4Block; ++n) {
      std::vector<float> padded = random_block(rng, kNvfp4Block, 0);
      std::fill(padded.begin() + n, padded.end(), 0.f);
      std::vector<uint8_t> full(kNvfp4Block), tail(kNvfp4Block, 0xAA);
      const uint8_t s_full = nvfp4_quantize_block(padded.data(), kNvfp4Block, 5.f, r, full.data());
      const uint8_t s_tail = nvfp4_quantize_block(padded.data(), n, 5.f, r, tail.data());
      EXPECT_EQ(s_tail, s_full);
      for (int i = 0; i < kNvfp4Block; ++i) EXPECT_EQ(tail[i], i < n ? full[i] : 0xAA) << i;
    }
  }
}

TEST(Nvfp4Block, ErrorBoundsAgainstFloat64) {
  for (Nvfp4ScaleRule r : kNvRules) {
    for (const NvCase& c : nv_cases(r, 5000, 17)) {
      const int n = static_cast<int>(c.x.size());
      std::vector<uint8_t> codes(n);
      const uint8_t scale = nvfp4_quantize_block(c.x.data(), n, c.s_enc, r, codes.data());
      const double f = testing::ref_value(testing::kE4M3, scale);
      const double unit = f / c.s_enc;  // one E2M1 unit in x's units
      for (int i = 0; i < n; ++i) {
        const double x = c.x[i];
        const double deq = nvfp4_dequantize(codes[i], scale, c.s_enc);
        ASSERT_EQ(deq,
                  static_cast<float>(testing::ref_value(testing::kE2M1, codes[i]) * f / c.s_enc))
            << "dequantize is the exact product, divided once";
        const double slack = 0x1p-20 * (std::fabs(x) + std::fabs(deq)) + 1e-300;
        if (f == 0) {
          ASSERT_LE(std::fabs(x), std::ldexp(1.0, -10) / c.s_enc * 6.01) << "scale rounded to 0";
          continue;
        }
        const double y = x / unit;
        if (std::fabs(y) <= 6) {
          ASSERT_LE(std::fabs(x - deq), e2m1_half_step(y) * unit + slack) << scale_rule_name(r);
          continue;
        }
        // Saturation: the code is +-6. kRoundUp and kRestricted only saturate at their largest
        // scale (or by FP32 rounding noise); the nearest scale of a normal sf is within 1/16.
        ASSERT_EQ(codes[i] & 0x7, 0x7) << y;
        const bool capped = scale == 0x7E || (r == Nvfp4ScaleRule::kRestricted && f == 384);
        if (r == Nvfp4ScaleRule::kRoundUp || r == Nvfp4ScaleRule::kRestricted) {
          ASSERT_TRUE(capped || std::fabs(y) <= 6 * (1 + 0x1p-20)) << scale_rule_name(r) << y;
        } else if (!capped && f >= 0x1p-6) {
          ASSERT_LE(std::fabs(y), 6 * 17.0 / 16 * (1 + 0x1p-20)) << scale_rule_name(r);
        }
      }
    }
  }
}

// ---- MXFP4 ------------------------------------------------------------------------------------

int frexp_floor_log2(double a) {
  int e;
  std::frexp(a, &e);
  return e - 1;
}

TEST(Mxfp4Block, ScaleRulesAndCodesMatchFloat64Reference) {
  std::mt19937_64 rng(21);
  for (MxScaleRule r : kMxRules) {
    for (int i = 0; i < 20000; ++i) {
      const int n = 1 + static_cast<int>(rng() % kMxfp4Block);
      const std::vector<float> x = random_block(rng, n, static_cast<int>(rng() % 200) - 100);
      std::vector<uint8_t> codes(n);
      const uint8_t scale = mxfp4_quantize_block(x.data(), n, r, codes.data());
      const double amax = ref_amax(x);
      int e = frexp_floor_log2(amax) - 2;
      if (r == MxScaleRule::kRoundUp && amax > 6 * std::ldexp(1.0, e)) ++e;
      e = std::clamp(e, -127, 127);
      ASSERT_EQ(scale, e + 127);
      if (r == MxScaleRule::kRoundUp) {
        ASSERT_LE(amax, 6 * std::ldexp(1.0, e));
        ASSERT_GT(amax, 6 * std::ldexp(1.0, e - 1)) << "smallest such e";
      }
      for (int j = 0; j < n; ++j) {
        const double y = std::ldexp(static_cast<double>(x[j]), -e);  // exact
        ASSERT_EQ(codes[j], ref_e2m1(y)) << x[j] << " e " << e;
        const double deq = mxfp4_dequantize(codes[j], scale);
        if (std::fabs(y) <= 6) {
          ASSERT_LE(std::fabs(x[j] - deq), e2m1_half_step(y) * std::ldexp(1.0, e));
        } else {
          ASSERT_EQ(r, MxScaleRule::kOcpFloor);
          ASSERT_LT(std::fabs(y), 8);
          ASSERT_EQ(std::fabs(deq), 6 * std::ldexp(1.0, e)) << "saturates to 6";
        }
      }
    }
  }
}

TEST(Mxfp4Block, OcpFloorSaturatesBetweenSixAndEight) {
  const float x[] = {7.f, -7.5f, 6.5f, 1.f};  // amax 7.5: e = floor(log2 7.5) - 2 = 0
  uint8_t codes[4];
  EXPECT_EQ(mxfp4_quantize_block(x, 4, MxScaleRule::kOcpFloor, codes), 127);
  EXPECT_EQ(codes[0], 0x7);
  EXPECT_EQ(codes[1], 0xF);
  EXPECT_EQ(codes[2], 0x7);
  EXPECT_EQ(codes[3], 0x2);
  EXPECT_EQ(mxfp4_quantize_block(x, 4, MxScaleRule::kRoundUp, codes), 128) << "7.5 <= 6 * 2";
}

TEST(Mxfp4Block, RoundUpKeepsAmaxOfExactlySixUnits) {
  // amax = 6 * 2^k is representable with e = k (code 6 = 0x7); one ulp above needs e = k + 1.
  for (int k : {-130, -127, -126, -20, 0, 5, 125}) {
    const float six = std::ldexp(6.f, k);
    uint8_t code;
    EXPECT_EQ(mxfp4_quantize_block(&six, 1, MxScaleRule::kRoundUp, &code), std::max(k, -127) + 127);
    EXPECT_EQ(code, k >= -127 ? 0x7 : float_to_e2m1(std::ldexp(6.f, k + 127)));
    const float above = std::nextafter(six, kInf);
    EXPECT_EQ(mxfp4_quantize_block(&above, 1, MxScaleRule::kRoundUp, &code),
              std::max(k + 1, -127) + 127);
  }
}

TEST(Mxfp4Block, SpecialBlocks) {
  for (MxScaleRule r : kMxRules) {
    const float zeros[3] = {0.f, -0.f, 0.f};
    uint8_t codes[kMxfp4Block];
    EXPECT_EQ(mxfp4_quantize_block(zeros, 3, r, codes), 0x00);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(codes[i], 0);
    for (float bad : {kNan, kInf, -kInf}) {
      std::vector<float> x(kMxfp4Block, 2.f);
      x[31] = bad;
      EXPECT_EQ(mxfp4_quantize_block(x.data(), kMxfp4Block, r, codes), 0xFF);
      for (uint8_t c : codes) {
        EXPECT_EQ(c, 0);
        EXPECT_TRUE(std::isnan(mxfp4_dequantize(c, 0xFF)));
      }
    }
  }
}

TEST(Mxfp4Block, ExponentClampsAndSubnormalBlocks) {
  uint8_t codes[2];
  // amax near 2^-140: e = -142 clamps to -127; x * 2^127 is exact.
  const float tiny[] = {std::ldexp(1.5f, -140), std::ldexp(-1.f, -141)};
  EXPECT_EQ(mxfp4_quantize_block(tiny, 2, MxScaleRule::kOcpFloor, codes), 0x00);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[1], 0x8);
  // Subnormal blocks that still have nonzero codes after the clamp.
  const float sub[] = {std::ldexp(1.5f, -127), std::ldexp(-1.f, -128)};
  for (MxScaleRule r : kMxRules) {
    EXPECT_EQ(mxfp4_quantize_block(sub, 2, r, codes), 0x00);
    EXPECT_EQ(codes[0], float_to_e2m1(1.5f));
    EXPECT_EQ(codes[1], float_to_e2m1(-0.5f));
    EXPECT_EQ(mxfp4_dequantize(codes[0], 0), sub[0]);
    EXPECT_EQ(mxfp4_dequantize(codes[1], 0), sub[1]);
  }
  // The top of the float range: e = 125 (floor) / 126 (round up); never the clamp at 127.
  const float huge[] = {FLT_MAX, std::ldexp(1.f, 127)};
  EXPECT_EQ(mxfp4_quantize_block(huge, 2, MxScaleRule::kOcpFloor, codes), 125 + 127);
  EXPECT_EQ(codes[0], 0x7);
  EXPECT_EQ(codes[1], float_to_e2m1(4.f));
  EXPECT_EQ(mxfp4_quantize_block(huge, 2, MxScaleRule::kRoundUp, codes), 126 + 127);
  EXPECT_EQ(codes[0], float_to_e2m1(4.f));
  EXPECT_EQ(codes[1], float_to_e2m1(2.f));
  EXPECT_EQ(mxfp4_dequantize(0x7, 254), kInf) << "6 * 2^127 overflows FP32";
  EXPECT_EQ(mxfp4_dequantize(0x2, 254), std::ldexp(1.f, 127));
}

TEST(Mxfp4Block, PowerOfTwoScalingSplitsBelowTheNormalRange) {
  // x * 2^k with 2^k subnormal: split in two normal factors, exact for normal results.
  EXPECT_EQ(detail::scale_pow2(std::ldexp(1.f, 100), -127), std::ldexp(1.f, -27));
  EXPECT_EQ(detail::scale_pow2(std::ldexp(1.75f, 120), -200), std::ldexp(1.75f, -80));
  EXPECT_EQ(detail::scale_pow2(3.f, 127), std::ldexp(3.f, 127));
}

TEST(Mxfp4Block, TailBlocksMatchZeroPadding) {
  std::mt19937_64 rng(22);
  for (MxScaleRule r : kMxRules) {
    for (int n = 1; n < kMxfp4Block; ++n) {
      std::vector<float> padded = random_block(rng, kMxfp4Block, 3);
      std::fill(padded.begin() + n, padded.end(), 0.f);
      std::vector<uint8_t> full(kMxfp4Block), tail(kMxfp4Block, 0xAA);
      EXPECT_EQ(mxfp4_quantize_block(padded.data(), n, r, tail.data()),
                mxfp4_quantize_block(padded.data(), kMxfp4Block, r, full.data()));
      for (int i = 0; i < kMxfp4Block; ++i) EXPECT_EQ(tail[i], i < n ? full[i] : 0xAA);
    }
  }
}

// ---- FP8 blocks -------------------------------------------------------------------------------

TEST(Fp8Block, ScaleAndCodesMatchReference) {
  std::mt19937_64 rng(31);
  const testing::MiniFormat* fmts[] = {&testing::kE4M3, &testing::kE5M2};
  for (Fp8Format fmt : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    const testing::MiniFormat& mf = *fmts[fmt == Fp8Format::kE4M3 ? 0 : 1];
    const std::vector<double> mags = testing::finite_magnitudes(mf);
    const float fmax = static_cast<float>(mags.back());
    for (int i = 0; i < 5000; ++i) {
      const int n = 1 + static_cast<int>(rng() % 128);
      const int64_t stride = 1 + static_cast<int64_t>(rng() % 3);
      std::vector<float> x =
          random_block(rng, static_cast<int>(n * stride), static_cast<int>(rng() % 60) - 30);
      std::vector<uint8_t> codes(n);
      const float scale = fp8_quantize_block(x.data(), n, stride, fmt, codes.data());
      double amax = 0;
      for (int j = 0; j < n; ++j) amax = std::max(amax, std::fabs(double(x[j * stride])));
      ASSERT_EQ(scale, static_cast<float>(amax) / fmax);
      const float inv = fmax / static_cast<float>(amax);
      bool hit_max = false;
      for (int j = 0; j < n; ++j) {
        const float v = x[j * stride];
        ASSERT_EQ(codes[j], testing::ref_encode(mf, mags, v * inv));
        hit_max |= (codes[j] & 0x7F) == static_cast<int>(mags.size() - 1);
        const double deq = fp8_to_float(codes[j], fmt) * static_cast<double>(scale);
        const double rel = (fmt == Fp8Format::kE4M3 ? 1.0 / 16 : 1.0 / 8) + 0x1p-20;
        ASSERT_LE(std::fabs(v - deq), std::fabs(v) * rel + scale * mags[1] / 2 + 1e-300);
      }
      ASSERT_TRUE(hit_max) << "the amax element uses the largest code";
    }
  }
}

TEST(Fp8Block, SpecialBlocks) {
  for (Fp8Format fmt : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    const uint8_t nan_code = fmt == Fp8Format::kE4M3 ? 0x7F : 0x7E;
    float x[4] = {1.f, 2.f, kNan, 3.f};
    uint8_t codes[4];
    EXPECT_TRUE(std::isnan(fp8_quantize_block(x, 4, 1, fmt, codes)));
    for (uint8_t c : codes) EXPECT_EQ(c, nan_code);
    x[2] = -kInf;
    EXPECT_TRUE(std::isnan(fp8_quantize_block(x, 4, 1, fmt, codes)));
    for (uint8_t c : codes) EXPECT_TRUE(std::isnan(fp8_to_float(c, fmt)));
    const float zeros[4] = {0.f, -0.f, 0.f, 0.f};
    EXPECT_EQ(fp8_quantize_block(zeros, 4, 1, fmt, codes), 1.f);
    for (uint8_t c : codes) EXPECT_EQ(c & 0x7F, 0);
    // amax the smallest subnormal: fmax / amax overflows and is clamped to FLT_MAX, the block
    // underflows to (signed) zero codes and a zero scale: finite, never NaN.
    const float tiny[2] = {from_bits(1u), -from_bits(1u)};
    const float s = fp8_quantize_block(tiny, 2, 1, fmt, codes);
    EXPECT_EQ(s, 0.f);
    EXPECT_EQ(codes[0], 0x00);
    EXPECT_EQ(codes[1], 0x80);
    // A tiny normal amax whose inverse is finite keeps full codes.
    const float small[2] = {std::ldexp(1.f, -110), -std::ldexp(0.5f, -110)};
    fp8_quantize_block(small, 2, 1, fmt, codes);
    EXPECT_EQ(fp8_to_float(codes[0], fmt), fmt == Fp8Format::kE4M3 ? 448.f : 57344.f);
  }
}

// ---- Row helpers and packing ------------------------------------------------------------------

TEST(QuantizeRows, MatchBlockCallsWithTailsAndLeadingDimension) {
  std::mt19937_64 rng(41);
  // Large enough for the threaded path (rows * cols well above 2^16), with a tail block.
  for (int64_t cols : {int64_t{40}, int64_t{1000}}) {
    const int64_t rows = cols == 40 ? 7 : 300, ld = cols + 5;
    std::vector<float> x = random_block(rng, static_cast<int>(rows * ld), 0);
    for (Nvfp4ScaleRule r : kNvRules) {
      const int64_t nb = (cols + 15) / 16;
      std::vector<uint8_t> codes(rows * cols), scales(rows * nb);
      nvfp4_quantize_rows(x.data(), rows, cols, ld, 2.f, r, codes.data(), scales.data());
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t b = 0; b < nb; ++b) {
          const int n = static_cast<int>(std::min<int64_t>(16, cols - b * 16));
          uint8_t want[16];
          ASSERT_EQ(scales[i * nb + b], nvfp4_quantize_block(&x[i * ld + b * 16], n, 2.f, r, want));
          for (int j = 0; j < n; ++j) ASSERT_EQ(codes[i * cols + b * 16 + j], want[j]);
        }
      }
    }
    for (MxScaleRule r : kMxRules) {
      const int64_t nb = (cols + 31) / 32;
      std::vector<uint8_t> codes(rows * cols), scales(rows * nb);
      mxfp4_quantize_rows(x.data(), rows, cols, ld, r, codes.data(), scales.data());
      for (int64_t i = 0; i < rows; ++i) {
        for (int64_t b = 0; b < nb; ++b) {
          const int n = static_cast<int>(std::min<int64_t>(32, cols - b * 32));
          uint8_t want[32];
          ASSERT_EQ(scales[i * nb + b], mxfp4_quantize_block(&x[i * ld + b * 32], n, r, want));
          for (int j = 0; j < n; ++j) ASSERT_EQ(codes[i * cols + b * 32 + j], want[j]);
        }
      }
    }
  }
}

TEST(QuantizeRows, PackUnpackRoundTrip) {
  const int64_t rows = 3, cols = 6;
  std::vector<uint8_t> codes(rows * cols), packed(rows * cols / 2), back(rows * cols);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>((i * 7) & 0xF);
  pack_e2m1_rows(codes.data(), rows, cols, packed.data());
  for (int64_t j = 0; j < rows * cols / 2; ++j) {
    EXPECT_EQ(packed[j] & 0xF, codes[2 * j]) << "even element in the low nibble";
    EXPECT_EQ(packed[j] >> 4, codes[2 * j + 1]);
  }
  unpack_e2m1_rows(packed.data(), rows, cols, back.data());
  EXPECT_EQ(back, codes);
}

}  // namespace
}  // namespace fp4attn
