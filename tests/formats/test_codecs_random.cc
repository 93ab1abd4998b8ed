// The encoders against the independent float64 brute-force reference on millions of random floats
// of every magnitude: raw random bit patterns (float subnormals included), log-uniform values over
// each format's range and beyond, and values within a few ulps of every rounding boundary.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "fp4attn/numerics/formats.h"
#include "support/codec_reference.h"

namespace fp4attn {
namespace {

using testing::from_bits;
using testing::MiniFormat;

constexpr uint64_t kSeed = 0x5EED'F4A7'7E57ull;

struct Case {
  const MiniFormat& fmt;
  uint8_t (*encode)(float);
};

// Random floats: a third raw bit patterns (NaN/Inf included; uniform over exponents, so float
// subnormals show up too, plus a forced share of them), a third log-uniform around the format's
// range, a third within +-4 ulps of a midpoint between adjacent codes.
std::vector<float> random_inputs(const std::vector<double>& mags, int n, std::mt19937_64& rng) {
  std::vector<float> out;
  out.reserve(n);
  std::uniform_int_distribution<uint32_t> bits;
  const double lo = std::log2(mags[1]) - 4, hi = std::log2(mags.back()) + 3;
  std::uniform_real_distribution<double> log_mag(lo, hi);
  std::uniform_int_distribution<size_t> pick(0, mags.size() - 2);
  std::uniform_int_distribution<int> ulps(-4, 4);
  for (int i = 0; i < n; ++i) {
    const uint32_t sign = (bits(rng) & 1u) << 31;
    float x;
    switch (i % 4) {
      case 0:
        x = from_bits(bits(rng));
        break;
      case 1:
        x = from_bits(sign | (bits(rng) & 0x007FFFFFu));  // float subnormal
        break;
      case 2:
        x = static_cast<float>(std::exp2(log_mag(rng)));
        x = sign ? -x : x;
        break;
      default: {
        const size_t c = pick(rng);
        float v = static_cast<float>((mags[c] + mags[c + 1]) / 2);
        for (int k = ulps(rng); k != 0; k += (k > 0 ? -1 : 1)) {
          v = std::nextafter(v, k > 0 ? INFINITY : 0.f);
        }
        x = sign ? -v : v;
      }
    }
    out.push_back(x);
  }
  return out;
}

TEST(CodecsRandom, MatchBruteForceFloat64Reference) {
  const Case cases[] = {{testing::kE2M1, float_to_e2m1},
                        {testing::kE4M3, float_to_e4m3},
                        {testing::kE5M2, float_to_e5m2}};
  constexpr int kPerFormat = 1 << 21;
  std::mt19937_64 rng(kSeed);
  for (const Case& c : cases) {
    const std::vector<double> mags = testing::finite_magnitudes(c.fmt);
    const std::vector<float> xs = random_inputs(mags, kPerFormat, rng);
    int failures = 0;
    for (float x : xs) {
      const int want = testing::ref_encode(c.fmt, mags, static_cast<double>(x));
      const int got = c.encode(x);
      if (got != want && ++failures <= 10) {
        ADD_FAILURE() << c.fmt.name << "(" << x << " = 0x" << std::hex << testing::to_bits(x)
                      << ") = 0x" << got << ", reference 0x" << want;
      }
    }
    EXPECT_EQ(failures, 0) << c.fmt.name;
  }
}

TEST(CodecsRandom, Ue8m0MatchesFrexp) {
  std::mt19937_64 rng(kSeed + 1);
  std::uniform_int_distribution<uint32_t> bits(1u, 0x7F7FFFFFu);  // positive finite, nonzero
  for (int i = 0; i < (1 << 20); ++i) {
    const float x = from_bits(bits(rng));
    int e2;
    const double m = std::frexp(static_cast<double>(x), &e2);  // x = m * 2^e2, m in [0.5, 1)
    const int floor_ref = e2 - 1;
    const int ceil_ref = m == 0.5 ? floor_ref : floor_ref + 1;
    ASSERT_EQ(floor_log2(x), floor_ref) << x;
    const auto clamp = [](int e) { return e < -127 ? -127 : (e > 127 ? 127 : e); };
    ASSERT_EQ(float_to_ue8m0(x, Ue8m0Round::kFloor), clamp(floor_ref) + 127) << x;
    ASSERT_EQ(float_to_ue8m0(x, Ue8m0Round::kCeil), clamp(ceil_ref) + 127) << x;
  }
}

}  // namespace
}  // namespace fp4attn
