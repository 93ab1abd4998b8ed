// Exhaustive tests of the element codecs over every code: decode against the definition, round
// trips, ordering, ties at midpoints, saturation, NaN/Inf and signed zero.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "fp4attn/numerics/formats.h"
#include "support/codec_reference.h"

namespace fp4attn {
namespace {

using testing::finite_magnitudes;
using testing::from_bits;
using testing::kE2M1;
using testing::kE4M3;
using testing::kE5M2;
using testing::MiniFormat;
using testing::num_codes;
using testing::ref_value;
using testing::same_float;
using testing::sign_mask;
using testing::to_bits;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// The codec under test for each format, behind one interface.
struct Codec {
  const MiniFormat& fmt;
  float (*decode)(uint8_t);
  uint8_t (*encode)(float);
};

const Codec kCodecs[] = {
    {kE2M1, e2m1_to_float, float_to_e2m1},
    {kE4M3, e4m3_to_float, float_to_e4m3},
    {kE5M2, e5m2_to_float, float_to_e5m2},
};

TEST(Codecs, SpecFacts) {
  EXPECT_EQ(e2m1_to_float(0x7), 6.f);
  EXPECT_EQ(e2m1_to_float(0x1), 0.5f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.f);
  EXPECT_EQ(e4m3_to_float(0x01), std::ldexp(1.f, -9));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
  EXPECT_EQ(e5m2_to_float(0x7B), 57344.f);
  EXPECT_EQ(e5m2_to_float(0x7C), kInf);
  EXPECT_EQ(e5m2_to_float(0xFC), -kInf);
  EXPECT_EQ(e5m2_to_float(0x01), std::ldexp(1.f, -16));
  EXPECT_EQ(ue8m0_to_float(127), 1.f);
  EXPECT_EQ(ue8m0_to_float(0), std::ldexp(1.f, -127));
  EXPECT_TRUE(std::isnan(ue8m0_to_float(0xFF)));
}

TEST(Codecs, DecodeMatchesDefinitionForEveryCode) {
  for (const Codec& c : kCodecs) {
    for (int code = 0; code < num_codes(c.fmt); ++code) {
      const float got = c.decode(static_cast<uint8_t>(code));
      const float want = static_cast<float>(ref_value(c.fmt, code));
      EXPECT_TRUE(same_float(got, want)) << c.fmt.name << " code " << code << ": " << got;
    }
  }
}

TEST(Codecs, RoundTripEveryCode) {
  for (const Codec& c : kCodecs) {
    for (int code = 0; code < num_codes(c.fmt); ++code) {
      const float v = c.decode(static_cast<uint8_t>(code));
      const uint8_t back = c.encode(v);
      if (std::isnan(v)) {
        EXPECT_TRUE(std::isnan(c.decode(back))) << c.fmt.name << " NaN code " << code;
        EXPECT_EQ(back & sign_mask(c.fmt), code & sign_mask(c.fmt)) << "NaN keeps its sign";
      } else {
        EXPECT_EQ(back, code) << c.fmt.name << " value " << v;
      }
    }
  }
}

TEST(Codecs, PositiveCodesDecodeInIncreasingOrder) {
  for (const Codec& c : kCodecs) {
    float prev = -1.f;
    for (int code = 0; code < sign_mask(c.fmt); ++code) {
      const float v = c.decode(static_cast<uint8_t>(code));
      if (std::isnan(v)) break;
      EXPECT_GT(v, prev) << c.fmt.name << " code " << code;
      prev = v;
    }
  }
}

TEST(Codecs, NegativeCodesMirrorPositiveOnes) {
  for (const Codec& c : kCodecs) {
    for (int code = 0; code < sign_mask(c.fmt); ++code) {
      const float p = c.decode(static_cast<uint8_t>(code));
      const float n = c.decode(static_cast<uint8_t>(code | sign_mask(c.fmt)));
      if (std::isnan(p)) {
        EXPECT_TRUE(std::isnan(n));
      } else {
        EXPECT_EQ(to_bits(n), to_bits(-p)) << c.fmt.name << " code " << code;
      }
    }
  }
}

// Midpoints between adjacent finite codes go to the even code; one float ulp either side goes to
// the nearer code. Covers zero <-> smallest subnormal and every binade boundary.
TEST(Codecs, MidpointsTieToEvenAndNeighboursRoundToNearest) {
  for (const Codec& c : kCodecs) {
    const std::vector<double> mags = finite_magnitudes(c.fmt);
    for (size_t lo = 0; lo + 1 < mags.size(); ++lo) {
      const int hi = static_cast<int>(lo) + 1;
      const float mid = static_cast<float>((mags[lo] + mags[hi]) / 2);
      ASSERT_EQ(static_cast<double>(mid), (mags[lo] + mags[hi]) / 2) << "midpoint exact in float";
      const int even = (lo % 2 == 0) ? static_cast<int>(lo) : hi;
      for (int s : {0, 1}) {
        const float sign = s ? -1.f : 1.f;
        const int sbit = s ? sign_mask(c.fmt) : 0;
        EXPECT_EQ(c.encode(sign * mid), sbit | even) << c.fmt.name << " mid " << mid;
        EXPECT_EQ(c.encode(sign * std::nextafter(mid, kInf)), sbit | hi) << c.fmt.name << mid;
        EXPECT_EQ(c.encode(sign * std::nextafter(mid, 0.f)), sbit | static_cast<int>(lo))
            << c.fmt.name << " below mid " << mid;
      }
    }
  }
}

TEST(Codecs, FiniteOverflowSaturates) {
  // E2M1: everything past 6 is 6, including 7 (the tie with a virtual 8) and Inf.
  for (float x : {6.f, 6.5f, 7.f, 7.5f, 100.f, FLT_MAX, kInf}) {
    EXPECT_EQ(float_to_e2m1(x), 0x7) << x;
    EXPECT_EQ(float_to_e2m1(-x), 0xF) << x;
  }
  // E4M3: 464 is the tie with a virtual 480; above 448 all saturate. Inf is NaN (no Inf in fn).
  for (float x : {448.f, 449.f, 464.f, 465.f, 480.f, 1e10f, FLT_MAX}) {
    EXPECT_EQ(float_to_e4m3(x), 0x7E) << x;
    EXPECT_EQ(float_to_e4m3(-x), 0xFE) << x;
  }
  EXPECT_EQ(float_to_e4m3(kInf), 0x7F);
  EXPECT_EQ(float_to_e4m3(-kInf), 0xFF);
  // E5M2: 61440 would round (tie, even) to 65536 = Inf; finite values saturate, Inf stays Inf.
  for (float x : {57344.f, 57345.f, 61440.f, 61441.f, 65536.f, 1e30f, FLT_MAX}) {
    EXPECT_EQ(float_to_e5m2(x), 0x7B) << x;
    EXPECT_EQ(float_to_e5m2(-x), 0xFB) << x;
  }
  EXPECT_EQ(float_to_e5m2(kInf), 0x7C);
  EXPECT_EQ(float_to_e5m2(-kInf), 0xFC);
}

TEST(Codecs, NanRules) {
  const float nans[] = {kNan, -kNan, from_bits(0x7F800001u), from_bits(0xFFFFFFFFu),
                        from_bits(0x7FBFFFFFu)};
  for (float n : nans) {
    const bool neg = std::signbit(n);
    EXPECT_EQ(float_to_e2m1(n), 0x0) << "E2M1 NaN -> +0, the scale carries the NaN";
    EXPECT_EQ(float_to_e4m3(n), neg ? 0xFF : 0x7F);
    EXPECT_EQ(float_to_e5m2(n), neg ? 0xFE : 0x7E);
  }
  for (int code = 0x7D; code <= 0x7F; ++code) {
    EXPECT_TRUE(std::isnan(e5m2_to_float(static_cast<uint8_t>(code))));
    EXPECT_TRUE(std::isnan(e5m2_to_float(static_cast<uint8_t>(code | 0x80))));
  }
}

TEST(Codecs, SignedZeroAndTinyInputs) {
  EXPECT_EQ(float_to_e2m1(0.f), 0x0);
  EXPECT_EQ(float_to_e2m1(-0.f), 0x8);
  EXPECT_EQ(float_to_e4m3(-0.f), 0x80);
  EXPECT_EQ(float_to_e5m2(-0.f), 0x80);
  EXPECT_TRUE(std::signbit(e2m1_to_float(0x8)) && e2m1_to_float(0x8) == 0.f);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)) && e4m3_to_float(0x80) == 0.f);
  EXPECT_TRUE(std::signbit(e5m2_to_float(0x80)) && e5m2_to_float(0x80) == 0.f);
  // Float subnormals and the smallest normals are far below half of every format's quantum.
  for (float x : {from_bits(1u), from_bits(0x007FFFFFu), FLT_MIN, 1e-30f}) {
    EXPECT_EQ(float_to_e2m1(x), 0x0);
    EXPECT_EQ(float_to_e2m1(-x), 0x8);
    EXPECT_EQ(float_to_e4m3(x), 0x00);
    EXPECT_EQ(float_to_e4m3(-x), 0x80);
    EXPECT_EQ(float_to_e5m2(x), 0x00);
    EXPECT_EQ(float_to_e5m2(-x), 0x80);
  }
}

// ---- UE8M0 ------------------------------------------------------------------------------------

TEST(Ue8m0, DecodeEveryCode) {
  for (int code = 0; code < 255; ++code) {
    EXPECT_EQ(ue8m0_to_float(static_cast<uint8_t>(code)), std::ldexp(1.f, code - 127)) << code;
  }
  EXPECT_TRUE(std::isnan(ue8m0_to_float(0xFF)));
}

TEST(Ue8m0, FromExponentClamps) {
  for (int e = -200; e <= 200; ++e) {
    const int clamped = e < -127 ? -127 : (e > 127 ? 127 : e);
    EXPECT_EQ(ue8m0_from_exponent(e), clamped + 127) << e;
  }
}

TEST(Ue8m0, FloorLog2OfEveryBinade) {
  for (int k = -149; k <= 127; ++k) {
    const float p = std::ldexp(1.f, k);
    EXPECT_EQ(floor_log2(p), k);
    EXPECT_EQ(floor_log2(-p), k) << "sign ignored";
    // The largest float of the binade (for subnormals: just below the next power of two).
    const float top = std::nextafter(std::ldexp(1.f, k + 1), 0.f);
    if (k < 127) {
      EXPECT_EQ(floor_log2(top), k) << k;
    }
  }
  EXPECT_EQ(floor_log2(FLT_MAX), 127);
}

TEST(Ue8m0, EncodePowersOfTwoAndBetween) {
  for (int k = -149; k <= 127; ++k) {
    const int clamped = k < -127 ? -127 : k;
    const float p = std::ldexp(1.f, k);
    EXPECT_EQ(float_to_ue8m0(p, Ue8m0Round::kFloor), clamped + 127) << k;
    EXPECT_EQ(float_to_ue8m0(p, Ue8m0Round::kCeil), clamped + 127) << k;
    const float above = std::nextafter(p, kInf);  // not a power of two (k < 127)
    if (k == 127) continue;
    EXPECT_EQ(float_to_ue8m0(above, Ue8m0Round::kFloor), clamped + 127) << k;
    const int ceil = k + 1 < -127 ? -127 : k + 1;
    EXPECT_EQ(float_to_ue8m0(above, Ue8m0Round::kCeil), ceil + 127) << k;
  }
  // A ceil beyond 2^127 clamps to 2^127.
  EXPECT_EQ(float_to_ue8m0(FLT_MAX, Ue8m0Round::kCeil), 254);
  EXPECT_EQ(float_to_ue8m0(FLT_MAX, Ue8m0Round::kFloor), 254);
}

TEST(Ue8m0, SpecialInputs) {
  for (Ue8m0Round r : {Ue8m0Round::kFloor, Ue8m0Round::kCeil}) {
    EXPECT_EQ(float_to_ue8m0(0.f, r), 0x00);
    EXPECT_EQ(float_to_ue8m0(-0.f, r), 0x00);
    EXPECT_EQ(float_to_ue8m0(-1.f, r), 0xFF);
    EXPECT_EQ(float_to_ue8m0(-from_bits(1u), r), 0xFF);
    EXPECT_EQ(float_to_ue8m0(kNan, r), 0xFF);
    EXPECT_EQ(float_to_ue8m0(kInf, r), 0xFF);
    EXPECT_EQ(float_to_ue8m0(-kInf, r), 0xFF);
  }
}

// ---- E2M1 pairs -------------------------------------------------------------------------------

TEST(E2m1Pairs, FirstIsTheLowNibble) {
  // cuda_fp4.hpp puts float2.x in bits 3..0; torch's Float4_e2m1fn_x2 puts val0 in bits 3..0.
  EXPECT_EQ(pack_e2m1x2(0x1, 0x2), 0x21);
  for (int byte = 0; byte < 256; ++byte) {
    const uint8_t b = static_cast<uint8_t>(byte);
    EXPECT_EQ(e2m1x2_first(b), byte & 0xF);
    EXPECT_EQ(e2m1x2_second(b), byte >> 4);
    EXPECT_EQ(pack_e2m1x2(e2m1x2_first(b), e2m1x2_second(b)), byte);
  }
  EXPECT_EQ(pack_e2m1x2(0xFF, 0x0), 0x0F) << "only the low 4 bits of each code are used";
}

}  // namespace
}  // namespace fp4attn
