// Bad input to the paged KV cache entry points: every rejection names the argument, and nothing
// is written or read out of bounds (the checks run before any access).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "fp4attn/golden/paged_kv.h"
#include "support/paged_kv_util.h"
#include "validate/validate_paged.h"

namespace fp4attn {
namespace {

using paged_test::OwnedCache;

::testing::AssertionResult HasSubstr(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\" does not contain \"" << part << "\"";
}

#define EXPECT_ERROR(expr, part)                \
  do {                                          \
    const Status _s = (expr);                   \
    EXPECT_FALSE(_s.ok()) << #expr;             \
    EXPECT_TRUE(HasSubstr(_s.message(), part)); \
  } while (0)

// A valid problem: 4 pages of 16 tokens, 2 kv heads, d = 64; b = 2, lengths 20 and 5; 4 q heads.
class ValidatePaged : public ::testing::Test {
 protected:
  OwnedCache c{KvCacheFormat::kNvfp4, 4, 16, 2, 64};
  std::vector<float> kv = std::vector<float>(3 * 2 * 64, 0.5f);
  std::vector<int32_t> slots = {0, 17, 40};
  std::vector<int32_t> table = {0, 1, 3, -1};  // [2, 2]
  std::vector<int32_t> lens = {20, 5};
  std::vector<int32_t> cu = {0, 3, 4};
  std::vector<float> q = std::vector<float>(4 * 4 * 64, 0.1f);
  std::vector<float> o = std::vector<float>(4 * 4 * 64);
  std::vector<float> lse = std::vector<float>(4 * 4);

  void SetUp() override { c.kg = c.vg = 2.f; }
  Status append() {
    return paged_kv_append(make_view(kv.data(), DType::kF32, {3, 2, 64}),
                           make_view(kv.data(), DType::kF32, {3, 2, 64}),
                           make_view(slots.data(), DType::kI32, {3}), c.view());
  }
  Status attend(PagedKvCache cache, TensorView qv, TensorView ov, TensorView lv, TensorView cuv) {
    return golden_paged_attention(qv, cuv, cache, make_view(table.data(), DType::kI32, {2, 2}),
                                  make_view(lens.data(), DType::kI32, {2}), {}, ov, lv);
  }
  Status attend() {
    return attend(c.view(), make_view(q.data(), DType::kF32, {4, 4, 64}),
                  make_view(o.data(), DType::kF32, {4, 4, 64}),
                  make_view(lse.data(), DType::kF32, {4, 4}),
                  make_view(cu.data(), DType::kI32, {3}));
  }
};

TEST_F(ValidatePaged, ValidInputsPass) {
  EXPECT_TRUE(append().ok()) << append().message();
  EXPECT_TRUE(attend().ok()) << attend().message();
}

TEST_F(ValidatePaged, Slots) {
  slots[1] = 64;
  EXPECT_ERROR(append(), "slot_mapping[1]: slot 64 is out of range [0, 64)");
  slots[1] = 40;
  EXPECT_ERROR(append(), "slot_mapping[2]: slot 40 is also written by token 1");
  slots = {-1, -1, 5};
  EXPECT_TRUE(append().ok());
}

TEST_F(ValidatePaged, AppendShapesAndDtypes) {
  EXPECT_ERROR(paged_kv_append(make_view(kv.data(), DType::kF32, {3, 3, 64}),
                               make_view(kv.data(), DType::kF32, {3, 2, 64}),
                               make_view(slots.data(), DType::kI32, {3}), c.view()),
               "k: expected shape (3, 2, 64)");
  EXPECT_ERROR(paged_kv_append(make_view(kv.data(), DType::kF32, {3, 2, 64}),
                               make_view(kv.data(), DType::kF32, {3, 2, 64}),
                               make_view(slots.data(), DType::kI32, {2}), c.view()),
               "slot_mapping: expected shape (3)");
  EXPECT_ERROR(paged_kv_append(make_view(kv.data(), DType::kF32, {3, 2, 64}),
                               make_view(kv.data(), DType::kF64, {3, 2, 64}),
                               make_view(slots.data(), DType::kI32, {3}), c.view()),
               "v: expected dtype");
  EXPECT_ERROR(paged_kv_append(make_view(kv.data(), DType::kF32, {3, 2, 64}),
                               make_view(kv.data(), DType::kF32, {3, 2, 64}),
                               make_view(slots.data(), DType::kU8, {3}), c.view()),
               "slot_mapping: expected dtype");
}

// Negative, NaN and infinite globals are refused by appends and readers alike, by name; 0
// (uncalibrated) is read with factor 0.
TEST_F(ValidatePaged, BadGlobalScales) {
  c.kg = -1.f;
  EXPECT_ERROR(append(), "k_global: expected a finite scale > 0 (or 0: uncalibrated), got -1");
  EXPECT_ERROR(attend(), "k_global: expected a finite scale > 0 (or 0: uncalibrated), got -1");
  c.kg = NAN;
  EXPECT_ERROR(append(), "k_global");
  EXPECT_ERROR(attend(), "k_global");
  c.kg = 2.f;
  c.vg = INFINITY;
  EXPECT_ERROR(append(), "v_global: expected a finite scale > 0 (or 0: uncalibrated), got inf");
  EXPECT_ERROR(attend(), "v_global: expected a finite scale > 0 (or 0: uncalibrated), got inf");
  c.vg = -INFINITY;
  EXPECT_ERROR(attend(), "v_global");
  c.vg = 0.f;
  EXPECT_TRUE(attend().ok()) << attend().message();
  PagedKvCache v = c.view();
  v.k_global = make_view(&c.kg, DType::kF64, {1});
  EXPECT_ERROR(attend(v, make_view(q.data(), DType::kF32, {4, 4, 64}),
                      make_view(o.data(), DType::kF32, {4, 4, 64}), TensorView{},
                      make_view(cu.data(), DType::kI32, {3})),
               "k_global: expected dtype");
}

TEST_F(ValidatePaged, CacheLayout) {
  PagedKvCache v = c.view();
  v.v_data = make_view(c.vd.data(), DType::kU8, {4, 16, 2, 16});
  EXPECT_ERROR(paged_kv_append(make_view(kv.data(), DType::kF32, {3, 2, 64}),
                               make_view(kv.data(), DType::kF32, {3, 2, 64}),
                               make_view(slots.data(), DType::kI32, {3}), v),
               "v_cache: expected shape (4, 16, 2, 32) like k_cache");
  v = c.view();
  v.k_scales = TensorView{};
  EXPECT_ERROR(attend(v, make_view(q.data(), DType::kF32, {4, 4, 64}),
                      make_view(o.data(), DType::kF32, {4, 4, 64}), TensorView{},
                      make_view(cu.data(), DType::kI32, {3})),
               "k_scales: expected rank 4");
  v = c.view();
  v.k_scales = make_view(c.ks.data(), DType::kU8, {4, 16, 2, 2});
  EXPECT_ERROR(attend(v, make_view(q.data(), DType::kF32, {4, 4, 64}),
                      make_view(o.data(), DType::kF32, {4, 4, 64}), TensorView{},
                      make_view(cu.data(), DType::kI32, {3})),
               "k_scales: expected shape (4, 16, 2, 4) for k_cache");
  v = c.view();
  v.k_data = make_view(c.kd.data(), DType::kU8, {4, 16, 2, 20});  // head_dim 40
  v.v_data = v.k_data;
  EXPECT_ERROR(attend(v, make_view(q.data(), DType::kF32, {4, 4, 64}),
                      make_view(o.data(), DType::kF32, {4, 4, 64}), TensorView{},
                      make_view(cu.data(), DType::kI32, {3})),
               "k_cache: head_dim 40 (2 * last dimension 20) is not a multiple of the NVFP4 block");
  PagedKvShape shape;
  EXPECT_ERROR(validate_paged_kv_cache(c.view(), {128}, false, &shape),
               "k_cache: head_dim 64 is not supported (supported: 128)");
  v = c.view();
  v.k_data.stride[1] = 0;  // two tokens of a page on the same bytes
  EXPECT_ERROR(validate_paged_kv_cache(v, {}, true, &shape), "k_cache: stride 0 in dimension 1");
  OwnedCache f8(KvCacheFormat::kFp8, 4, 16, 2, 64);
  v = f8.view();
  v.k_scales = c.view().k_scales;
  EXPECT_ERROR(validate_paged_kv_cache(v, {}, false, &shape), "k_scales/v_scales: the fp8 cache");
  v = c.view();
  v.k_data.shape[0] = v.v_data.shape[0] = v.k_scales.shape[0] = v.v_scales.shape[0] = 1 << 27;
  EXPECT_ERROR(validate_paged_kv_cache(v, {}, false, &shape), "do not fit the int32 slot mapping");
}

TEST_F(ValidatePaged, PageTablesAndLengths) {
  table[1] = 4;
  EXPECT_ERROR(attend(), "block_tables[0, 1]: page id 4 is out of range [0, 4)");
  table[1] = 1;
  table[3] = 7;  // past sequence 1's last page: never read
  EXPECT_TRUE(attend().ok());
  lens[1] = 33;
  EXPECT_ERROR(attend(), "seq_lens[1]: 33 is out of range [0, 32]");
  lens[1] = -1;
  EXPECT_ERROR(attend(), "seq_lens[1]: -1");
}

TEST_F(ValidatePaged, QueriesAndOutputs) {
  auto qv = make_view(q.data(), DType::kF32, {4, 4, 64});
  auto ov = make_view(o.data(), DType::kF32, {4, 4, 64});
  auto lv = make_view(lse.data(), DType::kF32, {4, 4});
  auto cuv = make_view(cu.data(), DType::kI32, {3});
  EXPECT_ERROR(attend(c.view(), make_view(q.data(), DType::kF32, {4, 3, 64}), ov, lv, cuv),
               "q/k_cache: number of heads 3 is not a multiple of kv heads 2");
  EXPECT_ERROR(attend(c.view(), make_view(q.data(), DType::kF32, {4, 2, 128}), ov, lv, cuv),
               "q: head_dim 128 differs from the cache's 64");
  EXPECT_ERROR(attend(c.view(), qv, ov, lv, TensorView{}), "cu_seqlens_q: required");
  EXPECT_ERROR(attend(c.view(), qv, make_view(o.data(), DType::kF32, {4, 4, 32}), lv, cuv),
               "o: expected shape (4, 4, 64) like q");
  EXPECT_ERROR(attend(c.view(), qv, ov, make_view(lse.data(), DType::kF32, {4, 3}), cuv),
               "lse: expected shape (4, 4)");
  cu = {1, 3, 4};
  EXPECT_ERROR(attend(c.view(), qv, ov, lv, cuv), "cu_seqlens_q[0]: expected 0, got 1");
  cu = {0, 3, 2};
  EXPECT_ERROR(attend(c.view(), qv, ov, lv, cuv), "cu_seqlens_q[2]: 2 is below");
  cu = {0, 3, 3};
  EXPECT_ERROR(attend(c.view(), qv, ov, lv, cuv), "cu_seqlens_q[2]: expected total_q = 4");
  // Rank-4 q: no cu_seqlens_q, batch from block_tables.
  EXPECT_ERROR(attend(c.view(), make_view(q.data(), DType::kF32, {2, 2, 4, 64}),
                      make_view(o.data(), DType::kF32, {2, 2, 4, 64}), TensorView{}, cuv),
               "cu_seqlens_q: only for a rank-3");
  EXPECT_ERROR(attend(c.view(), make_view(q.data(), DType::kF32, {3, 1, 4, 64}),
                      make_view(o.data(), DType::kF32, {3, 1, 4, 64}), TensorView{}, TensorView{}),
               "q: expected shape (2, 1, 4, 64) (batch of block_tables)");
  EXPECT_ERROR(attend(c.view(), make_view(q.data(), DType::kF32, {2, 1, 4, 64}),
                      make_view(o.data(), DType::kF32, {2, 1, 4, 64}),
                      make_view(lse.data(), DType::kF32, {2, 1, 4}), TensorView{}),
               "lse: expected shape (2, 4, 1)");
}

TEST_F(ValidatePaged, PartialsAndCombine) {
  std::vector<float> op(3 * 4 * 4 * 64), lp(3 * 4 * 4);
  auto run = [&](int64_t splits, int64_t split_size) {
    return golden_paged_attention_partials(make_view(q.data(), DType::kF32, {4, 4, 64}),
                                           make_view(cu.data(), DType::kI32, {3}), c.view(),
                                           make_view(table.data(), DType::kI32, {2, 2}),
                                           make_view(lens.data(), DType::kI32, {2}), {}, split_size,
                                           make_view(op.data(), DType::kF32, {splits, 4, 4, 64}),
                                           make_view(lp.data(), DType::kF32, {splits, 4, 4}));
  };
  EXPECT_TRUE(run(3, 8).ok()) << run(3, 8).message();
  EXPECT_ERROR(run(2, 8), "o_partial: 2 splits of 8 keys do not cover seq_lens[0] = 20");
  EXPECT_ERROR(run(3, 0), "split_size: expected >= 1, got 0");
  EXPECT_ERROR(
      combine_attention_partials(make_view(op.data(), DType::kF32, {3, 4, 4, 64}),
                                 make_view(lp.data(), DType::kF32, {3, 4, 2}),
                                 make_view(o.data(), DType::kF32, {4, 4, 64}), TensorView{}),
      "lse_partial: expected shape (3, 4, 4) for o_partial");
  EXPECT_ERROR(
      combine_attention_partials(make_view(op.data(), DType::kF32, {3, 4, 4, 64}),
                                 make_view(lp.data(), DType::kF32, {3, 4, 4}),
                                 make_view(o.data(), DType::kF32, {4, 2, 64}), TensorView{}),
      "o: expected shape (4, 4, 64) like o_partial");
  EXPECT_ERROR(combine_attention_partials(make_view(op.data(), DType::kF32, {3, 4, 4, 64}),
                                          make_view(lp.data(), DType::kF32, {3, 4, 4}),
                                          make_view(o.data(), DType::kF32, {4, 4, 64}),
                                          make_view(lse.data(), DType::kF32, {4, 3})),
               "lse: expected shape (4, 4) (heads, total_q)");
}

}  // namespace
}  // namespace fp4attn
