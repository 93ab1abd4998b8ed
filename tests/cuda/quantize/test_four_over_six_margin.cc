// Groundwork for a cheaper Four-Over-Six selection (docs/kernels/quantize.md, "Four-Over-Six:
// where the instructions go"): a screen may decide a block from an approximation of the two
// squared errors only when their gap exceeds what the reference's FP32 arithmetic can move.
// This test checks that bound against nvfp4_quantize_block(kFourOverSix) on millions of blocks
// (whenever the exact gap exceeds it, the reference picks the exactly better candidate) and
// measures how many blocks a screen of a given precision would leave to the exact path.
//
// The bound: with u = 2^-24, D = |x| s - g (exact; g = e2m1 * scale), the reference's
// d = RN(RN(|x| s) - g) has |d - D| <= eta = u (|x| s + |D|) (1 + 2u), so |d^2 - D^2| <=
// eta (2 |D| + eta), and its in-order FMA chain over n terms adds at most gamma_n (sum d^2),
// gamma_n = n u / (1 - n u). |err_fp32 - E| <= B = sum eta (2|D| + eta) + gamma_n (E + that sum).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "core/half.h"
#include "fp4attn/numerics/formats.h"
#include "fp4attn/numerics/quantize.h"

namespace fp4attn {
namespace {

float bf16_round(float v) { return bf16_bits_to_float(float_to_bf16_bits(v)); }

struct Sum {
  long double e = 0, bound = 0;
};

// The exact squared error (long double: |x| s has <= 48 significant bits, D and D^2 are then
// within long double's 64-bit rounding, far below the bound) and the FP32 deviation bound.
Sum exact_error(const float (&x)[kNvfp4Block], float s_enc, uint8_t scale) {
  uint8_t codes[kNvfp4Block];
  detail::nvfp4_encode_with_scale(x, kNvfp4Block, s_enc, scale, codes);
  const long double f = e4m3_to_float(scale), u = std::ldexp(1.0L, -24);
  Sum s;
  long double dev = 0;
  for (int i = 0; i < kNvfp4Block; ++i) {
    const long double xs = std::fabs(static_cast<long double>(x[i])) * s_enc;
    const long double d = xs - static_cast<long double>(e2m1_to_float(codes[i] & 7u)) * f;
    const long double eta = u * (xs + std::fabs(d)) * (1 + 2 * u);
    s.e += d * d;
    dev += eta * (2 * std::fabs(d) + eta);
  }
  const long double gamma = kNvfp4Block * u / (1 - kNvfp4Block * u);
  s.bound = dev + gamma * (s.e + dev) + s.e * std::ldexp(1.0L, -56);  // + long double rounding
  return s;
}

struct Counts {
  int64_t blocks = 0, same_scale = 0, undecided = 0, wrong = 0;
  std::vector<double> gap;  // |E4 - E6| / max(E4, E6) of blocks with c4 != c6
};

void check(const float (&x)[kNvfp4Block], float s_enc, Counts* c) {
  uint8_t codes[kNvfp4Block];
  const uint8_t ref =
      nvfp4_quantize_block(x, kNvfp4Block, s_enc, Nvfp4ScaleRule::kFourOverSix, codes);
  const float amax = block_amax(x, kNvfp4Block);
  const float flt_max = bits_float(detail::kFltMaxBits);
  const uint8_t c6 =
      float_to_e4m3(fminf(detail::mul_rn(detail::div_rn(amax, 6.f), s_enc), flt_max));
  const uint8_t c4 =
      float_to_e4m3(fminf(detail::mul_rn(detail::div_rn(amax, 4.f), s_enc), flt_max));
  ++c->blocks;
  if (c6 == c4) {
    ++c->same_scale;
    EXPECT_EQ(ref, c6);
    return;
  }
  const Sum e6 = exact_error(x, s_enc, c6), e4 = exact_error(x, s_enc, c4);
  const long double gap = e4.e - e6.e;
  c->gap.push_back(static_cast<double>(std::fabs(gap) / std::max(e4.e, e6.e)));
  if (std::fabs(gap) <= e4.bound + e6.bound) {
    ++c->undecided;
    return;
  }
  const uint8_t exact_choice = gap < 0 ? c4 : c6;
  if (exact_choice != ref && ++c->wrong <= 5) {
    ADD_FAILURE() << "bound violated: s_enc " << s_enc << " c6 " << int{c6} << " c4 " << int{c4}
                  << " E6 " << static_cast<double>(e6.e) << " E4 " << static_cast<double>(e4.e);
  }
}

// Fraction of blocks (c4 != c6) whose relative gap is at most t: what a screen with relative
// accuracy t would hand to the exact path.
double below(std::vector<double> g, double t) {
  std::sort(g.begin(), g.end());
  return g.empty() ? 0.0
                   : static_cast<double>(std::upper_bound(g.begin(), g.end(), t) - g.begin()) /
                         static_cast<double>(g.size());
}

void report(const char* name, const Counts& c) {
  std::printf(
      "%-12s blocks %lld  c4==c6 %.4f  undecided by the FP32 bound %.2e  gap<=2^-16 %.2e"
      "  gap<=2^-10 %.2e  gap<=2^-7 %.2e\n",
      name, static_cast<long long>(c.blocks),
      static_cast<double>(c.same_scale) / static_cast<double>(c.blocks),
      static_cast<double>(c.undecided) / static_cast<double>(c.gap.size()),
      below(c.gap, std::ldexp(1.0, -16)), below(c.gap, std::ldexp(1.0, -10)),
      below(c.gap, std::ldexp(1.0, -7)));
}

TEST(FourOverSixMargin, ReferenceFollowsExactErrorsOutsideTheBound) {
  std::mt19937_64 rng(42);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  std::student_t_distribution<float> t3(3.f);
  const char* names[] = {"gaussian", "heavy-tail", "uniform", "dyadic", "smoothed"};
  for (int dist = 0; dist < 5; ++dist) {
    Counts c;
    for (int b = 0; b < 400'000; ++b) {
      float x[kNvfp4Block];
      // The bench's supplied s_enc (672), random tensor amax scales, and log-uniform s_enc.
      float s_enc = b % 3 == 0 ? 672.f : 2688.f / (3.f + 2.f * unit(rng));
      if (dist == 0) {
        for (float& v : x) v = bf16_round(normal(rng));
      } else if (dist == 1) {
        for (float& v : x) v = bf16_round(t3(rng));
        if (b % 2) s_enc = std::ldexp(1.f + unit(rng), static_cast<int>(rng() % 30) - 5);
      } else if (dist == 2) {
        for (float& v : x) v = bf16_round(2.f * unit(rng) - 1.f);
      } else if (dist == 3) {  // equal errors and E2M1 midpoints are common
        const int denom = 1 << (rng() % 4);
        for (float& v : x) v = static_cast<float>(static_cast<int>(rng() % (8 * denom))) / denom;
        static constexpr float kScales[] = {1.f, 2.f, 0.5f, 0.75f, 1.5f, 3.f, 336.f, 672.f};
        s_enc = kScales[rng() % 8];
      } else {
        for (float& v : x) v = bf16_round(normal(rng)) - bf16_round(0.3f * normal(rng));
      }
      check(x, s_enc, &c);
    }
    report(names[dist], c);
    EXPECT_EQ(c.wrong, 0) << names[dist];
    // The bound is tight enough to matter: random data almost never falls inside it.
    if (dist != 3) {
      EXPECT_LT(c.undecided, c.blocks / 1000) << names[dist];
    }
  }
}

}  // namespace
}  // namespace fp4attn
