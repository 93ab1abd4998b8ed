// Seeded input suite: determinism, BF16-exact values, the prefix property, and the property each
// input kind claims.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/half.h"
#include "harness/suite.h"

namespace fp4attn {
namespace {

TEST(Suite, KindNamesRoundTrip) {
  const char* names[] = {"gaussian", "outliers", "large-logits", "near-uniform"};
  int i = 0;
  for (InputKind kind : kAllInputKinds) {
    EXPECT_STREQ(input_kind_name(kind), names[i++]);
    InputKind parsed = InputKind::kGaussian;
    ASSERT_TRUE(parse_input_kind(input_kind_name(kind), &parsed));
    EXPECT_EQ(parsed, kind);
  }
  InputKind out = InputKind::kNearUniform;
  EXPECT_FALSE(parse_input_kind("uniform", &out));
  EXPECT_FALSE(parse_input_kind("", &out));
  EXPECT_EQ(out, InputKind::kNearUniform);
}

bool bf16_exact(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)) == x; }

TEST(Suite, ShapesFiniteBf16ExactAndSeeded) {
  for (InputKind kind : kAllInputKinds) {
    SCOPED_TRACE(input_kind_name(kind));
    const SuiteInputs a = make_inputs(kind, 2, 33, 41, 4, 2, 24, 7);
    EXPECT_EQ(a.b, 2);
    EXPECT_EQ(a.s_q, 33);
    EXPECT_EQ(a.s_k, 41);
    EXPECT_EQ(a.h, 4);
    EXPECT_EQ(a.h_kv, 2);
    EXPECT_EQ(a.d, 24);
    ASSERT_EQ(a.q.size(), 2u * 33 * 4 * 24);
    ASSERT_EQ(a.k.size(), 2u * 41 * 2 * 24);
    ASSERT_EQ(a.v.size(), a.k.size());
    for (const std::vector<float>* t : {&a.q, &a.k, &a.v}) {
      for (float x : *t) {
        ASSERT_TRUE(std::isfinite(x));
        ASSERT_TRUE(bf16_exact(x)) << x;
      }
    }
    const SuiteInputs same = make_inputs(kind, 2, 33, 41, 4, 2, 24, 7);
    EXPECT_EQ(a.q, same.q);
    EXPECT_EQ(a.k, same.k);
    EXPECT_EQ(a.v, same.v);
    // Another seed changes (nearly) every value of every tensor.
    const SuiteInputs other = make_inputs(kind, 2, 33, 41, 4, 2, 24, 8);
    auto fraction_equal = [](const std::vector<float>& x, const std::vector<float>& y) {
      size_t n = 0;
      for (size_t i = 0; i < x.size(); ++i) n += x[i] == y[i];
      return static_cast<double>(n) / static_cast<double>(x.size());
    };
    EXPECT_LT(fraction_equal(a.q, other.q), 0.05);
    EXPECT_LT(fraction_equal(a.k, other.k), 0.05);
    EXPECT_LT(fraction_equal(a.v, other.v), 0.05);
    // q, k and v are different streams.
    EXPECT_LT(fraction_equal(a.k, a.v), 0.05);
  }
}

TEST(Suite, IndependentOfThreadCount) {
  const char* env = std::getenv("FP4ATTN_NUM_THREADS");
  const std::string saved = env ? env : "";
  setenv("FP4ATTN_NUM_THREADS", "1", 1);
  const SuiteInputs one = make_inputs(InputKind::kLargeLogits, 2, 50, 60, 2, 1, 16, 3);
  setenv("FP4ATTN_NUM_THREADS", "5", 1);
  const SuiteInputs five = make_inputs(InputKind::kLargeLogits, 2, 50, 60, 2, 1, 16, 3);
  if (env) {
    setenv("FP4ATTN_NUM_THREADS", saved.c_str(), 1);
  } else {
    unsetenv("FP4ATTN_NUM_THREADS");
  }
  EXPECT_EQ(one.q, five.q);
  EXPECT_EQ(one.k, five.k);
  EXPECT_EQ(one.v, five.v);
}

bool is_prefix(const std::vector<float>& small, const std::vector<float>& big) {
  return small.size() <= big.size() && std::equal(small.begin(), small.end(), big.begin());
}

// Counter-based generation: a longer sequence (b = 1) or more batches extend the smaller shape.
TEST(Suite, PrefixOfLargerShapes) {
  for (InputKind kind : kAllInputKinds) {
    SCOPED_TRACE(input_kind_name(kind));
    const SuiteInputs a = make_inputs(kind, 1, 40, 50, 4, 2, 16, 11);
    const SuiteInputs longer_q = make_inputs(kind, 1, 80, 50, 4, 2, 16, 11);
    EXPECT_TRUE(is_prefix(a.q, longer_q.q));
    EXPECT_EQ(a.k, longer_q.k);
    EXPECT_EQ(a.v, longer_q.v);
    const SuiteInputs longer_k = make_inputs(kind, 1, 40, 300, 4, 2, 16, 11);
    EXPECT_TRUE(is_prefix(a.k, longer_k.k));
    EXPECT_TRUE(is_prefix(a.v, longer_k.v));
    // Peaked large-logits queries copy a key chosen among all s_k keys, so q depends on s_k.
    if (kind != InputKind::kLargeLogits) {
      EXPECT_EQ(a.q, longer_k.q);
    }
    const SuiteInputs batches = make_inputs(kind, 3, 40, 50, 4, 2, 16, 11);
    EXPECT_TRUE(is_prefix(a.q, batches.q));
    EXPECT_TRUE(is_prefix(a.k, batches.k));
    EXPECT_TRUE(is_prefix(a.v, batches.v));
  }
}

TEST(Suite, DegenerateShapesDoNotCrash) {
  for (InputKind kind : kAllInputKinds) {
    const SuiteInputs e = make_inputs(kind, 0, 8, 8, 2, 1, 16, 1);
    EXPECT_TRUE(e.q.empty() && e.k.empty() && e.v.empty());
    const SuiteInputs no_keys = make_inputs(kind, 1, 8, 0, 2, 1, 16, 1);
    EXPECT_EQ(no_keys.q.size(), 8u * 2 * 16);
    EXPECT_TRUE(no_keys.k.empty());
    const SuiteInputs neg = make_inputs(kind, -1, 8, 8, 2, 1, 16, 1);
    EXPECT_EQ(neg.b, 0);
    EXPECT_TRUE(neg.q.empty());
  }
}

// Scaled logits softmax_scale * q.k of row i (query head h) against every key, scale 1/sqrt(d).
std::vector<double> logits_row(const SuiteInputs& in, int64_t b, int64_t i, int64_t h) {
  const int64_t g = h / (in.h / in.h_kv);
  const double scale = 1.0 / std::sqrt(static_cast<double>(in.d));
  std::vector<double> s(in.s_k);
  for (int64_t j = 0; j < in.s_k; ++j) {
    double dot = 0;
    for (int64_t c = 0; c < in.d; ++c) {
      dot += static_cast<double>(in.q[((b * in.s_q + i) * in.h + h) * in.d + c]) *
             in.k[((b * in.s_k + j) * in.h_kv + g) * in.d + c];
    }
    s[j] = scale * dot;
  }
  return s;
}

TEST(Suite, GaussianIsStandardNormal) {
  const SuiteInputs in = make_inputs(InputKind::kGaussian, 1, 256, 256, 4, 4, 32, 5);
  for (const std::vector<float>* t : {&in.q, &in.k, &in.v}) {
    double sum = 0, sum2 = 0, within_one = 0;
    for (float x : *t) sum += x, sum2 += double(x) * x, within_one += std::fabs(x) < 1;
    const double n = static_cast<double>(t->size()), mean = sum / n;
    EXPECT_NEAR(mean, 0.0, 0.03);
    EXPECT_NEAR(sum2 / n - mean * mean, 1.0, 0.04);
    EXPECT_NEAR(within_one / n, 0.6827, 0.01);
  }
}

TEST(Suite, OutlierChannelsInQAndKAndHeavyTails) {
  const int64_t d = 64, s = 256, h = 4, h_kv = 2;
  const SuiteInputs in = make_inputs(InputKind::kOutlierChannels, 1, s, s, h, h_kv, d, 9);
  auto is_outlier = [&](int64_t c) { return c == 8 || c == 24 || c == 40 || c == 56; };
  // Mean of k per (kv head, channel) over tokens, and rms of q per channel.
  std::vector<double> k_mean(h_kv * d, 0.0), q_rms(d, 0.0);
  for (int64_t j = 0; j < s; ++j)
    for (int64_t g = 0; g < h_kv; ++g)
      for (int64_t c = 0; c < d; ++c) k_mean[g * d + c] += in.k[(j * h_kv + g) * d + c] / s;
  for (int64_t i = 0; i < s * h; ++i)
    for (int64_t c = 0; c < d; ++c) q_rms[c] += double(in.q[i * d + c]) * in.q[i * d + c];
  double normal_abs_mean = 0;
  for (int64_t g = 0; g < h_kv; ++g) {
    for (int64_t c = 0; c < d; ++c) {
      const double m = std::fabs(k_mean[g * d + c]);
      if (is_outlier(c)) {
        EXPECT_GT(m, 15.0) << "k channel " << c;  // |mean| ~ 20: what K smoothing removes
      } else {
        EXPECT_LT(m, 3.0) << "k channel " << c;
        normal_abs_mean += m / (h_kv * (d - 4));
      }
    }
  }
  EXPECT_GT(normal_abs_mean, 0.2);  // a nonzero per-head key mean in the ordinary channels too
  double q_out = 1e300, q_normal = 0;
  for (int64_t c = 0; c < d; ++c) {
    if (is_outlier(c)) {
      q_out = std::min(q_out, q_rms[c]);
    } else {
      q_normal = std::max(q_normal, q_rms[c]);
    }
  }
  EXPECT_GT(q_out, 25.0 * q_normal);  // rms ratio > 5 (the scale is 10x)
  // v is heavy-tailed: kurtosis well above a Gaussian's 3 (3e for this construction).
  double m2 = 0, m4 = 0;
  for (float x : in.v) m2 += double(x) * x, m4 += std::pow(double(x), 4);
  m2 /= static_cast<double>(in.v.size());
  m4 /= static_cast<double>(in.v.size());
  EXPECT_GT(m4 / (m2 * m2), 5.0);
}

TEST(Suite, LargeLogitsHaveSinksAndPeakedRows) {
  for (int64_t d : {64, 128}) {
    SCOPED_TRACE(d);
    const SuiteInputs in = make_inputs(InputKind::kLargeLogits, 1, 128, 300, 2, 1, d, 13);
    int64_t rows = 0, rows_over_100 = 0, peaked_rows = 0;
    double max_logit = -1e300;
    for (int64_t h = 0; h < in.h; ++h) {
      for (int64_t i = 0; i < in.s_q; ++i) {
        const std::vector<double> s = logits_row(in, 0, i, h);
        const int64_t top = std::max_element(s.begin(), s.end()) - s.begin();
        double sum = 0;
        for (double x : s) sum += std::exp(x - s[top]);
        ++rows;
        rows_over_100 += s[top] > 100;
        max_logit = std::max(max_logit, s[top]);
        // Peaked: one ordinary (non-sink) key takes most of the probability.
        peaked_rows += top % 256 != 0 && 1 / sum > 0.5;
      }
    }
    EXPECT_GT(max_logit, 100.0);
    EXPECT_GT(rows_over_100, rows / 2) << rows_over_100 << " of " << rows;
    EXPECT_GT(peaked_rows, rows / 20) << peaked_rows << " of " << rows;
  }
}

TEST(Suite, NearUniformLogitsSpreadBelowPointTwo) {
  const SuiteInputs in = make_inputs(InputKind::kNearUniform, 2, 64, 512, 2, 1, 64, 17);
  double widest = 0;
  for (int64_t b = 0; b < in.b; ++b)
    for (int64_t h = 0; h < in.h; ++h)
      for (int64_t i = 0; i < in.s_q; ++i) {
        const std::vector<double> s = logits_row(in, b, i, h);
        const auto [lo, hi] = std::minmax_element(s.begin(), s.end());
        widest = std::max(widest, *hi - *lo);
      }
  EXPECT_LT(widest, 0.2);
  EXPECT_GT(widest, 0.0);
}

// Sizes whose product wraps (b * s * h * d = 2^64 wrapped to 0) were allocated empty and written
// past (a segfault, issue 26); now an error naming the sizes, before anything is allocated.
TEST(Suite, SizesThatOverflowAreAnErrorNamingThem) {
  const int64_t b = 1 << 20, s = 1 << 25, h = 4096, d = 128;
  SuiteSizes sizes{};
  const Status st = suite_sizes(b, s, s, h, h, d, &sizes);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(),
            "q elements: b * s_q * h * d = 1048576 * 33554432 * 4096 * 128 overflows int64");
  try {
    (void)make_inputs(InputKind::kGaussian, b, s, s, h, h, d, 0);
    ADD_FAILURE() << "make_inputs accepted sizes whose product overflows";
  } catch (const std::length_error& e) {
    EXPECT_EQ(std::string(e.what()), "make_inputs: " + st.message());
  }
  // The bytes of q + k + v overflow although each tensor's elements fit.
  const Status bytes =
      suite_sizes(1, int64_t(1) << 40, int64_t(1) << 40, 1 << 12, 1 << 12, 1 << 9, &sizes);
  ASSERT_FALSE(bytes.ok());
  EXPECT_NE(bytes.message().find("the byte count overflows int64"), std::string::npos);
}

TEST(Suite, SizesAboveTheHostMemoryLimitAreRefused) {
  SuiteSizes sizes{};
  ASSERT_TRUE(suite_sizes(1, 300, 200, 4, 2, 64, &sizes).ok());
  EXPECT_EQ(sizes.q_elements, 300 * 4 * 64);
  EXPECT_EQ(sizes.kv_elements, 200 * 2 * 64);
  EXPECT_EQ(sizes.bytes, 4 * (300 * 4 * 64 + 2 * 200 * 2 * 64));
  setenv("FP4ATTN_HOST_MEMORY_LIMIT", "100000", 1);
  const Status st = suite_sizes(1, 300, 200, 4, 2, 64, &sizes);
  bool threw = false;
  try {
    (void)make_inputs(InputKind::kGaussian, 1, 300, 200, 4, 2, 64, 0);
  } catch (const std::length_error&) {
    threw = true;
  }
  unsetenv("FP4ATTN_HOST_MEMORY_LIMIT");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("suite inputs q, k, v (b, s_q, s_k, h, h_kv, d = 1, 300, 200, 4, 2, "
                               "64): the host buffers need 500.00 KiB, more than the 97.66 KiB",
                               0),
            0u)
      << st.message();
  EXPECT_TRUE(threw);
}

}  // namespace
}  // namespace fp4attn
