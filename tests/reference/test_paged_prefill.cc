// Paged prefill on the host (paged_prefill.h): the operand layout; the host repack against the
// golden decode of the cache (paged_kv_dequantize): same tokens in the same places through
// shuffled and shared page tables, V keys permuted, padding zero, values equal (FP8) or one E4M3
// rounding apart (NVFP4 fold), NaN blocks kept; the golden paged prefill against float64 paged
// attention on the decoded cache (golden_paged_attention): the accuracy bounds the GPU tests use.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/half.h"
#include "fp4attn/golden/paged_kv.h"
#include "fp4attn/golden/paged_prefill.h"
#include "fp4attn/operands.h"
#include "harness/metrics.h"
#include "support/paged_kv_util.h"

namespace fp4attn {
namespace {

using paged_test::OwnedCache;

struct PrefillCase {
  KvCacheFormat format = KvCacheFormat::kNvfp4;
  int64_t page_size = 16, d = 128, h = 8, h_kv = 2;
  std::vector<int32_t> lens = {1, 17, 0, 130, 300};
  std::vector<int32_t> n_q = {1, 17, 0, 5, 300};
  bool share_prefix = true;  // sequence 4 reuses the pages of sequence 3's full pages
  bool zeros = false;        // cached tokens all zero: the globals stay uncalibrated (0)
  uint32_t seed = 1;
};

struct Built {
  PrefillCase s;
  OwnedCache cache;
  std::vector<int32_t> table, cu_q;
  int64_t max_pages = 0;
  std::vector<uint16_t> q;  // BF16 [total_q, h, d]
  explicit Built(const PrefillCase& st) : s(st), cache(st.format, 1, st.page_size, st.h_kv, st.d) {}
};

Built build(const PrefillCase& s) {
  Built x(s);
  const int64_t b = static_cast<int64_t>(s.lens.size()), ps = s.page_size;
  int64_t need = 0;
  for (int32_t l : s.lens) {
    need += (l + ps - 1) / ps;
    x.max_pages = std::max<int64_t>(x.max_pages, (l + ps - 1) / ps);
  }
  x.max_pages += 1;
  x.cache = OwnedCache(s.format, need + 2, ps, s.h_kv, s.d);
  std::vector<int32_t> perm(need + 2);
  std::iota(perm.begin(), perm.end(), 0);
  std::mt19937 rng(s.seed);
  std::shuffle(perm.begin(), perm.end(), rng);
  x.table.assign(b * x.max_pages, -1);
  size_t next = 0;
  std::vector<int32_t> slots;
  std::vector<float> k, v;
  std::normal_distribution<float> normal(0.f, 1.f);
  for (int64_t bi = 0; bi < b; ++bi) {
    const int64_t pages = (s.lens[bi] + ps - 1) / ps;
    int64_t shared = 0;
    if (s.share_prefix && bi == 4 && b > 4) {
      shared = std::min<int64_t>(s.lens[3] / ps, pages - 1);
      for (int64_t p = 0; p < shared; ++p)
        x.table[bi * x.max_pages + p] = x.table[3 * x.max_pages + p];
    }
    for (int64_t p = shared; p < pages; ++p) x.table[bi * x.max_pages + p] = perm.at(next++);
    for (int64_t j = shared * ps; j < s.lens[bi]; ++j) {
      slots.push_back(
          static_cast<int32_t>(paged_kv_slot(x.table[bi * x.max_pages + j / ps], ps, j % ps)));
      for (int64_t e = 0; e < s.h_kv * s.d; ++e) {
        k.push_back(s.zeros ? 0.f : normal(rng) + 0.5f * std::sin(0.37f * float(e % s.d)));
        v.push_back(s.zeros ? 0.f : normal(rng));
      }
    }
  }
  const int64_t n = static_cast<int64_t>(slots.size());
  const Status st = paged_kv_append(make_view(k.data(), DType::kF32, {n, s.h_kv, s.d}),
                                    make_view(v.data(), DType::kF32, {n, s.h_kv, s.d}),
                                    make_view(slots.data(), DType::kI32, {n}), x.cache.view());
  EXPECT_TRUE(st.ok()) << st.message();
  x.cu_q.assign(1, 0);
  for (int32_t nq : s.n_q) x.cu_q.push_back(x.cu_q.back() + nq);
  x.q.resize(x.cu_q.back() * s.h * s.d);
  for (auto& e : x.q) e = float_to_bf16_bits(normal(rng));
  return x;
}

TensorView i32(std::vector<int32_t>& v, std::initializer_list<int64_t> shape) {
  return make_view(v.data(), DType::kI32, shape);
}

TEST(PagedPrefillHost, LayoutOffsets) {
  std::vector<int32_t> cu = {0, 3, 3, 200}, lens = {5, 0, 300};
  PagedPrefillLayout x;
  ASSERT_TRUE(paged_prefill_layout(i32(cu, {4}), i32(lens, {3}), 4, 2, 64, &x).ok());
  EXPECT_EQ(x.cu_k, (std::vector<int64_t>{0, 5, 5, 305}));
  EXPECT_EQ(x.cu_v, (std::vector<int64_t>{0, 16, 16, 320}));
  EXPECT_EQ(x.cu_k_tiles, (std::vector<int64_t>{0, 1, 1, 4}));
  EXPECT_EQ(x.cu_q_tiles, (std::vector<int64_t>{0, 1, 1, 3}));
  EXPECT_EQ(x.q_data, 0);
  EXPECT_EQ(x.q_scale, 200 * 4 * 64 / 256 * 256);
  for (int64_t off : {x.q_scale, x.k_data, x.k_scale, x.v_data, x.v_scale, x.bytes}) {
    EXPECT_EQ(off % 256, 0);
  }
  std::vector<int32_t> bad = {0, 3, 2, 200};
  const Status st = paged_prefill_layout(i32(bad, {4}), i32(lens, {3}), 4, 2, 64, &x);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("cu_seqlens_q[2]"), std::string::npos) << st.message();
  std::vector<int32_t> neg = {5, -1, 300};
  EXPECT_FALSE(paged_prefill_layout(i32(cu, {4}), i32(neg, {3}), 4, 2, 64, &x).ok());
}

// Every operand element of the host repack against the decoded cache.
void check_repack(PrefillCase s) {
  SCOPED_TRACE(std::string(kv_cache_format_name(s.format)) + " ps " + std::to_string(s.page_size) +
               " d " + std::to_string(s.d));
  Built x = build(s);
  const int64_t b = static_cast<int64_t>(s.lens.size()), d = s.d, hk = s.h_kv;
  const bool fp4 = s.format == KvCacheFormat::kNvfp4;
  if (fp4) {  // a NaN block: scale 0x7F in the first token of sequence 3 (kv head 1, block 2)
    const int64_t page = x.table[3 * x.max_pages];
    x.cache.vs[((page * s.page_size) * hk + 1) * (d / 16) + 2] = 0x7F;
  }
  PagedPrefillLayout lay;
  ASSERT_TRUE(
      paged_prefill_layout(i32(x.cu_q, {b + 1}), i32(x.s.lens, {b}), s.h, hk, d, &lay).ok());
  std::vector<uint8_t> ws(lay.bytes, 0xCD);
  const PagedKvCache view = x.cache.view();
  ASSERT_TRUE(paged_prefill_repack_host(view, i32(x.table, {b, x.max_pages}), lay, ws.data()).ok());
  int64_t max_len = 1;
  for (int32_t l : s.lens) max_len = std::max<int64_t>(max_len, l);
  std::vector<float> kd(b * max_len * hk * d), vd(kd.size());
  ASSERT_TRUE(paged_kv_dequantize(view, i32(x.table, {b, x.max_pages}), i32(x.s.lens, {b}),
                                  make_view(kd.data(), DType::kF32, {b, max_len, hk, d}),
                                  make_view(vd.data(), DType::kF32, {b, max_len, hk, d}))
                  .ok());
  int64_t nan_seen = 0, checked = 0;
  for (int64_t i = 0; i < b; ++i) {
    if (s.lens[i] == 0) continue;
    const ForwardOperands in = paged_prefill_operands(lay, ws.data(), i, 1);
    const int64_t len = s.lens[i], pitch = operand_v_pitch(len), tiles = operand_scale_tiles(len);
    const uint8_t* ko = in.k_data.as<const uint8_t>();
    const uint8_t* vo = in.v_data.as<const uint8_t>();
    const float* kf = in.k_scale.as<const float>();
    const float* vf = in.v_scale.as<const float>();
    const float gk = fp4 ? 8.f / x.cache.kg : x.cache.kg, gv = fp4 ? 8.f / x.cache.vg : x.cache.vg;
    for (int64_t hh = 0; hh < hk; ++hh) {
      for (int64_t t = 0; t < tiles; ++t) ASSERT_EQ(kf[hh * tiles + t], gk);
      for (int64_t c = 0; c < d; ++c) {
        ASSERT_EQ(vf[hh * d + c], gv);
        for (int64_t p = len; p < pitch; ++p) {  // padding keys: zero wherever they land
          ASSERT_EQ(vo[(hh * d + c) * pitch + operand_v_position_of(p)], 0);
        }
      }
      for (int64_t j = 0; j < len; ++j) {
        for (int64_t c = 0; c < d; ++c) {
          const double kw = kd[((i * max_len + j) * hk + hh) * d + c];
          const double vw = vd[((i * max_len + j) * hk + hh) * d + c];
          const double kg = e4m3_to_float(ko[(hh * len + j) * d + c]) * double(gk);
          const double vg =
              e4m3_to_float(vo[(hh * d + c) * pitch + operand_v_position_of(j)]) * double(gv);
          for (auto [got, want] : {std::pair{kg, kw}, std::pair{vg, vw}}) {
            ++checked;
            if (std::isnan(want)) {
              ++nan_seen;
              ASSERT_TRUE(std::isnan(got)) << "seq " << i << " token " << j << " ch " << c;
              continue;
            }
            // FP8: the cached byte itself (one FP32 product apart); NVFP4: one E4M3 rounding of
            // e2m1 * scale / 8 (relative 2^-4, or 2^-10 absolute in E4M3's subnormals).
            const double tol = fp4 ? std::ldexp(std::fabs(want), -4) +
                                         std::ldexp(double(fp4 ? gk : 0.f), -10) * 1.0001
                                   : std::ldexp(std::fabs(want), -23);
            ASSERT_LE(std::fabs(got - want), tol)
                << "seq " << i << " token " << j << " head " << hh << " ch " << c;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 0);
  if (fp4) {
    EXPECT_GT(nan_seen, 0);
  }
}

TEST(PagedPrefillHost, RepackEqualsTheDecodedCache) {
  for (KvCacheFormat f : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    for (int64_t ps : {16, 64}) {
      for (int64_t d : {64, 128}) {
        PrefillCase s;
        s.format = f;
        s.page_size = ps;
        s.d = d;
        check_repack(s);
      }
    }
  }
  PrefillCase odd;
  odd.page_size = 24;  // not a multiple of the tile
  odd.lens = {1, 17, 0, 130, 300, 129};
  odd.n_q = {1, 1, 0, 2, 3, 129};
  check_repack(odd);
}

TEST(PagedPrefillHost, RepackRejectsBadPageIds) {
  PrefillCase s;
  Built x = build(s);
  const int64_t b = static_cast<int64_t>(s.lens.size());
  PagedPrefillLayout lay;
  ASSERT_TRUE(
      paged_prefill_layout(i32(x.cu_q, {b + 1}), i32(x.s.lens, {b}), s.h, s.h_kv, s.d, &lay).ok());
  std::vector<uint8_t> ws(lay.bytes);
  x.table[3 * x.max_pages + 1] = 1000;
  const Status st =
      paged_prefill_repack_host(x.cache.view(), i32(x.table, {b, x.max_pages}), lay, ws.data());
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("block_tables[3, 1]"), std::string::npos) << st.message();
}

// The golden prefill (the GPU path's numerics) against float64 attention on the decoded cache.
ErrorStats prefill_vs_f64(const PrefillCase& s, Recipe q_recipe, bool causal, double lse_tol) {
  Built x = build(s);
  const int64_t b = static_cast<int64_t>(s.lens.size()), tq = x.cu_q.back();
  PagedAttentionOptions opt;
  opt.causal = causal;
  std::vector<double> o(tq * s.h * s.d), o64(o.size()), lse(s.h * tq), lse64(lse.size());
  const TensorView qv = make_view(x.q.data(), DType::kBF16, {tq, s.h, s.d});
  Status st = golden_paged_prefill(qv, i32(x.cu_q, {b + 1}), x.cache.view(),
                                   i32(x.table, {b, x.max_pages}), i32(x.s.lens, {b}), opt,
                                   q_recipe, make_view(o.data(), DType::kF64, {tq, s.h, s.d}),
                                   make_view(lse.data(), DType::kF64, {s.h, tq}));
  EXPECT_TRUE(st.ok()) << st.message();
  st = golden_paged_attention(qv, i32(x.cu_q, {b + 1}), x.cache.view(),
                              i32(x.table, {b, x.max_pages}), i32(x.s.lens, {b}), opt,
                              make_view(o64.data(), DType::kF64, {tq, s.h, s.d}),
                              make_view(lse64.data(), DType::kF64, {s.h, tq}));
  EXPECT_TRUE(st.ok()) << st.message();
  double lse_err = 0;
  for (size_t i = 0; i < lse.size(); ++i) {
    if (std::isinf(lse64[i])) {
      EXPECT_TRUE(std::isinf(lse[i]) && lse[i] > 0) << i;
    } else {
      lse_err = std::max(lse_err, std::fabs(lse[i] - lse64[i]));
    }
  }
  std::printf("[paged prefill golden] lse max abs %.4f\n", lse_err);
  EXPECT_LE(lse_err, lse_tol);
  return compare(o.data(), o64.data(), static_cast<int64_t>(o.size()));
}

// Bounds (also the GPU tests'): the engine's numerics on N(0, 1) queries and cached tokens. vs
// float64 on the *decoded* cache the errors are Q's quantization, the fold of NVFP4 K/V (a
// quarter of the products rounded at 2^-4), and P and V in E4M3: the fp8 recipe's budget
// (numerics.md §6: 0.9985 / 0.054 at s = 1024), plus NVFP4 Q's own for q_recipe nvfp4. Measured
// here (d = 64, 5 sequences): fp8 Q 0.9989-0.9994 / 0.034-0.047, nvfp4 Q 0.9965-0.9974 /
// 0.072-0.084; LSE max abs (rows of 1 key included, where it is the score's own error) 0.06-0.10
// and 0.18-0.20. Bounds about 1.5x those.
TEST(PagedPrefillHost, GoldenAgainstFloat64) {
  for (KvCacheFormat f : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    for (Recipe r : {Recipe::kFp8, Recipe::kNvfp4}) {
      for (bool causal : {true, false}) {
        PrefillCase s;
        s.format = f;
        s.d = 64;
        const ErrorStats e = prefill_vs_f64(s, r, causal, r == Recipe::kFp8 ? 0.15 : 0.3);
        std::printf("[paged prefill golden] %s q %s %s: %s\n", kv_cache_format_name(f),
                    recipe_name(r), causal ? "causal" : "non-causal", to_string(e).c_str());
        EXPECT_EQ(e.nan_mismatch, 0);
        EXPECT_GE(e.cos, r == Recipe::kFp8 ? 0.997 : 0.99);
        EXPECT_LE(e.rel_l2, r == Recipe::kFp8 ? 0.07 : 0.12);
      }
    }
  }
}

// A cache of zeros (globals 0, factors 0): O = 0 exactly, the LSE within the usual bounds of
// float64 attention on the decoded cache (zeros too).
TEST(PagedPrefillHost, GoldenOnAnUncalibratedCacheOfZeros) {
  for (KvCacheFormat f : {KvCacheFormat::kNvfp4, KvCacheFormat::kFp8}) {
    PrefillCase s;
    s.format = f;
    s.d = 64;
    s.zeros = true;
    const Built x = build(s);
    ASSERT_EQ(x.cache.kg, 0.f);
    ASSERT_EQ(x.cache.vg, 0.f);
    const ErrorStats e = prefill_vs_f64(s, Recipe::kFp8, true, 0.15);
    EXPECT_EQ(e.nan_mismatch, 0);
    EXPECT_EQ(e.max_abs, 0.0) << to_string(e);
    EXPECT_EQ(e.cos, 1.0) << to_string(e);
  }
}

TEST(PagedPrefillHost, GoldenRejectsBadInput) {
  PrefillCase s;
  Built x = build(s);
  const int64_t b = static_cast<int64_t>(s.lens.size()), tq = x.cu_q.back();
  std::vector<float> o(tq * s.h * s.d);
  const TensorView qv = make_view(x.q.data(), DType::kBF16, {tq, s.h, s.d});
  const TensorView ov = make_view(o.data(), DType::kF32, {tq, s.h, s.d});
  Status st =
      golden_paged_prefill(qv, i32(x.cu_q, {b + 1}), x.cache.view(), i32(x.table, {b, x.max_pages}),
                           i32(x.s.lens, {b}), {}, Recipe::kMxfp4, ov, TensorView{});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("q_recipe"), std::string::npos) << st.message();
  std::vector<int32_t> lens = x.s.lens;
  lens[1] = 100000;
  st =
      golden_paged_prefill(qv, i32(x.cu_q, {b + 1}), x.cache.view(), i32(x.table, {b, x.max_pages}),
                           i32(lens, {b}), {}, Recipe::kFp8, ov, TensorView{});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("seq_lens[1]"), std::string::npos) << st.message();
  x.cache.vg = -2.f;
  st =
      golden_paged_prefill(qv, i32(x.cu_q, {b + 1}), x.cache.view(), i32(x.table, {b, x.max_pages}),
                           i32(x.s.lens, {b}), {}, Recipe::kFp8, ov, TensorView{});
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("v_global"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace fp4attn
