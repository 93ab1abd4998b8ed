// Host twins of the GPU backward's bit helpers (src/cuda/bwd/bits.h): the gradient
// scales' exponents equal the golden model's, power-of-two scaling is exact, the causal query
// range and the permuted query order of the transposed operands are what the kernel assumes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <utility>

#include "cuda/bwd/bits.h"
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

TEST(BwdBits, Pow2IsMulPow2) {
  EXPECT_TRUE(Pow2(0).single());
  EXPECT_TRUE(Pow2(-126).single());
  EXPECT_TRUE(Pow2(127).single());
  EXPECT_FALSE(Pow2(128).single());
  EXPECT_FALSE(Pow2(-127).single());
  std::mt19937 rng(13);
  std::normal_distribution<float> dist(0.f, 1.f);
  for (int e = -300; e <= 300; ++e) {
    const Pow2 f(e);
    for (int it = 0; it < 2000; ++it) {
      const float x = dist(rng) * std::ldexp(1.f, int(rng() % 300) - 150);
      const float a = mul_pow2(x, e), b = f(x);
      ASSERT_TRUE(std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b)))
          << x << " * 2^" << e << ": " << a << " vs " << b;
      if (f.single()) {
        const float c = f.apply<true>(x);
        ASSERT_TRUE(std::memcmp(&a, &c, 4) == 0 || (std::isnan(a) && std::isnan(c)))
            << x << " " << e;
      }
    }
    for (float x : {0.f, -0.f, std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::denorm_min(), 3.4e38f}) {
      const float a = mul_pow2(x, e), b = f(x);
      ASSERT_TRUE(std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b))) << x << " " << e;
    }
  }
}

TEST(BwdBits, FirstQueryBlockCoversEveryVisiblePair) {
  // The main kernel's blocks (128 keys, 64 queries) and a finer grid (64 keys, 32 queries).
  for (const auto& [keys, queries] :
       {std::pair<int64_t, int64_t>{kKeyBlock, kQueryBlock}, {64, 32}}) {
    for (int64_t s_q : {1, 17, 64, 100, 333}) {
      for (int64_t s_k : {1, 17, 64, 100, 333}) {
        for (bool causal : {false, true}) {
          int64_t prev = 0;
          for (int64_t n0 = 0; n0 < s_k; n0 += keys) {
            const int64_t mb = first_query_block(n0, s_q, s_k, causal, queries);
            EXPECT_GE(mb, prev) << "not monotone in the key block (deterministic turns need it)";
            prev = mb;
            for (int64_t i = 0; i < s_q; ++i) {
              for (int64_t j = n0; j < std::min(n0 + keys, s_k); ++j) {
                if (key_visible(i, j, s_q, s_k, causal)) {
                  ASSERT_GE(i, mb * queries) << s_q << " " << s_k << " " << n0;
                }
              }
            }
            // The first block it visits has a visible pair unless no query sees the key block.
            bool any = false;
            for (int64_t i = mb * queries; i < std::min(s_q, (mb + 1) * queries); ++i) {
              any = any || key_visible(i, n0, s_q, s_k, causal);
            }
            const bool none = causal && n0 > s_q - 1 + s_k - s_q;
            EXPECT_TRUE(any || none || n0 >= s_k) << s_q << " " << s_k << " " << n0;
          }
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
  for (int64_t q = 0; q < kPrepQueries; ++q) seen.insert(transposed_position_of_query(q));
  EXPECT_EQ(seen.size(), size_t(kPrepQueries));
  EXPECT_EQ(*seen.rbegin(), kPrepQueries - 1);
  EXPECT_EQ(padded_queries(0), 0);
  EXPECT_EQ(padded_queries(17), 64);
  EXPECT_EQ(padded_queries(64), 64);
  EXPECT_EQ(padded_queries(65), 128);
  EXPECT_EQ(kQueryPad % kPrepQueries, 0);
  EXPECT_EQ(kQueryPad % kQueryBlock, 0);
}

TEST(BwdBits, AFragmentsMatchTheirQueries) {
  // The gradient pass's P^T and dS^T A operands (wgmma, A from registers) are packed from the S^T /
  // dP^T accumulators (64 keys x 64 queries per warpgroup) with a_source_element; the B operands
  // (dO_t, Q_t) hold the queries of each 64-block in the permuted order. Every byte must meet
  // its own query and its own key row, and each thread's bytes must cover its 16 k positions
  // of each half exactly once.
  for (int t = 0; t < 4; ++t) {
    std::set<int> seen[2];
    for (int kk = 0; kk < kQueryBlock / 32; ++kk) {
      for (int r = 0; r < 4; ++r) {
        for (int b = 0; b < 4; ++b) {
          const int e = 16 * kk + a_source_element(r, b);
          ASSERT_LT(e, kQueryBlock / 2);  // 32 accumulator registers of 64 x 64
          EXPECT_EQ(accum_row_half(e), r & 1) << "row of element " << e;
          const int pos = a_k_position(kk, r, b, t);
          EXPECT_EQ(operand_v_key_at(pos), accum_col(e, t)) << "t " << t << " position " << pos;
          EXPECT_EQ(transposed_position_of_query(accum_col(e, t)), pos);
          EXPECT_TRUE(seen[r & 1].insert(e).second);
        }
      }
    }
    EXPECT_EQ(seen[0].size(), 16u);
    EXPECT_EQ(seen[1].size(), 16u);
  }
}

// add_d_hp's reduce-scatter (main_dhp.cuh), step for step on 32 simulated lanes of a warp's 16 x 64
// accumulator tile: the two sums lane (g, t) ends with are the column sums of d_hp_col(g, t, b),
// and the warp's 64 values cover every column once.
TEST(BwdBits, DHpReduceScatterSumsEveryColumn) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(-1, 1);
  double x[16][64];
  for (auto& row : x) {
    for (double& e : row) e = u(rng);
  }
  double v[32][16];
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane / 4, t = lane % 4;
    for (int k = 0; k < 16; ++k) {
      const int e = d_hp_element(k);
      ASSERT_EQ(accum_row_half(e), 0);
      ASSERT_EQ(accum_row_half(e + 2), 1);
      ASSERT_EQ(accum_col(e, t), accum_col(e + 2, t));
      v[lane][k] = x[g][accum_col(e, t)] + x[g + 8][accum_col(e + 2, t)];
    }
  }
  for (const auto& [w, mask] : {std::pair{8, 16}, std::pair{4, 8}, std::pair{2, 4}}) {
    double next[32][16];
    for (int lane = 0; lane < 32; ++lane) {
      const int partner = lane ^ mask;
      const bool upper = (lane & mask) != 0;
      for (int i = 0; i < w; ++i) {
        const double send = upper ? v[partner][i + w] : v[partner][i];  // the partner's send
        next[lane][i] = (upper ? v[lane][i + w] : v[lane][i]) + send;
      }
    }
    std::memcpy(v, next, sizeof(v));
  }
  std::set<int> cols;
  for (int lane = 0; lane < 32; ++lane) {
    for (int b = 0; b < 2; ++b) {
      const int c = d_hp_col(lane / 4, lane % 4, b);
      double want = 0;
      for (const auto& row : x) want += row[c];
      EXPECT_NEAR(v[lane][b], want, 1e-12) << "lane " << lane << " b " << b;
      cols.insert(c);
    }
  }
  EXPECT_EQ(cols.size(), 64u);
}

}  // namespace
}  // namespace fp4attn::bwd
