// The NaN rule of the golden model (numerics.md §4, "NaN"): a non-finite V value in a key the row
// reads reaches the row even where that key's P is exactly 0, because float64 computes
// 0 * inf = NaN (issue 26, finding 6: the PV loops skipped P = 0 keys). Masked keys are never
// read and stay exempt.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "fp4attn/golden/golden.h"
#include "fp4attn/golden/reference.h"
#include "fp4attn/operands.h"
#include "harness/suite.h"

namespace fp4attn {
namespace {

constexpr int64_t kSk = 64, kD = 64, kPoisonKey = 40, kPoisonChannel = 5;

// One head, 4 query rows, 64 keys: every query has a score 2500 nats above the others at key 0
// (q = k_0 = 100 e_0, k_j = -100 e_0), so P is exactly 0 at keys 1..63 in float64 and in every
// recipe. V is Gaussian with -inf at (key 40, channel 5): another 16- and 32-key block than key 0.
struct Problem {
  std::vector<float> q, k, v;
  int64_t s_q = 4;
};

Problem make_problem() {
  Problem p;
  SuiteInputs in = make_inputs(InputKind::kGaussian, 1, p.s_q, kSk, 1, 1, kD, 3);
  p.q.assign(p.s_q * kD, 0.f);
  p.k.assign(kSk * kD, 0.f);
  for (int64_t i = 0; i < p.s_q; ++i) p.q[i * kD] = 100.f;
  for (int64_t j = 0; j < kSk; ++j) p.k[j * kD] = j == 0 ? 100.f : -100.f;
  p.v = in.v;
  p.v[kPoisonKey * kD + kPoisonChannel] = -std::numeric_limits<float>::infinity();
  return p;
}

// Channel c of every row is NaN exactly for the poisoned channel; the others are finite.
void expect_poisoned_channel(const std::vector<double>& o, int64_t s_q, const char* what) {
  for (int64_t i = 0; i < s_q; ++i) {
    for (int64_t c = 0; c < kD; ++c) {
      const double x = o[i * kD + c];
      if (c == kPoisonChannel) {
        EXPECT_TRUE(std::isnan(x)) << what << ": row " << i << " channel " << c << " = " << x;
      } else {
        EXPECT_TRUE(std::isfinite(x)) << what << ": row " << i << " channel " << c << " = " << x;
      }
    }
  }
}

TEST(NanRule, Float64GivesNanWhereVIsInfAndPIsZero) {
  Problem p = make_problem();
  std::vector<double> o(p.s_q * kD);
  const Status st = reference_attention_forward(
      make_view(p.q.data(), DType::kF32, {1, p.s_q, 1, kD}),
      make_view(p.k.data(), DType::kF32, {1, kSk, 1, kD}),
      make_view(p.v.data(), DType::kF32, {1, kSk, 1, kD}), {0, false},
      make_view(o.data(), DType::kF64, {1, p.s_q, 1, kD}), TensorView{});
  ASSERT_TRUE(st.ok()) << st.message();
  expect_poisoned_channel(o, p.s_q, "float64");
}

// The recipes whose V operand keeps a non-finite value inside its own block (per-token BF16,
// NVFP4 per 16 keys, Direct-P V per 32 keys): without the rule they gave finite outputs. The
// fp8-V recipes poison the channel through its per-channel scale whatever P is.
class NanRuleRecipe : public testing::TestWithParam<Recipe> {};

TEST_P(NanRuleRecipe, GoldenForwardFollowsFloat64) {
  Problem p = make_problem();
  for (Emulation emu : {Emulation::kFoldedE4M3, Emulation::kBlockScaledExact}) {
    RecipeOptions opt;
    opt.recipe = GetParam();
    opt.emulation = emu;
    std::vector<double> o(p.s_q * kD);
    const Status st =
        golden_attention_forward(make_view(p.q.data(), DType::kF32, {1, p.s_q, 1, kD}),
                                 make_view(p.k.data(), DType::kF32, {1, kSk, 1, kD}),
                                 make_view(p.v.data(), DType::kF32, {1, kSk, 1, kD}), opt,
                                 make_view(o.data(), DType::kF64, {1, p.s_q, 1, kD}), TensorView{});
    ASSERT_TRUE(st.ok()) << st.message();
    expect_poisoned_channel(o, p.s_q, emu == Emulation::kFoldedE4M3 ? "folded" : "exact");
  }
}

TEST_P(NanRuleRecipe, GoldenOverOperandsFollowsFloat64) {
  Problem p = make_problem();
  const Recipe r = GetParam();
  const DType code = r == Recipe::kBf16 ? DType::kBF16 : DType::kE4M3;
  const int64_t width = r == Recipe::kBf16 ? 2 : 1, pitch = operand_v_pitch(kSk);
  std::vector<uint8_t> qd(p.s_q * kD * width), kd(kSk * kD * width), vd(kD * pitch * width);
  std::vector<float> qs(operand_scale_tiles(p.s_q)), ks(operand_scale_tiles(kSk)), vs(kD);
  ForwardOperands in;
  in.q_data = make_view(qd.data(), code, {1, 1, p.s_q, kD});
  in.k_data = make_view(kd.data(), code, {1, 1, kSk, kD});
  in.v_data = make_view(vd.data(), code, {1, 1, kD, pitch});
  in.q_scale = make_view(qs.data(), DType::kF32, {1, 1, operand_scale_tiles(p.s_q)});
  in.k_scale = make_view(ks.data(), DType::kF32, {1, 1, operand_scale_tiles(kSk)});
  in.v_scale = make_view(vs.data(), DType::kF32, {1, 1, kD});
  const struct {
    std::vector<float>* x;
    int64_t s;
    OperandRole role;
    TensorView data, scale;
  } roles[] = {{&p.q, p.s_q, OperandRole::kQ, in.q_data, in.q_scale},
               {&p.k, kSk, OperandRole::kK, in.k_data, in.k_scale},
               {&p.v, kSk, OperandRole::kV, in.v_data, in.v_scale}};
  for (const auto& x : roles) {
    const Status st =
        quantize_operand_host(make_view(x.x->data(), DType::kF32, {1, x.s, 1, kD}), r, x.role,
                              OperandOptions{}, x.data, x.scale, TensorView{});
    ASSERT_TRUE(st.ok()) << st.message();
  }
  RecipeOptions opt;
  opt.recipe = r;
  std::vector<double> o(p.s_q * kD);
  const Status st = golden_attention_forward_operands(
      in, opt, make_view(o.data(), DType::kF64, {1, p.s_q, 1, kD}), TensorView{});
  ASSERT_TRUE(st.ok()) << st.message();
  expect_poisoned_channel(o, p.s_q, "operands");
}

INSTANTIATE_TEST_SUITE_P(Recipes, NanRuleRecipe,
                         testing::Values(Recipe::kBf16, Recipe::kNvfp4All, Recipe::kFp4Direct),
                         [](const testing::TestParamInfo<Recipe>& info) {
                           std::string n = recipe_name(info.param);
                           for (char& c : n) c = c == '-' ? '_' : c;
                           return n;
                         });

// A key the causal mask hides is never read: its -inf reaches no row that cannot see it.
TEST(NanRule, MaskedKeysAreExempt) {
  // Causal bottom-right with s_q = s_k: row i sees keys 0..i; poison the last key only.
  const int64_t s = kSk;
  SuiteInputs in = make_inputs(InputKind::kGaussian, 1, s, s, 1, 1, kD, 5);
  in.v[(s - 1) * kD + kPoisonChannel] = -std::numeric_limits<float>::infinity();
  for (Recipe r : {Recipe::kBf16, Recipe::kNvfp4All, Recipe::kFp4Direct}) {
    RecipeOptions opt;
    opt.recipe = r;
    opt.causal = true;
    std::vector<double> o(s * kD);
    const Status st =
        golden_attention_forward(make_view(in.q.data(), DType::kF32, {1, s, 1, kD}),
                                 make_view(in.k.data(), DType::kF32, {1, s, 1, kD}),
                                 make_view(in.v.data(), DType::kF32, {1, s, 1, kD}), opt,
                                 make_view(o.data(), DType::kF64, {1, s, 1, kD}), TensorView{});
    ASSERT_TRUE(st.ok()) << st.message();
    // Rows that read no key of the poisoned key's V block stay finite: bf16's block is the key
    // itself (only the last row reads it), nvfp4-all's 16 keys, fp4-direct's 32.
    const int64_t first_reader = r == Recipe::kBf16 ? s - 1 : (r == Recipe::kFp4Direct ? 32 : 48);
    for (int64_t i = 0; i < first_reader; ++i) {
      EXPECT_TRUE(std::isfinite(o[i * kD + kPoisonChannel])) << recipe_name(r) << " row " << i;
    }
    // The last row reads it (-inf through a nonzero P in bf16, NaN through a NaN block scale).
    EXPECT_FALSE(std::isfinite(o[(s - 1) * kD + kPoisonChannel])) << recipe_name(r);
  }
}

}  // namespace
}  // namespace fp4attn
