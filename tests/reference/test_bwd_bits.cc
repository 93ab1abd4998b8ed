// Host twins of the GPU backward's bit helpers (src/cuda/backward/bwd_bits.h): the gradient
// scales' exponents equal the golden model's, power-of-two scaling is exact, the causal query
// range and the permuted query order of the transposed operands are what the kernel assumes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>

#include "cuda/backward/bwd_bits.h"
#include "reference/golden_backward_fp8.h"

namespace fp4attn::bwd {
namespace {

TEST(BwdBits, Pow2ScaleExpMatchesTheGoldenModel) {
  EXPECT_EQ(kE4m3Top, golden::kE4m3TopLog2);
  EXPECT_EQ(kE5m2Top, golden::kE5m2TopLog2);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(0.5f, 1.f);
  std::uniform_int_distribution<int> ex(-140, 120);
  for (int it = 0; it < 200000; ++it) {
    const float a = std::ldexp(mant(rng), ex(rng));
    for (int top : {kE4m3Top, kE5m2Top}) {
      ASSERT_EQ(pow2_scale_exp(a, top), golden::pow2_scale_exp(double(a), top)) << a;
    }
  }
  for (int e = -149; e < 128; ++e) {  // exact powers of two (the binade edge) and their neighbours
    const float a = std::ldexp(1.f, e);
    for (float x : {a, std::nextafter(a, 0.f), std::nextafter(a, 1e30f)}) {
      if (!(x > 0) || std::isinf(x)) continue;
      ASSERT_EQ(pow2_scale_exp(x, kE5m2Top), golden::pow2_scale_exp(double(x), kE5m2Top)) << x;
    }
  }
  EXPECT_EQ(pow2_scale_exp(0.f, 8), 0);
  EXPECT_EQ(pow2_scale_exp(std::numeric_limits<float>::infinity(), 8), 0);
  EXPECT_EQ(pow2_scale_exp(std::numeric_limits<float>::quiet_NaN(), 8), 0);
  EXPECT_EQ(pow2_scale_exp(1.f, 8), 8);   // 1 * 2^8 = 2^8: the top itself
  EXPECT_EQ(pow2_scale_exp(1.5f, 8), 7);  // 1.5 * 2^7 in (2^7, 2^8]
}

TEST(BwdBits, MulPow2IsLdexpRoundedOnce) {
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int it = 0; it < 100000; ++it) {
    const float x = dist(rng) * std::ldexp(1.f, int(rng() % 60) - 30);
    const int e = int(rng() % 300) - 150;
    const float want = static_cast<float>(std::ldexp(double(x), e));  // one rounding
    const float got = mul_pow2(x, e);
    if (e >= -126 && e <= 127) {
      ASSERT_EQ(got, want) << x << " * 2^" << e;
    } else if (std::isfinite(want) && std::fabs(want) >= 1.17549435e-38f) {
      ASSERT_EQ(got, want) << x << " * 2^" << e;  // normal results: still exact
    }
  }
  EXPECT_TRUE(std::isinf(mul_pow2(1.f, 148)));
  EXPECT_EQ(mul_pow2(std::ldexp(1.f, -140), 148), 256.f);  // a subnormal dO lifted exactly
}

TEST(BwdBits, FirstQueryBlockCoversEveryVisiblePair) {
  for (int64_t s_q : {1, 17, 64, 100, 333}) {
    for (int64_t s_k : {1, 17, 64, 100, 333}) {
      for (bool causal : {false, true}) {
        int64_t prev = 0;
        for (int64_t n0 = 0; n0 < s_k; n0 += kBlockKeys) {
          const int64_t mb = first_query_block(n0, s_q, s_k, causal);
          EXPECT_GE(mb, prev) << "not monotone in the key block (deterministic turns need it)";
          prev = mb;
          for (int64_t i = 0; i < s_q; ++i) {
            for (int64_t j = n0; j < std::min(n0 + kBlockKeys, s_k); ++j) {
              if (key_visible(i, j, s_q, s_k, causal)) {
                ASSERT_GE(i, mb * kBlockQueries) << s_q << " " << s_k << " " << n0;
              }
            }
          }
          // The first block it visits has a visible pair unless no query sees the key block.
          bool any = false;
          for (int64_t i = mb * kBlockQueries; i < std::min(s_q, (mb + 1) * kBlockQueries); ++i) {
            any = any || key_visible(i, n0, s_q, s_k, causal);
          }
          const bool none = causal && n0 > s_q - 1 + s_k - s_q;
          EXPECT_TRUE(any || none || n0 >= s_k) << s_q << " " << s_k << " " << n0;
        }
      }
    }
  }
}

TEST(BwdBits, PermutedQueriesMatchTheAccumulatorLayout) {
  // Thread t's accumulator columns {2t, 2t+1} of tiles 0 and 1 must be the queries at k positions
  // 4t..4t+3, and every 32-query block is a permutation of itself.
  for (int t = 0; t < 4; ++t) {
    const int want[4] = {2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t};
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(transposed_position_of_query(want[i]), 4 * t + i);
      EXPECT_EQ(transposed_position_of_query(16 + want[i]), 16 + 4 * t + i);
    }
  }
  std::set<int64_t> seen;
  for (int64_t q = 0; q < kBlockQueries; ++q) seen.insert(transposed_position_of_query(q));
  EXPECT_EQ(seen.size(), size_t(kBlockQueries));
  EXPECT_EQ(*seen.rbegin(), kBlockQueries - 1);
  EXPECT_EQ(padded_queries(0), 0);
  EXPECT_EQ(padded_queries(17), 32);
  EXPECT_EQ(padded_queries(64), 64);
}

}  // namespace
}  // namespace fp4attn::bwd
