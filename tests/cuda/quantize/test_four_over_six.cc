// The GPU quantizers' Four-Over-Six choice (src/cuda/quantize/four_over_six.h, host+device)
// against nvfp4_quantize_block(kFourOverSix) on millions of random blocks and on adversarial ones
// (equal errors, E2M1 midpoints of either candidate, saturated and subnormal scales): the chosen
// scale, every magnitude and the sign rule must be the reference's.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>

#include "core/half.h"
#include "cuda/quantize/four_over_six.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"

namespace fp4attn {
namespace {

float bf16_round(float v) { return bf16_bits_to_float(float_to_bf16_bits(v)); }

struct Stats {
  int64_t blocks = 0, fast = 0, use4 = 0, ties = 0, failures = 0;
};

// Checks one block (finite values; s_enc > 0 with a finite table) both ways the kernels run it:
// the unclamped /6 candidate when four_over_six_fast_ok, and the clamped one always. a6_16bit:
// the amax is a 16-bit value (the kernels then divide by 6 with div6_16bit).
void check_block(const float (&x)[kNvfp4Block], float s_enc, bool a6_16bit, Stats* st) {
  uint8_t ref_codes[kNvfp4Block];
  const uint8_t ref_scale =
      nvfp4_quantize_block(x, kNvfp4Block, s_enc, Nvfp4ScaleRule::kFourOverSix, ref_codes);
  const float amax = block_amax(x, kNvfp4Block);
  const float a6 = a6_16bit ? packed::div6_16bit(amax) : detail::div_rn(amax, kE2m1Max);
  const packed::FosCodes c = packed::four_over_six_codes(amax, a6, s_enc);
  const packed::ScaleEntry e6 = packed::nvfp4_scale_entry(s_enc, c.c6);
  const packed::ScaleEntry e4 = packed::nvfp4_scale_entry(s_enc, c.c4);
  const bool fast = packed::four_over_six_fast_ok(c);
  ++st->blocks;
  st->fast += fast;
  st->use4 += ref_scale == c.c4 && c.c4 != c.c6;
  for (int variant = fast ? 0 : 1; variant < 2; ++variant) {
    uint32_t mag[2];
    const uint32_t code = variant == 0
                              ? packed::four_over_six_select<false>(x, s_enc, c, e6, e4, mag)
                              : packed::four_over_six_select<true>(x, s_enc, c, e6, e4, mag);
    bool ok = code == ref_scale;
    for (int i = 0; i < kNvfp4Block && ok; ++i) {
      const uint32_t m = (mag[i / 8] >> (4 * (i % 8))) & 0xFu;
      const uint32_t sign = code != 0 && std::signbit(x[i]) ? 0x8u : 0u;
      ok = (m | sign) == ref_codes[i];
    }
    if (!ok && ++st->failures <= 5) {
      ADD_FAILURE() << "s_enc " << s_enc << " c6 " << c.c6 << " c4 " << c.c4 << " variant "
                    << variant << " got " << code << " want " << int{ref_scale} << " x[0] " << x[0]
                    << " amax " << amax;
    }
  }
}

// The errors of both candidates in the reference's arithmetic (for counting ties).
bool errors_tie(const float (&x)[kNvfp4Block], float s_enc) {
  const float amax = block_amax(x, kNvfp4Block);
  const float flt_max = bits_float(detail::kFltMaxBits);
  const uint8_t c6 =
      float_to_e4m3(fminf(detail::mul_rn(detail::div_rn(amax, 6.f), s_enc), flt_max));
  const uint8_t c4 =
      float_to_e4m3(fminf(detail::mul_rn(detail::div_rn(amax, 4.f), s_enc), flt_max));
  if (c6 == c4) return false;
  uint8_t k6[kNvfp4Block], k4[kNvfp4Block];
  detail::nvfp4_encode_with_scale(x, kNvfp4Block, s_enc, c6, k6);
  detail::nvfp4_encode_with_scale(x, kNvfp4Block, s_enc, c4, k4);
  return detail::nvfp4_block_sq_error(x, kNvfp4Block, s_enc, c6, k6) ==
         detail::nvfp4_block_sq_error(x, kNvfp4Block, s_enc, c4, k4);
}

bool table_finite(float s_enc) { return s_enc > 0.f && s_enc * 512.f <= 3.4028234e38f; }

TEST(FourOverSixSelect, RandomBlocksEqualReference) {
  std::mt19937_64 rng(20261129);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  Stats st;
  constexpr int kBlocks = 1'000'000;
  for (int b = 0; b < kBlocks; ++b) {
    float x[kNvfp4Block];
    const int kind = b % 4;
    // 0: BF16 Gaussian, s_enc of a tensor amax around 3-5 sigma (the bench's supplied 672 too);
    // 1: BF16 with heavy tails and wide s_enc; 2: FP32 differences (smoothed K);
    // 3: BF16 Gaussian scaled by a random power of two, s_enc log-uniform.
    float s_enc;
    if (kind == 0) {
      for (float& v : x) v = bf16_round(normal(rng));
      s_enc = b % 8 == 0 ? 672.f : 2688.f / (3.f + 2.f * unit(rng));
    } else if (kind == 1) {
      for (float& v : x) v = bf16_round(normal(rng) * std::exp(2.f * normal(rng)));
      s_enc = std::ldexp(1.f + unit(rng), static_cast<int>(rng() % 40) - 10);
    } else if (kind == 2) {
      for (float& v : x) v = bf16_round(normal(rng)) - bf16_round(0.3f * normal(rng));
      s_enc = 2688.f / (3.f + 2.f * unit(rng));
    } else {
      const int e = static_cast<int>(rng() % 200) - 100;
      for (float& v : x) v = bf16_round(std::ldexp(normal(rng), e));
      s_enc = std::ldexp(1.f + unit(rng), static_cast<int>(rng() % 200) - 100);
    }
    if (!table_finite(s_enc)) continue;
    check_block(x, s_enc, kind != 2, &st);
  }
  EXPECT_EQ(st.failures, 0);
  // Both candidates win often, and the rare clamped path is exercised.
  EXPECT_GT(st.use4, st.blocks / 5);
  EXPECT_LT(st.fast, st.blocks);
}

// Values on small dyadic grids make equal errors (and E2M1 midpoints of both candidates) common.
TEST(FourOverSixSelect, TiesAndMidpointsEqualReference) {
  std::mt19937_64 rng(7);
  Stats st;
  int64_t ties = 0;
  for (int b = 0; b < 400'000; ++b) {
    float x[kNvfp4Block];
    const int denom = 1 << (rng() % 4);  // steps 1, 1/2, 1/4, 1/8
    const int top = static_cast<int>(6 * denom + rng() % (4 * denom));
    for (float& v : x) {
      const int k = static_cast<int>(rng() % (top + 1));
      v = (rng() & 1 ? -1.f : 1.f) * static_cast<float>(k) / denom;
    }
    x[rng() % kNvfp4Block] = static_cast<float>(top) / denom;  // amax on the grid
    static constexpr float kScales[] = {1.f, 2.f, 0.5f, 0.75f, 1.5f, 3.f, 448.f * 6.f / 8.f, 672.f};
    const float s_enc = kScales[rng() % 8];
    ties += errors_tie(x, s_enc);
    check_block(x, s_enc, true, &st);
  }
  EXPECT_EQ(st.failures, 0);
  EXPECT_GT(ties, 1000);  // the tie rule (keep /6) is exercised
}

// Saturated scales (c6 == c4 == 448, and c4 alone at 448), subnormal /6 scales 0..3 with c4
// above them, all-zero and single-value blocks.
TEST(FourOverSixSelect, ExtremeScalesEqualReference) {
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  Stats st;
  for (int b = 0; b < 200'000; ++b) {
    float x[kNvfp4Block];
    for (float& v : x) v = bf16_round(normal(rng));
    if (b % 16 == 0) {
      for (float& v : x) v = 0.f;
      x[rng() % kNvfp4Block] = bf16_round(normal(rng));
    }
    const float amax = block_amax(x, kNvfp4Block);
    if (!(amax > 0.f)) continue;
    // sf6 = amax s_enc / 6 spread over [2^-12, 2^11]: E4M3 subnormals, normals, saturation.
    const float sf6 = std::ldexp(0.5f + unit(rng), static_cast<int>(rng() % 24) - 12);
    const float s_enc = sf6 * 6.f / amax;
    if (!table_finite(s_enc)) continue;
    check_block(x, s_enc, true, &st);
  }
  EXPECT_EQ(st.failures, 0);
  EXPECT_LT(st.fast, st.blocks);
}

}  // namespace
}  // namespace fp4attn
