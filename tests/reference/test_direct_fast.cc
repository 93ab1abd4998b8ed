// fp4-direct's lean kernel map (direct_p.h: direct_e2m1_round(_eighths), fma_sat,
// direct_block_scale) against the definitions it replaces: the E2M1 rounding over every float of
// [2^-3, 8] and a stride of all 2^32 (all of them with FP4ATTN_FULL_SWEEP=1), the kernel's scaled
// FFMA.SAT form over random and threshold-hitting (S, c, k0), and the block exponent over a stride
// of [-1024, 0] plus 64 floats either side of each switch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "fp4attn/numerics/direct_p.h"
#include "fp4attn/numerics/formats.h"

namespace fp4attn {
namespace {

// The map the kernel used before (p_paths.cuh at 9c2e964): max(0, u), then the magic number of
// u's E2M1 step chosen by two compares, satfinite by a min.
float previous_kernel_round(float u) {
  const float v = detail::max0(u);  // the kernel's fmaxf: every NaN -> 0
  const float magic = v < 2.f ? 6291456.f : (v < 4.f ? 12582912.f : 25165824.f);
  return std::fmin(detail::sub_rn(detail::sub_rn(v, -magic), magic), 6.f);
}

float golden_round(float u) { return e2m1_to_float(float_to_e2m1(detail::max0(u))); }

// Mismatches of the lifted map with the given constants over every float bit pattern from lo to
// hi (inclusive) with the given stride; the first mismatch in *first.
int64_t sweep(uint32_t lo, uint32_t hi, uint32_t stride, int32_t lift, int32_t floor_bits,
              uint32_t* first) {
  int64_t bad = 0;
  for (uint64_t b = lo; b <= hi; b += stride) {
    const float u = bits_float(static_cast<uint32_t>(b));
    const float got = detail::e2m1_round_lifted(detail::max0(u), 6.f, lift, floor_bits);
    // The kernel's form: u / 8 through FFMA.SAT, codes in eighths.
    const float eighths = 8.f * detail::e2m1_round_lifted(fma_sat(u, 0.125f, 0.f), 0.75f, lift,
                                                          floor_bits - (3 << 23));
    // Bit equality with the previous kernel (the operand byte sees the sign of a zero) and value
    // equality with the golden codec.
    const uint32_t want = float_bits(previous_kernel_round(u));
    if (float_bits(got) != want || float_bits(eighths) != want || got != golden_round(u)) {
      if (bad++ == 0) *first = static_cast<uint32_t>(b);
    }
  }
  return bad;
}

// Every float of [2^-3, 8] (every rounding decision), a prime stride over all 2^32 patterns, and
// with FP4ATTN_FULL_SWEEP=1 all of them (about a minute; ran once, 0 mismatches).
TEST(DirectFast, E2m1RoundEqualsTheCodecOnEveryFloat) {
  uint32_t first = 0;
  const bool full = std::getenv("FP4ATTN_FULL_SWEEP") != nullptr;
  EXPECT_EQ(sweep(float_bits(0.125f), float_bits(8.f), 1, kE2m1Lift, kE2m1LiftFloor, &first), 0)
      << "first mismatch at bits 0x" << std::hex << first;
  EXPECT_EQ(sweep(0u, 0xFFFFFFFFu, full ? 1 : 211, kE2m1Lift, kE2m1LiftFloor, &first), 0)
      << "first mismatch at bits 0x" << std::hex << first;
}

TEST(DirectFast, E2m1RoundTiesNanAndInfinities) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float cases[][2] = {{0.25f, 0.f},
                            {0.75f, 1.f},
                            {1.25f, 1.f},
                            {1.75f, 2.f},
                            {2.5f, 2.f},
                            {3.5f, 4.f},
                            {5.f, 4.f},
                            {7.f, 6.f},
                            {6.f, 6.f},
                            {kInf, 6.f},
                            {-kInf, 0.f},
                            {-0.f, 0.f},
                            {std::nextafter(0.25f, 1.f), 0.5f},
                            {std::nextafter(0.75f, 0.f), 0.5f},
                            {std::nextafter(5.f, 6.f), 6.f},
                            {std::nextafter(2.f, 0.f), 2.f},
                            {std::numeric_limits<float>::quiet_NaN(), 0.f},
                            {1e30f, 6.f},
                            {-1e30f, 0.f}};
  for (const auto& c : cases) {
    EXPECT_EQ(float_bits(direct_e2m1_round(c[0])), float_bits(c[1])) << c[0];
    const float w = fma_sat(c[0], 0.125f, 0.f);
    EXPECT_EQ(float_bits(8.f * direct_e2m1_round_eighths(w)), float_bits(c[1])) << c[0];
  }
}

// Off-by-one constants must be caught by the sweep of [2^-3, 8] (every 7th float suffices).
// (kE2m1Lift - 1 is no mutation: it only halves M for exact powers of two, which need no rounding.)
TEST(DirectFast, E2m1RoundMutationsFail) {
  const uint32_t lo = float_bits(0.125f), hi = float_bits(8.f);
  uint32_t first = 0;
  EXPECT_GT(sweep(lo, hi, 7, kE2m1Lift + (1 << 23), kE2m1LiftFloor, &first), 0);
  EXPECT_GT(sweep(lo, hi, 7, kE2m1Lift - (1 << 23), kE2m1LiftFloor, &first), 0);
  EXPECT_GT(sweep(lo, hi, 7, kE2m1Lift - (1 << 22), kE2m1LiftFloor, &first), 0);
  EXPECT_GT(sweep(lo, hi, 7, kE2m1Lift, kE2m1LiftFloor + (1 << 23), &first), 0);
  EXPECT_GT(sweep(lo, hi, 7, kE2m1Lift, kE2m1LiftFloor - (1 << 23), &first), 0);
}

// The previous kernel's per-key code: u = fmaf(S, A c, k0), k0 = fmaf(A, t, B) with t = (log2 6 -
// e) - m; the new one: FFMA.SAT of S with A c / 8 and k0 / 8 = fmaf(A / 8, t, B / 8), in eighths.
// Equal whenever |S| < 2^25 (E4M3 Q K^T sums at d <= 128) or S is +-inf or NaN: the scaling by
// 1/8 is exact for every normal result, and where A c / 8 would be subnormal (c < 2^-123) S A c
// cannot move u off k0 (|k0| >= 2^-25 or k0 = 0).
bool same_code(float S, float c, float t) {
  const float k0 = fmaf(kDirectA, t, kDirectB);
  const float k08 = fmaf(kDirectA / 8, t, kDirectB / 8);
  const float ac = detail::mul_rn(kDirectA, c), ac8 = detail::mul_rn(kDirectA / 8, c);
  const float before = previous_kernel_round(fmaf(S, ac, k0));
  const float after = 8.f * direct_e2m1_round_eighths(fma_sat(S, ac8, k08));
  return float_bits(before) == float_bits(after);
}

TEST(DirectFast, ScaledFfmaSatGivesTheSameCodes) {
  uint64_t rng = 0x9E3779B97F4A7C15ull;
  auto next = [&rng] {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
  };
  auto uniform = [&next] { return static_cast<double>(next() >> 11) * 0x1p-53; };
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float special_c[] = {
      0.f, 1e-40f, 0x1p-126f, 0x1p-123f, 3e-38f, kInf, std::numeric_limits<float>::quiet_NaN()};
  const float thresholds[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f, 6.f, 7.f, 8.f};
  int64_t bad = 0, checked = 0;
  for (int i = 0; i < 200000; ++i) {
    // c log-uniform over [2^-140, 2^4] (tiny ones included), sometimes special.
    float c = static_cast<float>(std::exp2(-140.0 + 144.0 * uniform()));
    if (i % 97 == 0) c = special_c[(i / 97) % 7];
    // t = (log2 6 - e) - m: e in [-130, 0], m in [-64, 64]; near -0.8 k0 is tiny.
    const int e = -static_cast<int>(next() % 131), m = static_cast<int>(next() % 129) - 64;
    float t = (kLog2Six - static_cast<float>(e)) - static_cast<float>(m);
    if (i % 5 == 0) t = -0.8f + static_cast<float>(uniform() - 0.5) * 1e-6f;
    // S random over +-2^25, or aimed at each threshold and its neighbours.
    const float ac = detail::mul_rn(kDirectA, c), k0 = fmaf(kDirectA, t, kDirectB);
    float S = static_cast<float>((uniform() * 2 - 1) * std::exp2(25.0 * uniform()));
    for (float T : thresholds) {
      const float aim = static_cast<float>((double(T) - k0) / ac);
      float s0 = std::isfinite(aim) && std::fabs(aim) < 0x1p25f ? aim : S;
      for (int k = 0; k < 3; ++k) s0 = std::nextafter(s0, -kInf);
      for (int k = 0; k < 7; ++k, s0 = std::nextafter(s0, kInf), ++checked) {
        bad += !same_code(s0, c, t);
      }
    }
    for (float s1 : {S, -kInf, kInf, std::numeric_limits<float>::quiet_NaN(), 0.f}) {
      bad += !same_code(s1, c, t);
      ++checked;
    }
  }
  EXPECT_EQ(bad, 0) << "of " << checked;
}

// direct_operand (rounding with the unit in M) = the rounded code times the operand unit, for
// every block exponent e in [-126, 0] and a zero block: all floats u of [2^-3, 8] at e = 0, -126
// and a zero block, a stride of all 2^32 at every e. The kernel's input is w = fma_sat(u / 8).
int64_t operand_mismatches(float g, uint32_t lo, uint32_t hi, uint32_t stride) {
  const DirectBlockScale sc = direct_block_scale(g, 9);
  const DirectKeyMap km = direct_key_map(sc);
  const int e = direct_block_exponent(g);
  const bool zero = e + 127 <= 0;
  int64_t bad = 0;
  for (uint64_t b = lo; b <= hi; b += stride) {
    const float u = bits_float(static_cast<uint32_t>(b));
    const float want = zero ? 0.f : previous_kernel_round(u) * std::ldexp(1.f, e + 6);
    bad += float_bits(direct_operand(fma_sat(u, 0.125f, 0.f), km)) != float_bits(want);
  }
  return bad;
}

TEST(DirectFast, OperandEqualsCodeTimesUnit) {
  const uint32_t lo = float_bits(0.125f), hi = float_bits(8.f);
  for (float g : {0.f, -126.f, -3000.f}) {
    EXPECT_EQ(operand_mismatches(g, lo, hi, 1), 0) << "g " << g;
  }
  for (int e = 0; e >= -127; --e) {
    EXPECT_EQ(operand_mismatches(static_cast<float>(e), 0u, 0xFFFFFFFFu, 16411), 0) << "e " << e;
  }
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (float g : {-kInf, std::numeric_limits<float>::quiet_NaN()}) {
    EXPECT_EQ(operand_mismatches(g, 0u, 0xFFFFFFFFu, 65537), 0) << "g " << g;
  }
  if (std::getenv("FP4ATTN_FULL_SWEEP") != nullptr) {  // ran once: 0 mismatches
    for (float g : {0.f, -126.f}) EXPECT_EQ(operand_mismatches(g, 0u, 0xFFFFFFFFu, 1), 0) << g;
  }
}

// A key map one binade off must be caught.
TEST(DirectFast, OperandMutationsFail) {
  const DirectKeyMap km = direct_key_map(direct_block_scale(-3.f, 9));
  const DirectKeyMap bad[] = {{km.unit, km.lift + (1 << 23), km.floor_bits},
                              {km.unit, km.lift, km.floor_bits - (1 << 23)},
                              {km.unit, km.lift - (1 << 22), km.floor_bits}};
  for (const DirectKeyMap& m : bad) {
    int64_t n = 0;
    for (uint32_t b = float_bits(0.125f); b <= float_bits(8.f); b += 7) {
      const float w = fma_sat(bits_float(b), 0.125f, 0.f);
      n += float_bits(direct_operand(w, m)) != float_bits(direct_operand(w, km));
    }
    EXPECT_GT(n, 0);
  }
}

// The kernel sums the operand values of a block row; the sum equals the previous unit * sum(q):
// every term is a multiple of unit / 2 below 6 * unit, so both sums are exact.
TEST(DirectFast, OperandSumEqualsUnitTimesCodeSum) {
  uint64_t rng = 12345;
  int64_t bad = 0;
  for (int i = 0; i < 100000; ++i) {
    const int e = -static_cast<int>((rng = rng * 6364136223846793005ull + 1) >> 57);
    const DirectKeyMap km = direct_key_map(direct_block_scale(static_cast<float>(e), 9));
    float psum = 0.f, qsum = 0.f;
    for (int k = 0; k < 8; ++k) {
      rng = rng * 6364136223846793005ull + 1;
      const float u = static_cast<float>(static_cast<double>(rng >> 40) * 0x1p-24 * 9.0 - 1.0);
      psum += direct_operand(fma_sat(u, 0.125f, 0.f), km);
      qsum += previous_kernel_round(u);
    }
    const float want = e + 127 <= 0 ? 0.f : qsum * std::ldexp(1.f, e + 6);  // zero block: 0
    bad += float_bits(psum) != float_bits(want);
  }
  EXPECT_EQ(bad, 0);
}

// direct_cap_free: with |m| <= 2^20 no key of a nonzero block reaches u >= 7 (w >= 7/8), where
// the clamp at 6 would matter; a hunt for the largest w: the kernel's arithmetic on block maxima
// just below each exponent switch (g - e near 1 - (1 - log2 1.5), the largest x), |m| up to 2^20
// and the row max at the block (m = ceil(bm c)) or above it. Without the clamp the operand
// equals the clamped one for every w < 7/8 (all floats of [2^-6, 7/8]).
TEST(DirectFast, CapFreeBelowTwoToTheTwenty) {
  uint64_t rng = 0x2545F4914F6CDD1Dull;
  auto next = [&rng] {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
  };
  auto uniform = [&next] { return static_cast<double>(next() >> 11) * 0x1p-53; };
  float worst = 0.f;
  int64_t nonzero = 0;
  for (int i = 0; i < 400000; ++i) {
    const double mag = i % 2 ? 0x1p20 : std::exp2(20.0 * uniform());
    const float m = static_cast<float>(std::ceil((uniform() * 2 - 1) * mag));
    const int e = -static_cast<int>(next() % 127);
    const float cb = static_cast<float>(std::exp2(-30.0 + 34.0 * uniform()));
    // X = bm * cb just below m + e + 1 - 0.415 (the switch to e + 1), or at m itself.
    const double x = i % 3 ? double(m) + e + 0.5849625 - 1e-6 * uniform() : double(m);
    float bm = static_cast<float>(x / cb);
    for (int k = 0; k < 4; ++k, bm = std::nextafter(bm, 0x1p127f)) {
      const float row_m = i % 5 ? m : std::ceil(detail::mul_rn(bm, cb));  // m at the block max
      const DirectBlockScale sc = direct_block_scale(fmaf(bm, cb, -row_m), 9);
      if (sc.unit == 0.f || !(fmaf(bm, cb, -row_m) <= 0x1p-10f)) continue;
      const float k08 = fmaf(kDirectA / 8, kLog2Six - sc.e - row_m, kDirectB / 8);
      worst = std::fmax(worst, fma_sat(bm, detail::mul_rn(kDirectA / 8, cb), k08));
      ++nonzero;
    }
  }
  std::printf("largest u of a nonzero block with |m| <= 2^20: %.6f (%lld blocks)\n", 8 * worst,
              static_cast<long long>(nonzero));
  EXPECT_GT(nonzero, 1000000);
  EXPECT_LT(worst, 0.8f);  // u < 6.4: far from 7
  const DirectKeyMap km = direct_key_map(direct_block_scale(-2.f, 9));
  int64_t bad = 0;
  for (uint32_t b = float_bits(0x1p-6f); b < float_bits(0.875f); ++b) {
    const float w = bits_float(b);
    bad += float_bits(direct_operand<false>(w, km)) != float_bits(direct_operand<true>(w, km));
  }
  EXPECT_EQ(bad, 0);
  EXPECT_NE(direct_operand<false>(0.875f, km), direct_operand<true>(0.875f, km));  // the limit
  // FFMA.SAT may return -0 for a -0 result: the operand is +0 either way.
  EXPECT_EQ(float_bits(direct_operand<false>(-0.f, km)), 0u);
  EXPECT_EQ(float_bits(direct_operand<true>(-0.f, km)), 0u);
  EXPECT_TRUE(direct_cap_free(0x1p20f));
  EXPECT_FALSE(direct_cap_free(0x1.000002p20f));
  EXPECT_FALSE(direct_cap_free(std::numeric_limits<float>::infinity()));
}

// The row max from the quad's block maxima (softmax_direct) against update_row_max's order (per
// lane max per scale tile, times c, then the quad): m_new = max(m_old, ceil(mx)) is the same for
// S with -inf (masked) and NaN entries and c of 0, NaN, +inf or finite (fmaxf ignores NaN), up
// to the sign of a zero m.
TEST(DirectFast, RowMaxFromBlockMaximaEqualsUpdateRowMax) {
  uint64_t rng = 77;
  auto next = [&rng] {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
  };
  constexpr float kInf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float cs[] = {0.f, nan, kInf, 1e-30f, 0.37f, 3.f};
  auto pick = [&](int k) -> float {
    switch (next() % 8) {
      case 0:
        return -kInf;
      case 1:
        return k % 3 ? -kInf : nan;
      case 2:
        return 0.f;
      default:
        return static_cast<float>(static_cast<int64_t>(next() % 2001) - 1000) * 0.25f;
    }
  };
  int64_t bad = 0;
  for (int it = 0; it < 200000; ++it) {
    // 4 lanes x 2 tiles x 2 blocks per tile x 8 keys of one row; c per tile.
    float sv[4][2][2][8];
    for (auto& lane : sv)
      for (auto& tile : lane)
        for (auto& blk : tile)
          for (int k = 0; k < 8; ++k) blk[k] = pick(k);
    const float c[2] = {cs[next() % 6], cs[next() % 6]};
    const float m_old = next() % 2 ? -kInf : static_cast<float>(static_cast<int>(next() % 64) - 32);
    float old_mx = -kInf, new_mx = -kInf, tile_max[2] = {-kInf, -kInf};
    for (int l = 0; l < 4; ++l) {
      float mp[2] = {-kInf, -kInf};
      for (int t = 0; t < 2; ++t)
        for (int b = 0; b < 2; ++b)
          for (float x : sv[l][t][b]) mp[t] = std::fmax(mp[t], x);
      old_mx = std::fmax(old_mx, std::fmax(mp[0] * c[0], mp[1] * c[1]));
    }
    for (int t = 0; t < 2; ++t) {
      for (int b = 0; b < 2; ++b) {
        float bm = -kInf;  // the block max over the quad
        for (int l = 0; l < 4; ++l)
          for (float x : sv[l][t][b]) bm = std::fmax(bm, x);
        tile_max[t] = std::fmax(tile_max[t], bm);
      }
    }
    new_mx = std::fmax(tile_max[0] * c[0], tile_max[1] * c[1]);
    const float m_a = std::fmax(m_old, std::ceil(old_mx)),
                m_b = std::fmax(m_old, std::ceil(new_mx));
    // Equal in value; the sign of a zero m may differ (c = 0, with fmaxf free to order -0 and
    // +0), which changes nothing downstream: m only enters sums and differences with nonzero
    // terms or with another +-0 (g, k0, alpha, the LSE).
    bad += !(m_a == m_b || (std::isnan(m_a) && std::isnan(m_b)));
  }
  EXPECT_EQ(bad, 0);
}

// The kernel's block exponent and unit before: int e = g >= -1000 ? direct_block_exponent(g) :
// -1000, zero block when e + 127 <= 0, unit = 2^(e + 6) else 0.
bool same_as_previous(float g) {
  const int e = g >= -1000.f ? direct_block_exponent(g) : -1000;
  const bool zero = e + 127 <= 0;
  const float unit = zero ? 0.f : std::ldexp(1.f, e + 6);
  const DirectBlockScale s = direct_block_scale(g), s9 = direct_block_scale(g, 9);
  // The kernel's unit for codes in eighths: 8 times the operand unit, exactly; the field is the
  // unit's exponent less 127 (-127 for a zero block).
  if (float_bits(s9.unit) != float_bits(8.f * unit)) return false;
  if (s9.field != (zero ? -(127 << 23) : (e + 9) * (1 << 23))) return false;
  if (float_bits(s.unit) != float_bits(unit)) return false;
  return zero || s.e == static_cast<float>(e);  // k0 uses e only in nonzero blocks
}

TEST(DirectFast, BlockScaleEqualsTheIntegerExponent) {
  int64_t bad = 0, checked = 0;
  // Every 13th float of [-1024, 0] (below -127 all blocks are zero blocks).
  for (uint32_t b = float_bits(-0.f); b <= float_bits(-1024.f); b += 13, ++checked) {
    bad += !same_as_previous(bits_float(b));
  }
  // 64 floats either side of every switch k - (1 - log2 1.5) down to the zero-block limit.
  for (int k = 1; k >= -130; --k) {
    float g = static_cast<float>(k) - kNearestPow2Shift;
    for (int i = 0; i < 64; ++i) g = std::nextafter(g, -2000.f);
    for (int i = 0; i < 129; ++i, g = std::nextafter(g, 0.f), ++checked) {
      if (g <= 0.f) bad += !same_as_previous(g);
    }
  }
  EXPECT_EQ(bad, 0) << "of " << checked;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (float g : {-kInf, std::numeric_limits<float>::quiet_NaN(), -1e30f, -1000.f, -1001.f,
                  -126.f - kNearestPow2Shift, -127.f - kNearestPow2Shift}) {
    EXPECT_TRUE(same_as_previous(g)) << g;
  }
  EXPECT_EQ(direct_block_scale(-126.f - kNearestPow2Shift).unit, std::ldexp(1.f, -120));
  EXPECT_EQ(direct_block_scale(std::nextafter(-126.f - kNearestPow2Shift, -200.f)).unit, 0.f);
  EXPECT_EQ(direct_block_scale(0.f).unit, 64.f);
}

}  // namespace
}  // namespace fp4attn
