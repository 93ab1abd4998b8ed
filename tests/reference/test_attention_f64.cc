// Float64 reference attention: forward against a naive implementation written here (full score
// matrix, std::exp), invariances, edge cases, and backward against central finite differences.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "core/parallel.h"
#include "fp4attn/golden/reference.h"

namespace fp4attn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Shape {
  int64_t b, s_q, s_k, h, h_kv, d;
  bool causal;
  int64_t q_numel() const { return b * s_q * h * d; }
  int64_t kv_numel() const { return b * s_k * h_kv * d; }
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << "b=" << s.b << " s_q=" << s.s_q << " s_k=" << s.s_k << " h=" << s.h << " h_kv=" << s.h_kv
      << " d=" << s.d << (s.causal ? " causal" : "");
}

std::vector<double> random_normal(int64_t n, uint64_t seed, double stddev = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, stddev);
  std::vector<double> x(n);
  for (double& e : x) e = dist(rng);
  return x;
}

// Contiguous f64 views of the test's dense BSHD vectors.
TensorView qv(const Shape& s, std::vector<double>& x) {
  return make_view(x.data(), DType::kF64, {s.b, s.s_q, s.h, s.d});
}
TensorView kvv(const Shape& s, std::vector<double>& x) {
  return make_view(x.data(), DType::kF64, {s.b, s.s_k, s.h_kv, s.d});
}
TensorView lsev(const Shape& s, std::vector<double>& x) {
  return make_view(x.data(), DType::kF64, {s.b, s.h, s.s_q});
}

struct Naive {
  std::vector<double> o, lse;  // BSHD and [b][h][s_q]
};

// The textbook definition: materialize the masked score matrix of each (batch, head), softmax with
// std::exp, O = P V. LSE is ln(sum exp(s)) taken literally (no max shift), so it is an independent
// check of the reference's m + ln(sum exp(s - m)) for moderate logits.
Naive naive_attention(const Shape& s, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, double scale) {
  Naive out{std::vector<double>(s.q_numel(), 0.0), std::vector<double>(s.b * s.h * s.s_q, kInf)};
  const int64_t group = s.h / s.h_kv;
  std::vector<double> scores(s.s_q * s.s_k);
  for (int64_t b = 0; b < s.b; ++b) {
    for (int64_t h = 0; h < s.h; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < s.s_q; ++i) {
        for (int64_t j = 0; j < s.s_k; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < s.d; ++c) {
            dot += q[((b * s.s_q + i) * s.h + h) * s.d + c] *
                   k[((b * s.s_k + j) * s.h_kv + g) * s.d + c];
          }
          const bool masked = s.causal && j > i + s.s_k - s.s_q;
          scores[i * s.s_k + j] = masked ? -kInf : scale * dot;
        }
      }
      for (int64_t i = 0; i < s.s_q; ++i) {
        const double* row = &scores[i * s.s_k];
        const double m = s.s_k ? *std::max_element(row, row + s.s_k) : -kInf;
        if (m == -kInf) continue;  // no visible key: O stays 0, LSE +inf
        double sum = 0, sum_unshifted = 0;
        for (int64_t j = 0; j < s.s_k; ++j) {
          sum += std::exp(row[j] - m);
          sum_unshifted += std::exp(row[j]);
        }
        out.lse[(b * s.h + h) * s.s_q + i] = std::log(sum_unshifted);
        for (int64_t j = 0; j < s.s_k; ++j) {
          const double p = std::exp(row[j] - m) / sum;
          for (int64_t c = 0; c < s.d; ++c) {
            out.o[((b * s.s_q + i) * s.h + h) * s.d + c] +=
                p * v[((b * s.s_k + j) * s.h_kv + g) * s.d + c];
          }
        }
      }
    }
  }
  return out;
}

// Runs the reference forward on f64 inputs into freshly NaN-poisoned f64 outputs.
Naive run_forward(const Shape& s, std::vector<double> q, std::vector<double> k,
                  std::vector<double> v, double softmax_scale = 0) {
  Naive out{std::vector<double>(s.q_numel(), kNaN), std::vector<double>(s.b * s.h * s.s_q, kNaN)};
  AttentionOptions opt;
  opt.softmax_scale = softmax_scale;
  opt.causal = s.causal;
  Status st = reference_attention_forward(qv(s, q), kvv(s, k), kvv(s, v), opt, qv(s, out.o),
                                          lsev(s, out.lse));
  EXPECT_TRUE(st.ok()) << st.message();
  return out;
}

bool row_has_keys(const Shape& s, int64_t i) {
  return s.s_k > 0 && (!s.causal || i + s.s_k - s.s_q >= 0);
}

void expect_matches_naive(const Shape& s, const Naive& got, const Naive& want, double tol) {
  for (int64_t idx = 0; idx < s.q_numel(); ++idx) {
    const int64_t i = (idx / (s.h * s.d)) % s.s_q;
    if (row_has_keys(s, i)) {
      ASSERT_NEAR(got.o[idx], want.o[idx], tol) << "o index " << idx;
    } else {
      ASSERT_EQ(got.o[idx], 0.0) << "o index " << idx << " (row without keys)";
    }
  }
  for (size_t idx = 0; idx < got.lse.size(); ++idx) {
    if (std::isinf(want.lse[idx])) {
      ASSERT_EQ(got.lse[idx], kInf) << "lse index " << idx;
    } else {
      ASSERT_NEAR(got.lse[idx], want.lse[idx], tol * (1 + std::fabs(want.lse[idx])))
          << "lse index " << idx;
    }
  }
}

class ForwardVsNaive : public ::testing::TestWithParam<Shape> {};

TEST_P(ForwardVsNaive, MatchesNaive) {
  const Shape s = GetParam();
  const auto q = random_normal(s.q_numel(), 1), k = random_normal(s.kv_numel(), 2),
             v = random_normal(s.kv_numel(), 3);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.d));
  expect_matches_naive(s, run_forward(s, q, k, v), naive_attention(s, q, k, v, scale), 1e-12);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ForwardVsNaive,
    ::testing::Values(Shape{1, 4, 4, 2, 2, 8, false}, Shape{2, 5, 9, 4, 2, 5, false},
                      Shape{2, 5, 9, 4, 2, 5, true},     // causal, s_q < s_k
                      Shape{1, 9, 5, 3, 1, 7, true},     // causal, s_q > s_k: rows 0..3 see nothing
                      Shape{1, 37, 70, 2, 1, 16, true},  // more than one row block
                      Shape{1, 70, 37, 2, 2, 3, false}, Shape{1, 3, 1, 1, 1, 1, true}));

TEST(ReferenceForward, Float32LseAndExplicitScale) {
  const Shape s{1, 6, 11, 2, 1, 8, false};
  auto q = random_normal(s.q_numel(), 4), k = random_normal(s.kv_numel(), 5),
       v = random_normal(s.kv_numel(), 6);
  // An explicit 1/sqrt(d) is the default, bit for bit; another scale matches the naive model.
  const Naive def = run_forward(s, q, k, v);
  const Naive explicit_scale = run_forward(s, q, k, v, 1.0 / std::sqrt(8.0));
  EXPECT_EQ(def.o, explicit_scale.o);
  expect_matches_naive(s, run_forward(s, q, k, v, 0.7), naive_attention(s, q, k, v, 0.7), 1e-12);

  std::vector<double> o(s.q_numel());
  std::vector<float> lse(s.b * s.h * s.s_q, NAN);
  AttentionOptions opt;
  ASSERT_TRUE(reference_attention_forward(qv(s, q), kvv(s, k), kvv(s, v), opt, qv(s, o),
                                          make_view(lse.data(), DType::kF32, {s.b, s.h, s.s_q}))
                  .ok());
  for (size_t i = 0; i < lse.size(); ++i) EXPECT_EQ(lse[i], static_cast<float>(def.lse[i]));
}

// BF16 inputs are read exactly; outputs are rounded once from double.
TEST(ReferenceForward, Bf16InputsMatchNaive) {
  const Shape s{2, 7, 13, 4, 2, 16, true};
  std::vector<uint16_t> qb(s.q_numel()), kb(s.kv_numel()), vb(s.kv_numel());
  std::vector<double> q(s.q_numel()), k(s.kv_numel()), v(s.kv_numel());
  auto to_bf16 = [](const std::vector<double>& x, std::vector<uint16_t>* bits,
                    std::vector<double>* exact) {
    for (size_t i = 0; i < x.size(); ++i) {
      (*bits)[i] = float_to_bf16_bits(static_cast<float>(x[i]));
      (*exact)[i] = bf16_bits_to_float((*bits)[i]);
    }
  };
  to_bf16(random_normal(s.q_numel(), 7), &qb, &q);
  to_bf16(random_normal(s.kv_numel(), 8), &kb, &k);
  to_bf16(random_normal(s.kv_numel(), 9), &vb, &v);
  const Naive want = naive_attention(s, q, k, v, 0.25);

  AttentionOptions opt;
  opt.causal = true;
  std::vector<float> o(s.q_numel(), NAN);
  std::vector<uint16_t> o_bf16(s.q_numel());
  const TensorView qt = make_view(qb.data(), DType::kBF16, {s.b, s.s_q, s.h, s.d});
  const TensorView kt = make_view(kb.data(), DType::kBF16, {s.b, s.s_k, s.h_kv, s.d});
  const TensorView vt = make_view(vb.data(), DType::kBF16, {s.b, s.s_k, s.h_kv, s.d});
  ASSERT_TRUE(reference_attention_forward(qt, kt, vt, opt,
                                          make_view(o.data(), DType::kF32, {s.b, s.s_q, s.h, s.d}),
                                          TensorView{})
                  .ok());
  ASSERT_TRUE(reference_attention_forward(
                  qt, kt, vt, opt, make_view(o_bf16.data(), DType::kBF16, {s.b, s.s_q, s.h, s.d}),
                  TensorView{})
                  .ok());
  for (int64_t i = 0; i < s.q_numel(); ++i) {
    ASSERT_NEAR(o[i], want.o[i], 1e-6 * (1 + std::fabs(want.o[i]))) << i;
    // BF16 output: within half a BF16 ulp of the exact value (plus the float step).
    ASSERT_NEAR(bf16_bits_to_float(o_bf16[i]), want.o[i], 0x1p-8 * std::fabs(want.o[i]) + 1e-30)
        << i;
  }
}

// q is a head slice of a wider buffer, k and v are stored BHSD, o and lse are written into padded
// or transposed storage: results equal the contiguous run bit for bit and nothing else is written.
TEST(ReferenceForward, NonContiguousStrides) {
  const Shape s{2, 6, 9, 2, 1, 4, true};
  const auto q = random_normal(s.q_numel(), 10), k = random_normal(s.kv_numel(), 11),
             v = random_normal(s.kv_numel(), 12);
  const Naive want = run_forward(s, q, k, v);
  expect_matches_naive(s, want, naive_attention(s, q, k, v, 0.5), 1e-12);

  // q: heads 1..2 of a [b][s_q][5 heads][d] buffer.
  const int64_t wide_h = 5;
  std::vector<double> q_wide(s.b * s.s_q * wide_h * s.d, kNaN);
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t i = 0; i < s.s_q; ++i)
      for (int64_t h = 0; h < s.h; ++h)
        for (int64_t c = 0; c < s.d; ++c)
          q_wide[((b * s.s_q + i) * wide_h + h + 1) * s.d + c] =
              q[((b * s.s_q + i) * s.h + h) * s.d + c];
  const TensorView q_view =
      make_strided_view(q_wide.data() + s.d, DType::kF64, {s.b, s.s_q, s.h, s.d},
                        {s.s_q * wide_h * s.d, wide_h * s.d, s.d, 1});
  // k, v: physical [b][h_kv][s_k][d], viewed as BSHD.
  std::vector<double> k_bhsd(s.kv_numel()), v_bhsd(s.kv_numel());
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t j = 0; j < s.s_k; ++j)
      for (int64_t g = 0; g < s.h_kv; ++g)
        for (int64_t c = 0; c < s.d; ++c) {
          const int64_t src = ((b * s.s_k + j) * s.h_kv + g) * s.d + c;
          const int64_t dst = ((b * s.h_kv + g) * s.s_k + j) * s.d + c;
          k_bhsd[dst] = k[src];
          v_bhsd[dst] = v[src];
        }
  const std::initializer_list<int64_t> kv_strides = {s.h_kv * s.s_k * s.d, s.d, s.s_k * s.d, 1};
  const TensorView k_view =
      make_strided_view(k_bhsd.data(), DType::kF64, {s.b, s.s_k, s.h_kv, s.d}, kv_strides);
  const TensorView v_view =
      make_strided_view(v_bhsd.data(), DType::kF64, {s.b, s.s_k, s.h_kv, s.d}, kv_strides);
  // o: each head's row padded to 3 * d; lse: each (b, h) row padded to s_q + 2.
  const double kSentinel = -12345.0;
  std::vector<double> o_pad(s.b * s.s_q * s.h * 3 * s.d, kSentinel);
  const TensorView o_view = make_strided_view(o_pad.data(), DType::kF64, {s.b, s.s_q, s.h, s.d},
                                              {s.s_q * s.h * 3 * s.d, s.h * 3 * s.d, 3 * s.d, 1});
  const int64_t lse_row = s.s_q + 2;
  std::vector<double> lse_pad(s.b * s.h * lse_row, kSentinel);
  const TensorView lse_view = make_strided_view(lse_pad.data(), DType::kF64, {s.b, s.h, s.s_q},
                                                {s.h * lse_row, lse_row, 1});
  AttentionOptions opt;
  opt.causal = true;
  Status st = reference_attention_forward(q_view, k_view, v_view, opt, o_view, lse_view);
  ASSERT_TRUE(st.ok()) << st.message();

  for (int64_t bh = 0; bh < s.b * s.h; ++bh) {
    for (int64_t i = 0; i < lse_row; ++i) {
      EXPECT_EQ(lse_pad[bh * lse_row + i], i < s.s_q ? want.lse[bh * s.s_q + i] : kSentinel);
    }
  }
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t i = 0; i < s.s_q; ++i)
      for (int64_t h = 0; h < s.h; ++h) {
        for (int64_t c = 0; c < 3 * s.d; ++c) {
          const double got = o_pad[((b * s.s_q + i) * s.h + h) * 3 * s.d + c];
          if (c < s.d) {
            EXPECT_EQ(got, want.o[((b * s.s_q + i) * s.h + h) * s.d + c]);
          } else {
            EXPECT_EQ(got, kSentinel) << "padding was written";
          }
        }
      }
}

TEST(ReferenceForward, CausalRowsWithoutKeysGetZeroAndInfLse) {
  const Shape s{1, 6, 3, 1, 1, 4, true};  // rows 0..2 see no key (bottom-right alignment)
  const auto q = random_normal(s.q_numel(), 13), k = random_normal(s.kv_numel(), 14),
             v = random_normal(s.kv_numel(), 15);
  const Naive got = run_forward(s, q, k, v);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(got.lse[i], kInf);
    for (int64_t c = 0; c < s.d; ++c) EXPECT_EQ(got.o[i * s.d + c], 0.0);
  }
  // Row 3 sees key 0 only: O = v_0, LSE = the one logit.
  double dot = 0;
  for (int64_t c = 0; c < s.d; ++c) dot += q[3 * s.d + c] * k[c];
  EXPECT_NEAR(got.lse[3], 0.5 * dot, 1e-15);
  for (int64_t c = 0; c < s.d; ++c) EXPECT_EQ(got.o[3 * s.d + c], v[c]);
}

TEST(ReferenceForward, NoKeysAtAll) {
  for (bool causal : {false, true}) {
    const Shape s{2, 3, 0, 2, 1, 4, causal};
    const Naive got = run_forward(s, random_normal(s.q_numel(), 16), {}, {});
    for (double x : got.o) EXPECT_EQ(x, 0.0);
    for (double x : got.lse) EXPECT_EQ(x, kInf);
  }
}

TEST(ReferenceForward, ZeroSizedInputsWriteNothing) {
  AttentionOptions opt;
  // b == 0 with null pointers everywhere.
  ASSERT_TRUE(reference_attention_forward(make_view(nullptr, DType::kF32, {0, 4, 2, 8}),
                                          make_view(nullptr, DType::kF32, {0, 5, 2, 8}),
                                          make_view(nullptr, DType::kF32, {0, 5, 2, 8}), opt,
                                          make_view(nullptr, DType::kF32, {0, 4, 2, 8}),
                                          make_view(nullptr, DType::kF32, {0, 2, 4}))
                  .ok());
  // s_q == 0 and h == 0 with real k/v.
  std::vector<float> kv(5 * 2 * 8, 1.0f);
  for (int64_t h : {0, 2}) {
    const int64_t s_q = h == 0 ? 4 : 0;
    EXPECT_TRUE(reference_attention_forward(make_view(nullptr, DType::kF32, {1, s_q, h, 8}),
                                            make_view(kv.data(), DType::kF32, {1, 5, 2, 8}),
                                            make_view(kv.data(), DType::kF32, {1, 5, 2, 8}), opt,
                                            make_view(nullptr, DType::kF32, {1, s_q, h, 8}),
                                            TensorView{})
                    .ok());
  }
}

TEST(ReferenceForward, GqaEqualsMhaWithRepeatedKv) {
  for (bool causal : {false, true}) {
    const Shape gqa{2, 5, 8, 6, 2, 4, causal};
    Shape mha = gqa;
    mha.h_kv = 6;
    const auto q = random_normal(gqa.q_numel(), 17), k = random_normal(gqa.kv_numel(), 18),
               v = random_normal(gqa.kv_numel(), 19);
    std::vector<double> k_rep(mha.kv_numel()), v_rep(mha.kv_numel());
    for (int64_t t = 0; t < gqa.b * gqa.s_k; ++t)
      for (int64_t h = 0; h < mha.h_kv; ++h)
        for (int64_t c = 0; c < gqa.d; ++c) {
          k_rep[(t * mha.h_kv + h) * gqa.d + c] = k[(t * gqa.h_kv + h / 3) * gqa.d + c];
          v_rep[(t * mha.h_kv + h) * gqa.d + c] = v[(t * gqa.h_kv + h / 3) * gqa.d + c];
        }
    const Naive a = run_forward(gqa, q, k, v), b = run_forward(mha, q, k_rep, v_rep);
    EXPECT_EQ(a.o, b.o);
    EXPECT_EQ(a.lse, b.lse);
  }
}

TEST(ReferenceForward, KeyPermutationInvariance) {
  const Shape s{1, 5, 17, 2, 2, 6, false};
  const auto q = random_normal(s.q_numel(), 20), k = random_normal(s.kv_numel(), 21),
             v = random_normal(s.kv_numel(), 22);
  std::vector<int64_t> perm(s.s_k);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937_64(23));
  std::vector<double> k_p(k.size()), v_p(v.size());
  const int64_t row = s.h_kv * s.d;
  for (int64_t j = 0; j < s.s_k; ++j) {
    std::copy_n(&k[perm[j] * row], row, &k_p[j * row]);
    std::copy_n(&v[perm[j] * row], row, &v_p[j * row]);
  }
  const Naive a = run_forward(s, q, k, v), b = run_forward(s, q, k_p, v_p);
  for (size_t i = 0; i < a.o.size(); ++i) EXPECT_NEAR(a.o[i], b.o[i], 1e-14);
  for (size_t i = 0; i < a.lse.size(); ++i) EXPECT_NEAR(a.lse[i], b.lse[i], 1e-14);
}

// Logits in the hundreds: the max-subtracted softmax stays finite where exp(s) overflows.
TEST(ReferenceForward, LargeLogitsStayFinite) {
  const Shape s{1, 4, 9, 1, 1, 16, false};
  const auto q = random_normal(s.q_numel(), 24, 60.0), k = random_normal(s.kv_numel(), 25, 60.0),
             v = random_normal(s.kv_numel(), 26);
  const Naive got = run_forward(s, q, k, v);
  const Naive want = naive_attention(s, q, k, v, 0.25);  // its O is max-shifted too
  double max_logit = -kInf;
  for (int64_t i = 0; i < s.s_q; ++i) {
    double row_max = -kInf;
    for (int64_t j = 0; j < s.s_k; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < s.d; ++c) dot += q[i * s.d + c] * k[j * s.d + c];
      row_max = std::max(row_max, 0.25 * dot);
    }
    max_logit = std::max(max_logit, row_max);
    EXPECT_TRUE(std::isfinite(got.lse[i]));
    EXPECT_GE(got.lse[i], row_max);
    EXPECT_LE(got.lse[i], row_max + std::log(static_cast<double>(s.s_k)));
  }
  ASSERT_GT(max_logit, 800.0);  // exp() of this overflows double
  for (size_t i = 0; i < got.o.size(); ++i) EXPECT_NEAR(got.o[i], want.o[i], 1e-12);
}

TEST(ReferenceForward, RejectsBadArguments) {
  const Shape s{1, 2, 3, 2, 1, 4, false};
  auto q = random_normal(s.q_numel(), 27), k = random_normal(s.kv_numel(), 28);
  std::vector<double> o(s.q_numel()), lse(16);
  AttentionOptions opt;
  opt.softmax_scale = -1;
  Status st =
      reference_attention_forward(qv(s, q), kvv(s, k), kvv(s, k), opt, qv(s, o), TensorView{});
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "softmax_scale: expected a finite value > 0, got -1");
  opt.softmax_scale = 0;
  st = reference_attention_forward(qv(s, q), kvv(s, k), kvv(s, k), opt, qv(s, o),
                                   make_view(lse.data(), DType::kF64, {1, 2, 3}));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("lse: expected shape (b, h, s_q) = (1, 2, 2)"), std::string::npos)
      << st.message();
  // Formats the golden model cannot read are refused, not misread.
  TensorView q8 = qv(s, q);
  q8.dtype = DType::kE4M3;
  st = reference_attention_forward(q8, kvv(s, k), kvv(s, k), opt, qv(s, o), TensorView{});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("q: expected dtype"), std::string::npos) << st.message();
}

// ---------------------------------------------------------------------------------------------
// Backward

struct Grads {
  std::vector<double> dq, dk, dv;
};

Grads run_backward(const Shape& s, std::vector<double> q, std::vector<double> k,
                   std::vector<double> v, std::vector<double> dout) {
  Grads g{std::vector<double>(s.q_numel(), kNaN), std::vector<double>(s.kv_numel(), kNaN),
          std::vector<double>(s.kv_numel(), kNaN)};
  AttentionOptions opt;
  opt.causal = s.causal;
  Status st = reference_attention_backward(qv(s, q), kvv(s, k), kvv(s, v), qv(s, dout), opt,
                                           qv(s, g.dq), kvv(s, g.dk), kvv(s, g.dv));
  EXPECT_TRUE(st.ok()) << st.message();
  return g;
}

class BackwardVsFiniteDifferences : public ::testing::TestWithParam<Shape> {};

// L = sum(dout * O) has gradient (dq, dk, dv); compare with central differences of L.
TEST_P(BackwardVsFiniteDifferences, Matches) {
  const Shape s = GetParam();
  std::vector<double> q = random_normal(s.q_numel(), 30), k = random_normal(s.kv_numel(), 31),
                      v = random_normal(s.kv_numel(), 32), dout = random_normal(s.q_numel(), 33);
  const Grads g = run_backward(s, q, k, v, dout);
  auto loss = [&] {
    const Naive f = run_forward(s, q, k, v);
    double l = 0;
    for (size_t i = 0; i < f.o.size(); ++i) l += dout[i] * f.o[i];
    return l;
  };
  const double eps = 1e-5;
  auto check = [&](std::vector<double>* x, const std::vector<double>& grad, const char* name) {
    for (size_t i = 0; i < x->size(); ++i) {
      const double saved = (*x)[i];
      (*x)[i] = saved + eps;
      const double up = loss();
      (*x)[i] = saved - eps;
      const double down = loss();
      (*x)[i] = saved;
      const double fd = (up - down) / (2 * eps);
      EXPECT_NEAR(grad[i], fd, 1e-7 + 1e-6 * std::fabs(fd)) << name << "[" << i << "]";
    }
  };
  check(&q, g.dq, "dq");
  check(&k, g.dk, "dk");
  check(&v, g.dv, "dv");
}

INSTANTIATE_TEST_SUITE_P(Shapes, BackwardVsFiniteDifferences,
                         ::testing::Values(Shape{1, 3, 4, 2, 1, 3, false},
                                           Shape{1, 3, 4, 2, 1, 3, true},
                                           Shape{1, 5, 3, 2, 2, 2, true},  // rows without keys
                                           Shape{2, 2, 2, 4, 2, 3, false},
                                           Shape{1, 34, 3, 1, 1, 2, true}));  // two row blocks

TEST(ReferenceBackward, GqaEqualsMhaWithGroupSummedKvGradients) {
  for (bool causal : {false, true}) {
    const Shape gqa{2, 7, 5, 6, 2, 4, causal};
    Shape mha = gqa;
    mha.h_kv = 6;
    const auto q = random_normal(gqa.q_numel(), 34), k = random_normal(gqa.kv_numel(), 35),
               v = random_normal(gqa.kv_numel(), 36), dout = random_normal(gqa.q_numel(), 37);
    std::vector<double> k_rep(mha.kv_numel()), v_rep(mha.kv_numel());
    for (int64_t t = 0; t < gqa.b * gqa.s_k; ++t)
      for (int64_t h = 0; h < mha.h_kv; ++h)
        for (int64_t c = 0; c < gqa.d; ++c) {
          k_rep[(t * mha.h_kv + h) * gqa.d + c] = k[(t * gqa.h_kv + h / 3) * gqa.d + c];
          v_rep[(t * mha.h_kv + h) * gqa.d + c] = v[(t * gqa.h_kv + h / 3) * gqa.d + c];
        }
    const Grads a = run_backward(gqa, q, k, v, dout), b = run_backward(mha, q, k_rep, v_rep, dout);
    EXPECT_EQ(a.dq, b.dq);
    std::vector<double> dk_sum(gqa.kv_numel(), 0.0), dv_sum(gqa.kv_numel(), 0.0);
    for (int64_t t = 0; t < gqa.b * gqa.s_k; ++t)
      for (int64_t h = 0; h < mha.h_kv; ++h)
        for (int64_t c = 0; c < gqa.d; ++c) {
          dk_sum[(t * gqa.h_kv + h / 3) * gqa.d + c] += b.dk[(t * mha.h_kv + h) * gqa.d + c];
          dv_sum[(t * gqa.h_kv + h / 3) * gqa.d + c] += b.dv[(t * mha.h_kv + h) * gqa.d + c];
        }
    for (int64_t i = 0; i < gqa.kv_numel(); ++i) {
      EXPECT_NEAR(a.dk[i], dk_sum[i], 1e-13);
      EXPECT_NEAR(a.dv[i], dv_sum[i], 1e-13);
    }
  }
}

// BF16 inputs with f32 gradients equal the f64 run on the same (exactly decoded) values, rounded.
TEST(ReferenceBackward, Bf16InputsFloat32Gradients) {
  const Shape s{1, 4, 6, 2, 1, 8, true};
  std::vector<uint16_t> bits[4];
  std::vector<double> exact[4];
  const int64_t sizes[4] = {s.q_numel(), s.kv_numel(), s.kv_numel(), s.q_numel()};
  for (int t = 0; t < 4; ++t) {
    for (double x : random_normal(sizes[t], 40 + t)) {
      bits[t].push_back(float_to_bf16_bits(static_cast<float>(x)));
      exact[t].push_back(bf16_bits_to_float(bits[t].back()));
    }
  }
  const Grads want = run_backward(s, exact[0], exact[1], exact[2], exact[3]);
  std::vector<float> dq(s.q_numel()), dk(s.kv_numel()), dv(s.kv_numel());
  auto q_shape = [&](void* p, DType t) { return make_view(p, t, {s.b, s.s_q, s.h, s.d}); };
  auto k_shape = [&](void* p, DType t) { return make_view(p, t, {s.b, s.s_k, s.h_kv, s.d}); };
  AttentionOptions opt;
  opt.causal = true;
  ASSERT_TRUE(reference_attention_backward(
                  q_shape(bits[0].data(), DType::kBF16), k_shape(bits[1].data(), DType::kBF16),
                  k_shape(bits[2].data(), DType::kBF16), q_shape(bits[3].data(), DType::kBF16), opt,
                  q_shape(dq.data(), DType::kF32), k_shape(dk.data(), DType::kF32),
                  k_shape(dv.data(), DType::kF32))
                  .ok());
  for (int64_t i = 0; i < s.q_numel(); ++i) EXPECT_EQ(dq[i], static_cast<float>(want.dq[i]));
  for (int64_t i = 0; i < s.kv_numel(); ++i) {
    EXPECT_EQ(dk[i], static_cast<float>(want.dk[i]));
    EXPECT_EQ(dv[i], static_cast<float>(want.dv[i]));
  }
}

TEST(ReferenceBackward, EmptyRowsAndKeysGiveZeroGradients) {
  // s_q == 0: dk and dv are written as zeros (they were NaN).
  Shape s{1, 0, 4, 2, 1, 3, false};
  Grads g =
      run_backward(s, {}, random_normal(s.kv_numel(), 50), random_normal(s.kv_numel(), 51), {});
  for (double x : g.dk) EXPECT_EQ(x, 0.0);
  for (double x : g.dv) EXPECT_EQ(x, 0.0);
  // s_k == 0: dq is zero.
  s = Shape{1, 3, 0, 2, 1, 3, true};
  g = run_backward(s, random_normal(s.q_numel(), 52), {}, {}, random_normal(s.q_numel(), 53));
  for (double x : g.dq) EXPECT_EQ(x, 0.0);
  // Causal s_q > s_k: the rows without keys have dq = 0.
  s = Shape{1, 5, 2, 1, 1, 3, true};
  g = run_backward(s, random_normal(s.q_numel(), 54), random_normal(s.kv_numel(), 55),
                   random_normal(s.kv_numel(), 56), random_normal(s.q_numel(), 57));
  // (Row 3 sees one key: P = 1 whatever q is, so its dq is 0 too; row 4 sees two.)
  for (int64_t i = 0; i < 4 * s.d; ++i) EXPECT_EQ(g.dq[i], 0.0);
  for (int64_t i = 4 * s.d; i < s.q_numel(); ++i) EXPECT_NE(g.dq[i], 0.0);
}

TEST(ReferenceBackward, RejectsBadGradientArguments) {
  const Shape s{1, 2, 3, 2, 1, 4, false};
  auto q = random_normal(s.q_numel(), 60), k = random_normal(s.kv_numel(), 61);
  std::vector<double> dq(s.q_numel()), dk(s.kv_numel()), dv(s.kv_numel());
  std::vector<uint16_t> half(s.q_numel());
  AttentionOptions opt;
  Status st = reference_attention_backward(
      qv(s, q), kvv(s, k), kvv(s, k), qv(s, q), opt,
      make_view(half.data(), DType::kF16, {s.b, s.s_q, s.h, s.d}), kvv(s, dk), kvv(s, dv));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "dq: expected dtype float64, float32, got float16");
  st = reference_attention_backward(qv(s, q), kvv(s, k), kvv(s, k), qv(s, q), opt, qv(s, dq),
                                    kvv(s, dk), qv(s, dv));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "dv: expected shape (1, 3, 1, 4) like v, got (1, 2, 2, 4)");
  st = reference_attention_backward(qv(s, q), kvv(s, k), kvv(s, k), kvv(s, k), opt, qv(s, dq),
                                    kvv(s, dk), kvv(s, dv));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("dout: expected shape (1, 2, 2, 4) like q", 0), 0u) << st.message();
}

// ---------------------------------------------------------------------------------------------
// Threads

// Sets FP4ATTN_NUM_THREADS for one scope (tests run single-threaded, so setenv is safe here).
class ScopedThreads {
 public:
  explicit ScopedThreads(const std::string& value) {
    if (const char* old = std::getenv("FP4ATTN_NUM_THREADS")) old_ = old, had_ = true;
    setenv("FP4ATTN_NUM_THREADS", value.c_str(), 1);
  }
  explicit ScopedThreads(int n) : ScopedThreads(std::to_string(n)) {}
  ~ScopedThreads() {
    if (had_) {
      setenv("FP4ATTN_NUM_THREADS", old_.c_str(), 1);
    } else {
      unsetenv("FP4ATTN_NUM_THREADS");
    }
  }

 private:
  std::string old_;
  bool had_ = false;
};

TEST(ParallelFor, VisitsEveryIndexOnce) {
  for (int threads : {1, 3, 8}) {
    ScopedThreads scoped(threads);
    EXPECT_EQ(num_threads(), threads);
    for (int64_t n : {0, 1, 5, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      parallel_for(n, [&](int64_t i) { hits[i].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

TEST(ParallelFor, IgnoresInvalidThreadCount) {
  for (const char* value : {"zero", "-2", "0", "3x", ""}) {
    ScopedThreads scoped{std::string(value)};
    EXPECT_GE(num_threads(), 1) << value;
  }
}

TEST(Reference, BitwiseDeterministicAcrossThreadCounts) {
  const Shape s{2, 70, 90, 4, 2, 16, true};
  const auto q = random_normal(s.q_numel(), 70), k = random_normal(s.kv_numel(), 71),
             v = random_normal(s.kv_numel(), 72), dout = random_normal(s.q_numel(), 73);
  Naive fwd[3];
  Grads bwd[3];
  const int counts[3] = {1, 3, 7};
  for (int t = 0; t < 3; ++t) {
    ScopedThreads scoped(counts[t]);
    fwd[t] = run_forward(s, q, k, v);
    bwd[t] = run_backward(s, q, k, v, dout);
  }
  auto same_bits = [](const std::vector<double>& a, const std::vector<double>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
  };
  for (int t = 1; t < 3; ++t) {
    EXPECT_TRUE(same_bits(fwd[0].o, fwd[t].o)) << counts[t] << " threads";
    EXPECT_TRUE(same_bits(fwd[0].lse, fwd[t].lse)) << counts[t] << " threads";
    EXPECT_TRUE(same_bits(bwd[0].dq, bwd[t].dq)) << counts[t] << " threads";
    EXPECT_TRUE(same_bits(bwd[0].dk, bwd[t].dk)) << counts[t] << " threads";
    EXPECT_TRUE(same_bits(bwd[0].dv, bwd[t].dv)) << counts[t] << " threads";
  }
}

}  // namespace
}  // namespace fp4attn
