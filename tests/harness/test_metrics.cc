// Accuracy metrics: exact values on constructed vectors, NaN/Inf parity, zero references.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "harness/metrics.h"

namespace fp4attn {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::vector<double> random_vector(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist;
  std::vector<double> x(n);
  for (double& e : x) e = dist(rng);
  return x;
}

TEST(Metrics, IdenticalVectors) {
  const auto r = random_vector(1000, 1);
  const ErrorStats s = compare(r.data(), r.data(), 1000);
  EXPECT_EQ(s.n, 1000);
  EXPECT_EQ(s.cos, 1.0);
  EXPECT_EQ(s.rel_l2, 0.0);
  EXPECT_EQ(s.rel_l1, 0.0);
  EXPECT_EQ(s.rmse, 0.0);
  EXPECT_EQ(s.max_abs, 0.0);
  EXPECT_EQ(s.nan_mismatch, 0);
  EXPECT_EQ(s.inf_mismatch, 0);
}

TEST(Metrics, ScaledVector) {
  const auto r = random_vector(1000, 2);
  for (double scale : {0.5, 1.5, 3.0}) {
    std::vector<double> t(r);
    for (double& x : t) x *= scale;
    const ErrorStats s = compare(t.data(), r.data(), 1000);
    EXPECT_NEAR(s.cos, 1.0, 1e-15);
    EXPECT_NEAR(s.rel_l2, std::fabs(scale - 1), 1e-14);
    EXPECT_NEAR(s.rel_l1, std::fabs(scale - 1), 1e-14);
    double max_ref = 0, sum2 = 0;
    for (double x : r) max_ref = std::max(max_ref, std::fabs(x)), sum2 += x * x;
    EXPECT_NEAR(s.max_abs, std::fabs(scale - 1) * max_ref, 1e-14);
    EXPECT_NEAR(s.rmse, std::fabs(scale - 1) * std::sqrt(sum2 / 1000), 1e-14);
  }
  std::vector<double> neg(r);
  for (double& x : neg) x = -x;
  const ErrorStats s = compare(neg.data(), r.data(), 1000);
  EXPECT_NEAR(s.cos, -1.0, 1e-15);
  EXPECT_NEAR(s.rel_l2, 2.0, 1e-15);
}

TEST(Metrics, HandComputedExample) {
  const double t[] = {1, 0, 2}, r[] = {0, 1, 2};
  const ErrorStats s = compare(t, r, 3);
  EXPECT_NEAR(s.cos, 4.0 / 5.0, 1e-15);                // <t,r> = 4, |t| = |r| = sqrt(5)
  EXPECT_NEAR(s.rel_l2, std::sqrt(2.0 / 5.0), 1e-15);  // |t-r| = sqrt(2)
  EXPECT_NEAR(s.rel_l1, 2.0 / 3.0, 1e-15);
  EXPECT_NEAR(s.rmse, std::sqrt(2.0 / 3.0), 1e-15);
  EXPECT_EQ(s.max_abs, 1.0);
}

TEST(Metrics, NanParityAndFinitePairsOnly) {
  const double t[] = {1, kNaN, kNaN, 2, 5};
  const double r[] = {1, kNaN, 3, kNaN, 4};
  const ErrorStats s = compare(t, r, 5);
  EXPECT_EQ(s.n, 5);
  EXPECT_EQ(s.nan_mismatch, 2);  // positions 2 and 3; both-NaN at 1 is parity
  EXPECT_EQ(s.inf_mismatch, 0);
  // Metrics over positions 0 and 4 only: t = (1, 5), r = (1, 4).
  EXPECT_EQ(s.max_abs, 1.0);
  EXPECT_NEAR(s.rel_l2, 1.0 / std::sqrt(17.0), 1e-15);
  EXPECT_NEAR(s.rmse, std::sqrt(0.5), 1e-15);
}

TEST(Metrics, InfParity) {
  const double t[] = {kInf, kInf, -kInf, 1, kNaN, 3};
  const double r[] = {kInf, -kInf, 2, -kInf, kInf, 3};
  const ErrorStats s = compare(t, r, 6);
  // Same-signed Inf at 0 matches; sign flip, Inf vs finite (twice) and NaN vs Inf differ.
  EXPECT_EQ(s.inf_mismatch, 4);
  EXPECT_EQ(s.nan_mismatch, 1);
  EXPECT_EQ(s.max_abs, 0.0);  // only position 5 is finite in both
  EXPECT_EQ(s.cos, 1.0);
}

TEST(Metrics, ZeroReference) {
  const double zero[] = {0, 0, 0}, x[] = {1, -2, 0};
  ErrorStats s = compare(zero, zero, 3);  // both all-zero: perfect agreement
  EXPECT_EQ(s.cos, 1.0);
  EXPECT_EQ(s.rel_l2, 0.0);
  EXPECT_EQ(s.rel_l1, 0.0);
  s = compare(x, zero, 3);  // reference zero, test not: infinitely wrong
  EXPECT_EQ(s.cos, 0.0);
  EXPECT_EQ(s.rel_l2, kInf);
  EXPECT_EQ(s.rel_l1, kInf);
  EXPECT_EQ(s.max_abs, 2.0);
  s = compare(zero, x, 3);  // test zero, reference not: all of it missing
  EXPECT_EQ(s.cos, 0.0);
  EXPECT_EQ(s.rel_l2, 1.0);
  EXPECT_EQ(s.rel_l1, 1.0);
  s = compare(zero, zero, 0);  // nothing to compare
  EXPECT_EQ(s.n, 0);
  EXPECT_EQ(s.cos, 1.0);
  EXPECT_EQ(s.rmse, 0.0);
}

// The view overload reads any float dtype and strides in logical order.
TEST(Metrics, TensorViewsOfDifferentDtypesAndStrides) {
  const auto r = random_vector(24, 3);
  std::vector<double> ref_t(24);  // reference stored transposed: [4][6] holding a [6][4] tensor
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 4; ++j) ref_t[j * 6 + i] = r[i * 4 + j];
  std::vector<uint16_t> test_bits(24);
  std::vector<double> test_exact(24);
  for (int i = 0; i < 24; ++i) {
    test_bits[i] = float_to_bf16_bits(static_cast<float>(r[i]));
    test_exact[i] = bf16_bits_to_float(test_bits[i]);
  }
  const TensorView test = make_view(test_bits.data(), DType::kBF16, {6, 4});
  const TensorView ref = make_strided_view(ref_t.data(), DType::kF64, {6, 4}, {1, 6});
  const ErrorStats got = compare(test, ref);
  const ErrorStats want = compare(test_exact.data(), r.data(), 24);
  EXPECT_EQ(got.n, 24);
  EXPECT_EQ(got.cos, want.cos);
  EXPECT_EQ(got.rel_l2, want.rel_l2);
  EXPECT_EQ(got.max_abs, want.max_abs);
  EXPECT_GT(got.rel_l2, 0.0);
  EXPECT_LT(got.rel_l2, 0x1p-8);  // BF16 rounding error
}

TEST(Metrics, RejectsMismatchedViews) {
  std::vector<float> a(12), b(12);
  const TensorView ta = make_view(a.data(), DType::kF32, {3, 4});
  const TensorView tb = make_view(b.data(), DType::kF32, {4, 3});
  ErrorStats s;
  Status st = compare(ta, tb, &s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "test: expected shape (4, 3) like ref, got (3, 4)");
  s = compare(ta, tb);
  EXPECT_EQ(s.n, -1);
  EXPECT_TRUE(std::isnan(s.cos));
  EXPECT_FALSE(s.cos >= 0.99);  // any threshold check fails
  TensorView bad = make_view(b.data(), DType::kE4M3, {3, 4});
  st = compare(ta, bad, &s);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("ref: expected dtype"), std::string::npos) << st.message();
}

TEST(Metrics, ToStringNamesEveryField) {
  ErrorStats s;
  s.n = 7;
  s.cos = 0.5;
  s.nan_mismatch = 2;
  const std::string text = to_string(s);
  for (const char* key : {"n=7", "cos=0.5", "rel_l2=", "rel_l1=", "rmse=", "max_abs=",
                          "nan_mismatch=2", "inf_mismatch=0"}) {
    EXPECT_NE(text.find(key), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace fp4attn
