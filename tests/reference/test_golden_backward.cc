// What the golden backward is the gradient of (docs/numerics.md §8), recipe by recipe:
// * bf16: the float64 reference backward;
// * exp2 recipes with D from the high-precision O: the float64 gradient of exact attention of the
//   dequantized operands (quantizers straight through); with D from the forward's O (the default)
//   it differs by exactly the D term;
// * nvfp4-fast, fp4-direct: the gradient of their own P (the forward's codes) with the code map's
//   derivative taken as the exponential's, checked by central differences.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>
#include <vector>

#include "reference/golden_softmax.h"
#include "support/golden_backward_util.h"

namespace fp4attn::bwd_test {
namespace {

std::vector<Problem> shapes() {
  std::vector<Problem> v(5);
  v[1].causal = true;  // s_q < s_k, bottom-right
  v[2].causal = true;  // rows 0..23 see no key
  v[2].s_q = 72, v[2].s_k = 48;
  v[3].h = 4, v[3].h_kv = 2;  // GQA
  v[3].causal = true;
  v[4].d = 128, v[4].s_q = 33, v[4].s_k = 57;
  return v;
}

void expect_grads_near(const Grads& got, const Grads& want, double tol, const char* what) {
  EXPECT_LE(max_abs_diff(got.dq, want.dq), tol) << what << ": dq";
  EXPECT_LE(max_abs_diff(got.dk, want.dk), tol) << what << ": dk";
  EXPECT_LE(max_abs_diff(got.dv, want.dv), tol) << what << ": dv";
}

TEST(GoldenBackward, Bf16EqualsTheFloat64Reference) {
  for (const Problem& p : shapes()) {
    Inputs in = make_problem_inputs(p);
    const Grads want = reference_backward(p, in.q, in.k, in.v, in.dout);
    Forward f = golden_forward(p, in, recipe_options(Recipe::kBf16));
    // D from the forward's O: the bf16 forward's O carries BF16 P, so pass the exact O as "o".
    Forward exact{reference_forward(p, in.q, in.k, in.v), f.lse};
    expect_grads_near(golden_backward(p, in, exact, recipe_options(Recipe::kBf16)), want, 1e-10,
                      "o = exact O");
    BackwardOptions hp;
    hp.d_source = DSource::kHighPrecisionO;
    expect_grads_near(golden_backward(p, in, f, recipe_options(Recipe::kBf16), hp), want, 1e-10,
                      "D from the high-precision O");
  }
}

constexpr Recipe kExp2Recipes[] = {Recipe::kFp8, Recipe::kNvfp4, Recipe::kNvfp4Hx, Recipe::kMxfp4,
                                   Recipe::kNvfp4All};

TEST(GoldenBackward, Exp2RecipesAreTheFloat64GradientOfTheirDequantizedOperands) {
  for (Recipe r : kExp2Recipes) {
    for (const Problem& p : shapes()) {
      Inputs in = make_problem_inputs(p);
      Dequantized x = dequantize(p, in, recipe_options(r));
      const Grads want = reference_backward(p, x.q, x.k, x.v, in.dout);
      Forward f = golden_forward(p, in, recipe_options(r));
      BackwardOptions hp;
      hp.d_source = DSource::kHighPrecisionO;
      expect_grads_near(golden_backward(p, in, f, recipe_options(r), hp), want, 1e-9,
                        recipe_name(r));
    }
  }
}

// With D from the forward's O, dS_ij changes by -p_ij (D_fwd - D_hp): dv stays, and
// dq_i changes by -scale * (D_fwd - D_hp)_i * sum_j p_ij k_j (attention with V := K).
TEST(GoldenBackward, DefaultDComesFromTheForwardsO) {
  for (Recipe r : kExp2Recipes) {
    Problem p;
    p.causal = true;
    p.s_q = 72, p.s_k = 48;
    Inputs in = make_problem_inputs(p);
    Dequantized x = dequantize(p, in, recipe_options(r));
    Forward f = golden_forward(p, in, recipe_options(r));
    BackwardOptions hp;
    hp.d_source = DSource::kHighPrecisionO;
    const Grads g_hp = golden_backward(p, in, f, recipe_options(r), hp);
    const Grads g_fwd = golden_backward(p, in, f, recipe_options(r));
    const std::vector<double> o_hp = reference_forward(p, x.q, x.k, x.v);
    const std::vector<double> pk = reference_forward(p, x.q, x.k, x.k);
    const double scale = 1 / std::sqrt(double(p.d));
    std::vector<double> want = g_hp.dq;
    double moved = 0;
    for (int64_t row = 0; row < p.b * p.s_q * p.h; ++row) {
      double dd = 0;
      for (int64_t c = 0; c < p.d; ++c) {
        dd += in.dout[row * p.d + c] * (f.o[row * p.d + c] - o_hp[row * p.d + c]);
      }
      for (int64_t c = 0; c < p.d; ++c) want[row * p.d + c] -= scale * dd * pk[row * p.d + c];
      moved = std::max(moved, std::fabs(dd));
    }
    EXPECT_GT(moved, 1e-4) << recipe_name(r) << ": the forward's O should differ";
    EXPECT_LE(max_abs_diff(g_fwd.dq, want), 1e-9) << recipe_name(r);
    EXPECT_LE(max_abs_diff(g_fwd.dv, g_hp.dv), 1e-12) << recipe_name(r);
  }
}

// The exp-free recipes: with P-hat the forward's normalized P of a row and the operands
// dequantized, the backward is the derivative at eps = 0 of
//   O_i(eps) = sum_j w_ij (v_j + eps dv_j) / sum_j w_ij,  w_ij = P-hat_ij exp(S_ij(eps) - S_ij(0)),
//   S_ij(eps) = scale (q_i + eps dq_i) . (k_j + eps dk_j),
// i.e. the forward's codes with dP/dz = ln 2 * P (the exponential's derivative) and the operand
// quantizers straight through. O(0) is the forward's output, which the test checks too.
class SurrogateLoss {
 public:
  SurrogateLoss(const Problem& p, Inputs& in, const RecipeOptions& opt)
      : p_(p), in_(in), x_(dequantize(p, in, opt)), phat_(p.b * p.h * p.s_q * p.s_k, 0.0) {
    const double zscale = std::numbers::log2e / std::sqrt(double(p.d));
    RecipeOptions o = opt;
    o.causal = p.causal;
    for (int64_t b = 0; b < p.b; ++b) {
      for (int64_t h = 0; h < p.h; ++h) {
        const int64_t hk = h / (p.h / p.h_kv);
        const golden::Operand qo =
            golden::prepare_qk(golden::gather_head(p.qv(in.q), b, h), opt.recipe, opt.emulation, 0);
        const golden::Operand ko = golden::prepare_qk(golden::gather_head(p.kvv(in.k), b, hk),
                                                      opt.recipe, opt.emulation, 0);
        for (int64_t i = 0; i < p.s_q; ++i) {
          const int64_t n = visible(i);
          if (n == 0) continue;
          std::vector<double> z(n);
          for (int64_t j = 0; j < n; ++j) {  // the forward's expression, in its order
            double s = 0;
            for (int64_t c = 0; c < p.d; ++c) s += qo.val[i * p.d + c] * ko.val[j * p.d + c];
            z[j] = s * qo.factor[i] * ko.factor[j] * zscale;
          }
          const golden::RowP r = golden::make_row_p(z, n, o);
          for (int64_t j = 0; j < n; ++j) phat_[row(b, h, i) * p.s_k + j] = r.p[j] * r.p_unit / r.l;
        }
      }
    }
  }

  // sum_i dout_i . O_i(eps) for the direction (dq, dk, dv); out_o receives O when not null.
  double operator()(double eps, const Grads& dir, std::vector<double>* out_o = nullptr) const {
    const Problem& p = p_;
    const double scale = 1 / std::sqrt(double(p.d));
    double loss = 0;
    std::vector<double> acc(p.d);
    for (int64_t b = 0; b < p.b; ++b) {
      for (int64_t h = 0; h < p.h; ++h) {
        const int64_t hk = h / (p.h / p.h_kv);
        for (int64_t i = 0; i < p.s_q; ++i) {
          const int64_t qi = ((b * p.s_q + i) * p.h + h) * p.d;
          std::fill(acc.begin(), acc.end(), 0.0);
          double wsum = 0;
          for (int64_t j = 0; j < visible(i); ++j) {
            const int64_t kj = ((b * p.s_k + j) * p.h_kv + hk) * p.d;
            double s0 = 0, s1 = 0;
            for (int64_t c = 0; c < p.d; ++c) {
              s0 += x_.q[qi + c] * x_.k[kj + c];
              s1 += (x_.q[qi + c] + eps * dir.dq[qi + c]) * (x_.k[kj + c] + eps * dir.dk[kj + c]);
            }
            const double w = phat_[row(b, h, i) * p.s_k + j] * std::exp(scale * (s1 - s0));
            wsum += w;
            for (int64_t c = 0; c < p.d; ++c) acc[c] += w * (x_.v[kj + c] + eps * dir.dv[kj + c]);
          }
          for (int64_t c = 0; c < p.d; ++c) {
            const double o = wsum > 0 ? acc[c] / wsum : 0.0;
            loss += in_.dout[qi + c] * o;
            if (out_o) (*out_o)[qi + c] = o;
          }
        }
      }
    }
    return loss;
  }

 private:
  int64_t visible(int64_t i) const {
    return p_.causal ? std::clamp<int64_t>(i + p_.s_k - p_.s_q + 1, 0, p_.s_k) : p_.s_k;
  }
  int64_t row(int64_t b, int64_t h, int64_t i) const { return (b * p_.h + h) * p_.s_q + i; }

  Problem p_;
  Inputs& in_;
  Dequantized x_;
  std::vector<double> phat_;
};

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

TEST(GoldenBackward, ExpFreeRecipesAreTheGradientOfTheirCodesWithTheExpDerivative) {
  for (Recipe r : {Recipe::kNvfp4Fast, Recipe::kFp4Direct}) {
    for (Problem p : shapes()) {
      if (p.d == 128) continue;  // the d = 64 shapes cover it; keeps the test fast
      Inputs in = make_problem_inputs(p);
      Forward f = golden_forward(p, in, recipe_options(r));
      const SurrogateLoss loss(p, in, recipe_options(r));
      Grads dir = {make_problem_inputs(p, 1.0, 99).dout, make_problem_inputs(p, 1.0, 98).k,
                   make_problem_inputs(p, 1.0, 97).v};
      std::vector<double> o0(p.q_numel());
      loss(0, dir, &o0);
      EXPECT_LE(max_abs_diff(o0, f.o), 1e-12) << recipe_name(r) << ": O(0) is the forward's O";
      const double h = 1e-5;
      const double fd = (loss(h, dir) - loss(-h, dir)) / (2 * h);
      for (DSource ds : {DSource::kForwardO, DSource::kHighPrecisionO}) {
        BackwardOptions bopt;
        bopt.d_source = ds;
        const Grads g = golden_backward(p, in, f, recipe_options(r), bopt);
        const double analytic = dot(g.dq, dir.dq) + dot(g.dk, dir.dk) + dot(g.dv, dir.dv);
        EXPECT_NEAR(analytic, fd, 1e-7 * (1 + std::fabs(fd))) << recipe_name(r);
      }
    }
  }
}

}  // namespace
}  // namespace fp4attn::bwd_test
