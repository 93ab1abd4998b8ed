// The golden model of the quantized recipes: accuracy against float64, the documented edge
// cases (no keys, NaN, zero sizes), exactness claims (nvfp4-hx and mxfp4 fold exactly) and the
// schedule invariance of P codes under integer shifts of the row reference.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fp4attn/golden/golden.h"
#include "fp4attn/golden/reference.h"
#include "harness/metrics.h"
#include "harness/suite.h"
#include "reference/golden_operands.h"
#include "reference/golden_softmax.h"

namespace fp4attn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Result {
  std::vector<double> o, lse;
};

struct Problem {
  int64_t b = 1, s_q = 96, s_k = 160, h = 2, h_kv = 2, d = 64;
  bool causal = false;
};

SuiteInputs inputs_for(const Problem& p, InputKind kind = InputKind::kGaussian, uint64_t seed = 7) {
  return make_inputs(kind, p.b, p.s_q, p.s_k, p.h, p.h_kv, p.d, seed);
}

Result run_golden(const Problem& p, SuiteInputs& in, RecipeOptions opt) {
  Result r{std::vector<double>(p.b * p.s_q * p.h * p.d), std::vector<double>(p.b * p.h * p.s_q)};
  opt.causal = p.causal;
  Status st =
      golden_attention_forward(make_view(in.q.data(), DType::kF32, {p.b, p.s_q, p.h, p.d}),
                               make_view(in.k.data(), DType::kF32, {p.b, p.s_k, p.h_kv, p.d}),
                               make_view(in.v.data(), DType::kF32, {p.b, p.s_k, p.h_kv, p.d}), opt,
                               make_view(r.o.data(), DType::kF64, {p.b, p.s_q, p.h, p.d}),
                               make_view(r.lse.data(), DType::kF64, {p.b, p.h, p.s_q}));
  EXPECT_TRUE(st.ok()) << st.message();
  return r;
}

Result run_f64(const Problem& p, SuiteInputs& in) {
  Result r{std::vector<double>(p.b * p.s_q * p.h * p.d), std::vector<double>(p.b * p.h * p.s_q)};
  Status st = reference_attention_forward(
      make_view(in.q.data(), DType::kF32, {p.b, p.s_q, p.h, p.d}),
      make_view(in.k.data(), DType::kF32, {p.b, p.s_k, p.h_kv, p.d}),
      make_view(in.v.data(), DType::kF32, {p.b, p.s_k, p.h_kv, p.d}), {0, p.causal},
      make_view(r.o.data(), DType::kF64, {p.b, p.s_q, p.h, p.d}),
      make_view(r.lse.data(), DType::kF64, {p.b, p.h, p.s_q}));
  EXPECT_TRUE(st.ok()) << st.message();
  return r;
}

RecipeOptions options(Recipe r) {
  RecipeOptions o;
  o.recipe = r;
  return o;
}

// Upper bounds of rel-L2 against float64 on Gaussian inputs, about 1.5x what the recipes reach
// (docs/numerics.md has the measured table).
double max_rel_l2(Recipe r) {
  switch (r) {
    case Recipe::kBf16:
      return 0.01;
    case Recipe::kFp8:
      return 0.06;
    case Recipe::kFp8Fast:
      return 0.07;
    case Recipe::kInt8:  // measured 0.038-0.039 (d 64 / 128, both masks)
      return 0.045;
    case Recipe::kInt8Fast:
      return 0.05;
    case Recipe::kNvfp4:
      return 0.21;
    case Recipe::kNvfp4Hx:
      return 0.23;
    case Recipe::kMxfp4:
      return 0.25;
    case Recipe::kNvfp4Fast:
      return 0.21;
    case Recipe::kNvfp4All:
      return 0.30;
    case Recipe::kFp4Direct:
      return 0.45;
  }
  return 0;
}

// Bounds of |LSE - LSE_f64|: FP4 Q/K move every logit, so the LSE moves with them (about half
// these bounds is measured); a wrong lift or offset would miss by ln(2^8) = 5.5.
double max_lse_err(Recipe r) {
  switch (r) {
    case Recipe::kBf16:
      return 1e-3;
    case Recipe::kFp8:
    case Recipe::kInt8:
      return 0.05;
    case Recipe::kFp8Fast:
    case Recipe::kInt8Fast:
      return 0.15;  // fp8's 0.05 and the code map's P, up to 6.1% above 2^x (LSE up to ln 1.061
                    // high)
    case Recipe::kFp4Direct:
      return 0.6;
    default:
      return 0.25;
  }
}

class EveryRecipe : public ::testing::TestWithParam<Recipe> {};

TEST_P(EveryRecipe, CloseToFloat64OnGaussianInputs) {
  for (bool causal : {false, true}) {
    for (int64_t d : {64, 128}) {
      Problem p;
      p.causal = causal;
      p.d = d;
      SuiteInputs in = inputs_for(p);
      Result ref = run_f64(p, in), got = run_golden(p, in, options(GetParam()));
      ErrorStats e = compare(got.o.data(), ref.o.data(), got.o.size());
      EXPECT_LT(e.rel_l2, max_rel_l2(GetParam())) << "d=" << d << " causal=" << causal;
      EXPECT_GT(e.cos, 1 - max_rel_l2(GetParam()) * max_rel_l2(GetParam()));
      EXPECT_EQ(e.nan_mismatch, 0);
      for (size_t i = 0; i < ref.lse.size(); ++i) {
        if (std::isinf(ref.lse[i])) {
          EXPECT_EQ(got.lse[i], kInf);
        } else {
          EXPECT_NEAR(got.lse[i], ref.lse[i], max_lse_err(GetParam())) << "row " << i;
        }
      }
    }
  }
}

TEST_P(EveryRecipe, RowsWithoutKeysGiveZeroAndInfiniteLse) {
  Problem p;
  p.causal = true;
  p.s_q = 100;
  p.s_k = 40;  // rows 0..59 see no key
  SuiteInputs in = inputs_for(p);
  Result got = run_golden(p, in, options(GetParam()));
  for (int64_t h = 0; h < p.h; ++h) {
    for (int64_t i = 0; i < p.s_q; ++i) {
      const double lse = got.lse[h * p.s_q + i];
      if (i < p.s_q - p.s_k) {
        EXPECT_EQ(lse, kInf);
        for (int64_t c = 0; c < p.d; ++c) EXPECT_EQ(got.o[(i * p.h + h) * p.d + c], 0.0);
      } else {
        EXPECT_TRUE(std::isfinite(lse));
      }
    }
  }
}

TEST_P(EveryRecipe, NoKeysAtAllIsNotAnError) {
  Problem p;
  p.s_k = 0;
  SuiteInputs in = inputs_for(p);
  Result got = run_golden(p, in, options(GetParam()));
  for (double x : got.o) EXPECT_EQ(x, 0.0);
  for (double x : got.lse) EXPECT_EQ(x, kInf);
}

TEST_P(EveryRecipe, NanInAQueryPoisonsItsRowOnly) {
  Problem p;
  SuiteInputs in = inputs_for(p);
  const int64_t row = 17, head = 1;
  in.q[(row * p.h + head) * p.d + 5] = std::numeric_limits<float>::quiet_NaN();
  Result got = run_golden(p, in, options(GetParam()));
  // fp8 and int8 have one Q scale per 128 tokens: the NaN poisons that block's rows (all 96 here).
  const bool whole_block =
      operand_recipe(GetParam()) == Recipe::kFp8 || recipe_qk_is_int8(GetParam());
  for (int64_t i = 0; i < p.s_q; ++i) {
    const bool poisoned = whole_block ? i / 128 == row / 128 : i == row;
    EXPECT_EQ(std::isnan(got.lse[head * p.s_q + i]), poisoned) << "row " << i;
    EXPECT_EQ(std::isnan(got.o[(i * p.h + head) * p.d]), poisoned) << "row " << i;
  }
  EXPECT_FALSE(std::isnan(got.o[(row * p.h + 0) * p.d]));  // other head untouched
}

TEST_P(EveryRecipe, InfInAKeyNeverBecomesAFiniteOutput) {
  Problem p;
  SuiteInputs in = inputs_for(p);
  in.k[(33 * p.h_kv + 0) * p.d + 2] = std::numeric_limits<float>::infinity();
  Result got = run_golden(p, in, options(GetParam()));
  if (GetParam() == Recipe::kBf16) {
    // IEEE attention: an infinite logit gives what the float64 reference gives (a -inf logit is
    // a masked key, +inf a NaN row).
    Result ref = run_f64(p, in);
    EXPECT_EQ(compare(got.o.data(), ref.o.data(), got.o.size()).nan_mismatch, 0);
    return;
  }
  // Quantized recipes: the key's block scale is NaN, so every row of head 0 (all read key 33)
  // is NaN, never a silently finite value.
  for (int64_t i = 0; i < p.s_q; ++i) EXPECT_TRUE(std::isnan(got.o[(i * p.h) * p.d]));
}

TEST_P(EveryRecipe, GqaEqualsRepeatedKeyValueHeads) {
  Problem gqa;
  gqa.h = 4;
  gqa.h_kv = 2;
  SuiteInputs in = inputs_for(gqa);
  Problem mha = gqa;
  mha.h_kv = 4;
  SuiteInputs rep = in;
  rep.h_kv = 4;
  rep.k.assign(mha.b * mha.s_k * 4 * mha.d, 0);
  rep.v = rep.k;
  for (int64_t s = 0; s < gqa.s_k; ++s) {
    for (int64_t h = 0; h < 4; ++h) {
      for (int64_t c = 0; c < gqa.d; ++c) {
        rep.k[(s * 4 + h) * gqa.d + c] = in.k[(s * 2 + h / 2) * gqa.d + c];
        rep.v[(s * 4 + h) * gqa.d + c] = in.v[(s * 2 + h / 2) * gqa.d + c];
      }
    }
  }
  Result a = run_golden(gqa, in, options(GetParam()));
  Result b = run_golden(mha, rep, options(GetParam()));
  EXPECT_EQ(a.o, b.o);
  EXPECT_EQ(a.lse, b.lse);
}

TEST_P(EveryRecipe, StridedBhsdInputsGiveTheSameResult) {
  Problem p;
  SuiteInputs in = inputs_for(p);
  Result bshd = run_golden(p, in, options(GetParam()));
  // The same q stored BHSD: q[b][h][s][d], described with strides.
  std::vector<float> q_bhsd(in.q.size());
  for (int64_t s = 0; s < p.s_q; ++s)
    for (int64_t h = 0; h < p.h; ++h)
      for (int64_t c = 0; c < p.d; ++c)
        q_bhsd[(h * p.s_q + s) * p.d + c] = in.q[(s * p.h + h) * p.d + c];
  std::vector<double> o(bshd.o.size()), lse(bshd.lse.size());
  RecipeOptions opt = options(GetParam());
  Status st =
      golden_attention_forward(make_strided_view(q_bhsd.data(), DType::kF32, {1, p.s_q, p.h, p.d},
                                                 {p.h * p.s_q * p.d, p.d, p.s_q * p.d, 1}),
                               make_view(in.k.data(), DType::kF32, {1, p.s_k, p.h_kv, p.d}),
                               make_view(in.v.data(), DType::kF32, {1, p.s_k, p.h_kv, p.d}), opt,
                               make_view(o.data(), DType::kF64, {1, p.s_q, p.h, p.d}),
                               make_view(lse.data(), DType::kF64, {1, p.h, p.s_q}));
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(o, bshd.o);
  EXPECT_EQ(lse, bshd.lse);
}

INSTANTIATE_TEST_SUITE_P(Recipes, EveryRecipe, ::testing::ValuesIn(kAllRecipes),
                         [](const auto& info) {
                           std::string n = recipe_name(info.param);
                           for (char& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

// Folding is exact for nvfp4-hx (restricted scale mantissas) and mxfp4 (power-of-two scales):
// the Hopper operands give Blackwell's block-scaled products. Plain nvfp4 rounds when folding.
TEST(GoldenFolding, ExactForRestrictedNvfp4AndMxfp4Only) {
  Problem p;
  SuiteInputs in = inputs_for(p, InputKind::kOutlierChannels);
  for (Recipe r : {Recipe::kNvfp4Hx, Recipe::kMxfp4, Recipe::kNvfp4}) {
    RecipeOptions folded = options(r), exact = options(r);
    exact.emulation = Emulation::kBlockScaledExact;
    Result a = run_golden(p, in, folded), b = run_golden(p, in, exact);
    ErrorStats e = compare(a.o.data(), b.o.data(), a.o.size());
    if (r == Recipe::kNvfp4) {
      EXPECT_GT(e.rel_l2, 1e-4) << "plain NVFP4 folding should round";
    } else {
      EXPECT_LT(e.rel_l2, 1e-12) << recipe_name(r);
    }
  }
}

TEST(GoldenSmoothing, CorrectsTheLseAndKeepsTheOutput) {
  Problem p;
  SuiteInputs in = inputs_for(p, InputKind::kOutlierChannels);
  Result ref = run_f64(p, in);
  RecipeOptions opt = options(Recipe::kBf16);
  opt.smooth_k = true;
  Result got = run_golden(p, in, opt);
  EXPECT_LT(compare(got.o.data(), ref.o.data(), got.o.size()).rel_l2, 0.02);
  for (size_t i = 0; i < ref.lse.size(); ++i) EXPECT_NEAR(got.lse[i], ref.lse[i], 0.05);
}

TEST(GoldenValidation, RejectsUnsupportedHeadDimAndBadScales) {
  Problem p;
  p.d = 96;
  SuiteInputs in = inputs_for(p);
  std::vector<double> o(p.s_q * p.h * p.d);
  auto run = [&](const RecipeOptions& opt) {
    return golden_attention_forward(make_view(in.q.data(), DType::kF32, {1, p.s_q, p.h, p.d}),
                                    make_view(in.k.data(), DType::kF32, {1, p.s_k, p.h, p.d}),
                                    make_view(in.v.data(), DType::kF32, {1, p.s_k, p.h, p.d}), opt,
                                    make_view(o.data(), DType::kF64, {1, p.s_q, p.h, p.d}),
                                    TensorView{});
  };
  Status st = run(options(Recipe::kNvfp4));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("head_dim 96 is not supported"), std::string::npos) << st.message();

  p.d = 64;
  in = inputs_for(p);
  o.resize(p.s_q * p.h * p.d);
  RecipeOptions bad = options(Recipe::kNvfp4);
  bad.k_tensor_scale = -2;
  st = run(bad);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("k_tensor_scale: expected a finite value >= 0"), std::string::npos)
      << st.message();
  bad = options(Recipe::kNvfp4);
  bad.softmax_scale = -1;
  st = run(bad);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("softmax_scale"), std::string::npos) << st.message();
  bad = options(static_cast<Recipe>(42));
  st = run(bad);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("recipe: unknown recipe value 42"), std::string::npos);
}

// Codes depend on scores only through z - m with m an integer: shifting every score of a row by
// an integer shifts m by the same integer and leaves P unchanged (what makes GPU codes
// independent of the tile schedule and of lazy rescaling).
TEST(GoldenSoftmax, PIsInvariantUnderIntegerShifts) {
  std::vector<double> z(200), shifted(200);
  for (int j = 0; j < 200; ++j) z[j] = 4 * std::sin(0.37 * j) - 0.01 * j;
  for (Recipe r : kAllRecipes) {
    if (r == Recipe::kBf16) continue;  // uses the real max, as FlashAttention does
    for (double k : {-3.0, 1.0, 17.0}) {
      for (int j = 0; j < 200; ++j) shifted[j] = z[j] + k;
      golden::RowP a = golden::make_row_p(z, 200, options(r));
      golden::RowP b = golden::make_row_p(shifted, 200, options(r));
      EXPECT_EQ(a.p, b.p) << recipe_name(r);
      EXPECT_DOUBLE_EQ(a.l, b.l) << recipe_name(r);
      EXPECT_NEAR(b.lse_log2 - a.lse_log2, k, 1e-9) << recipe_name(r);
    }
  }
}

// fp8-fast is fp8's operands with nvfp4-fast's P: the same operand values and factors, the same
// P row, and an output that differs from both recipes'.
TEST(GoldenRecipes, Fp8FastIsFp8OperandsWithTheCodeMap) {
  golden::HeadMatrix m{200, 64, std::vector<float>(200 * 64)};
  for (size_t i = 0; i < m.x.size(); ++i) m.x[i] = std::sin(0.37 * double(i)) * (1 + i % 7);
  for (bool v : {false, true}) {
    const auto prep = v ? golden::prepare_v : golden::prepare_qk;
    const golden::Operand a = prep(m, Recipe::kFp8Fast, Emulation::kFoldedE4M3, 0.f);
    const golden::Operand b = prep(m, Recipe::kFp8, Emulation::kFoldedE4M3, 0.f);
    EXPECT_EQ(a.val, b.val) << (v ? "V" : "Q/K");
    EXPECT_EQ(a.factor, b.factor) << (v ? "V" : "Q/K");
  }
  std::vector<double> z(77);
  for (int j = 0; j < 77; ++j) z[j] = -0.173 * j + 0.5 * std::cos(j);
  const golden::RowP a = golden::make_row_p(z, 77, options(Recipe::kFp8Fast));
  const golden::RowP b = golden::make_row_p(z, 77, options(Recipe::kNvfp4Fast));
  EXPECT_EQ(a.p, b.p);
  EXPECT_EQ(a.l, b.l);
  EXPECT_EQ(a.lse_log2, b.lse_log2);
  Problem p;
  SuiteInputs in = inputs_for(p);
  const Result fast = run_golden(p, in, options(Recipe::kFp8Fast));
  for (Recipe other : {Recipe::kFp8, Recipe::kNvfp4Fast}) {
    EXPECT_NE(fast.o, run_golden(p, in, options(other)).o) << recipe_name(other);
  }
}

TEST(GoldenSoftmax, ExpFreeDenominatorsSumTheRoundedP) {
  std::vector<double> z(77);
  for (int j = 0; j < 77; ++j) z[j] = -0.173 * j + 0.5 * std::cos(j);
  golden::RowP fast = golden::make_row_p(z, 77, options(Recipe::kNvfp4Fast));
  double sum = 0;
  for (double p : fast.p) sum += p;
  EXPECT_EQ(fast.l, sum);
  // The exp2 recipes lift P by 2^8: the row maximum lands in (128, 256].
  golden::RowP fp8 = golden::make_row_p(z, 77, options(Recipe::kFp8));
  double pmax = 0;
  for (double p : fp8.p) pmax = std::max(pmax, p);
  EXPECT_GT(pmax, 128);
  EXPECT_LE(pmax, 256);
}

}  // namespace
}  // namespace fp4attn

namespace fp4attn {
namespace {

// Logits above 100 (attention sinks): the integer row reference keeps every recipe finite
// without a guard (fp4-direct's paper needed one past 500 with its shiftless reference).
TEST(GoldenSuite, LargeLogitsStayFinite) {
  Problem p;
  p.d = 128;
  p.s_k = 600;
  SuiteInputs in = inputs_for(p, InputKind::kLargeLogits);
  for (Recipe r : kAllRecipes) {
    Result got = run_golden(p, in, options(r));
    for (double x : got.o) ASSERT_TRUE(std::isfinite(x)) << recipe_name(r);
    for (double x : got.lse) ASSERT_TRUE(std::isfinite(x)) << recipe_name(r);
  }
}

// Outlier channels with a large key mean: K smoothing is what makes the quantized recipes
// usable there (numerics.md §6): with it, fp8 and nvfp4 reach these bounds, without it not.
TEST(GoldenSuite, KSmoothingRescuesOutlierChannels) {
  Problem p;
  p.d = 128;
  p.s_q = 128;
  p.s_k = 256;
  SuiteInputs in = inputs_for(p, InputKind::kOutlierChannels);
  Result ref = run_f64(p, in);
  for (auto [r, bound] : {std::pair{Recipe::kFp8, 0.2}, std::pair{Recipe::kNvfp4, 0.4}}) {
    RecipeOptions plain = options(r), smooth = options(r);
    smooth.smooth_k = true;
    Result a = run_golden(p, in, plain), b = run_golden(p, in, smooth);
    const double e_plain = compare(a.o.data(), ref.o.data(), a.o.size()).rel_l2;
    const double e_smooth = compare(b.o.data(), ref.o.data(), b.o.size()).rel_l2;
    EXPECT_LT(e_smooth, bound) << recipe_name(r);
    EXPECT_GT(e_plain, 1.5 * e_smooth) << recipe_name(r);
  }
}

}  // namespace
}  // namespace fp4attn
