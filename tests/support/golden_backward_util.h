// Shared fixtures of the golden backward tests: a problem, its inputs and upstream gradient, the
// golden forward and backward, and the dequantized operands the recipe multiplies.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "fp4attn/golden/golden.h"
#include "fp4attn/golden/golden_backward.h"
#include "fp4attn/golden/reference.h"
#include "harness/suite.h"
#include "reference/golden_operands.h"

namespace fp4attn::bwd_test {

struct Problem {
  int64_t b = 1, s_q = 40, s_k = 72, h = 2, h_kv = 2, d = 64;
  bool causal = false;
  int64_t q_numel() const { return b * s_q * h * d; }
  int64_t kv_numel() const { return b * s_k * h_kv * d; }
  TensorView qv(std::vector<double>& x) const {
    return make_view(x.data(), DType::kF64, {b, s_q, h, d});
  }
  TensorView kvv(std::vector<double>& x) const {
    return make_view(x.data(), DType::kF64, {b, s_k, h_kv, d});
  }
  TensorView lsev(std::vector<double>& x) const {
    return make_view(x.data(), DType::kF64, {b, h, s_q});
  }
};

// Inputs (BF16-exact suite values) and a Gaussian upstream gradient of stddev dout_std.
struct Inputs {
  std::vector<double> q, k, v, dout;
};

inline Inputs make_problem_inputs(const Problem& p, double dout_std = 1.0, uint64_t seed = 11,
                                  InputKind kind = InputKind::kGaussian) {
  SuiteInputs s = make_inputs(kind, p.b, p.s_q, p.s_k, p.h, p.h_kv, p.d, seed);
  Inputs in{{s.q.begin(), s.q.end()}, {s.k.begin(), s.k.end()}, {s.v.begin(), s.v.end()}, {}};
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<double> n01(0.0, dout_std);
  in.dout.resize(p.q_numel());
  for (double& x : in.dout) x = n01(rng);
  return in;
}

struct Forward {
  std::vector<double> o, lse;
};

inline Forward golden_forward(const Problem& p, Inputs& in, RecipeOptions opt) {
  Forward f{std::vector<double>(p.q_numel()), std::vector<double>(p.b * p.h * p.s_q)};
  opt.causal = p.causal;
  Status st =
      golden_attention_forward(p.qv(in.q), p.kvv(in.k), p.kvv(in.v), opt, p.qv(f.o), p.lsev(f.lse));
  EXPECT_TRUE(st.ok()) << st.message();
  return f;
}

struct Grads {
  std::vector<double> dq, dk, dv;
};

inline Grads golden_backward(const Problem& p, Inputs& in, Forward& f, RecipeOptions opt,
                             const BackwardOptions& bopt = {}) {
  Grads g{std::vector<double>(p.q_numel()), std::vector<double>(p.kv_numel()),
          std::vector<double>(p.kv_numel())};
  opt.causal = p.causal;
  Status st =
      golden_attention_backward(p.qv(in.q), p.kvv(in.k), p.kvv(in.v), p.qv(f.o), p.qv(in.dout),
                                p.lsev(f.lse), opt, p.qv(g.dq), p.kvv(g.dk), p.kvv(g.dv), bopt);
  EXPECT_TRUE(st.ok()) << st.message();
  return g;
}

inline Grads reference_backward(const Problem& p, std::vector<double>& q, std::vector<double>& k,
                                std::vector<double>& v, std::vector<double>& dout) {
  Grads g{std::vector<double>(p.q_numel()), std::vector<double>(p.kv_numel()),
          std::vector<double>(p.kv_numel())};
  Status st = reference_attention_backward(p.qv(q), p.kvv(k), p.kvv(v), p.qv(dout), {0, p.causal},
                                           p.qv(g.dq), p.kvv(g.dk), p.kvv(g.dv));
  EXPECT_TRUE(st.ok()) << st.message();
  return g;
}

inline std::vector<double> reference_forward(const Problem& p, std::vector<double>& q,
                                             std::vector<double>& k, std::vector<double>& v) {
  std::vector<double> o(p.q_numel());
  Status st = reference_attention_forward(p.qv(q), p.kvv(k), p.kvv(v), {0, p.causal}, p.qv(o),
                                          TensorView{});
  EXPECT_TRUE(st.ok()) << st.message();
  return o;
}

// The real values the recipe's GEMMs multiply (operand value times factor), back in BSHD.
struct Dequantized {
  std::vector<double> q, k, v;
};

inline void scatter_operand(const golden::Operand& op, bool per_row, int64_t b, int64_t h,
                            int64_t heads, std::vector<double>* out) {
  for (int64_t s = 0; s < op.rows; ++s) {
    for (int64_t c = 0; c < op.cols; ++c) {
      (*out)[((b * op.rows + s) * heads + h) * op.cols + c] =
          op.val[s * op.cols + c] * op.factor[per_row ? s : c];
    }
  }
}

inline Dequantized dequantize(const Problem& p, Inputs& in, const RecipeOptions& opt) {
  Dequantized dq{std::vector<double>(p.q_numel()), std::vector<double>(p.kv_numel()),
                 std::vector<double>(p.kv_numel())};
  for (int64_t b = 0; b < p.b; ++b) {
    for (int64_t h = 0; h < p.h; ++h) {
      golden::HeadMatrix m = golden::gather_head(p.qv(in.q), b, h);
      scatter_operand(golden::prepare_qk(m, opt.recipe, opt.emulation, 0), true, b, h, p.h, &dq.q);
    }
    for (int64_t h = 0; h < p.h_kv; ++h) {
      golden::HeadMatrix k = golden::gather_head(p.kvv(in.k), b, h);
      golden::HeadMatrix v = golden::gather_head(p.kvv(in.v), b, h);
      scatter_operand(golden::prepare_qk(k, opt.recipe, opt.emulation, 0), true, b, h, p.h_kv,
                      &dq.k);
      scatter_operand(golden::prepare_v(v, opt.recipe, opt.emulation, 0), false, b, h, p.h_kv,
                      &dq.v);
    }
  }
  return dq;
}

inline double max_abs_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

inline RecipeOptions recipe_options(Recipe r) {
  RecipeOptions o;
  o.recipe = r;
  return o;
}

}  // namespace fp4attn::bwd_test
