// The P-dump classifier (src/reference/p_dump_compare.h) on synthetic dumps: an exact-arithmetic
// kernel (make_row_p over the keys seen so far, i.e. the running reference) must come out
// equal or "underflow edge" only, and planted faults (a flipped code, a wrong byte, a shifted
// reference, a written masked key, unwritten and stray positions) must be counted where they
// belong, so that the GPU test (tests/cuda/test_p_dump_gpu.cu) cannot accept garbage.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "fp4attn/numerics/formats.h"
#include "reference/golden_softmax.h"
#include "support/p_dump_compare.h"

namespace fp4attn::golden {
namespace {

constexpr uint8_t kPoison = 0xAB;
constexpr int64_t kN = 128;

float poison_float() {
  const uint32_t bits = kPoison * 0x01010101u;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

struct Dump {
  std::vector<uint8_t> p;
  std::vector<float> m;
};

// What a kernel with the golden model's arithmetic writes: block j's P made at the running
// reference of keys [0, end of block j), masked keys 0, unprocessed blocks left poisoned.
Dump exact_kernel_dump(const std::vector<double>& z, int64_t n, int64_t blocks, int64_t written,
                       const RecipeOptions& opt) {
  Dump d{std::vector<uint8_t>(blocks * kN, kPoison), std::vector<float>(blocks, poison_float())};
  for (int64_t j = 0; j < written; ++j) {
    const int64_t end = std::min(n, (j + 1) * kN);
    RowP r;
    if (end > j * kN) r = make_row_p(z, end, opt);
    d.m[j] = end > 0 ? float(integer_row_max(z, end)) : -std::numeric_limits<float>::infinity();
    for (int64_t k = j * kN; k < (j + 1) * kN; ++k) {
      d.p[k] = k < end ? float_to_e4m3(float(r.p[k])) : 0;
    }
  }
  return d;
}

// Scores whose spread grows along the row, so that the running max moves across blocks: by a
// few units (moderate, as the GPU test's inputs), or so far that the early keys reach the
// underflow range (wide).
std::vector<double> growing_scores(int64_t s_k, bool wide, std::mt19937_64& rng) {
  std::normal_distribution<double> g(0, wide ? 2 : 1.5);
  std::vector<double> z(s_k);
  for (int64_t k = 0; k < s_k; ++k) z[k] = g(rng) * (wide ? 0.5 + 4.0 * k / s_k : 1.0 + k / s_k);
  return z;
}

RecipeOptions recipe_opt(Recipe r) {
  RecipeOptions o;
  o.recipe = r;
  return o;
}

const Recipe kPRecipes[] = {Recipe::kFp8, Recipe::kNvfp4Fast, Recipe::kFp4Direct,
                            Recipe::kNvfp4All};

TEST(PDumpCompare, ClassifiesSingleValues) {
  const std::vector<double> e4m3;
  const std::vector<std::vector<double>> none;
  EXPECT_EQ(classify_p(1.0, 1.0, 0, e4m3, none), PMatch::kEqual);
  EXPECT_EQ(classify_p(0.0, 0.0, -3, e4m3, none), PMatch::kEqual);
  EXPECT_EQ(classify_p(1.125, 1.0, 0, e4m3, none), PMatch::kOneCode);
  EXPECT_EQ(classify_p(0.9375 * 0.5, 0.5, 0, e4m3, none), PMatch::kOneCode);  // across a binade
  EXPECT_EQ(classify_p(1.25, 1.0, 0, e4m3, none), PMatch::kOther);
  EXPECT_EQ(classify_p(std::ldexp(2, -9), std::ldexp(1, -9), 0, e4m3, none), PMatch::kOneCode);
  EXPECT_EQ(classify_p(std::ldexp(1, -9), 0.0, 0, e4m3, none), PMatch::kOneCode);
  EXPECT_EQ(classify_p(-1.0, 1.0, 0, e4m3, none), PMatch::kOther);
  // Made at a finer reference (shift -1), 4.5 * 2^-9 is not on the golden's subnormal grid.
  const double fine = std::ldexp(4.5, -9);
  EXPECT_EQ(classify_p(fine, std::ldexp(1, -9), -1, e4m3, none), PMatch::kUnderflowEdge);
  EXPECT_EQ(classify_p(fine, std::ldexp(1, -9), 0, e4m3, none), PMatch::kOther);  // same reference
  EXPECT_EQ(classify_p(0.02, 0.04, -1, e4m3, none), PMatch::kOther);  // 0.04 is above 2 * 2^-6
  // A coarser kernel reference (shift +2) moves the limit to 2^-4.
  EXPECT_EQ(classify_p(0.0625 * 0.75, 0.0625 * 1.5, 2, e4m3, none), PMatch::kUnderflowEdge);
  // fp4-direct: one E2M1 code in the block exponent's grid; 4 and 6 are adjacent, 1 and 6 not.
  const std::vector<double> direct = p_block_grid(Recipe::kFp4Direct, -2, 0);
  EXPECT_EQ(classify_p(6 * 16, 4 * 16, 0, direct, none), PMatch::kOneCode);
  EXPECT_EQ(classify_p(6 * 16, 1 * 16, 0, direct, none), PMatch::kOther);
  EXPECT_EQ(classify_p(0, 0.5 * 16, 0, direct, none), PMatch::kOneCode);
  EXPECT_EQ(p_block_grid(Recipe::kFp4Direct, -1000, 0), std::vector<double>{0});
  // nvfp4-all: the folded grid of scale 64: 0, 4, 8, 12, 16, 24, 32, 48.
  const std::vector<double> all = p_block_grid(Recipe::kNvfp4All, 64, 0);
  EXPECT_EQ(all, (std::vector<double>{0, 4, 8, 12, 16, 24, 32, 48}));
  EXPECT_EQ(classify_p(32, 48, 0, all, none), PMatch::kOneCode);
  EXPECT_EQ(classify_p(36, 32, 0, all, none), PMatch::kOther);  // an E4M3 step, not a grid step
  // A block scale one E4M3 step up (72): the same or the next code under it is a parameter flip.
  const std::vector<std::vector<double>> up = {p_block_grid(Recipe::kNvfp4All, 72, 0)};
  EXPECT_EQ(classify_p(36, 32, 0, all, up), PMatch::kParamFlip);  // code 4 under both
  EXPECT_EQ(classify_p(56, 32, 0, all, up), PMatch::kParamFlip);  // 6 under 72 vs 4 under 64
  EXPECT_EQ(classify_p(9, 32, 0, all, up), PMatch::kOther);       // 1 under 72 vs 4 under 64
  // fp4-direct: the exponent one higher, the code one lower.
  const std::vector<std::vector<double>> e_up = {p_block_grid(Recipe::kFp4Direct, -1, 0)};
  EXPECT_EQ(classify_p(4 * 32, 6 * 16, 0, direct, e_up), PMatch::kParamFlip);
}

struct RowCase {
  std::vector<double> z;
  int64_t n, blocks, written;
};

// Rows of 5-6 blocks: full, causal-like (fewer visible keys than written), a tail.
std::vector<RowCase> rows(std::mt19937_64& rng, bool wide = false) {
  std::vector<RowCase> v;
  for (int i = 0; i < 60; ++i) {
    const int64_t s_k = 700;
    RowCase c{growing_scores(s_k, wide, rng), s_k, 6, 6};
    if (i % 3 == 1) c.n = 300 + 5 * i;  // causal: keys past n masked
    if (i % 3 == 2) c.n = 640 + i;      // a longer tail masked
    v.push_back(c);
  }
  return v;
}

PDumpStats compare(const RowCase& c, const Dump& d, const RecipeOptions& opt) {
  PDumpStats st;
  compare_p_row(d.p.data(), d.m.data(), kN, c.blocks, c.written, kPoison, c.z, c.n, opt, "row",
                &st);
  return st;
}

TEST(PDumpCompare, ExactRunningReferenceIsEqualOrUnderflowEdge) {
  std::mt19937_64 rng(7);
  for (bool wide : {false, true}) {
    const std::vector<RowCase> cases = rows(rng, wide);
    for (Recipe r : kPRecipes) {
      SCOPED_TRACE(std::string(recipe_name(r)) + (wide ? " wide" : " moderate"));
      const RecipeOptions opt = recipe_opt(r);
      PDumpStats all;
      for (const RowCase& c : cases) {
        all.add(compare(c, exact_kernel_dump(c.z, c.n, c.blocks, c.written, opt), opt));
      }
      std::printf("[p-dump exact %s %s] %s\n", wide ? "wide" : "moderate", recipe_name(r),
                  all.summary().c_str());
      EXPECT_EQ(all.other, 0) << all.first_other;
      EXPECT_EQ(all.unwritten + all.stray + all.bad_m + all.masked_nonzero, 0) << all.first_other;
      EXPECT_GT(all.rescaled, all.compared() / 10);  // the row max does move
      EXPECT_GT(all.masked, 0);
      EXPECT_EQ(all.rows_final_m_differs, 0);
      if (wide) {
        EXPECT_GT(all.underflow_edge, all.compared() / 100);  // the edge is exercised
      } else {
        EXPECT_GE(double(all.equal), 0.999 * double(all.compared()));
      }
    }
  }
}

// The kernel's scores differ from the golden's by FP32 and MMA rounding; with a perturbation of
// that size (and larger) flips are one code apart, never "other".
TEST(PDumpCompare, PerturbedScoresFlipOneCode) {
  std::mt19937_64 rng(11);
  const std::vector<RowCase> cases = rows(rng);
  std::normal_distribution<double> noise(0, 1);
  for (double eps : {1e-5, 3e-4}) {
    for (Recipe r : kPRecipes) {
      SCOPED_TRACE(std::string(recipe_name(r)) + " eps " + std::to_string(eps));
      const RecipeOptions opt = recipe_opt(r);
      PDumpStats all;
      for (const RowCase& c : cases) {
        std::vector<double> zk = c.z;
        for (double& x : zk) x += eps * noise(rng);
        all.add(compare(c, exact_kernel_dump(zk, c.n, c.blocks, c.written, opt), opt));
      }
      std::printf("[p-dump eps=%g %s] %s\n", eps, recipe_name(r), all.summary().c_str());
      EXPECT_LE(all.other, all.compared() / 20000) << all.first_other;
      if (eps > 1e-4) {
        EXPECT_GT(all.one_code + all.param_flip, 0);
      }
    }
  }
}

// A visible key of a block made at the final reference whose golden value is normal.
int64_t normal_key(const RowCase& c, const Dump& d, int64_t skip_blocks = 0) {
  const double m_final = integer_row_max(c.z, c.n);
  for (int64_t k = skip_blocks * kN; k < c.n; ++k) {
    if (d.m[k / kN] == m_final && e4m3_to_float(d.p[k]) >= 1.0) return k;
  }
  return -1;
}

TEST(PDumpCompare, PlantedFaultsAreCounted) {
  std::mt19937_64 rng(5);
  const std::vector<RowCase> cases = rows(rng);
  const RowCase& full = cases[0];    // n = 700 of 6 written blocks: 68 tail keys masked
  const RowCase& causal = cases[1];  // n = 307
  for (Recipe r : kPRecipes) {
    SCOPED_TRACE(recipe_name(r));
    const RecipeOptions opt = recipe_opt(r);
    const Dump clean = exact_kernel_dump(full.z, full.n, full.blocks, full.written, opt);
    const PDumpStats base = compare(full, clean, opt);
    ASSERT_EQ(base.other, 0);
    const int64_t k = normal_key(full, clean);
    ASSERT_GE(k, 0);

    Dump d = clean;  // a far wrong byte: 1/4 or less of the value
    d.p[k] = float_to_e4m3(e4m3_to_float(clean.p[k]) * 0.25f);
    PDumpStats st = compare(full, d, opt);
    EXPECT_EQ(st.other, 1);
    EXPECT_NE(st.first_other.find("key " + std::to_string(k)), std::string::npos);

    if (r == Recipe::kFp8 || r == Recipe::kNvfp4Fast) {  // one E4M3 code up
      d = clean;
      d.p[k] = uint8_t(clean.p[k] + 1);
      st = compare(full, d, opt);
      EXPECT_EQ(st.other, 0);
      EXPECT_EQ(st.one_code, base.one_code + 1);
      // Two codes up is "other".
      d.p[k] = uint8_t(clean.p[k] + 2);
      EXPECT_EQ(compare(full, d, opt).other, 1);
    }

    d = clean;  // a reference one too high: every normal value of the block is 2x off (for
    // fp4-direct that looks like every block's exponent flipped: not "equal" either)
    const int64_t last = full.written - 1;
    d.m[last] += 1;
    st = compare(full, d, opt);
    EXPECT_GT(st.other + st.param_flip, 20);
    EXPECT_LT(st.equal, base.equal - 20);
    EXPECT_EQ(st.rows_final_m_differs, 1);

    d = clean;  // a decreasing reference
    d.m[0] = d.m[1] + 1;
    EXPECT_EQ(compare(full, d, opt).bad_m, 1);

    d = clean;  // a masked key written
    d.p[full.n] = 0x38;
    st = compare(full, d, opt);
    EXPECT_EQ(st.masked_nonzero, 1);

    d = clean;  // unwritten P and m
    d.p[3] = kPoison;
    d.m[2] = poison_float();
    EXPECT_EQ(compare(full, d, opt).unwritten, 2);

    // Causal: blocks past the written ones must stay poisoned.
    RowCase c = causal;
    c.written = 3;
    const Dump cd = exact_kernel_dump(c.z, c.n, c.blocks, c.written, opt);
    st = compare(c, cd, opt);
    EXPECT_EQ(st.stray + st.unwritten + st.other, 0) << st.first_other;
    Dump bad = cd;
    bad.p[3 * kN + 5] = 0;
    bad.m[4] = 1.f;
    EXPECT_EQ(compare(c, bad, opt).stray, 2);
    // Written blocks that stop before the visible keys do: the rest are unwritten.
    c.written = 2;
    const Dump short_dump = exact_kernel_dump(c.z, c.n, c.blocks, c.written, opt);
    EXPECT_EQ(compare(c, short_dump, opt).unwritten, c.n - 2 * kN);
  }
}

// The block-scaled recipes: a code moved within the block's grid is one code; a value off every
// grid is not.
TEST(PDumpCompare, BlockScaledCodes) {
  std::mt19937_64 rng(9);
  const std::vector<RowCase> cases = rows(rng);
  const RowCase& c = cases[0];
  for (Recipe r : {Recipe::kFp4Direct, Recipe::kNvfp4All}) {
    SCOPED_TRACE(recipe_name(r));
    const RecipeOptions opt = recipe_opt(r);
    const Dump clean = exact_kernel_dump(c.z, c.n, c.blocks, c.written, opt);
    std::vector<double> param;
    const RowP g = make_row_p(c.z, c.n, opt, &param);
    const int64_t k = normal_key(c, clean, 1);
    ASSERT_GE(k, 0);
    const std::vector<double> grid = p_block_grid(r, param[k], 0);
    const auto it = std::find(grid.begin(), grid.end(), g.p[k]);
    ASSERT_NE(it, grid.end());
    Dump d = clean;
    const double down = *(it - 1);  // one grid step down (g.p[k] >= 1 is not the lowest)
    d.p[k] = float_to_e4m3(float(down));
    PDumpStats st = compare(c, d, opt);
    EXPECT_EQ(st.other, 0) << st.first_other;
    EXPECT_EQ(st.one_code, compare(c, clean, opt).one_code + 1);
    // Off the grid: the E4M3 neighbour of a grid value that is not a grid value.
    uint8_t off = uint8_t(clean.p[k] + 1);
    while (std::find(grid.begin(), grid.end(), double(e4m3_to_float(off))) != grid.end()) ++off;
    d.p[k] = off;
    EXPECT_EQ(compare(c, d, opt).other, 1);
  }
}

}  // namespace
}  // namespace fp4attn::golden
