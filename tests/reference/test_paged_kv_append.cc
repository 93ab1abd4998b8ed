// paged_kv_append: the bytes in each slot equal the block codecs of quantize.h on the same token
// (NVFP4: nvfp4_quantize_rows + pack_e2m1_rows; FP8: E4M3_RNE(x * (1 / scale))), for random and
// adversarial tokens (NaN, Inf, zero and tiny blocks, values above the calibrated range), every
// NVFP4 rule, supplied and calibrated global scales; slots not written keep their bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "core/half.h"
#include "fp4attn/golden/paged_kv.h"
#include "fp4attn/numerics/quantize.h"
#include "support/paged_kv_util.h"

namespace fp4attn {
namespace {

using paged_test::OwnedCache;

constexpr int64_t kPages = 6, kPageSize = 16, kHeads = 2;

// Tokens [n, kHeads, d] with adversarial blocks in the first few tokens.
std::vector<float> adversarial_tokens(int64_t n, int64_t d, uint32_t seed) {
  std::vector<float> x = paged_test::normal(n * kHeads * d, seed);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  x[3] = nan;                                           // token 0 head 0, block 0: NaN scale
  x[d + 17] = -inf;                                     // token 0 head 1, block 1: NaN scale
  for (int c = 0; c < 16; ++c) x[2 * d + c] = 0.f;      // token 1 head 0, block 0: zero
  for (int c = 16; c < 32; ++c) x[2 * d + c] = 1e-30f;  // tiny block: scale 0 (documented)
  x[4 * d + 5] = 40.f;                                  // token 2: well above the other tokens
  return x;
}

// The slots of n tokens: a permutation of the cache's slots, every 5th token skipped (-1).
std::vector<int32_t> scattered_slots(int64_t n) {
  std::vector<int32_t> slots(n);
  for (int64_t i = 0; i < n; ++i)
    slots[i] = i % 5 == 4 ? -1 : static_cast<int32_t>((i * 37) % (kPages * kPageSize));
  return slots;
}

float written_amax(const std::vector<float>& x, const std::vector<int32_t>& slots, int64_t d) {
  float amax = 0;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i] < 0) continue;
    amax = std::max(amax, finite_amax(&x[i * kHeads * d], kHeads * d));
  }
  return amax;
}

// The expected bytes of a written NVFP4 slot: the row codec of quantize.h.
void expect_nvfp4_slot(const OwnedCache& c, const std::vector<uint8_t>& data,
                       const std::vector<uint8_t>& scales, const float* x, int32_t slot,
                       float s_enc, Nvfp4ScaleRule rule) {
  const int64_t d = c.d;
  std::vector<uint8_t> codes(kHeads * d), packed(kHeads * d / 2), sc(kHeads * d / 16);
  nvfp4_quantize_rows(x, kHeads, d, d, s_enc, rule, codes.data(), sc.data());
  pack_e2m1_rows(codes.data(), kHeads, d, packed.data());
  EXPECT_EQ(0, std::memcmp(&data[slot * kHeads * d / 2], packed.data(), packed.size()))
      << "slot " << slot;
  EXPECT_EQ(0, std::memcmp(&scales[slot * kHeads * d / 16], sc.data(), sc.size()))
      << "slot " << slot;
}

class PagedAppendNvfp4 : public ::testing::TestWithParam<Nvfp4ScaleRule> {};

TEST_P(PagedAppendNvfp4, CalibratedMatchesCodecByteForByte) {
  const Nvfp4ScaleRule rule = GetParam();
  for (int64_t d : {64, 128}) {
    OwnedCache c(KvCacheFormat::kNvfp4, kPages, kPageSize, kHeads, d);
    const int64_t n = 50;
    const std::vector<float> k = adversarial_tokens(n, d, 1), v = adversarial_tokens(n, d, 2);
    const std::vector<int32_t> slots = scattered_slots(n);
    ASSERT_TRUE(paged_kv_append(
                    make_view(const_cast<float*>(k.data()), DType::kF32, {n, kHeads, d}),
                    make_view(const_cast<float*>(v.data()), DType::kF32, {n, kHeads, d}),
                    make_view(const_cast<int32_t*>(slots.data()), DType::kI32, {n}), c.view(rule))
                    .ok());
    EXPECT_EQ(c.kg, nvfp4_tensor_scale(written_amax(k, slots, d), rule));
    EXPECT_EQ(c.vg, nvfp4_tensor_scale(written_amax(v, slots, d), rule));
    std::vector<bool> written(kPages * kPageSize, false);
    for (int64_t i = 0; i < n; ++i) {
      if (slots[i] < 0) continue;
      written[slots[i]] = true;
      expect_nvfp4_slot(c, c.kd, c.ks, &k[i * kHeads * d], slots[i], c.kg, rule);
      expect_nvfp4_slot(c, c.vd, c.vs, &v[i * kHeads * d], slots[i], c.vg, rule);
    }
    EXPECT_EQ(c.ks[0], 0x7F);  // the NaN block of token 0 (slot 0)
    for (int64_t s = 0; s < kPages * kPageSize; ++s) {
      if (written[s]) continue;
      for (int64_t e = 0; e < kHeads * d / 2; ++e) {
        ASSERT_EQ(c.kd[s * kHeads * d / 2 + e], OwnedCache::kSentinel) << "slot " << s;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rules, PagedAppendNvfp4,
                         ::testing::Values(Nvfp4ScaleRule::kNearest, Nvfp4ScaleRule::kFourOverSix,
                                           Nvfp4ScaleRule::kRoundUp, Nvfp4ScaleRule::kRestricted));

TEST(PagedAppend, SuppliedScaleIsKeptAndSecondAppendDoesNotRecalibrate) {
  const int64_t d = 64, n = 8;
  OwnedCache c(KvCacheFormat::kNvfp4, kPages, kPageSize, kHeads, d);
  c.kg = 100.f;  // supplied K scale; V calibrates
  const std::vector<float> k = paged_test::normal(n * kHeads * d, 3);
  const std::vector<float> v = paged_test::normal(n * kHeads * d, 4);
  std::vector<int32_t> slots = {0, 1, 2, 3, 4, 5, 6, 7};
  auto append = [&](const std::vector<float>& kk, const std::vector<float>& vv) {
    return paged_kv_append(make_view(const_cast<float*>(kk.data()), DType::kF32, {n, kHeads, d}),
                           make_view(const_cast<float*>(vv.data()), DType::kF32, {n, kHeads, d}),
                           make_view(slots.data(), DType::kI32, {n}), c.view());
  };
  ASSERT_TRUE(append(k, v).ok());
  EXPECT_EQ(c.kg, 100.f);
  const float vg = c.vg;
  EXPECT_EQ(vg,
            nvfp4_tensor_scale(finite_amax(v.data(), n * kHeads * d), Nvfp4ScaleRule::kNearest));
  // Larger tokens later: same global, their blocks saturate at the calibrated range.
  std::vector<float> big = v;
  for (float& x : big) x *= 10.f;
  slots = {8, 9, 10, 11, 12, 13, 14, 15};
  ASSERT_TRUE(append(k, big).ok());
  EXPECT_EQ(c.vg, vg);
  for (int64_t i = 0; i < n; ++i) {
    expect_nvfp4_slot(c, c.kd, c.ks, &k[i * kHeads * d], slots[i], 100.f, Nvfp4ScaleRule::kNearest);
    expect_nvfp4_slot(c, c.vd, c.vs, &big[i * kHeads * d], slots[i], vg, Nvfp4ScaleRule::kNearest);
  }
}

TEST(PagedAppend, NothingWrittenLeavesScalesUncalibrated) {
  const int64_t d = 64, n = 2;
  OwnedCache c(KvCacheFormat::kNvfp4, kPages, kPageSize, kHeads, d);
  const std::vector<float> k(n * kHeads * d, 1.f);
  std::vector<int32_t> slots = {-1, -1};
  ASSERT_TRUE(paged_kv_append(make_view(const_cast<float*>(k.data()), DType::kF32, {n, kHeads, d}),
                              make_view(const_cast<float*>(k.data()), DType::kF32, {n, kHeads, d}),
                              make_view(slots.data(), DType::kI32, {n}), c.view())
                  .ok());
  EXPECT_EQ(c.kg, 0.f);
  EXPECT_EQ(c.vg, 0.f);
}

// Appends into one cache: k and v [n, kHeads, d] F32 (v = k), slots as given.
Status append_to(OwnedCache& c, const std::vector<float>& k, const std::vector<int32_t>& slots,
                 Nvfp4ScaleRule rule = Nvfp4ScaleRule::kNearest) {
  const int64_t n = static_cast<int64_t>(slots.size()), d = c.d;
  TensorView kv = make_view(const_cast<float*>(k.data()), DType::kF32, {n, kHeads, d});
  return paged_kv_append(kv, kv, make_view(const_cast<int32_t*>(slots.data()), DType::kI32, {n}),
                         c.view(rule));
}

// Both caches decode to the same values (NaN where NaN), through the decoded view and the golden
// paged attention: one sequence of `len` tokens over pages 0, 1, ...
void expect_same_decode(OwnedCache& a, OwnedCache& b, int64_t len, Nvfp4ScaleRule rule) {
  const int64_t d = a.d, pages = (len + kPageSize - 1) / kPageSize;
  std::vector<int32_t> table(pages), lens = {static_cast<int32_t>(len)};
  std::iota(table.begin(), table.end(), 0);
  const TensorView bt = make_view(table.data(), DType::kI32, {1, pages});
  const TensorView sl = make_view(lens.data(), DType::kI32, {1});
  std::vector<float> q = paged_test::normal(4 * kHeads * d, 9);
  std::vector<std::vector<float>> decoded, o;
  for (OwnedCache* c : {&a, &b}) {
    std::vector<float> ko(len * kHeads * d), vo(ko.size()), out(4 * kHeads * d);
    Status st = paged_kv_dequantize(c->view(rule), bt, sl,
                                    make_view(ko.data(), DType::kF32, {1, len, kHeads, d}),
                                    make_view(vo.data(), DType::kF32, {1, len, kHeads, d}));
    ASSERT_TRUE(st.ok()) << st.message();
    st = golden_paged_attention(make_view(q.data(), DType::kF32, {1, 2, 2 * kHeads, d}),
                                TensorView{}, c->view(rule), bt, sl, PagedAttentionOptions{},
                                make_view(out.data(), DType::kF32, {1, 2, 2 * kHeads, d}),
                                TensorView{});
    ASSERT_TRUE(st.ok()) << st.message();
    ko.insert(ko.end(), vo.begin(), vo.end());
    decoded.push_back(ko);
    o.push_back(out);
  }
  for (size_t i = 0; i < decoded[0].size(); ++i) {
    const float x = decoded[0][i], y = decoded[1][i];
    ASSERT_TRUE(x == y || (std::isnan(x) && std::isnan(y)))
        << "decoded " << i << ": " << x << " vs " << y;
  }
  for (size_t i = 0; i < o[0].size(); ++i) {
    const float x = o[0][i], y = o[1][i];
    ASSERT_TRUE(x == y || (std::isnan(x) && std::isnan(y)))
        << "o " << i << ": " << x << " vs " << y;
  }
}

// An append whose written tokens have finite amax 0 (zeros, -0, a skipped token of data) leaves
// both globals 0; the next append with data calibrates them as a single append of that data
// would, and the cache equals, byte for byte and decoded, one built with those globals supplied.
TEST(PagedAppend, ZeroFirstAppendLeavesGlobalsUncalibrated) {
  const int64_t d = 64, row = kHeads * d;
  std::vector<float> zeros(4 * row, 0.f);
  for (int64_t i = 1; i < 3 * row; i += 3) zeros[i] = -0.f;
  for (int64_t i = 3 * row; i < 4 * row; ++i) zeros[i] = 1e4f;  // token 3: skipped
  const std::vector<int32_t> zero_slots = {0, 1, 2, -1};
  const std::vector<float> data = adversarial_tokens(20, d, 10);
  std::vector<int32_t> data_slots(20);
  std::iota(data_slots.begin(), data_slots.end(), 3);
  std::vector<std::pair<KvCacheFormat, Nvfp4ScaleRule>> formats = {
      {KvCacheFormat::kFp8, Nvfp4ScaleRule::kNearest}};
  for (Nvfp4ScaleRule r : {Nvfp4ScaleRule::kNearest, Nvfp4ScaleRule::kRoundUp,
                           Nvfp4ScaleRule::kFourOverSix, Nvfp4ScaleRule::kRestricted}) {
    formats.push_back({KvCacheFormat::kNvfp4, r});
  }
  for (const auto& [format, rule] : formats) {
    SCOPED_TRACE(std::string(kv_cache_format_name(format)) + " " + scale_rule_name(rule));
    OwnedCache c(format, kPages, kPageSize, kHeads, d);
    ASSERT_TRUE(append_to(c, zeros, zero_slots, rule).ok());
    EXPECT_EQ(c.kg, 0.f);
    EXPECT_EQ(c.vg, 0.f);
    ASSERT_TRUE(append_to(c, data, data_slots, rule).ok());
    OwnedCache once(format, kPages, kPageSize, kHeads, d);
    ASSERT_TRUE(append_to(once, data, data_slots, rule).ok());
    EXPECT_NE(c.kg, 0.f);
    EXPECT_EQ(c.kg, once.kg);
    EXPECT_EQ(c.vg, once.vg);
    // The same tokens appended with the final globals supplied.
    OwnedCache ref(format, kPages, kPageSize, kHeads, d);
    ref.kg = c.kg;
    ref.vg = c.vg;
    ASSERT_TRUE(append_to(ref, zeros, zero_slots, rule).ok());
    ASSERT_TRUE(append_to(ref, data, data_slots, rule).ok());
    EXPECT_EQ(c.kd, ref.kd);
    EXPECT_EQ(c.vd, ref.vd);
    EXPECT_EQ(c.ks, ref.ks);
    EXPECT_EQ(c.vs, ref.vs);
    // The zero tokens are zero codes (FP8: +-0) and zero scales.
    const bool fp4 = format == KvCacheFormat::kNvfp4;
    for (int64_t e = 0; e < 3 * row / (fp4 ? 2 : 1); ++e) {
      ASSERT_EQ(c.kd[e] & (fp4 ? 0xFF : 0x7F), 0) << e;
    }
    for (int64_t e = 0; fp4 && e < 3 * row / 16; ++e) ASSERT_EQ(c.ks[e], 0) << e;
    expect_same_decode(c, ref, 23, rule);
  }
}

// Only NaN, +-Inf and zeros: the finite amax is 0, so the globals stay 0; the blocks carry NaN
// (NVFP4 scale 0x7F, FP8 NaN codes) exactly as under any supplied global.
TEST(PagedAppend, NonFiniteOnlyFirstAppendLeavesGlobalsUncalibrated) {
  const int64_t d = 64, row = kHeads * d;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(3 * row, 0.f);
  for (int64_t i = 0; i < 3 * row; i += 5) x[i] = i % 3 == 0 ? nan : i % 3 == 1 ? inf : -inf;
  const std::vector<int32_t> slots = {0, 1, 2};
  for (KvCacheFormat format : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    SCOPED_TRACE(kv_cache_format_name(format));
    OwnedCache c(format, kPages, kPageSize, kHeads, d), ref = c;
    ASSERT_TRUE(append_to(c, x, slots).ok());
    EXPECT_EQ(c.kg, 0.f);
    EXPECT_EQ(c.vg, 0.f);
    ref.kg = ref.vg = 3.f;
    ASSERT_TRUE(append_to(ref, x, slots).ok());
    EXPECT_EQ(c.kd, ref.kd);
    EXPECT_EQ(c.ks, ref.ks);
    if (format == KvCacheFormat::kNvfp4) {
      EXPECT_EQ(c.ks[0], 0x7F);
    } else {
      EXPECT_EQ(c.kd[0] & 0x7F, 0x7F);
    }
    // A later append with data calibrates; the first tokens still decode to NaN and 0 only.
    ASSERT_TRUE(append_to(c, paged_test::normal(2 * row, 11), {3, 4}).ok());
    EXPECT_GT(c.kg, 0.f);
    std::vector<int32_t> table = {0}, len = {3};
    std::vector<float> ko(3 * row), vo(ko.size());
    ASSERT_TRUE(paged_kv_dequantize(c.view(), make_view(table.data(), DType::kI32, {1, 1}),
                                    make_view(len.data(), DType::kI32, {1}),
                                    make_view(ko.data(), DType::kF32, {1, 3, kHeads, d}),
                                    make_view(vo.data(), DType::kF32, {1, 3, kHeads, d}))
                    .ok());
    EXPECT_TRUE(std::isnan(ko[0]));
    for (float v : ko) ASSERT_TRUE(std::isnan(v) || v == 0.f) << v;
  }
}

TEST(PagedAppend, Bf16InputEqualsItsFloatValues) {
  const int64_t d = 128, n = 5;
  std::vector<float> x = paged_test::normal(n * kHeads * d, 5, 3.f);
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    bits[i] = float_to_bf16_bits(x[i]);
    x[i] = bf16_bits_to_float(bits[i]);
  }
  std::vector<int32_t> slots = {40, 3, 77, 12, 95};
  OwnedCache a(KvCacheFormat::kNvfp4, kPages, kPageSize, kHeads, d), b = a;
  ASSERT_TRUE(paged_kv_append(make_view(bits.data(), DType::kBF16, {n, kHeads, d}),
                              make_view(bits.data(), DType::kBF16, {n, kHeads, d}),
                              make_view(slots.data(), DType::kI32, {n}), a.view())
                  .ok());
  ASSERT_TRUE(paged_kv_append(make_view(x.data(), DType::kF32, {n, kHeads, d}),
                              make_view(x.data(), DType::kF32, {n, kHeads, d}),
                              make_view(slots.data(), DType::kI32, {n}), b.view())
                  .ok());
  EXPECT_EQ(a.kd, b.kd);
  EXPECT_EQ(a.ks, b.ks);
  EXPECT_EQ(a.kg, b.kg);
}

TEST(PagedAppend, Fp8PerTensorScale) {
  const int64_t d = 64, n = 20;
  for (float supplied : {0.f, 0.02f}) {
    OwnedCache c(KvCacheFormat::kFp8, kPages, kPageSize, kHeads, d);
    c.kg = c.vg = supplied;
    const std::vector<float> k = adversarial_tokens(n, d, 6), v = adversarial_tokens(n, d, 7);
    const std::vector<int32_t> slots = scattered_slots(n);
    ASSERT_TRUE(
        paged_kv_append(make_view(const_cast<float*>(k.data()), DType::kF32, {n, kHeads, d}),
                        make_view(const_cast<float*>(v.data()), DType::kF32, {n, kHeads, d}),
                        make_view(const_cast<int32_t*>(slots.data()), DType::kI32, {n}), c.view())
            .ok());
    const float kg = supplied != 0 ? supplied : written_amax(k, slots, d) / 448.f;
    EXPECT_EQ(c.kg, kg);
    const float inv = 1.f / kg;
    for (int64_t i = 0; i < n; ++i) {
      if (slots[i] < 0) continue;
      for (int64_t e = 0; e < kHeads * d; ++e) {
        ASSERT_EQ(c.kd[slots[i] * kHeads * d + e], float_to_e4m3(k[i * kHeads * d + e] * inv))
            << "token " << i << " element " << e;
      }
    }
    EXPECT_EQ(c.kd[3], 0x7F);  // NaN stays local to its element (slot 0 = token 0)
  }
}

TEST(PagedAppend, DequantizeIsTheCodecsValue) {
  const int64_t d = 64, n = 30;
  OwnedCache c(KvCacheFormat::kNvfp4, kPages, kPageSize, kHeads, d);
  const std::vector<float> k = adversarial_tokens(n, d, 8);
  std::vector<int32_t> slots(n);
  // One sequence over pages 5, 2 (table order), tokens 0..29.
  const std::vector<int32_t> table = {5, 2};
  for (int64_t j = 0; j < n; ++j) slots[j] = table[j / kPageSize] * kPageSize + j % kPageSize;
  ASSERT_TRUE(paged_kv_append(make_view(const_cast<float*>(k.data()), DType::kF32, {n, kHeads, d}),
                              make_view(const_cast<float*>(k.data()), DType::kF32, {n, kHeads, d}),
                              make_view(slots.data(), DType::kI32, {n}), c.view())
                  .ok());
  int32_t len = n;
  std::vector<float> ko(1 * (n + 3) * kHeads * d, -1.f), vo(ko.size());
  ASSERT_TRUE(paged_kv_dequantize(
                  c.view(), make_view(const_cast<int32_t*>(table.data()), DType::kI32, {1, 2}),
                  make_view(&len, DType::kI32, {1}),
                  make_view(ko.data(), DType::kF32, {1, n + 3, kHeads, d}),
                  make_view(vo.data(), DType::kF32, {1, n + 3, kHeads, d}))
                  .ok());
  std::vector<uint8_t> codes(kHeads * d), sc(kHeads * d / 16);
  for (int64_t j = 0; j < n + 3; ++j) {
    if (j < n)
      nvfp4_quantize_rows(&k[j * kHeads * d], kHeads, d, d, c.kg, Nvfp4ScaleRule::kNearest,
                          codes.data(), sc.data());
    for (int64_t e = 0; e < kHeads * d; ++e) {
      const float want = j < n ? nvfp4_dequantize(codes[e], sc[e / 16], c.kg) : 0.f;
      const float got = ko[j * kHeads * d + e];
      ASSERT_TRUE(got == want || (std::isnan(got) && std::isnan(want)))
          << "token " << j << " element " << e << ": " << got << " vs " << want;
    }
  }
}

}  // namespace
}  // namespace fp4attn
