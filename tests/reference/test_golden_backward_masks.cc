// Golden backward structure for every recipe and both arithmetics: GQA sums dk/dv over the group,
// causal masks (bottom-right) keep later keys out of a row's gradients, rows without keys
// contribute nothing, results do not depend on the thread count, and bad arguments are refused.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "support/golden_backward_util.h"

namespace fp4attn::bwd_test {
namespace {

std::vector<BackwardOptions> arithmetics(Recipe r) {
  std::vector<BackwardOptions> v(1);
  if (r != Recipe::kBf16) {
    v.emplace_back().arithmetic = BackwardArithmetic::kEmulatedFp8;
  }
  return v;
}

class BackwardEveryRecipe : public ::testing::TestWithParam<Recipe> {};

TEST_P(BackwardEveryRecipe, GqaSumsOverTheGroupOfRepeatedKv) {
  Problem gqa;
  gqa.h = 4, gqa.h_kv = 2, gqa.causal = true, gqa.s_q = 24, gqa.s_k = 40;
  Problem mha = gqa;
  mha.h_kv = 4;
  Inputs in = make_problem_inputs(gqa);
  Inputs rep = in;  // kv head g of gqa repeated for query heads 2g and 2g + 1
  rep.k.assign(mha.kv_numel(), 0), rep.v.assign(mha.kv_numel(), 0);
  for (int64_t j = 0; j < gqa.s_k; ++j) {
    for (int64_t h = 0; h < 4; ++h) {
      for (int64_t c = 0; c < gqa.d; ++c) {
        rep.k[(j * 4 + h) * gqa.d + c] = in.k[(j * 2 + h / 2) * gqa.d + c];
        rep.v[(j * 4 + h) * gqa.d + c] = in.v[(j * 2 + h / 2) * gqa.d + c];
      }
    }
  }
  const RecipeOptions opt = recipe_options(GetParam());
  Forward fg = golden_forward(gqa, in, opt), fm = golden_forward(mha, rep, opt);
  for (const BackwardOptions& bopt : arithmetics(GetParam())) {
    const Grads g = golden_backward(gqa, in, fg, opt, bopt);
    const Grads m = golden_backward(mha, rep, fm, opt, bopt);
    EXPECT_LE(max_abs_diff(g.dq, m.dq), 1e-12);
    std::vector<double> dk(gqa.kv_numel(), 0.0), dv(gqa.kv_numel(), 0.0);
    for (int64_t j = 0; j < gqa.s_k; ++j) {
      for (int64_t h = 0; h < 4; ++h) {
        for (int64_t c = 0; c < gqa.d; ++c) {
          dk[(j * 2 + h / 2) * gqa.d + c] += m.dk[(j * 4 + h) * gqa.d + c];
          dv[(j * 2 + h / 2) * gqa.d + c] += m.dv[(j * 4 + h) * gqa.d + c];
        }
      }
    }
    EXPECT_LE(max_abs_diff(g.dk, dk), 1e-12);
    EXPECT_LE(max_abs_diff(g.dv, dv), 1e-12);
  }
}

// dout nonzero on one row only: keys after that row's last visible key get no gradient. Not where
// K is smoothed (the int8 recipes): the mean over every key moves each quantized key, so later
// keys reach a row through it (SageAttention's smoothing has the same reach).
TEST_P(BackwardEveryRecipe, CausalKeepsLaterKeysOutOfARowsGradients) {
  if (recipe_smooths_k(GetParam())) GTEST_SKIP() << "K smoothed by its mean over all keys";
  Problem p;
  p.causal = true, p.h = 1, p.h_kv = 1, p.s_q = 24, p.s_k = 40;
  Inputs in = make_problem_inputs(p);
  const RecipeOptions opt = recipe_options(GetParam());
  Forward f = golden_forward(p, in, opt);
  const int64_t row = 5, last_key = row + p.s_k - p.s_q;  // bottom-right: keys 0..21
  for (int64_t x = 0; x < p.q_numel(); ++x) {
    if (x / p.d != row) in.dout[x] = 0;
  }
  for (const BackwardOptions& bopt : arithmetics(GetParam())) {
    const Grads g = golden_backward(p, in, f, opt, bopt);
    double before = 0, after = 0;
    for (int64_t x = 0; x < p.kv_numel(); ++x) {
      double& sum = x / p.d <= last_key ? before : after;
      sum += std::fabs(g.dk[x]) + std::fabs(g.dv[x]);
    }
    EXPECT_GT(before, 0);
    EXPECT_EQ(after, 0);
    for (int64_t x = 0; x < p.q_numel(); ++x) {
      if (x / p.d != row) {
        EXPECT_EQ(g.dq[x], 0) << "only the row with a gradient moves q";
      }
    }
  }
}

TEST_P(BackwardEveryRecipe, RowsWithoutKeysContributeNothing) {
  Problem p;
  p.causal = true, p.s_q = 56, p.s_k = 40;  // rows 0..15 see no key
  Inputs in = make_problem_inputs(p);
  const RecipeOptions opt = recipe_options(GetParam());
  Forward f = golden_forward(p, in, opt);
  for (const BackwardOptions& bopt : arithmetics(GetParam())) {
    const Grads g = golden_backward(p, in, f, opt, bopt);
    Inputs quiet = in;  // the same with zero dout on the rows without keys
    for (int64_t x = 0; x < p.q_numel(); ++x) {
      if ((x / (p.h * p.d)) < p.s_q - p.s_k) quiet.dout[x] = 0;
    }
    const Grads gq = golden_backward(p, quiet, f, opt, bopt);
    EXPECT_EQ(g.dk, gq.dk);
    EXPECT_EQ(g.dv, gq.dv);
    for (int64_t x = 0; x < p.q_numel(); ++x) {
      if ((x / (p.h * p.d)) < p.s_q - p.s_k) {
        EXPECT_EQ(g.dq[x], 0);
      }
    }
  }
  Problem none = p;
  none.s_k = 0;  // no keys at all: zero gradients, not an error
  Inputs in0 = make_problem_inputs(none);
  Forward f0 = golden_forward(none, in0, opt);
  const Grads g0 = golden_backward(none, in0, f0, opt);
  for (double x : g0.dq) EXPECT_EQ(x, 0);
}

TEST_P(BackwardEveryRecipe, SmoothKGradientIsCenteredOverKeys) {
  Problem p;
  Inputs in = make_problem_inputs(p, 1.0, 3, InputKind::kOutlierChannels);
  RecipeOptions opt = recipe_options(GetParam());
  opt.smooth_k = true;
  Forward f = golden_forward(p, in, opt);
  const Grads g = golden_backward(p, in, f, opt);
  for (int64_t h = 0; h < p.h_kv; ++h) {  // k - mean(k): the gradient sums to 0 over keys
    for (int64_t c = 0; c < p.d; ++c) {
      double s = 0, a = 0;
      for (int64_t j = 0; j < p.s_k; ++j) {
        s += g.dk[(j * p.h_kv + h) * p.d + c];
        a += std::fabs(g.dk[(j * p.h_kv + h) * p.d + c]);
      }
      EXPECT_LE(std::fabs(s), 1e-12 * (1 + a));
    }
  }
}

TEST_P(BackwardEveryRecipe, SameBitsForAnyThreadCount) {
  Problem p;
  p.h = 4, p.h_kv = 1, p.causal = true;
  Inputs in = make_problem_inputs(p);
  const RecipeOptions opt = recipe_options(GetParam());
  Forward f = golden_forward(p, in, opt);
  const char* old = std::getenv("FP4ATTN_NUM_THREADS");
  const std::string saved = old ? old : "";
  setenv("FP4ATTN_NUM_THREADS", "1", 1);
  const Grads one = golden_backward(p, in, f, opt);
  setenv("FP4ATTN_NUM_THREADS", "3", 1);
  const Grads three = golden_backward(p, in, f, opt);
  if (old) {
    setenv("FP4ATTN_NUM_THREADS", saved.c_str(), 1);
  } else {
    unsetenv("FP4ATTN_NUM_THREADS");
  }
  EXPECT_EQ(one.dq, three.dq);
  EXPECT_EQ(one.dk, three.dk);
  EXPECT_EQ(one.dv, three.dv);
}

INSTANTIATE_TEST_SUITE_P(Recipes, BackwardEveryRecipe, ::testing::ValuesIn(kAllRecipes),
                         [](const ::testing::TestParamInfo<Recipe>& info) {
                           std::string s = recipe_name(info.param);
                           for (char& ch : s) ch = ch == '-' ? '_' : ch;
                           return s;
                         });

TEST(GoldenBackwardArgs, RefusesBadInput) {
  Problem p;
  Inputs in = make_problem_inputs(p);
  Forward f = golden_forward(p, in, recipe_options(Recipe::kNvfp4));
  Grads g{std::vector<double>(p.q_numel()), std::vector<double>(p.kv_numel()),
          std::vector<double>(p.kv_numel())};
  auto run = [&](const TensorView& lse, const TensorView& dq, Recipe r, BackwardOptions b) {
    return golden_attention_backward(p.qv(in.q), p.kvv(in.k), p.kvv(in.v), p.qv(f.o), p.qv(in.dout),
                                     lse, recipe_options(r), dq, p.kvv(g.dk), p.kvv(g.dv), b);
  };
  Status st = run(TensorView{}, p.qv(g.dq), Recipe::kNvfp4, {});
  EXPECT_NE(st.message().find("lse"), std::string::npos) << st.message();
  st = run(p.lsev(f.lse), p.kvv(g.dk), Recipe::kNvfp4, {});
  EXPECT_NE(st.message().find("dq"), std::string::npos) << st.message();
  BackwardOptions emu;
  emu.arithmetic = BackwardArithmetic::kEmulatedFp8;
  st = run(p.lsev(f.lse), p.qv(g.dq), Recipe::kBf16, emu);
  EXPECT_NE(st.message().find("arithmetic"), std::string::npos) << st.message();
  emu.p_lift_log2 = 9;
  st = run(p.lsev(f.lse), p.qv(g.dq), Recipe::kNvfp4, emu);
  EXPECT_NE(st.message().find("p_lift_log2"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace fp4attn::bwd_test
