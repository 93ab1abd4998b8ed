// Golden paged attention: equals the float64 reference on the decoded cache (same math, so to
// 1e-12) for decode, speculative decode and varlen prefill/extend, GQA, NVFP4 and FP8 caches,
// page sizes 16 and 64, random page tables; split-KV partials merged by the combine equal the
// unsplit result; empty rows and NaN behave as documented.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "fp4attn/golden/paged_kv.h"
#include "fp4attn/golden/reference.h"
#include "support/paged_kv_util.h"

namespace fp4attn {
namespace {

using paged_test::OwnedCache;
using paged_test::PageTable;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kH = 8, kHkv = 2;

// A filled cache and a batch of queries over it.
struct Batch {
  OwnedCache cache;
  PageTable pages;
  std::vector<int32_t> cu_q;  // [b + 1] query rows per sequence
  std::vector<double> q;      // [total_q, h, d]
  int64_t d;

  Batch(KvCacheFormat f, int64_t page_size, int64_t d_, const std::vector<int32_t>& lens,
        const std::vector<int32_t>& s_q, uint32_t seed)
      : cache(f, 0, page_size, kHkv, d_), pages{}, d(d_) {
    int64_t need = 0;
    for (int32_t l : lens) need += (l + page_size - 1) / page_size;
    cache = OwnedCache(f, need + 3, page_size, kHkv, d);  // spare pages are never read
    pages = paged_test::random_pages(lens, page_size, need + 3, seed);
    // Append each sequence's tokens, longest first, in two appends each (decode-like growth).
    for (size_t bi = 0; bi < lens.size(); ++bi) {
      const int64_t n = lens[bi];
      const std::vector<float> k = paged_test::normal(n * kHkv * d, seed + 10 * bi + 1);
      const std::vector<float> v = paged_test::normal(n * kHkv * d, seed + 10 * bi + 2);
      std::vector<int32_t> slots(n);
      for (int64_t j = 0; j < n; ++j) slots[j] = pages.slot(bi, j);
      for (int64_t lo = 0; lo < n;) {
        const int64_t hi = std::min(n, lo + std::max<int64_t>(1, n / 2));
        const int64_t m = hi - lo;
        EXPECT_TRUE(paged_kv_append(
                        make_view(const_cast<float*>(&k[lo * kHkv * d]), DType::kF32, {m, kHkv, d}),
                        make_view(const_cast<float*>(&v[lo * kHkv * d]), DType::kF32, {m, kHkv, d}),
                        make_view(&slots[lo], DType::kI32, {m}), cache.view())
                        .ok());
        lo = hi;
      }
    }
    cu_q.assign(1, 0);
    for (int32_t s : s_q) cu_q.push_back(cu_q.back() + s);
    std::vector<float> qf = paged_test::normal(cu_q.back() * kH * d, seed + 7);
    q.assign(qf.begin(), qf.end());
  }
  int64_t b() const { return pages.b; }
  int64_t total_q() const { return cu_q.back(); }
  TensorView tables() { return make_view(pages.table.data(), DType::kI32, {b(), pages.max_pages}); }
  TensorView lens() { return make_view(pages.lens.data(), DType::kI32, {b()}); }
  TensorView qv() { return make_view(q.data(), DType::kF64, {total_q(), kH, d}); }
  TensorView cu() { return make_view(cu_q.data(), DType::kI32, {b() + 1}); }
};

// Float64 reference per sequence on the decoded cache: o [total_q, h, d], lse [h, total_q].
void reference(Batch& bt, bool causal, std::vector<double>* o, std::vector<double>* lse) {
  const int64_t d = bt.d, b = bt.b();
  int64_t max_len = 1;
  for (int32_t l : bt.pages.lens) max_len = std::max<int64_t>(max_len, l);
  std::vector<double> kd(b * max_len * kHkv * d), vd(kd.size());
  ASSERT_TRUE(paged_kv_dequantize(bt.cache.view(), bt.tables(), bt.lens(),
                                  make_view(kd.data(), DType::kF64, {b, max_len, kHkv, d}),
                                  make_view(vd.data(), DType::kF64, {b, max_len, kHkv, d}))
                  .ok());
  const int64_t tq = bt.total_q();
  o->assign(tq * kH * d, 0);
  lse->assign(kH * tq, 0);
  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t q0 = bt.cu_q[bi], s_q = bt.cu_q[bi + 1] - q0, len = bt.pages.lens[bi];
    const int64_t kvs = max_len * kHkv * d;
    std::vector<double> lse_b(kH * s_q);
    AttentionOptions opt;
    opt.causal = causal;
    ASSERT_TRUE(
        reference_attention_forward(
            make_strided_view(&bt.q[q0 * kH * d], DType::kF64, {1, s_q, kH, d}, {0, kH * d, d, 1}),
            make_strided_view(&kd[bi * kvs], DType::kF64, {1, len, kHkv, d}, {0, kHkv * d, d, 1}),
            make_strided_view(&vd[bi * kvs], DType::kF64, {1, len, kHkv, d}, {0, kHkv * d, d, 1}),
            opt,
            make_strided_view(&(*o)[q0 * kH * d], DType::kF64, {1, s_q, kH, d}, {0, kH * d, d, 1}),
            make_view(lse_b.data(), DType::kF64, {1, kH, s_q}))
            .ok());
    for (int64_t hq = 0; hq < kH; ++hq) {
      for (int64_t i = 0; i < s_q; ++i) (*lse)[hq * tq + q0 + i] = lse_b[hq * s_q + i];
    }
  }
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isinf(want[i]) || std::isnan(want[i])) {
      ASSERT_TRUE(got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i])))
          << what << "[" << i << "]: " << got[i] << " vs " << want[i];
      continue;
    }
    ASSERT_NEAR(got[i], want[i], tol * std::max(1.0, std::abs(want[i]))) << what << "[" << i << "]";
  }
}

struct Case {
  KvCacheFormat format;
  int64_t page_size, d;
};

class GoldenPaged : public ::testing::TestWithParam<Case> {};

// Varlen extend/prefill and decode rows in one batch; an empty sequence; s_q > len (causal rows
// without keys).
TEST_P(GoldenPaged, VarlenEqualsFloat64ReferenceOnTheDecodedCache) {
  const Case c = GetParam();
  Batch bt(c.format, c.page_size, c.d, {37, 1, 0, 130, 64, 3}, {5, 1, 2, 17, 1, 6}, 11);
  for (bool causal : {true, false}) {
    std::vector<double> o(bt.total_q() * kH * c.d), lse(kH * bt.total_q()), ro, rl;
    PagedAttentionOptions opt;
    opt.causal = causal;
    ASSERT_TRUE(golden_paged_attention(bt.qv(), bt.cu(), bt.cache.view(), bt.tables(), bt.lens(),
                                       opt,
                                       make_view(o.data(), DType::kF64, {bt.total_q(), kH, c.d}),
                                       make_view(lse.data(), DType::kF64, {kH, bt.total_q()}))
                    .ok());
    reference(bt, causal, &ro, &rl);
    expect_close(o, ro, 1e-12, "o");
    expect_close(lse, rl, 1e-12, "lse");
  }
}

// Uniform decode (rank-4 q): 1 token, and 4 tokens per sequence (speculative decoding).
TEST_P(GoldenPaged, DecodeRank4EqualsVarlen) {
  const Case c = GetParam();
  for (int64_t s_q : {1, 4}) {
    const std::vector<int32_t> lens = {200, 5, 64, 1};
    Batch bt(c.format, c.page_size, c.d, lens, std::vector<int32_t>(lens.size(), s_q), 21);
    const int64_t b = bt.b();
    std::vector<double> o4(b * s_q * kH * c.d), l4(b * kH * s_q), ov(o4.size()), lv(l4.size());
    PagedAttentionOptions opt;
    ASSERT_TRUE(golden_paged_attention(make_view(bt.q.data(), DType::kF64, {b, s_q, kH, c.d}),
                                       TensorView{}, bt.cache.view(), bt.tables(), bt.lens(), opt,
                                       make_view(o4.data(), DType::kF64, {b, s_q, kH, c.d}),
                                       make_view(l4.data(), DType::kF64, {b, kH, s_q}))
                    .ok());
    ASSERT_TRUE(golden_paged_attention(bt.qv(), bt.cu(), bt.cache.view(), bt.tables(), bt.lens(),
                                       opt, make_view(ov.data(), DType::kF64, {b * s_q, kH, c.d}),
                                       make_view(lv.data(), DType::kF64, {kH, b * s_q}))
                    .ok());
    EXPECT_EQ(o4, ov);
    for (int64_t bi = 0; bi < b; ++bi) {
      for (int64_t hq = 0; hq < kH; ++hq) {
        for (int64_t i = 0; i < s_q; ++i) {
          ASSERT_EQ(l4[(bi * kH + hq) * s_q + i], lv[hq * b * s_q + bi * s_q + i]);
        }
      }
    }
    std::vector<double> ro, rl;
    reference(bt, true, &ro, &rl);
    expect_close(ov, ro, 1e-12, "o");
  }
}

// Split-KV: partials over fixed key ranges, merged by the combine, equal the unsplit result.
TEST_P(GoldenPaged, SplitKvCombineEqualsUnsplit) {
  const Case c = GetParam();
  Batch bt(c.format, c.page_size, c.d, {150, 0, 33, 2}, {1, 2, 4, 3}, 31);
  const int64_t tq = bt.total_q();
  std::vector<double> o(tq * kH * c.d), lse(kH * tq);
  PagedAttentionOptions opt;
  ASSERT_TRUE(golden_paged_attention(bt.qv(), bt.cu(), bt.cache.view(), bt.tables(), bt.lens(), opt,
                                     make_view(o.data(), DType::kF64, {tq, kH, c.d}),
                                     make_view(lse.data(), DType::kF64, {kH, tq}))
                  .ok());
  for (int64_t split_size : {16, 37, 64, 150}) {
    const int64_t splits = (150 + split_size - 1) / split_size + 1;  // the last one empty
    std::vector<double> op(splits * tq * kH * c.d), lp(splits * tq * kH);
    ASSERT_TRUE(golden_paged_attention_partials(
                    bt.qv(), bt.cu(), bt.cache.view(), bt.tables(), bt.lens(), opt, split_size,
                    make_view(op.data(), DType::kF64, {splits, tq, kH, c.d}),
                    make_view(lp.data(), DType::kF64, {splits, tq, kH}))
                    .ok());
    for (int64_t i = (splits - 1) * tq * kH; i < splits * tq * kH; ++i) {
      ASSERT_EQ(lp[i], -kInf);  // the empty split
    }
    std::vector<double> oc(o.size()), lc(lse.size());
    ASSERT_TRUE(combine_attention_partials(make_view(op.data(), DType::kF64, {splits, tq, kH, c.d}),
                                           make_view(lp.data(), DType::kF64, {splits, tq, kH}),
                                           make_view(oc.data(), DType::kF64, {tq, kH, c.d}),
                                           make_view(lc.data(), DType::kF64, {kH, tq}))
                    .ok());
    expect_close(oc, o, 1e-12, "o");
    expect_close(lc, lse, 1e-12, "lse");
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, GoldenPaged,
                         ::testing::Values(Case{KvCacheFormat::kNvfp4, 16, 128},
                                           Case{KvCacheFormat::kNvfp4, 64, 64},
                                           Case{KvCacheFormat::kFp8, 16, 64},
                                           Case{KvCacheFormat::kFp8, 64, 128}));

TEST(GoldenPagedRows, EmptyRowsAreZeroWithInfiniteLse) {
  Batch bt(KvCacheFormat::kNvfp4, 16, 64, {0, 2}, {1, 4}, 41);
  std::vector<double> o(5 * kH * 64, 7.0), lse(kH * 5);
  ASSERT_TRUE(golden_paged_attention(bt.qv(), bt.cu(), bt.cache.view(), bt.tables(), bt.lens(),
                                     PagedAttentionOptions{},
                                     make_view(o.data(), DType::kF64, {5, kH, 64}),
                                     make_view(lse.data(), DType::kF64, {kH, 5}))
                  .ok());
  // Row 0: empty sequence. Rows 1, 2: queries 0 and 1 of 4 over 2 keys (causal) see nothing.
  for (int64_t r : {0, 1, 2}) {
    for (int64_t hq = 0; hq < kH; ++hq) {
      EXPECT_EQ(lse[hq * 5 + r], kInf);
      for (int64_t c = 0; c < 64; ++c) ASSERT_EQ(o[(r * kH + hq) * 64 + c], 0.0);
    }
  }
  EXPECT_TRUE(std::isfinite(lse[3]));
}

// A cache of zeros only keeps its globals uncalibrated (0): decoding it is no error and gives
// what its codes say, zeros (O = 0, uniform weights over the zero scores: LSE = ln(keys)).
TEST(GoldenPagedRows, UncalibratedCacheOfZerosDecodesToZeros) {
  const int64_t d = 64, len = 20;
  for (KvCacheFormat f : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    SCOPED_TRACE(kv_cache_format_name(f));
    OwnedCache c(f, 2, 16, kHkv, d);
    std::vector<float> zeros(len * kHkv * d, 0.f);
    std::vector<int32_t> slots(len), table = {1, 0}, lens = {len};
    for (int64_t j = 0; j < len; ++j) slots[j] = table[j / 16] * 16 + j % 16;
    const TensorView z = make_view(zeros.data(), DType::kF32, {len, kHkv, d});
    ASSERT_TRUE(paged_kv_append(z, z, make_view(slots.data(), DType::kI32, {len}), c.view()).ok());
    ASSERT_EQ(c.kg, 0.f);
    ASSERT_EQ(c.vg, 0.f);
    const TensorView bt = make_view(table.data(), DType::kI32, {1, 2});
    const TensorView sl = make_view(lens.data(), DType::kI32, {1});
    std::vector<double> q(kH * d, 0.3), o(q.size(), 7.0), lse(kH), kd(len * kHkv * d, 7.0),
        vd(kd.size(), 7.0);
    Status st = golden_paged_attention(make_view(q.data(), DType::kF64, {1, 1, kH, d}),
                                       TensorView{}, c.view(), bt, sl, PagedAttentionOptions{},
                                       make_view(o.data(), DType::kF64, {1, 1, kH, d}),
                                       make_view(lse.data(), DType::kF64, {1, kH, 1}));
    ASSERT_TRUE(st.ok()) << st.message();
    for (double x : o) ASSERT_EQ(x, 0.0);
    for (double x : lse) EXPECT_NEAR(x, std::log(static_cast<double>(len)), 1e-12);
    st = paged_kv_dequantize(c.view(), bt, sl, make_view(kd.data(), DType::kF64, {1, len, kHkv, d}),
                             make_view(vd.data(), DType::kF64, {1, len, kHkv, d}));
    ASSERT_TRUE(st.ok()) << st.message();
    for (size_t i = 0; i < kd.size(); ++i) ASSERT_TRUE(kd[i] == 0.0 && vd[i] == 0.0) << i;
  }
}

TEST(GoldenPagedRows, SharedPrefixPagesGiveTheSameRows) {
  // Sequence 1's table is sequence 0's (prefix caching): same keys, same outputs.
  Batch bt(KvCacheFormat::kNvfp4, 16, 64, {40, 40}, {1, 1}, 51);
  for (int64_t p = 0; p < bt.pages.max_pages; ++p) {
    bt.pages.table[bt.pages.max_pages + p] = bt.pages.table[p];
  }
  bt.q.resize(2 * kH * 64);
  std::copy(bt.q.begin(), bt.q.begin() + kH * 64, bt.q.begin() + kH * 64);
  std::vector<double> o(2 * kH * 64);
  ASSERT_TRUE(golden_paged_attention(bt.qv(), bt.cu(), bt.cache.view(), bt.tables(), bt.lens(),
                                     PagedAttentionOptions{},
                                     make_view(o.data(), DType::kF64, {2, kH, 64}), TensorView{})
                  .ok());
  for (int64_t i = 0; i < kH * 64; ++i) ASSERT_EQ(o[i], o[kH * 64 + i]);
}

TEST(CombinePartials, EmptyNanAndSingleSplit) {
  const int64_t d = 2;
  // Row 0: both partials empty. Row 1: one NaN LSE. Row 2: one live partial, one empty.
  std::vector<double> op = {0, 0, 1, 2, 3, 4,   // split 0: rows 0..2
                            0, 0, 5, 6, 0, 0};  // split 1
  std::vector<double> lp = {-kInf, std::nan(""), 0.5, -kInf, 0.1, -kInf};
  std::vector<double> o(3 * d), lse(3);
  ASSERT_TRUE(combine_attention_partials(make_view(op.data(), DType::kF64, {2, 3, 1, d}),
                                         make_view(lp.data(), DType::kF64, {2, 3, 1}),
                                         make_view(o.data(), DType::kF64, {3, 1, d}),
                                         make_view(lse.data(), DType::kF64, {1, 3}))
                  .ok());
  EXPECT_EQ(o[0], 0.0);
  EXPECT_EQ(o[1], 0.0);
  EXPECT_EQ(lse[0], kInf);
  EXPECT_TRUE(std::isnan(o[2]) && std::isnan(o[3]) && std::isnan(lse[1]));
  EXPECT_EQ(o[4], 3.0);
  EXPECT_EQ(o[5], 4.0);
  EXPECT_EQ(lse[2], 0.5);
}

}  // namespace
}  // namespace fp4attn
